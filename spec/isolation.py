"""Where a target's calls run — a watched thread under a deadline, the caller's thread, or a forked
worker process — and every way a call can fail to come back (an overrun, a crash) turned into a
failure the report can show, never a crash of the suite.

Two entry points: `run_law` runs a law's whole run where the target's ``isolation`` says (for
``process``, first in the run's worker process), and `call_in` makes one call of the target
there. The thread a run's calls are made in is kept per thread of the caller (two checks running
at once in two threads each keep their own); the worker processes are kept per check (`workers`).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import faulthandler
import mmap
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from spec.signature import guarded
from spec.target import Target, TargetError, TargetFailed

T = TypeVar("T")

class TargetHung(BaseException):
    """The target did not return within the deadline.

    A ``BaseException`` on purpose: Hypothesis treats it like ``KeyboardInterrupt`` and stops at
    once instead of shrinking, which would call the hanging target again many times.
    """


def _interrupt(thread: threading.Thread) -> None:
    """Raise `TargetHung` inside ``thread`` at its next Python instruction (best effort:
    a thread blocked in C code stays blocked, and is abandoned)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(TargetHung))


class _CallThread:
    """A daemon thread that runs the jobs handed to it, one at a time — single calls
    (`with_deadline`) or whole law runs (`watched`) — kept for the next job: a job costs a
    hand-off through two locks, not the start of a thread. ``go`` is released by the caller when
    ``job`` is set, ``done`` by this thread when ``box`` holds the job's value or error; a lock's
    acquire with a timeout waits in C, without the Python-level condition variable an event or
    a queue takes per job."""

    def __init__(self) -> None:
        self.go, self.done = threading.Lock(), threading.Lock()
        self.go.acquire()
        self.done.acquire()
        self.job: Callable[[], Any] | None = None
        self.box: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._serve, daemon=True, name="spec-target-call")
        self.thread.start()

    def _serve(self) -> None:
        try:
            while True:
                self.go.acquire()
                fn, box = self.job, {}
                assert fn is not None
                try:
                    box["value"] = fn()
                except TargetHung:  # interrupted past its deadline: this thread is done
                    self.done.release()  # for a caller still waiting for it to unwind (`watched`)
                    return
                except BaseException as e:  # handed back to the caller's thread
                    box["error"] = e
                self.box = box
                self.done.release()
        except TargetHung:  # an interrupt that arrived between calls ends the thread too
            return

    def idle(self) -> bool:
        """Alive and not running a job (one left running by an interrupted caller is not idle)."""
        return self.thread.is_alive() and self.job is None

    def give(self, fn: Callable[[], Any]) -> None:
        """Start ``fn`` in this thread (the last job must be done)."""
        self.job = fn
        self.go.release()

    def wait(self, seconds: float) -> dict[str, Any] | None:
        """The job's outcome (``{"value": ...}`` or ``{"error": ...}``), or None if it is still
        running after ``seconds``."""
        if not self.done.acquire(timeout=min(seconds, threading.TIMEOUT_MAX)):
            return None
        box, self.box, self.job = self.box, {}, None
        return box

    def run(self, fn: Callable[[], Any], seconds: float) -> dict[str, Any] | None:
        """``fn``'s outcome, or None after ``seconds``."""
        self.give(fn)
        return self.wait(seconds)



class _Kept(threading.local):
    """This thread's kept threads: the one that makes single calls (`with_deadline`) and the
    watched one that runs a law's whole run (`watched`), each reused until it is abandoned."""

    caller: _CallThread | None = None
    watched: tuple[_CallThread, Watch] | None = None


_KEPT = _Kept()


