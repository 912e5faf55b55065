"""What laws share: calling the target with the case's arguments, the golden for a case, the
one golden-tolerance assertion, and the capability checks (``needs``) with their reasons.

Assertions here raise ``AssertionError`` with a message that says what broke; their frames are
hidden from pytest tracebacks (``__tracebackhide__``) so a failure points at the law.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from spec import tolerance
from spec.calling import DEADLINE, call
from spec.cases import Case
from spec.dtypes import as_dtype
from spec.target import KEYWORD_FIELDS, Target

Array = np.ndarray

OBSERVED: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("OBSERVED", default=None)
"""Worst values a property saw (e.g. the error ratio), collected by the runner for the report."""


_FROM_CASE: Any = object()


def run(
    target: Target, case: Case, q: Array, k: Array, v: Array, *,
    causal: bool | None = None, mask: Any = _FROM_CASE, scale: Any = _FROM_CASE, **keywords: Any,
) -> Array:  # -> [..., n_q, d_v], float64
    """The target's output for these inputs as float64: flags and the §2b keywords from the case
    unless given (``bias=``, ``window=``, ...; None = not passed)."""
    out = call(
        target, q, k, v, deadline=DEADLINE.get(),
        causal=case.causal if causal is None else causal,
        mask=case.mask_array() if mask is _FROM_CASE else mask,
        scale=case.scale if scale is _FROM_CASE else scale,
        **(case.keywords() | keywords),
    )
    return out.astype(np.float64)


def run_lse(
    target: Target, case: Case, q: Array, k: Array, v: Array, **overrides: Any
) -> tuple[Array, Array]:  # -> out [..., n_q, d_v], lse [..., n_q], float64
    """``run`` with ``return_lse=True``: the output and the target's logsumexp, as float64."""
    out, lse = call(
        target, q, k, v, deadline=DEADLINE.get(), causal=overrides.pop("causal", case.causal),
        mask=overrides.pop("mask", case.mask_array()), scale=overrides.pop("scale", case.scale),
        **(case.keywords() | overrides | {"return_lse": True}),
    )
    return out.astype(np.float64), lse.astype(np.float64)


def observe(key: str, value: float) -> None:
    seen = OBSERVED.get()
    if seen is not None and (key not in seen or value > seen[key]):
        seen[key] = value


def scale_of(case: Case) -> float:
    return 1.0 / math.sqrt(case.d_k) if case.scale is None else case.scale


def expected(
    target: Target, case: Case, q: Array, k: Array, v: Array, *, visible: Array | None = None,
    bias: Any = _FROM_CASE,
) -> tuple[Array, Array, Array, float]:
    """Golden, its pattern, the baseline and the floor for these inputs (K/V heads repeated for GQA;
    ``bias`` replaces the case's bias array; baseline and floor in the dtype the target computes in,
    see ``Target.computes``)."""
    if case.kv_heads is not None:
        k, v = tolerance.repeat_kv(k, case.heads), tolerance.repeat_kv(v, case.heads)
    vis = case.visible(target) if visible is None else visible
    s = scale_of(case)
    bias = case.bias_array() if bias is _FROM_CASE else bias
    gold, weights, _ = case.golden(target, q, k, v, scale=s, visible=vis, bias=bias)
    sinks = None if case.sinks is None else np.asarray(case.sinks)
    work = as_dtype(target.precision(case.dtype))
    qw, kw, vw = (x.astype(work) for x in (q, k, v))
    base = tolerance.baseline(qw, kw, vw, visible=vis, scale=s, bias=bias, softcap=case.softcap, sinks=sinks)
    return gold, weights, base, tolerance.floor(qw, kw, vw, scale=s, bias=bias)


def assert_matches(
    target: Target, case: Case, out: Array, q: Array, k: Array, v: Array, *,
    rows: Array | None = None, visible: Array | None = None, what: str = "output", bias: Any = _FROM_CASE,
) -> tolerance.Comparison:
    """Assert ``out`` is within the tolerance policy of the golden on rows that see a key."""
    __tracebackhide__ = True
    gold, weights, base, floor = expected(target, case, q, k, v, visible=visible, bias=bias)
    seen = weights.sum(axis=-1) > 0
    rows = seen if rows is None else rows & seen
    cmp = tolerance.compare(out, gold, base, rows=rows, tolerance=target.tolerance, floor_=floor)
    assert_within_tolerance(cmp, dtype=target.precision_text(case.dtype), what=what)
    return cmp


def assert_within_tolerance(
    cmp: tolerance.Comparison, *, dtype: str, what: str, against: str = "the float64 golden"
) -> None:
    """THE golden-tolerance assertion of every law: the ratio is observed (worst per dtype, for
    the report) and a ratio above 1 fails, saying what differed from what, where and by how much."""
    __tracebackhide__ = True
    observe(f"error ratio {dtype}", cmp.ratio)
    assert cmp.ok, f"{what} differs from {against}: {cmp.explain()}"


