"""Calling a target safely: fresh copies in, a deadline, and every misbehaviour turned into a
failure the report can show (never a crash of the suite)."""

from __future__ import annotations

import contextvars
import ctypes
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from spec.target import Target, TargetError


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
    with every misbehaviour a :class:`TargetFailed` (an exception, ``sys.exit``) or
    :class:`TargetHung` (an overrun). ``what`` names the callable in messages ("the target",
    "grad_fn").

    Modes: ``thread`` — a worker thread under the deadline (``target.deadline_s`` overrides the
    profile's); ``caller`` — this thread, no deadline (for libraries that must be called from
    one thread); ``process`` — not built yet: a worker process, so that a crash or a call stuck
    in C is a failure and the run goes on in a fresh worker (this is the one place for it).
    """
    seconds = target.deadline_s if target.deadline_s is not None else deadline
    if target.isolation == "process":
        raise TargetError("isolation='process' is not available yet in this version of spec; "
                          "use 'thread' or 'caller'")
    try:
        if target.isolation == "caller":
            return fn()
        return with_deadline(fn, seconds)
    except (TargetHung, TargetError):
        raise
    except (Exception, SystemExit) as e:  # a sys.exit() in the target must not end the suite
        raise TargetFailed(f"{what} raised {type(e).__name__}: {e}") from e


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
    got = invoke(target, "the target",
                 lambda: target(*args, causal=causal, mask=mask_copy, scale=scale, **given), deadline)
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
    got = invoke(target, "grad_fn", lambda: grad_fn(*args, **kwargs),
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