def with_deadline(fn: Callable[[], Any], seconds: float | None) -> Any:
    """``fn()``, or `TargetHung` after ``seconds``.

    The call runs in a daemon thread, kept for the next call. One that overruns is interrupted if
    it is running Python (a loop, a sleep) and abandoned if it is stuck in C code (a deadlocked
    kernel) — either way the next call gets a fresh thread, the suite goes on, and a stuck thread
    cannot keep the process alive.
    """
    if seconds is None:
        return fn()
    if _KEPT.caller is None or not _KEPT.caller.idle():
        _KEPT.caller = _CallThread()
    worker = _KEPT.caller
    box = worker.run(fn, seconds)
    if box is None:
        _KEPT.caller = None  # abandoned: it may never come back
        _interrupt(worker.thread)
        raise TargetHung(f"did not return within the {seconds:g} s deadline")
    if "error" in box:
        raise box["error"]
    return box["value"]


class Watch:
    """The deadline of the call that the watched thread (`watched`) is making, for the thread
    that watches it: set by `invoke` around each call, read by `watched`, under one lock, so that
    an overrun is interrupted only while the call that overran is still running."""

    def __init__(self, thread: threading.Thread) -> None:
        self.lock = threading.Lock()
        self.until: float | None = None  # time.monotonic() past which the running call is late
        self.seconds = 0.0  # its deadline
        self.thread = thread

    @contextlib.contextmanager
    def call(self, seconds: float) -> Iterator[None]:
        with self.lock:
            self.until, self.seconds = time.monotonic() + seconds, seconds
        try:
            yield
        finally:
            with self.lock:
                self.until = None

    def interrupt_if_late(self) -> float | None:
        """Interrupt the watched thread if its call is past its deadline; that deadline, or None."""
        with self.lock:
            if self.until is None or time.monotonic() < self.until:
                return None
            _interrupt(self.thread)
            self.until = None
            return self.seconds


WATCH: contextvars.ContextVar[Watch | None] = contextvars.ContextVar("WATCH", default=None)
"""The `Watch` of the watched thread, inside that thread."""
_GRACE_S = 1.0  # how long an interrupted thread is given to unwind before it is abandoned


def watched(fn: Callable[[], Any], deadline: float) -> Any:
    """``fn()`` in the watched thread (kept from one call to the next, with this thread's
    context), each target call it makes under its deadline: the calls run in that thread, one
    after another, and this thread looks at the one running every tenth of ``deadline`` (the
    deadline the calls are under; at most once a second), so an overrun is caught within a
    tenth of its deadline. Waking a thread on the other core costs more than a small call
    itself, so the calls are not handed to a thread one by one (`with_deadline`): what that
    cost is measured in docs/performance.md. The thread is kept because a new one costs more still:
    Hypothesis registers a random generator per thread, with a full garbage collection, and
    validates each strategy again.

    A call past its deadline is interrupted (`TargetHung` raised in the thread at its next
    Python instruction, so ``fn`` unwinds as after any other failure) and `TargetHung` is
    raised here; the thread is given a second to unwind, then abandoned (a daemon, it cannot
    keep the process alive), and the next call starts a fresh one. ``fn``'s value is returned
    and its exception re-raised here."""
    if _KEPT.watched is None or not _KEPT.watched[0].idle():
        fresh = _CallThread()
        _KEPT.watched = (fresh, Watch(fresh.thread))
    worker, watch = _KEPT.watched
    context = contextvars.copy_context()

    def body() -> Any:
        WATCH.set(watch)
        return fn()

    worker.give(lambda: context.run(body))
    look = min(1.0, deadline / 10)
    while (box := worker.wait(look)) is None:
        late = watch.interrupt_if_late()
        if late is not None:
            _KEPT.watched = None  # an interrupt may still be pending in it: never reused
            worker.wait(_GRACE_S)
            raise TargetHung(f"did not return within the {late:g} s deadline")
    if "error" in box:
        raise box["error"]
    return box["value"]


MAX_CRASHES = 20
"""Crashes of one target's worker within one law run before the suite stops shrinking
(each crash restarts the worker; Hypothesis would otherwise call the crashing case many times)."""


class TargetStopped(BaseException):
    """A failure after which calling the target again is pointless (its worker kept crashing).

    A ``BaseException`` for the same reason as `TargetHung`: Hypothesis stops at once.
    """