def slack(target: Target, case: Case, q: Array, k: Array) -> float:
    """Tolerance on the weights' sum for this case (see tolerance.weight_sum_slack)."""
    if case.kv_heads is not None:
        k = tolerance.repeat_kv(k, case.heads)
    top = tolerance.max_score(q, k, visible=case.visible(target), scale=scale_of(case))
    return tolerance.weight_sum_slack(target.precision(case.dtype), case.n_k, top)


def assert_same(
    target: Target, case: Case, a: Array, b: Array, q: Array, k: Array, v: Array, *,
    visible: Array | None = None, what: str, bias: Any = _FROM_CASE,
) -> None:
    """Assert two outputs of the target agree within twice what the tolerance policy allows each
    (they may round differently; they may not differ by more). NaN must match NaN."""
    __tracebackhide__ = True
    gold, weights, base, floor = expected(target, case, q, k, v, visible=visible, bias=bias)
    rows = weights.sum(axis=-1) > 0
    allowed = tolerance.compare(gold, gold, base, rows=rows, tolerance=target.tolerance, floor_=floor).allowed
    with np.errstate(invalid="ignore"):
        diff = np.where(rows[..., None], np.abs(a - b), 0.0)
    diff = np.where(np.isnan(a) & np.isnan(b), 0.0, np.where(np.isnan(diff), np.inf, diff))
    if diff.size == 0:
        return
    at = np.unravel_index(int(np.argmax(diff)), diff.shape)
    observe("error ratio", float(diff[at]) / (2 * allowed) if allowed > 0 else 0.0)
    assert diff[at] <= 2 * allowed, (
        f"{what}: entry {[int(i) for i in at]} is {float(b[at]):.6g} instead of {float(a[at]):.6g} "
        f"(difference {float(diff[at]):.3g}, allowed {2 * allowed:.3g})"
    )


def _short(perm: Array) -> str:
    items = perm.tolist()
    return str(items) if len(items) <= 8 else str(items[:8])[:-1] + ", …]"


def identity_values(case: Case) -> Array:  # -> [*kv_lead, n_k, n_k]
    """V = I: the output is then the attention pattern itself."""
    eye = np.eye(case.n_k, dtype=case.dtype)
    return np.ascontiguousarray(np.broadcast_to(eye, (*case.kv_lead, case.n_k, case.n_k)))


def pattern(target: Target, case: Case) -> tuple[Array, Array, Array]:
    """(pattern read through V = I, q, k)."""
    q, k, _ = case.arrays()
    return run(target, case, q, k, identity_values(case)), q, k


def sees_any(target: Target, case: Case) -> Array:  # -> [*lead, n_q] bool
    return np.asarray(case.visible(target).any(axis=-1))


def held_fixed(target: Target, case: Case, blind: Array) -> Array:  # [*lead, n_q] -> [*lead, n_q] bool
    """Of the rows that see none of the changed keys (``blind``), those whose output may not move.
    A row that sees no key at all is among them only where its declared policy ignores the values
    (``zeros``, ``nan``): the mean of all values (``uniform``) or the unmasked row (``unmasked``)
    legitimately moves with them."""
    if target.masked_rows in ("zeros", "nan"):
        return blind
    return blind & sees_any(target, case)


def needs_ndim(*ranks: int) -> Callable[[Target], str | None]:
    def need(t: Target) -> str | None:
        if any(r in t.ndims for r in ranks):  # docstring set below: the capability as text
            return None
        return f"needs inputs of rank {' or '.join(map(str, ranks))} (target declares ndims={t.ndims})"

    need.__doc__ = f"inputs of rank {' or '.join(map(str, ranks))} (ndims)"
    return need


def needs_causal(t: Target) -> str | None:
    """a causal mode (causal_alignment not None)"""
    return None if t.causal_alignment else "needs a causal mode (target declares causal_alignment=None)"


def needs_mask(t: Target) -> str | None:
    """mask= (supports_mask)"""
    return None if t.supports_mask else "needs mask= (target declares supports_mask=False)"


def differs_at(a: Array, b: Array) -> tuple[int, ...]:
    bad = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    return tuple(int(i) for i in np.argwhere(bad)[0])




def needs_keyword(keyword: str) -> Callable[[Target], str | None]:
    """The check that a target takes the §2b keyword (``bias``, ``window``, ...)."""
    field = KEYWORD_FIELDS[keyword]

    def need(t: Target) -> str | None:
        return None if t.declares(keyword) else f"needs {keyword}= (target declares {field}=False)"

    need.__doc__ = f"{keyword}= ({field})"
    return need


def same_bits(a: Array, b: Array) -> Array:  # -> bool, same shape
    """Equal entry by entry, NaN equal to NaN (zeros of either sign are equal)."""
    return (a == b) | (np.isnan(a) & np.isnan(b))
