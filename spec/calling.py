"""Calling a target safely: fresh copies in, a deadline, and every misbehaviour turned into a
failure the report can show (never a crash of the suite)."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from spec.target import Target


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


def call(
    target: Target, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, deadline: float | None,
    causal: bool = False, mask: np.ndarray | None = None, scale: float | None = None,
    expect_shape: tuple[int, ...] | None = None, copy: bool = True,
) -> np.ndarray:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v]
    """Call the target on copies of the inputs (so a mutating target cannot corrupt the check;
    ``copy=False`` hands over the caller's arrays) and return its output as an ndarray of the
    expected shape."""
    args = [np.array(x, copy=copy) for x in (q, k, v)]
    mask_copy = None if mask is None else np.array(mask, copy=copy)
    seconds = target.deadline_s if target.deadline_s is not None else deadline
    try:
        out = with_deadline(
            lambda: target(*args, causal=causal, mask=mask_copy, scale=scale), seconds
        )
    except TargetHung:
        raise
    except (Exception, SystemExit) as e:  # a sys.exit() in the target must not end the suite
        raise TargetFailed(f"the target raised {type(e).__name__}: {e}") from e
    if not isinstance(out, np.ndarray) or out.dtype.kind not in "fiuVc":
        raise TargetFailed(f"the target returned {type(out).__name__} of dtype {out.dtype}, not floats")
    if expect_shape is None:
        try:
            lead = np.broadcast_shapes(q.shape[:-2], v.shape[:-2])
        except ValueError:  # grouped K/V heads: the output has the query heads
            lead = q.shape[:-2]
        expect_shape = (*lead, q.shape[-2], v.shape[-1])
    if out.shape != expect_shape:
        raise TargetFailed(f"the target returned shape {out.shape}, expected {expect_shape}")
    return out