@dataclass(frozen=True)
class Request:
    """A call into the target that can travel to a worker process: ``which`` callable of the
    target (``"fn"`` = the Target itself with its layout translation, ``"grad_fn"``) on
    ``args``/``kwargs`` (arrays and plain values, pickled). Calling it runs it here."""

    target: Target
    which: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __call__(self) -> Any:
        return _resolve(self.target, self.which)(*self.args, **self.kwargs)


def _resolve(target: Target, which: str) -> Callable[..., Any]:
    fn = target if which == "fn" else target.grad_fn
    if fn is None:
        raise TargetError(f"target {target.name!r} declares no {which}")
    return fn


def _arrays(request: Request) -> list[tuple[int | str, np.ndarray]]:
    """The array arguments of a request, by position or keyword (to send mutations back)."""
    found: list[tuple[int | str, np.ndarray]] = [(i, x) for i, x in enumerate(request.args)
                                                 if isinstance(x, np.ndarray)]
    return found + [(key, x) for key, x in request.kwargs.items() if isinstance(x, np.ndarray)]




def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class _Worker:
    """A forked child that serves calls into ``target`` until closed: it inherits the target
    through the fork (``fn`` need not pickle) and receives ``(which, args, kwargs)``; with
    ``once`` it runs that zero-argument callable (also inherited) a single time instead."""

    def __init__(self, target: Target, once: Callable[[], Any] | None = None, *,
                 loop: Callable[[Any], None] | None = None) -> None:
        # loop: the child's loop on its end of the pipe instead of `_serve` (`_RunWorker`)
        parent, child = multiprocessing.Pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the suite's code
            code = 0
            try:
                parent.close()
                _become_worker()
                _serve(child, target, once) if loop is None else loop(child)
            except BaseException:  # the pipe closed or the suite was interrupted
                code = 70
            finally:
                os._exit(code)
        child.close()
        self.pid, self.conn, self.target = pid, parent, target
        self.status: int | None = None  # set once reaped

    def call(self, message: Any, what: str, seconds: float | None) -> Any:
        """Send one call and return its reply: ``("ok", value, mutated)`` or ``("error", ...)``.

        A worker that dies is reaped and named (signal or exit status) in a `TargetFailed`;
        one that overruns is killed and a `TargetHung` raised."""
        try:
            self.conn.send(message)
            ready = self.conn.poll(seconds)
        except (BrokenPipeError, EOFError, OSError):
            ready = True  # died before reading: reaped below
        if not ready:
            self.close(kill=True)
            raise TargetHung(f"did not return within the {seconds:g} s deadline "
                             "(its worker process was killed)")
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            status = self.close(kill=False)
            if status < 0:
                raise TargetFailed(f"{what} crashed with {_signal_name(-status)} "
                                   f"(signal {-status}) in its worker process") from None
            raise TargetFailed(f"{what} ended its worker process with exit status {status} "
                               "(os._exit or a native abort)") from None

    def close(self, *, kill: bool) -> int:
        """Stop the worker (SIGKILL when ``kill`` or when it does not leave) and reap it;
        returns its exit status as ``waitpid`` says (negative: the signal that ended it).
        Closing twice returns the first status."""
        if self.status is not None:
            return self.status
        if kill:
            _kill(self.pid)
        else:
            try:
                self.conn.send(None)  # asks the loop to end
            except OSError:
                pass
        self.conn.close()
        for _ in range(2000):  # up to 2 s for a polite exit, then SIGKILL
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.001)
        else:
            _kill(self.pid)
            status = os.waitpid(self.pid, 0)[1]
        self.status = os.waitstatus_to_exitcode(status)
        return self.status


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _become_worker() -> None:
    """In a fresh worker: a fault is reported by the parent from the exit status, so core dumps
    and the fault handler's dump are switched off; Ctrl-C ends it (the parent reaps it)."""
    faulthandler.disable()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _single_threaded_torch()


