"""Gallery for the merge laws (`spec.laws.merge`): merge operators (`spec.MergeTarget`), each broken
one changing the max-shifted log-sum-exp merge in one place, and correct variants that compute it
differently. States are ``(out [..., n_q, d_v], lse [..., n_q])``; the maths runs in float32 for
16-bit outputs."""

from __future__ import annotations

import math

import numpy as np

from gallery.base import Broken
from impl.attention import compute_dtype
from spec import MergeTarget

Array = np.ndarray


def _work(out: Array, lse: Array) -> tuple[Array, Array]:
    work = compute_dtype(out.dtype)
    return out.astype(work), lse.astype(np.promote_types(work, lse.dtype))


def _shifted(lses: Array, *, empty: float = -np.inf) -> tuple[Array, Array]:  # [s, ..., n_q] -> weights, lse
    """The max-shifted weights e^(lse_i − lse) and the merged lse; ``empty`` read as −inf."""
    lses = np.where(lses == empty, -np.inf, lses)
    top = np.max(lses, axis=0)
    shift = np.where(np.isfinite(top), top, 0)
    e = np.exp(lses - shift)
    total = e.sum(axis=0)
    with np.errstate(divide="ignore"):
        lse = shift + np.log(total)
    return e / np.where(total > 0, total, 1), lse


def max_shifted_n(outs: Array, lses: Array) -> tuple[Array, Array]:
    """The n-way merge, shifted by the largest lse of each row."""
    o, lse = _work(outs, lses)
    w, merged = _shifted(lse)
    return (w[..., None] * o).sum(axis=0).astype(outs.dtype), merged.astype(lses.dtype)


