"""Calling a target safely: fresh copies in, a deadline, and every misbehaviour turned into a
failure the report can show (never a crash of the suite)."""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import faulthandler
import inspect
import multiprocessing
import os
import re
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from spec.target import KEYWORD_FIELDS, Target, TargetError


class TargetFailed(AssertionError):
    """The target raised, returned something that is not an array, or returned the wrong shape."""


class TargetHung(BaseException):
    """The target did not return within the deadline.

    A ``BaseException`` on purpose: Hypothesis treats it like ``KeyboardInterrupt`` and stops at
    once instead of shrinking, which would call the hanging target again many times.
    """


def _interrupt(thread: threading.Thread) -> None:
    """Raise :class:`TargetHung` inside ``thread`` at its next Python instruction (best effort:
    a thread blocked in C code stays blocked, and is abandoned)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(TargetHung))


def with_deadline(fn: Callable[[], Any], seconds: float | None) -> Any:
    """``fn()``, or :class:`TargetHung` after ``seconds``.

    The call runs in a daemon thread. One that overruns is interrupted if it is running Python
    (a loop, a sleep) and abandoned if it is stuck in C code (a deadlocked kernel): either way the
    suite goes on, and a stuck thread cannot keep the process alive.
    """
    if seconds is None:
        return fn()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed back to the caller's thread below
            box["error"] = e

    worker = threading.Thread(target=run, daemon=True, name="spec-target-call")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        _interrupt(worker)
        raise TargetHung(f"did not return within the {seconds:g} s deadline")
    if "error" in box:
        raise box["error"]
    return box["value"]


DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("DEADLINE", default=None)
"""Per-call deadline in seconds, set by the runner for the property being run."""

GRADS = ("dq", "dk", "dv")


def invoke(target: Target, what: str, fn: Callable[[], Any], deadline: float | None) -> Any:
    """THE way the suite calls into a target: ``fn()`` where the target's ``isolation`` says,
    with every misbehaviour a :class:`TargetFailed` (an exception, ``sys.exit``, a crash),
    :class:`TargetHung` (an overrun) or :class:`SignatureMismatch` (the target does not take the
    keywords it was declared to take). ``what`` names the callable in messages ("the target",
    "grad_fn").

    Modes: ``thread`` — a worker thread under the deadline (``target.deadline_s`` overrides the
    profile's); ``caller`` — this thread, no deadline (for libraries that must be called from
    one thread); ``process`` — a forked worker process (Linux/macOS fork): a crash (SIGSEGV,
    SIGABRT, ``os._exit``) is a failure naming the signal, an overrun SIGKILLs the worker, and
    the next call starts a fresh one. Within :func:`workers` (each property run) a target keeps
    one worker that receives :class:`Request` objects; any other ``fn`` runs in a one-off fork.
    Fork copies only the calling thread: PyTorch's intra-op pool is set to one thread in the
    worker (else a parent that used it makes the child hang); another library whose threads ran
    in the parent before the fork (an OpenMP or XLA pool) may deadlock in the child — then the
    deadline fails the call. JAX runs (its backend starts in each worker, so each property
    compiles afresh).
    """
    seconds = target.deadline_s if target.deadline_s is not None else deadline
    try:
        if target.isolation == "process":
            return _in_process(target, what, fn, seconds)
        if target.isolation == "caller":
            return _guarded(target, fn)
        return with_deadline(lambda: _guarded(target, fn), seconds)
    except (TargetHung, TargetStopped, TargetError, TargetFailed):
        raise
    except (Exception, SystemExit) as e:  # a sys.exit() in the target must not end the suite
        raise TargetFailed(f"{what} raised {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------------------------
# A signature that differs from the call (``is_causal=`` for ``causal=``): said once, with the fix.
# ---------------------------------------------------------------------------------------------

PASSED = ("causal", "mask", "scale", *KEYWORD_FIELDS)
"""The keywords the suite may pass to ``fn`` (and ``causal`` to ``grad_fn``)."""
DECLARED_BY = {"causal": "causal_alignment=None", "mask": "supports_mask=False",
               "scale": "supports_scale=False"} | {k: f"{f}=False" for k, f in KEYWORD_FIELDS.items()}
_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")
_MISSING = re.compile(r"missing \d+ required (?:keyword-only |positional )?arguments?: '(\w+)'")


class SignatureMismatch(BaseException):
    """The target does not take a keyword the suite passes (or requires one it never passes):
    every call would fail the same way, so the run says it once, with the fix, and stops.
    A ``BaseException`` so that Hypothesis stops at once instead of shrinking."""


def _guarded(target: Target, fn: Callable[[], Any]) -> Any:
    """``fn()``, with a TypeError that means "the signature differs" turned into a
    :class:`SignatureMismatch` (here, where the traceback is: also inside a worker process)."""
    try:
        return fn()
    except TypeError as e:
        hint = signature_hint(e, target)
        if hint:
            raise SignatureMismatch(hint) from None
        raise


def signature_hint(error: TypeError, target: Target) -> str | None:
    """The teaching message for a TypeError raised by binding the call to ``fn``/``grad_fn``
    (an unexpected keyword the suite passes, or a required one it never passes), else None."""
    text = str(error)
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    at_call = bool(frames) and frames[-1] in (Target.__call__.__code__, Request.__call__.__code__)
    grad = bool(frames) and frames[-1] is Request.__call__.__code__ and target.grad_fn is not None
    fn = target.grad_fn if grad and target.grad_fn is not None else target.fn
    who = "grad_fn" if grad else "the target"
    mine = getattr(fn, "__name__", "mine")
    shown = _signature(fn)
    unexpected = _UNEXPECTED.search(text)
    if unexpected and unexpected.group(1) in PASSED:
        name = unexpected.group(1)
        spelled = _spelled(fn, name)
        fix = "" if grad else f"declare Target(fn, {DECLARED_BY[name]}) if it does not support {name}, or "
        call_it = f"{spelled}={name}" if spelled else f"<its name for {name}>={name}"
        params = "q, k, v, d_out" if grad else "q, k, v"
        default = "False" if name == "causal" else "None"
        return (f"{who} does not take the keyword {name}= that the suite passes (its signature: "
                f"{mine}{shown}); {fix}wrap it: def f({params}, *, {name}={default}): "
                f"return {mine}({params}, {call_it})")
    missing = _MISSING.search(text)
    if missing and at_call:
        name = missing.group(1)
        return (f"{who} requires the argument {name}, which the suite never passes (its signature: "
                f"{mine}{shown}; the suite calls f(q, k, v, *, causal=...)); give {name} a default "
                f"or wrap it: def f(q, k, v, *, causal=False): return {mine}(q, k, v, {name}=...)")
    return None


def _signature(fn: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def _spelled(fn: Callable[..., Any], name: str) -> str | None:
    """The parameter of ``fn`` that most likely means ``name`` (``is_causal`` for ``causal``)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return next((p for p in params if name in p.lower() and p != name), None)