def _serve(conn: Any, target: Target, once: Callable[[], Any] | None) -> None:
    """The worker's loop: each message is a call (``None`` ends it)."""
    while True:
        message = conn.recv()
        if message is None:
            return
        if message == "once" and once is not None:
            request: Callable[[], Any] = once
            arrays = _arrays(once) if isinstance(once, Request) else []
        else:
            which, args, kwargs = message
            request = Request(target, which, tuple(args), dict(kwargs))
            arrays = _arrays(request)
        before = [x.copy() for _, x in arrays]
        try:
            value = guarded(target, request)
            changed = [(where, x) for (where, x), old in zip(arrays, before, strict=True)
                       if x.tobytes() != old.tobytes()]
            reply: tuple[Any, ...] = ("ok", value, changed)
        except BaseException as e:  # every outcome goes back to the parent
            reply = ("error", e)
        try:
            conn.send(reply)
        except Exception as e:  # an unpicklable result or exception: sent as text
            kind, shown = ("error" if reply[0] == "error" else "returned"), reply[1]
            conn.send(("text", kind, type(shown).__name__, str(shown)[:500], str(e)[:200]))


def _single_threaded_torch() -> None:
    """In a forked worker, PyTorch's OpenMP pool, if the parent ever used it, is threads that do
    not exist: the first parallel region would hang. One thread runs it inline instead."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)




class _Clock:
    """When the running call of a `_RunWorker` is late: one float in memory shared with the
    parent (``time.monotonic()``, one clock for every process), written by the worker around
    each call, 0 between calls; the parent reads it while it waits, so no call wakes it."""

    def __init__(self) -> None:
        self.memory = mmap.mmap(-1, 8)  # anonymous and shared: the fork's child writes the same page
        self.until = ctypes.c_double.from_buffer(self.memory)  # an aligned 8-byte store: never torn

    @contextlib.contextmanager
    def call(self, seconds: float | None) -> Iterator[None]:
        self.until.value = 0.0 if seconds is None else time.monotonic() + seconds
        try:
            yield
        finally:
            self.until.value = 0.0

    def late(self) -> bool:
        until = self.until.value
        return until != 0.0 and time.monotonic() > until


_RUN_CLOCK: _Clock | None = None
"""In a `_RunWorker` (this process is one): its clock; process-isolated calls then run directly,
timed by it."""


def in_run_worker() -> bool:
    """Whether this process is a `_RunWorker`, where a process-isolated target is called
    directly (the worker is the isolation)."""
    return _RUN_CLOCK is not None



class _RunWorker(_Worker):
    """A forked child that runs whole jobs for one target — a law's Hypothesis run — and
    calls the target directly inside them, each call timed by a shared `_Clock`. The
    alternative, a round trip to a `_Worker` per call (pickling, a pipe and two wake-ups of a
    process on the other core), costs more than most calls take (docs/performance.md has the
    figures). ``serve(target, job)`` is the job's work (inherited through the fork; ``job`` and
    its value are pickled)."""

    def __init__(self, target: Target, serve: Callable[[Target, Any], Any]) -> None:
        clock = self.clock = _Clock()

        def loop(conn: Any) -> None:
            global _RUN_CLOCK
            _RUN_CLOCK = clock
            while (job := conn.recv()) is not None:
                conn.send(serve(target, job))

        super().__init__(target, loop=loop)

    def run(self, job: Any, look: float) -> tuple[Any, str | None]:
        """``(value, None)``, or ``(None, what happened)`` when the worker died (reaped) or one of
        its calls overran (killed), looking at its clock every ``look`` seconds."""
        try:
            self.conn.send(job)
            while not self.conn.poll(look):
                if self.clock.late():
                    self.close(kill=True)
                    return None, "overran its deadline"
            return self.conn.recv(), None
        except (EOFError, OSError):
            status = self.close(kill=False)
            return None, (f"crashed with {_signal_name(-status)}" if status < 0
                          else f"ended its worker process with exit status {status}")




class Workers:
    """The worker processes of one check, one of each kind per target (found by identity, never
    by ``id``, which a new object may reuse): the `_Worker` that serves its calls one by one, and
    the `_RunWorker` that runs whole laws (None once it failed: that target is then called call
    by call for the rest of the check); ``crashes``: how many times the target's worker crashed
    in the law being run (`MAX_CRASHES`)."""

    def __init__(self) -> None:
        self._calls: list[_Worker] = []
        self._runs: list[tuple[Target, _RunWorker | None]] = []
        self.crashes = 0

    def call_worker(self, target: Target) -> _Worker:
        """The target's call worker, forked on first use (and again after one was dropped)."""
        for worker in self._calls:
            if worker.target is target:
                return worker
        worker = _Worker(target)
        self._calls.append(worker)
        return worker

    def kept(self, worker: _Worker) -> bool:
        return any(w is worker for w in self._calls)

    def drop(self, target: Target) -> None:
        """Forget the target's call worker (it crashed or was killed, and was reaped)."""
        self._calls = [w for w in self._calls if w.target is not target]

    def run_worker(self, target: Target, serve: Callable[[Target, Any], Any]) -> _RunWorker | None:
        """The target's run worker, forked on first use; None once one failed in this check."""
        for known, worker in self._runs:
            if known is target:
                return worker
        fresh = _RunWorker(target, serve)
        self._runs.append((target, fresh))
        return fresh

    def failed(self, target: Target) -> None:
        """The target's run worker crashed or overran: none again in this check."""
        self._runs = [(t, None if t is target else w) for t, w in self._runs]

    def close(self, *, kill: bool) -> None:
        for worker in [*self._calls, *(w for _, w in self._runs if w is not None)]:
            worker.close(kill=kill)


