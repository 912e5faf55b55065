"""Gallery for the laws of state across calls (`spec.laws.stateful`): the cheats of a kernel judged
on a few calls — an output cached on a fingerprint of the inputs or on their buffers, an output
buffer recycled or borrowed from an input, a plan kept from the first shape — and the plain cheats
any golden comparison rejects; beside them kernels that keep state and are right."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import numpy as np

from gallery.base import broken, plain
from impl.masks import causal_mask
from spec import Target, audit

Array = np.ndarray


# --- broken ------------------------------------------------------------------------------------

fingerprint_cache = audit.fingerprint_cache()
"""The last output cached on a fingerprint of the inputs (`spec.audit.fingerprint_cache`)."""
buffer_identity_cache = audit.buffer_cache()
"""Outputs cached on where the inputs live (`spec.audit.buffer_cache`)."""


_OUT: dict[tuple[Any, ...], Array] = {}


def output_buffer_reused(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    out = plain(q, k, v, causal=causal)
    kept = _OUT.setdefault((out.shape, out.dtype.str), np.empty_like(out))  # allocated once per shape
    kept[...] = out
    return kept


def output_is_input(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    if k.shape[-2] == 1 and not causal:  # one key: every query's output is that key's value
        return np.broadcast_to(v, (*q.shape[:-2], q.shape[-2], v.shape[-1]))
    return plain(q, k, v, causal=causal)


_PLAN: dict[str, int] = {}


def planned_at_first_shape(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    rows = _PLAN.setdefault("rows", q.shape[-2])  # the launch grid of the first call, kept
    out = plain(q, k, v, causal=causal)
    out[..., rows:, :] = 0  # rows past the first call's count: no program writes them
    return out


def mean_of_values(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    shape = (*q.shape[:-2], q.shape[-2], v.shape[-1])
    return np.broadcast_to(v.astype(np.float64).mean(axis=-2, keepdims=True), shape).astype(q.dtype)


def zeros(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    return np.zeros((*q.shape[:-2], q.shape[-2], v.shape[-1]), dtype=q.dtype)


def zeroes_its_inputs(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    out = plain(q, k, v, causal=causal)
    for x in (q, k, v):  # its scratch space, it thinks: the caller's arrays
        if x.flags.writeable:
            x[...] = 0
    return out


def lower_precision(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    half = (x.astype(np.float16) for x in (q, k, v))
    return plain(*half, causal=causal).astype(q.dtype)  # computed in float16 whatever it declares


BROKEN = [
    broken(fingerprint_cache, "fingerprint_twins_each_match_golden",
           "the last output cached on a fingerprint of the inputs (shapes, ends, sum, every 7th element)",
           name="fingerprint_cache"),
    broken(buffer_identity_cache, "refilled_inputs_give_new_outputs",
           "outputs cached on the input buffers' addresses: the same buffers refilled give the old output",
           name="buffer_identity_cache"),
    broken(output_buffer_reused, "outputs_unchanged_and_unshared",
           "one output buffer per shape, overwritten by the next call"),
    broken(output_is_input, "outputs_unchanged_and_unshared",
           "a single-key shortcut returning v itself (broadcast): the output is the caller's v"),
    broken(planned_at_first_shape, "interleaved_shapes_match_golden",
           "a launch grid planned at the first call: rows past its count are never written"),
    broken(mean_of_values, "refilled_inputs_give_new_outputs", "the mean of V, whatever the queries"),
    broken(zeros, "interleaved_shapes_match_golden", "zeros of the output's shape"),
    broken(zeroes_its_inputs, "inputs_not_mutated", "q, k and v zeroed after the output is computed"),
    broken(lower_precision, "fingerprint_twins_each_match_golden",
           "computed in float16 while it declares float32 and float64"),
]


# --- correct: state kept, and right ------------------------------------------------------------

_WORKSPACE: dict[tuple[Any, ...], Array] = {}


def workspace_kept(q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
                   scale: float | None = None) -> Array:
    """Correct: the scores written into a workspace kept across calls (one per shape), the output
    fresh each call."""
    s = np.swapaxes(k, -1, -2)
    work = _WORKSPACE.setdefault((q.shape[:-1], k.shape[:-1], np.result_type(q, np.float32).str),
                                 np.empty((*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2],
                                           k.shape[-2]), dtype=np.result_type(q, np.float32)))
    np.matmul(q, s, out=work, dtype=work.dtype)
    work *= work.dtype.type(1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    keep = np.ones(work.shape, dtype=bool) if mask is None else np.broadcast_to(mask, work.shape)
    if causal:
        keep = keep & causal_mask(*work.shape[-2:])
    work[...] = np.where(keep, work, -np.inf)
    top = np.max(work, axis=-1, keepdims=True, initial=-np.inf)
    np.exp(work - np.where(np.isfinite(top), top, 0), out=work)
    total = work.sum(axis=-1, keepdims=True)
    work /= np.where(total > 0, total, 1)
    return (work @ v.astype(work.dtype)).astype(q.dtype)


_MEMO: OrderedDict[tuple[Any, ...], Array] = OrderedDict()
MEMO_SIZE = 32


def memoized(q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
             scale: float | None = None) -> Array:
    """Correct: outputs memoized on every byte of every argument (shapes and dtypes too), each
    returned as a fresh copy; the oldest forgotten past `MEMO_SIZE`."""
    key = (causal, scale, *((x.shape, x.dtype.str, np.ascontiguousarray(x).tobytes())
                            for x in (q, k, v, *(() if mask is None else (mask,)))))
    if key not in _MEMO:
        _MEMO[key] = plain(q, k, v, causal=causal, mask=mask, scale=scale)
        if len(_MEMO) > MEMO_SIZE:
            _MEMO.popitem(last=False)
    _MEMO.move_to_end(key)
    return _MEMO[key].copy()


def view_of_its_own_buffer(q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
                           scale: float | None = None) -> Array:
    """Correct: the output written into a wider buffer allocated for this call, returned as a view
    of it (padded rows, as a kernel's aligned allocation)."""
    out = plain(q, k, v, causal=causal, mask=mask, scale=scale)
    buffer = np.empty((*out.shape[:-1], out.shape[-1] + 5), dtype=out.dtype)
    buffer[..., 2:2 + out.shape[-1]] = out
    return buffer[..., 2:2 + out.shape[-1]]


_DECLARED: dict[str, Any] = {"supports_mask": True, "supports_scale": True, "ndims": (2, 3, 4)}

CORRECT = [
    Target(workspace_kept, name="workspace_kept", **_DECLARED),
    Target(memoized, name="memoized_on_every_byte", **_DECLARED),
    Target(view_of_its_own_buffer, name="view_of_its_own_buffer", **_DECLARED),
]
