"""Calling a target safely: fresh copies in, a deadline, and every misbehaviour turned into a
failure the report can show (never a crash of the suite)."""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import faulthandler
import inspect
import mmap
import multiprocessing
import os
import re
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from spec import oracle
from spec.golden import GRADS
from spec.inputs import Inputs
from spec.keywords import arrangement, by_argument, carried, gradient_extras, registered
from spec.target import IN_LAYOUT, NotAnArray, Target, TargetError


class TargetFailed(AssertionError):
    """The target raised, returned something that is not an array, or returned the wrong shape."""


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
    (`with_deadline`) or whole property runs (`watched`) — kept for the next job: a job costs a
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


_CALLER: list[_CallThread] = []  # the live call thread, if any (a fork's child starts its own)


def with_deadline(fn: Callable[[], Any], seconds: float | None) -> Any:
    """``fn()``, or `TargetHung` after ``seconds``.

    The call runs in a daemon thread, kept for the next call. One that overruns is interrupted if
    it is running Python (a loop, a sleep) and abandoned if it is stuck in C code (a deadlocked
    kernel) — either way the next call gets a fresh thread, the suite goes on, and a stuck thread
    cannot keep the process alive.
    """
    if seconds is None:
        return fn()
    if not _CALLER or not _CALLER[0].idle():
        _CALLER[:] = [_CallThread()]
    worker = _CALLER[0]
    box = worker.run(fn, seconds)
    if box is None:
        _CALLER.clear()  # abandoned: it may never come back
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

_WATCHED: list[tuple[_CallThread, Watch]] = []  # the thread that runs watched work, kept between runs
_GRACE_S = 1.0  # how long an interrupted thread is given to unwind before it is abandoned


def watched(fn: Callable[[], Any], deadline: float) -> Any:
    """``fn()`` in the watched thread (kept from one call to the next, with this thread's
    context), each target call it makes under its deadline: the calls run in that thread, one
    after another, and this thread looks at the one running every tenth of ``deadline`` (the
    deadline the calls are under; at most once a second), so an overrun is caught within a
    tenth of its deadline. Waking a thread on the other core costs more than a small call
    itself: with a hand-off per call (`with_deadline`), ``spec check reference --profile ci``
    took 6–13 % more CPU time and 10–16 % more wall time (measured on the 2-core CI machine,
    2026-12-01, three alternated runs each way). The thread is kept because a new one costs more still:
    Hypothesis registers a random generator per thread, with a full garbage collection, and
    validates each strategy again.

    A call past its deadline is interrupted (`TargetHung` raised in the thread at its next
    Python instruction, so ``fn`` unwinds as after any other failure) and `TargetHung` is
    raised here; the thread is given a second to unwind, then abandoned (a daemon, it cannot
    keep the process alive), and the next call starts a fresh one. ``fn``'s value is returned
    and its exception re-raised here."""
    if not _WATCHED or not _WATCHED[0][0].idle():
        worker = _CallThread()
        _WATCHED[:] = [(worker, Watch(worker.thread))]
    worker, watch = _WATCHED[0]
    context = contextvars.copy_context()

    def body() -> Any:
        WATCH.set(watch)
        return fn()

    worker.give(lambda: context.run(body))
    look = min(1.0, deadline / 10)
    while (box := worker.wait(look)) is None:
        late = watch.interrupt_if_late()
        if late is not None:
            _WATCHED.clear()  # an interrupt may still be pending in it: never reused
            worker.wait(_GRACE_S)
            raise TargetHung(f"did not return within the {late:g} s deadline")
    if "error" in box:
        raise box["error"]
    return box["value"]


DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("DEADLINE", default=None)
"""Per-call deadline in seconds, set by the runner for the property being run."""