_WORKERS: contextvars.ContextVar[Workers | None] = contextvars.ContextVar("WORKERS", default=None)


@contextlib.contextmanager
def workers() -> Iterator[Workers]:
    """Within: process-isolated calls reuse one worker per target; on leaving (also on an
    exception or Ctrl-C) every worker is stopped and reaped, so none outlives the run. Nested
    (a law's run inside a whole check) it shares the outer workers, so a check forks once, not
    once per law, and starts its own count of crashes (`MAX_CRASHES` is per law's run)."""
    outer = _WORKERS.get()
    if outer is not None:
        before, outer.crashes = outer.crashes, 0
        try:
            yield outer
        finally:
            outer.crashes = before
        return
    pool = Workers()
    token = _WORKERS.set(pool)
    interrupted = True  # until the block ends normally: then a worker may still be mid-call
    try:
        yield pool
        interrupted = False
    finally:
        _WORKERS.reset(token)
        pool.close(kill=interrupted)


def _run_in_worker(target: Target, serve: Callable[[Target, Any], Any], job: Any,
                   deadline: float | None) -> tuple[Any, str | None] | None:
    """``serve(target, job)`` in the check's `_RunWorker` for ``target``: ``(value, None)``, or
    ``(None, what happened)`` if it crashed or a call in it overran ``deadline`` — then the worker
    is gone and the caller runs the job here again, each call in a `_Worker`, which reports and
    shrinks the failure. After that, None for the rest of the check: a target that crashed or
    hung once is called call by call from then on, so each later failure is met once."""
    pool = _WORKERS.get()
    assert pool is not None, "_run_in_worker needs workers()"
    worker = pool.run_worker(target, serve)
    if worker is None:
        return None
    value, failed = worker.run(job, min(1.0, deadline / 10) if deadline else 1.0)
    if failed is not None:
        pool.failed(target)
    return value, failed