def max_shifted(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    return max_shifted_n(np.stack([out_a, out_b]), np.stack([lse_a, lse_b]))


def log_add_exp(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    """lse = logaddexp(lse_a, lse_b); each weight e^(lse_i − lse), zero for an empty part."""
    (oa, la), (ob, lb) = _work(out_a, lse_a), _work(out_b, lse_b)
    lse = np.logaddexp(la, lb)
    safe = np.where(np.isfinite(lse), lse, 0)
    wa = np.where(np.isneginf(la), 0, np.exp(la - safe))[..., None]
    wb = np.where(np.isneginf(lb), 0, np.exp(lb - safe))[..., None]
    return (wa * oa + wb * ob).astype(out_a.dtype), lse.astype(lse_a.dtype)


def sigmoid_update(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    """Ring-flash-attention's update, out − σ(lse_b − lse_a)·(out − out_b), empty parts passed over."""
    (oa, la), (ob, lb) = _work(out_a, lse_a), _work(out_b, lse_b)
    with np.errstate(invalid="ignore", over="ignore"):
        share = np.where(np.isneginf(lb), 0, np.where(np.isneginf(la), 1, 1 / (1 + np.exp(la - lb))))
        lse = np.logaddexp(la, lb)
    return (oa - share[..., None] * (oa - ob)).astype(out_a.dtype), lse.astype(lse_a.dtype)


def sigmoid_update_bnhd(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    """`sigmoid_update` on ``bnhd`` states: out [b, n, h, d], lse [b, h, n] (FlashAttention's
    softmax_lse), the lse moved to the output's order and back."""
    if out_a.ndim != 4:
        return sigmoid_update(out_a, lse_a, out_b, lse_b)
    out, lse = sigmoid_update(out_a, np.swapaxes(lse_a, 1, 2), out_b, np.swapaxes(lse_b, 1, 2))
    return out, np.swapaxes(lse, 1, 2)


def base2(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    """FlashInfer's merge_state on base-2 lse: weights 2^(lse_i − lse)."""
    (oa, la), (ob, lb) = _work(out_a, lse_a), _work(out_b, lse_b)
    lse = np.logaddexp2(la, lb)
    safe = np.where(np.isfinite(lse), lse, 0)
    wa = np.where(np.isneginf(la), 0, np.exp2(la - safe))[..., None]
    wb = np.where(np.isneginf(lb), 0, np.exp2(lb - safe))[..., None]
    return (wa * oa + wb * ob).astype(out_a.dtype), lse.astype(lse_a.dtype)


def plus_inf_empty(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    """FlashAttention's convention: an empty state's lse is +inf, read as −inf before merging."""
    w, lse = _shifted(np.stack([lse_a, lse_b]), empty=np.inf)
    o = np.stack([_work(out_a, lse_a)[0], _work(out_b, lse_b)[0]])
    return (w[..., None] * o).sum(axis=0).astype(out_a.dtype), np.where(np.isneginf(lse), np.inf, lse).astype(
        lse_a.dtype)


# --- broken: each changes the merge in one place


def empty_empty_nan(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    # the max shift taken as it is: −inf − (−inf) = NaN when both parts are empty
    (oa, la), (ob, lb) = _work(out_a, lse_a), _work(out_b, lse_b)
    top = np.maximum(la, lb)
    with np.errstate(invalid="ignore"):
        ea, eb = np.exp(la - top), np.exp(lb - top)
        total = ea + eb
        out = (ea[..., None] * oa + eb[..., None] * ob) / total[..., None]
    return out.astype(out_a.dtype), (top + np.log(total)).astype(lse_a.dtype)


def overflowing(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    # exp(lse_a) + exp(lse_b) computed directly: inf once an lse passes the dtype's range
    (oa, la), (ob, lb) = _work(out_a, lse_a), _work(out_b, lse_b)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ea, eb = np.exp(la), np.exp(lb)
        total = ea + eb
        out = (ea[..., None] * oa + eb[..., None] * ob) / np.where(total > 0, total, 1)[..., None]
        return out.astype(out_a.dtype), np.log(total).astype(lse_a.dtype)


def base2_as_natural(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    # a base-2 lse merged with natural exponentials (log-add and weights in base e)
    return log_add_exp(out_a, lse_a, out_b, lse_b)


def plus_inf_as_number(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    # the unguarded merge of `empty_empty_nan` given the +inf sentinel of an empty state: e^(inf − inf) = NaN
    return empty_empty_nan(out_a, lse_a, out_b, lse_b)


def ignores_one_weight(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    # the output of the part with the larger lse, the other's weight dropped
    _, lse = log_add_exp(out_a, lse_a, out_b, lse_b)
    return np.where((lse_a >= lse_b)[..., None], out_a, out_b), lse


def max_from_first(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    # the shift taken from the first part (the running state assumed the larger): e^(lse_b − lse_a)
    # overflows when the second part dominates
    (oa, la), (ob, lb) = _work(out_a, lse_a), _work(out_b, lse_b)
    shift = np.where(np.isfinite(la), la, np.where(np.isfinite(lb), lb, 0))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ea, eb = np.exp(la - shift), np.exp(lb - shift)
        total = ea + eb
        out = (ea[..., None] * oa + eb[..., None] * ob) / np.where(total > 0, total, 1)[..., None]
        return out.astype(out_a.dtype), (shift + np.log(total)).astype(lse_a.dtype)


def lse_max_not_logadd(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    # the outputs weighted right, the merged lse max(lse_a, lse_b): the log-add dropped
    out, _ = log_add_exp(out_a, lse_a, out_b, lse_b)
    return out, np.maximum(lse_a, lse_b)


def global_max_n(outs: Array, lses: Array) -> tuple[Array, Array]:
    # the n-way shift taken over the whole array, not per row: rows far below it underflow to 0/0
    o, lse = _work(outs, lses)
    finite = lse[np.isfinite(lse)]
    shift = finite.max() if finite.size else 0
    e = np.exp(lse - shift)
    total = e.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (e[..., None] * o).sum(axis=0) / total[..., None]
        return out.astype(outs.dtype), (shift + np.log(total)).astype(lses.dtype)


_DTYPES = ("float16", "float32", "float64")


def _broken(fn: object, catches: str, bug: str, **declared: object) -> Broken:
    return Broken(MergeTarget(fn, name=fn.__name__, dtypes=_DTYPES, **declared), catches, bug)  # type: ignore


BROKEN = [
    _broken(empty_empty_nan, "merge_empty_empty_is_empty", "empty ⊕ empty gives NaN (flashinfer #4051)"),
    _broken(overflowing, "merge_large_lse",
            "exp(lse_a) + exp(lse_b) computed directly: overflows (EasyContext #14)"),
    _broken(base2_as_natural, "merge_base2_lse", "a base-2 lse merged as natural (sglang PR #35045)",
            lse_base=2),
    _broken(plus_inf_as_number, "merge_empty_is_identity",
            "the +inf empty-state sentinel merged as a number: NaN (flash-attention PR #1936)",
            empty_lse=math.inf),
    _broken(ignores_one_weight, "merge_equals_union",
            "returns out_a when lse_a ≥ lse_b: one part's weight ignored"),
    _broken(max_from_first, "merge_commutative",
            "shift taken from the first part: overflows when the second dominates"),
    _broken(lse_max_not_logadd, "merge_associative", "merged lse max(lse_a, lse_b): the log-add dropped"),
    Broken(MergeTarget(max_shifted, fn_n=global_max_n, name="global_max_n", dtypes=_DTYPES),
           "merge_n_way_equals_pairwise", "n-way shift by the array's max, not each row's: 0/0 = NaN"),
]

CORRECT = [
    MergeTarget(max_shifted, fn_n=max_shifted_n, name="max_shifted", dtypes=_DTYPES),
    MergeTarget(log_add_exp, name="log_add_exp", dtypes=_DTYPES),
    MergeTarget(sigmoid_update_bnhd, name="sigmoid_update_bnhd", dtypes=_DTYPES, layout="bnhd"),
    MergeTarget(base2, name="base2", dtypes=_DTYPES, lse_base=2),
    MergeTarget(plus_inf_empty, name="plus_inf_empty", dtypes=_DTYPES, empty_lse=math.inf),
]