def invoke(target: Target, what: str, fn: Callable[[], Any], deadline: float | None) -> Any:
    """THE way the suite calls into a target: ``fn()`` where the target's ``isolation`` says,
    with every misbehaviour a `TargetFailed` (an exception, ``sys.exit``, a crash),
    `TargetHung` (an overrun) or `SignatureMismatch` (the target does not take the
    keywords it was declared to take). ``what`` names the callable in messages ("the target",
    "grad_fn").

    Modes: ``thread`` — under the deadline (``target.deadline_s`` overrides the profile's): in
    this thread when it is `watched` (the runner runs each property so), else handed to a worker
    thread (`with_deadline`); ``caller`` — this thread, no deadline (for libraries that must be
    called from one thread); ``process`` — a forked worker process (Linux/macOS fork): a crash (SIGSEGV,
    SIGABRT, ``os._exit``) is a failure naming the signal, an overrun SIGKILLs the worker, and
    the next call starts a fresh one. The runner runs each property's whole run in the run's
    `_RunWorker`, where this calls ``fn`` directly, timed by the worker's clock; a run that
    crashes it or overruns is run again here, each call in the target's `_Worker` (kept within
    `workers`, receiving `Request` objects; any other ``fn`` runs in a one-off fork).
    Fork copies only the calling thread: PyTorch's intra-op pool is set to one thread in the
    worker (else a parent that used it makes the child hang); another library whose threads ran
    in the parent before the fork (an OpenMP or XLA pool) may deadlock in the child — then the
    deadline fails the call. JAX runs (its backend starts in each worker, so it compiles afresh
    after each crash).
    """
    seconds = target.deadline_s if target.deadline_s is not None else deadline
    try:
        if target.isolation == "process":
            return _in_process(target, what, fn, seconds)
        if target.isolation == "caller":
            return _guarded(target, fn)
        watch = WATCH.get()
        if watch is not None and seconds is not None and watch.thread is threading.current_thread():
            with watch.call(seconds):
                return _guarded(target, fn)
        return with_deadline(lambda: _guarded(target, fn), seconds)
    except (TargetHung, TargetStopped, TargetError, TargetFailed):
        raise
    except NotAnArray as e:  # what it returned, said as it is (not "the target raised ...")
        raise TargetFailed(str(e)) from None
    except (Exception, SystemExit) as e:  # a sys.exit() in the target must not end the suite
        raise TargetFailed(f"{what} raised {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------------------------
# A signature that differs from the call (``is_causal=`` for ``causal=``): said once, with the fix.
# ---------------------------------------------------------------------------------------------

CORE_FLAGS = {"causal": "causal_alignment=None", "mask": "supports_mask=False",
              "scale": "supports_scale=False"}


def declared_by() -> dict[str, str]:
    """Every keyword the suite may pass to ``fn`` (and to ``grad_fn``), with the declaration that
    turns it off: the core flags and each argument of each declared keyword."""
    return CORE_FLAGS | {arg: f"{kw.field}=False" for kw in registered().values() for arg in kw.passes}


RESIDUALS = {"out": "grad_takes_residuals=False", "lse": "grad_takes_residuals=False"}
"""What ``grad_fn`` is passed beside the forward's keywords when the target declares
``grad_takes_residuals``, with the declaration that turns it off."""

_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")
_MISSING = re.compile(r"missing \d+ required (?:keyword-only |positional )?arguments?: '(\w+)'")
_POSITIONAL = re.compile(r"takes (?:from \d+ to )?\d+ positional arguments? but \d+ "
                         r"(?:positional arguments? )?(?:\(and \d+ keyword-only arguments?\) )?"
                         r"(?:were|was) given"
                         r"|got multiple values for argument '\w+'")


class SignatureMismatch(BaseException):
    """The target does not take a keyword the suite passes (or requires one it never passes):
    every call would fail the same way, so the run says it once, with the fix, and stops.
    A ``BaseException`` so that Hypothesis stops at once instead of shrinking."""


def _guarded(target: Target, fn: Callable[[], Any]) -> Any:
    """``fn()``, with a TypeError that means "the signature differs" turned into a
    `SignatureMismatch` (here, where the traceback is: also inside a worker process)."""
    try:
        return fn()
    except TypeError as e:
        hint = signature_hint(e, target)
        if hint:
            raise SignatureMismatch(hint) from None
        raise


def signature_hint(error: TypeError, target: Target) -> str | None:
    """The teaching message for a TypeError raised by binding the call to ``fn``/``grad_fn``
    (an unexpected keyword the suite passes, a required one it never passes, or positional
    arguments it does not take: ``def f(q, k)``), else None."""
    text = str(error)
    frames = []
    tb, tb_frame = error.__traceback__, None
    while tb is not None:
        frames.append(tb.tb_frame.f_code)
        tb_frame = tb.tb_frame
        tb = tb.tb_next
    at_call = bool(frames) and frames[-1] in (Target.__call__.__code__, Request.__call__.__code__)
    grad = bool(frames) and frames[-1] is Request.__call__.__code__ and target.grad_fn is not None
    fn = target.grad_fn if grad and target.grad_fn is not None else target.fn
    who = "grad_fn" if grad else "the target"
    mine = getattr(fn, "__name__", "mine")
    shown = _signature(fn)
    unexpected = _UNEXPECTED.search(text)
    passed = declared_by() | (RESIDUALS if grad else {})
    if unexpected and unexpected.group(1) in passed:
        name = unexpected.group(1)
        spelled = _spelled(fn, name)
        fix = "" if grad and name not in RESIDUALS else \
            f"declare Target(fn, {passed[name]}) if it does not support {name}, or "
        call_it = f"{spelled}={name}" if spelled else f"<its name for {name}>={name}"
        params = "q, k, v, d_out" if grad else "q, k, v"
        default = "False" if name == "causal" else "None"
        return (f"{who} does not take the keyword {name}= that the suite passes (its signature: "
                f"{mine}{shown}); {fix}wrap it: def f({params}, *, {name}={default}): "
                f"return {mine}({params}, {call_it})")
    positional = _POSITIONAL.search(text)
    if positional and at_call:
        params = "q, k, v, d_out" if grad else "q, k, v"
        called = _called_with(tb_frame, params)
        return (f"{who} cannot be called as the suite calls it, {mine}({called}): {positional.group(0)} "
                f"(its signature: {mine}{shown}); it must take {params} positionally and causal= by "
                f"keyword: wrap it: def f({params}, *, causal=False): return {mine}(<{params} as it takes "
                "them>)")
    missing = _MISSING.search(text)
    if missing and at_call:
        name = missing.group(1)
        return (f"{who} requires the argument {name}, which the suite never passes (its signature: "
                f"{mine}{shown}; the suite calls f(q, k, v, *, causal=...)); give {name} a default "
                f"or wrap it: def f(q, k, v, *, causal=False): return {mine}(q, k, v, {name}=...)")
    return None


def _called_with(frame: Any, params: str) -> str:
    """The arguments of the call that failed to bind, as the suite passed them ("q, k, v,
    causal=True"), read from the frame that made it (``Target.__call__`` or ``Request.__call__``)."""
    local = frame.f_locals if frame is not None else {}
    keywords = local.get("kwargs") if "kwargs" in local else getattr(local.get("self"), "kwargs", None)
    shown = [f"{name}={'<array>' if isinstance(x, np.ndarray) else repr(x)}"
             for name, x in (keywords or {}).items() if x is not None]
    return ", ".join([params, *shown])


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


CALLS: contextvars.ContextVar[list[Call] | None] = contextvars.ContextVar("CALLS", default=None)
"""The calls made into targets while a law's example runs (set by the runner): a failure shows
the last one, exactly as the target received it."""


@dataclass(frozen=True)
class Call:
    """One call into a target, as it received it: ``which`` callable (``fn`` or ``grad_fn``),
    its inputs and, for a gradient, the upstream gradient, in the suite's layout; ``axes``: the
    two axes of q, k, v (and d_out) that ``fn`` received swapped (its ``bnhd`` layout), or None;
    ``arrangement``: the call's (`spec.keywords.arrangement`), which says which of them moved
    (`spec.target.IN_LAYOUT`: a paged cache's k and v never do)."""

    which: str
    inputs: Inputs
    d_out: np.ndarray | None = None
    axes: tuple[int, int] | None = None
    arrangement: str = "dense"

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array argument by name, exactly as the callable received it (in its layout;
        masks and biases are ``[batch, heads, n_q, n_k]`` in every layout, paged caches
        ``[num_blocks, block_size, heads_kv, d]``)."""
        found = self.inputs.arrays() | ({} if self.d_out is None else {"d_out": self.d_out})
        if self.axes is not None:
            moved = (*IN_LAYOUT[self.arrangement], "d_out")
            found |= {name: np.swapaxes(found[name], *self.axes) for name in moved if name in found}
        return found


def _record(call: Call) -> None:
    made = CALLS.get()
    if made is not None:
        made.append(call)


def arguments(target: Target, inputs: Inputs, *, copy: bool = True) -> dict[str, Any]:
    """The keyword arguments ``fn`` receives for ``inputs``: ``causal`` only when true, ``mask`` and
    ``scale`` when given, each keyword argument when given (``return_lse=False`` is not given), on
    copies when ``copy``. A keyword the target does not declare is a `TargetError` (a law asked
    for something the target cannot do: a bug in the law's needs), unless another keyword it
    declares carries it (``kv_lengths`` with ``block_table``: `spec.keywords.Keyword.carries`)."""
    kwargs: dict[str, Any] = {"causal": True} if inputs.causal else {}
    if inputs.mask is not None:
        kwargs["mask"] = np.array(inputs.mask, copy=copy)
    if inputs.scale is not None:
        kwargs["scale"] = inputs.scale
    table = by_argument()
    for name, value in inputs.keywords.items():
        kw = table.get(name)
        if kw is None:
            raise TargetError(f"unknown keyword {name!r}; the keywords are {', '.join(table)}")
        if value is None or (name == "return_lse" and value is False):
            continue
        if not getattr(target, kw.field) and not carried(target, name, inputs.keywords):
            raise TargetError(f"keyword {name}= needs {kw.field}=True, which target {target.name!r} "
                              "does not declare")
        kwargs[name] = np.array(value, copy=copy) if isinstance(value, np.ndarray) else value
    return kwargs


def call(
    target: Target, inputs: Inputs, *, deadline: float | None = None,
    expect_shape: tuple[int, ...] | None = None, copy: bool = True,
) -> Any:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v] (, lse [..., n_q])
    """Call the target on copies of ``inputs`` (so a mutating target cannot corrupt the check;
    ``copy=False`` hands over the caller's arrays) and return its output as an ndarray of the
    expected shape; with ``return_lse=True`` among the keywords the result is ``(out, lse)``,
    lse checked to be float and shaped ``[..., n_q]``. ``deadline`` defaults to the running
    property's (`DEADLINE`). The call is recorded (`CALLS`) for the report."""
    args = tuple(np.array(x, copy=copy) for x in (inputs.q, inputs.k, inputs.v))
    kwargs = arguments(target, inputs, copy=copy)
    kwargs["arrangement"] = arranged = arrangement(kwargs)
    _record(Call("fn", inputs, axes=target._layout_axes(inputs.q.ndim, packed=arranged == "packed"),
                 arrangement=arranged))
    request = Request(target, "fn", args, kwargs)
    got = invoke(target, "the target", request, DEADLINE.get() if deadline is None else deadline)
    out, lse = got if kwargs.get("return_lse") else (got, None)
    _check_float(out, "the target returned")
    # the output's shape is that of what k and v mean (a paged pool's shape is not the keys')
    expect_shape = oracle.meaning(inputs).out_shape if expect_shape is None else expect_shape
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
    target: Target, inputs: Inputs, d_out: np.ndarray, *,
    residuals: tuple[np.ndarray, np.ndarray] | None = None, deadline: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    # -> dq [.., n_q, d_k], dk [.., n_k, d_k], dv [.., n_k, d_v], extras
    """``target.grad_fn(q, k, v, d_out, **keywords)`` on copies, with exactly the keywords the
    forward would receive for ``inputs`` (`arguments`, without ``return_lse``), in the target's
    layout (packed sequences too), through `invoke` (so with the same guarantees as a forward
    call). ``residuals``: the forward's ``(out, lse)`` (suite layout), passed as ``out=`` and
    ``lse=`` (`Target.grad_takes_residuals`). ``deadline`` defaults to the running property's.

    Returns ``(dq, dk, dv, extras)``, each gradient checked for shape and dtype; ``extras`` holds
    the gradient of each extra input the target declares (`Target.grad_extras`) whose keyword
    the call was given, checked to have the shape and dtype of that input as passed (empty when
    none)."""
    grad_fn = target.grad_fn
    if grad_fn is None:
        raise TargetError(f"target {target.name!r} declares no grad_fn")
    q, k, v = inputs.q, inputs.k, inputs.v
    kwargs = arguments(target, inputs)
    kwargs.pop("return_lse", None)
    arranged = arrangement(kwargs)
    axes = target._layout_axes(q.ndim, packed=arranged == "packed")
    _record(Call("grad_fn", inputs, d_out, axes, arranged))
    moved = (*IN_LAYOUT[arranged], "d_out")

    def given(name: str, x: np.ndarray) -> np.ndarray:  # a copy, in the target's layout
        if axes and name in moved:
            return np.ascontiguousarray(np.swapaxes(x, *axes))
        return np.array(x, copy=True)

    args = tuple(given(name, x) for name, x in zip(("q", "k", "v", "d_out"), (q, k, v, d_out), strict=True))
    if residuals is not None:
        kwargs["out"], kwargs["lse"] = given("d_out", residuals[0]), np.array(residuals[1], copy=True)
    got = invoke(target, "grad_fn", Request(target, "grad_fn", args, kwargs),
                 DEADLINE.get() if deadline is None else deadline)
    size = 4 if target.grad_extras else 3
    if not isinstance(got, (tuple, list)) or len(got) != size or (
            size == 4 and not isinstance(got[3], Mapping)):
        got_what = f"{len(got)} items" if isinstance(got, (tuple, list)) else type(got).__name__
        wanted = ("(dq, dk, dv, extras), extras a dict (the target declares grad_extras="
                  f"{target.grad_extras!r})") if size == 4 else "the three (dq, dk, dv)"
        raise TargetFailed(f"grad_fn returned {got_what}, not {wanted}")
    grads = []
    for name, g, x in zip(GRADS, got[:3], (q, k, v), strict=True):
        g = Target._from_layout(np.asarray(g), axes)
        _check_gradient(g, name, x.shape, x.dtype)
        grads.append(g)
    extras = _extras(target, kwargs, got[3]) if size == 4 else {}
    return grads[0], grads[1], grads[2], extras


def _check_gradient(g: np.ndarray, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if g.shape != shape:
        raise TargetFailed(f"grad_fn returned {name} of shape {g.shape}, expected {shape}")
    if g.dtype != dtype:
        raise TargetFailed(f"grad_fn returned {name} of dtype {g.dtype}, expected {dtype}")


def _extras(target: Target, kwargs: dict[str, Any], returned: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The declared extras ``grad_fn`` returned, each checked against the input it is the gradient
    of (its keyword's first argument, as passed): present exactly when that keyword was given."""
    known = gradient_extras()
    wanted = {name: known[name] for name in target.grad_extras if known[name].given(kwargs) is not None}
    found: dict[str, np.ndarray] = {}
    for name, g in returned.items():
        if g is None:
            continue
        if name not in target.grad_extras:
            raise TargetFailed(f"grad_fn returned {name!r} among its extras, which the target does not "
                               f"declare (grad_extras={target.grad_extras!r})")
        if name not in wanted:
            raise TargetFailed(f"grad_fn returned {name} though the call gave no {known[name].passes[0]}=")
        value = np.asarray(kwargs[wanted[name].passes[0]])
        g = np.asarray(g)
        _check_gradient(g, name, value.shape, value.dtype)
        found[name] = g
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise TargetFailed(f"grad_fn returned no {missing[0]}, though the call gave "
                           f"{wanted[missing[0]].passes[0]}= and the target declares grad_extras="
                           f"{target.grad_extras!r}")
    return found


# ---------------------------------------------------------------------------------------------
# Process isolation: calls in a forked worker, so a crash or a call stuck in C is a failure.
# ---------------------------------------------------------------------------------------------

MAX_CRASHES = 20
"""Crashes of one target's worker within one property run before the suite stops shrinking
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


_RUN_CLOCK: list[_Clock] = []
"""In a `_RunWorker`: its clock (then process-isolated calls run directly, timed by it)."""


def in_run_worker() -> bool:
    """Whether this process is a `_RunWorker`, where a process-isolated target is called
    directly (the worker is the isolation)."""
    return bool(_RUN_CLOCK)


class _RunWorker(_Worker):
    """A forked child that runs whole jobs for one target — a property's Hypothesis run — and
    calls the target directly inside them, each call timed by a shared `_Clock`. The
    alternative, a round trip to a `_Worker` per call (pickling, a pipe and two wake-ups of a
    process on the other core), cost ~0.35 ms a call: ``spec check reference --profile ci``
    took 18–24 % more CPU time in process isolation than in thread isolation that way, and
    takes −1 to +3 % this way (three alternated runs each, on the 2-core CI machine,
    2026-12-02). ``serve(target, job)`` is the job's work (inherited through the fork; ``job``
    and its value are pickled)."""

    def __init__(self, target: Target, serve: Callable[[Target, Any], Any]) -> None:
        clock = self.clock = _Clock()

        def loop(conn: Any) -> None:
            _RUN_CLOCK[:] = [clock]
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


def run_in_worker(target: Target, serve: Callable[[Target, Any], Any], job: Any,
                  deadline: float | None) -> tuple[Any, str | None] | None:
    """``serve(target, job)`` in the run's `_RunWorker` for ``target`` (forked on first use, one
    for the run): ``(value, None)``, or ``(None, what happened)`` if it crashed or a call in it
    overran ``deadline`` — then the worker is gone and the caller runs the job here again, each
    call in a `_Worker`, which reports and shrinks the failure. After that, None for the rest of
    the run (within `workers`, which this needs): a target that crashed or hung once is called
    call by call from then on, so each later failure is met once, not once here and again."""
    pool = WORKERS.get()
    assert pool is not None, "run_in_worker needs workers()"
    key = ("run", id(target))
    worker = pool.get(key, False)
    if worker is None:
        return None
    if not isinstance(worker, _RunWorker) or worker.target is not target:
        worker = pool[key] = _RunWorker(target, serve)
    value, failed = worker.run(job, min(1.0, deadline / 10) if deadline else 1.0)
    if failed is not None:
        pool[key] = None
    return value, failed


def _in_process(target: Target, what: str, fn: Callable[[], Any], seconds: float | None) -> Any:
    """``fn()`` in a worker process: the run's worker for a `Request`, a one-off fork
    for any other callable (it inherits ``fn``); in a `_RunWorker`, here, timed by its clock."""
    if _RUN_CLOCK:
        with _RUN_CLOCK[0].call(seconds):
            return _guarded(target, fn)
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


WORKERS: contextvars.ContextVar[dict[Any, _Worker | None] | None] = contextvars.ContextVar("WORKERS",
                                                                                         default=None)
"""The worker processes of the current run (by target: ``id(target)`` for its `_Worker`,
``("run", id(target))`` for its `_RunWorker`, None there once it failed), or None outside
`workers`."""
CRASHES: contextvars.ContextVar[list[int]] = contextvars.ContextVar("CRASHES", default=[])  # noqa: B039


@contextlib.contextmanager
def workers() -> Iterator[None]:
    """Within: process-isolated calls reuse one worker per target; on leaving (also on an
    exception or Ctrl-C) every worker is stopped and reaped, so none outlives the run. Nested
    (a property run inside a whole check) it shares the outer workers, so a check forks once, not
    once per law, and starts its own count of crashes (`MAX_CRASHES` is per property run)."""
    if WORKERS.get() is not None:
        crash_token = CRASHES.set([])
        try:
            yield
        finally:
            CRASHES.reset(crash_token)
        return
    pool: dict[Any, _Worker | None] = {}
    token, crash_token = WORKERS.set(pool), CRASHES.set([])
    interrupted = True  # until the block ends normally: then a worker may still be mid-call
    try:
        yield
        interrupted = False
    finally:
        WORKERS.reset(token)
        CRASHES.reset(crash_token)
        for worker in pool.values():
            if worker is not None:
                worker.close(kill=interrupted)