def _in_process(target: Target, what: str, fn: Callable[[], Any], seconds: float | None) -> Any:
    """``fn()`` in a worker process: the target's call worker for a `Request`, a one-off fork
    for any other callable (it inherits ``fn``); in a `_RunWorker`, here, timed by its clock."""
    if _RUN_CLOCK is not None:
        with _RUN_CLOCK.call(seconds):
            return guarded(target, fn)
    pool = _WORKERS.get()
    if isinstance(fn, Request) and pool is not None:
        worker = pool.call_worker(target)
        message: Any = (fn.which, fn.args, fn.kwargs)
    else:
        worker, message = _Worker(target, once=fn), "once"
    try:
        reply = worker.call(message, what, seconds)
    except TargetFailed as e:  # the worker crashed (and was reaped)
        if pool is not None:
            pool.drop(target)
            pool.crashes += 1
            if pool.crashes >= MAX_CRASHES:
                raise TargetStopped(f"{e} ({pool.crashes} crashes: not called again)") from None
        raise
    except TargetHung:  # killed and reaped
        if pool is not None:
            pool.drop(target)
        raise
    finally:
        if pool is None or not pool.kept(worker):
            worker.close(kill=False)  # a one-off worker; no-op when already reaped
    if reply[0] == "ok":
        _, value, mutated = reply
        if isinstance(fn, Request):
            for where, x in mutated:
                np.copyto(fn.args[where] if isinstance(where, int) else fn.kwargs[where], x)
        return value
    if reply[0] == "text":
        _, kind, type_name, text, why = reply
        if kind == "error":
            raise TargetFailed(f"{what} raised {type_name}: {text}", raised=f"{type_name}: {text}")
        raise TargetFailed(f"{what} returned a {type_name} that cannot leave its worker process ({why})")
    raise reply[1]


# --- the two entry points ------------------------------------------------------------------------


def call_in(target: Target, what: str, fn: Callable[[], Any], seconds: float | None) -> Any:
    """``fn()`` (a call of the target) where the target's ``isolation`` says: ``thread`` — under
    ``seconds``, in this thread when it is the `watched` one running the law, else handed to a
    kept thread (`with_deadline`); ``caller`` — this thread, no deadline (for libraries that must
    be called from one thread); ``process`` — a forked worker process (Linux/macOS fork): a crash
    (SIGSEGV, SIGABRT, ``os._exit``) is a `TargetFailed` naming the signal, an overrun SIGKILLs
    the worker (`TargetHung`), and the next call starts a fresh one; inside the law's run worker,
    here, timed by its clock. Fork copies only the calling thread: PyTorch's intra-op pool is set
    to one thread in the worker (else a parent that used it makes the child hang); another
    library whose threads ran in the parent before the fork (an OpenMP or XLA pool) may deadlock
    in the child — then the deadline fails the call. A signature that differs from the call is a
    `spec.signature.SignatureMismatch` in every mode."""
    if target.isolation == "process":
        return _in_process(target, what, fn, seconds)
    if target.isolation == "caller":
        return guarded(target, fn)
    watch = WATCH.get()
    if watch is not None and seconds is not None and watch.thread is threading.current_thread():
        with watch.call(seconds):
            return guarded(target, fn)
    return with_deadline(lambda: guarded(target, fn), seconds)


_PASSED_ON = (KeyboardInterrupt, SystemExit, GeneratorExit)


def run_law(target: Target, attempt: Callable[[], None],
            conclude: Callable[[BaseException | None, str | None], T], *,
            remote: tuple[Callable[[Target, Any], T], Any] | None, deadline: float | None) -> T:
    """A law's whole run where the target's ``isolation`` says, concluded by ``conclude(error,
    crashed)``: ``error`` what ``attempt()`` raised (None if nothing; Ctrl-C is passed on),
    ``crashed`` what the run's worker process met if it did not come back.

    ``process``: first ``remote = (serve, job)`` — ``serve(target, job)`` in the check's run
    worker, calling the target directly there — whose value is the law's; only if that worker
    crashed or overran is ``attempt()`` run here, each call in a worker of its own, which
    reports and shrinks the failure. ``thread``: ``attempt()`` in the `watched` thread, each call
    under ``deadline``; ``caller``: in this thread."""
    crashed: str | None = None
    with workers():
        if remote is not None and target.isolation == "process" and not in_run_worker():
            outcome = _run_in_worker(target, remote[0], remote[1], deadline)
            if outcome is not None:
                value, crashed = outcome
                if crashed is None:
                    return value
        try:
            if target.isolation == "thread" and deadline is not None:
                watched(attempt, deadline)
            else:
                attempt()
        except _PASSED_ON:
            raise
        except BaseException as e:  # a misbehaving target must never crash the suite
            return conclude(e, crashed)
    return conclude(None, crashed)