def call(
    target: Target, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, deadline: float | None,
    causal: bool = False, mask: np.ndarray | None = None, scale: float | None = None,
    expect_shape: tuple[int, ...] | None = None, copy: bool = True, **keywords: Any,
) -> Any:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v] (, lse [..., n_q])
    """Call the target on copies of the inputs (so a mutating target cannot corrupt the check;
    ``copy=False`` hands over the caller's arrays) and return its output as an ndarray of the
    expected shape. ``keywords`` are those of DESIGN §2b (``bias=``, ``window=``, ...; None =
    not given); with ``return_lse=True`` the result is ``(out, lse)``, lse checked to be float
    and shaped ``[..., n_q]``. A keyword the target does not declare is a :class:`TargetError`
    (the law asked for something the target cannot do: a bug in the law's ``needs``)."""
    args = [np.array(x, copy=copy) for x in (q, k, v)]
    mask_copy = None if mask is None else np.array(mask, copy=copy)
    given = {name: (np.array(x, copy=copy) if isinstance(x, np.ndarray) else x)
             for name, x in target.keywords(keywords).items()}
    request = Request(target, "fn", tuple(args),
                      {"causal": causal, "mask": mask_copy, "scale": scale, **given})
    got = invoke(target, "the target", request, deadline)
    out, lse = got if given.get("return_lse") else (got, None)
    _check_float(out, "the target returned")
    if expect_shape is None:
        try:
            lead = np.broadcast_shapes(q.shape[:-2], v.shape[:-2])
        except ValueError:  # grouped K/V heads: the output has the query heads
            lead = q.shape[:-2]
        expect_shape = (*lead, q.shape[-2], v.shape[-1])
    if out.shape != expect_shape:
        raise TargetFailed(f"the target returned shape {out.shape}, expected {expect_shape}")
    if lse is None:
        return out
    _check_float(lse, "with return_lse=True the target returned lse as")
    if lse.shape != expect_shape[:-1]:
        raise TargetFailed(f"the target returned lse of shape {lse.shape}, expected {expect_shape[:-1]}")
    return out, lse


def _check_float(x: Any, said: str) -> None:
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "fiuVc":
        raise TargetFailed(f"{said} {type(x).__name__} of dtype {getattr(x, 'dtype', None)}, not floats")


