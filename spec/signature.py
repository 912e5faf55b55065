"""Diagnosing a signature that differs from the call: a ``TypeError`` raised by binding the suite's
call to ``fn`` or ``grad_fn`` (``is_causal=`` where the suite passes ``causal=``) is said once,
with the fix, instead of failing every law."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from spec.keywords import registered
from spec.target import Target

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


def guarded(target: Target, fn: Callable[[], Any]) -> Any:
    """``fn()``, with a TypeError that means "the signature differs" turned into a
    `SignatureMismatch` (where the traceback is: inside a worker process too). ``fn`` is the
    target itself or a callable object whose ``__call__`` binds the call (`spec.call.Request`),
    ``fn.which`` saying which of the target's callables it calls."""
    try:
        return fn()
    except TypeError as e:
        hint = signature_hint(e, target, fn)
        if hint:
            raise SignatureMismatch(hint) from None
        raise


def signature_hint(error: TypeError, target: Target, through: Any = None) -> str | None:
    """The teaching message for a TypeError raised by binding the call to ``fn``/``grad_fn``
    (an unexpected keyword the suite passes, a required one it never passes, or positional
    arguments it does not take: ``def f(q, k)``), else None. ``through``: the callable object the
    call was made through (its ``__call__`` is where binding ``grad_fn`` fails; binding ``fn``
    fails in ``Target.__call__``)."""
    text = str(error)
    frames = []
    tb, tb_frame = error.__traceback__, None
    while tb is not None:
        frames.append(tb.tb_frame.f_code)
        tb_frame = tb.tb_frame
        tb = tb.tb_next
    caller = getattr(vars(type(through)).get("__call__"), "__code__", None)  # a class's own __call__
    binders = (Target.__call__.__code__, *([caller] if caller is not None else []))
    at_call = bool(frames) and frames[-1] in binders
    grad = bool(frames) and frames[-1] is caller and target.grad_fn is not None \
        and getattr(through, "which", "fn") == "grad_fn"
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
    causal=True"), read from the frame that made it (``Target.__call__`` or the request's)."""
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