def call_grad(
    target: Target, q: np.ndarray, k: np.ndarray, v: np.ndarray, d_out: np.ndarray, *, causal: bool,
    deadline: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # -> dq [.., n_q, d_k], dk [.., n_k, d_k], dv [.., n_k, d_v]
    """``target.grad_fn`` on copies, in the target's layout, through :func:`invoke` (so with the
    same guarantees as a forward call); each gradient checked for shape and dtype.
    ``deadline`` defaults to the running property's (:data:`DEADLINE`)."""
    grad_fn = target.grad_fn
    if grad_fn is None:
        raise TargetError(f"target {target.name!r} declares no grad_fn")
    args = [np.array(x, copy=True) for x in (q, k, v, d_out)]
    swap = target.layout == "bnhd" and q.ndim == 4
    if swap:
        args = [np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in args]
    kwargs: dict[str, Any] = {"causal": True} if causal else {}
    got = invoke(target, "grad_fn", Request(target, "grad_fn", tuple(args), kwargs),
                 DEADLINE.get() if deadline is None else deadline)
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        got_what = f"{len(got)} arrays" if isinstance(got, (tuple, list)) else type(got).__name__
        raise TargetFailed(f"grad_fn returned {got_what}, not the three (dq, dk, dv)")
    grads = []
    for name, g, x in zip(GRADS, got, (q, k, v), strict=True):
        g = np.asarray(g)
        if swap and g.ndim == 4:
            g = np.swapaxes(g, 1, 2)
        if g.shape != x.shape:
            raise TargetFailed(f"grad_fn returned {name} of shape {g.shape}, expected {x.shape}")
        if g.dtype != x.dtype:
            raise TargetFailed(f"grad_fn returned {name} of dtype {g.dtype}, inputs are {x.dtype}")
        grads.append(g)
    return grads[0], grads[1], grads[2]


# ---------------------------------------------------------------------------------------------
# Process isolation: calls in a forked worker, so a crash or a call stuck in C is a failure.
# ---------------------------------------------------------------------------------------------

MAX_CRASHES = 20
"""Crashes of one target's worker within one property run before the suite stops shrinking
(each crash restarts the worker; Hypothesis would otherwise call the crashing case many times)."""


class TargetStopped(BaseException):
    """A failure after which calling the target again is pointless (its worker kept crashing).

    A ``BaseException`` for the same reason as :class:`TargetHung`: Hypothesis stops at once.
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

    def __init__(self, target: Target, once: Callable[[], Any] | None = None) -> None:
        parent, child = multiprocessing.Pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the suite's code
            code = 0
            try:
                parent.close()
                _serve(child, target, once)
            except BaseException:  # the pipe closed or the suite was interrupted
                code = 70
            finally:
                os._exit(code)
        child.close()
        self.pid, self.conn, self.target = pid, parent, target
        self.status: int | None = None  # set once reaped

    def call(self, message: Any, what: str, seconds: float | None) -> Any:
        """Send one call and return its reply: ``("ok", value, mutated)`` or ``("error", ...)``.

        A worker that dies is reaped and named (signal or exit status) in a :class:`TargetFailed`;
        one that overruns is killed and a :class:`TargetHung` raised."""
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
        for _ in range(200):  # up to 2 s for a polite exit, then SIGKILL
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.01)
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


def _serve(conn: Any, target: Target, once: Callable[[], Any] | None) -> None:
    """The worker's loop: each message is a call (``None`` ends it). A fault here is reported by
    the parent from the exit status, so core dumps and the fault handler's dump are switched off."""
    faulthandler.disable()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C: the parent reaps us
    _single_threaded_torch()
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
            value = _guarded(target, request)
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


def _in_process(target: Target, what: str, fn: Callable[[], Any], seconds: float | None) -> Any:
    """``fn()`` in a worker process: the run's worker for a :class:`Request`, a one-off fork
    for any other callable (it inherits ``fn``)."""
    pool = WORKERS.get()
    if isinstance(fn, Request) and pool is not None:
        worker = pool.get(id(target))
        if worker is None or worker.target is not target:
            worker = pool[id(target)] = _Worker(target)
        message: Any = (fn.which, fn.args, fn.kwargs)
    else:
        worker, message = _Worker(target, once=fn), "once"
    try:
        reply = worker.call(message, what, seconds)
    except TargetFailed as e:  # the worker crashed (and was reaped)
        if pool is not None:
            pool.pop(id(target), None)
            crashes = CRASHES.get()
            crashes.append(1)
            if len(crashes) >= MAX_CRASHES:
                raise TargetStopped(f"{e} ({len(crashes)} crashes: not called again)") from None
        raise
    except TargetHung:  # killed and reaped
        if pool is not None:
            pool.pop(id(target), None)
        raise
    finally:
        if pool is None or pool.get(id(target)) is not worker:
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
            raise TargetFailed(f"{what} raised {type_name}: {text}")
        raise TargetFailed(f"{what} returned a {type_name} that cannot leave its worker process ({why})")
    raise reply[1]


WORKERS: contextvars.ContextVar[dict[int, _Worker] | None] = contextvars.ContextVar("WORKERS", default=None)
"""The worker processes of the current run (by target), or None outside :func:`workers`."""
CRASHES: contextvars.ContextVar[list[int]] = contextvars.ContextVar("CRASHES", default=[])  # noqa: B039


@contextlib.contextmanager
def workers() -> Iterator[None]:
    """Within: process-isolated calls reuse one worker per target; on leaving (also on an
    exception or Ctrl-C) every worker is stopped and reaped, so none outlives the run."""
    pool: dict[int, _Worker] = {}
    token, crash_token = WORKERS.set(pool), CRASHES.set([])
    interrupted = True  # until the block ends normally: then a worker may still be mid-call
    try:
        yield
        interrupted = False
    finally:
        WORKERS.reset(token)
        CRASHES.reset(crash_token)
        for worker in pool.values():
            worker.close(kill=interrupted)
