"""Gallery for the invariance and cascade laws (`spec.laws.invariance`, `spec.laws.cascade`): split-KV
kernels that choose their split count from the whole call (its batch size, a sequence's place in it,
the total of the lengths), each declaring the invariance it breaks, and one that computes each sequence
on its own and keeps them all.

A split-KV kernel cuts each row's keys into parts, attends to each part and merges the parts by
their logsumexps: the result is right to rounding whatever the split count, but not bit for bit —
so a split count chosen from anything but the sequence itself makes its output depend on its
neighbours. The kernels that take the split count as ``num_splits=`` (`spec.keywords.num_splits`)
are held to the golden at every count they declare, and, declaring ``invariant=("splits",)``, to
one output across them.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from gallery.base import broken
from impl import attention
from impl.masks import causal_mask
from impl.merge import merge_states, merge_states_n
from spec import Target

Array = np.ndarray


def split_kv(q: Array, k: Array, v: Array, splits: Array, *, causal: bool = False, mask: Any = None,
             scale: float | None = None, kv_lengths: Any = None, align: str = "top_left") -> Array:
    # q [b, h, n_q, d_k], k [b, h, n_k, d_k], v [b, h, n_k, d_v], splits [b] -> [b, h, n_q, d_v]
    """Batch row b's keys (its first ``kv_lengths[b]``) cut into ``splits[b]`` near-equal parts,
    each attended to (causal aligned as ``align`` says, ``mask`` hiding keys as `impl.attention`
    does), merged by their logsumexps."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    keep = np.ones((q.shape[0], 1, n_q, n_k), dtype=bool)
    if causal:
        keep &= causal_mask(n_q, n_k, align=align)  # type: ignore[arg-type]
    if mask is not None:
        keep = keep & np.broadcast_to(mask, (q.shape[0], *np.shape(mask)[-3:]))
    if kv_lengths is not None:
        keep &= (np.arange(n_k) < np.asarray(kv_lengths)[:, None])[:, None, None, :]
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    own = [n_k] * q.shape[0] if kv_lengths is None else np.asarray(kv_lengths).tolist()
    for b, count in enumerate(np.asarray(splits).tolist()):  # the parts cut row b's own keys
        edges = np.linspace(0, own[b], max(1, min(count, own[b])) + 1).astype(int)
        parts = [attention(q[b], k[b, :, lo:hi], v[b, :, lo:hi], mask=keep[b, :, :, lo:hi], scale=scale,
                           return_lse=True) for lo, hi in itertools.pairwise(edges)]
        if len(parts) == 1:
            out[b] = parts[0][0]
            continue
        merged, _ = merge_states_n(np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts]))
        out[b] = merged
    return out


def _batched(fn: Any) -> Any:
    """``fn`` for 4-D calls, `impl.attention` for the others (2-D and 3-D calls hold one sequence)."""

    def call(q: Array, k: Array, v: Array, **kw: Any) -> Array:
        return fn(q, k, v, **kw) if q.ndim == 4 else attention(q, k, v, **kw)

    call.__name__ = call.__qualname__ = fn.__name__
    return call


@_batched
def splits_by_batch_size(q: Array, k: Array, v: Array, **kw: Any) -> Array:
    # fewer rows, more splits: a small batch leaves the machine idle, so each row's keys are split
    return split_kv(q, k, v, np.full(q.shape[0], max(1, 4 // q.shape[0])), **kw)


@_batched
def last_row_split_further(q: Array, k: Array, v: Array, **kw: Any) -> Array:
    # the last row of the batch takes the workers the others leave idle, and splits its keys in two
    splits = np.ones(q.shape[0], dtype=int)
    splits[-1] = 2
    return split_kv(q, k, v, splits, **kw)


@_batched
def splits_by_total(q: Array, k: Array, v: Array, *, kv_lengths: Any = None, **kw: Any) -> Array:
    # the split count from the whole call's key count (the work to spread): an odd total leaves a
    # partial tile, and every row is split in two to balance it — the schedule of the whole call
    total = k.shape[0] * k.shape[-2] if kv_lengths is None else int(np.sum(kv_lengths))
    return split_kv(q, k, v, np.full(q.shape[0], 1 + total % 2), kv_lengths=kv_lengths, **kw)


@_batched
def each_row_alone(q: Array, k: Array, v: Array, *, kv_lengths: Any = None, **kw: Any) -> Array:
    """Each batch row on its own, with its own keys only: nothing of another row reaches it."""
    lengths = [k.shape[-2]] * q.shape[0] if kv_lengths is None else np.asarray(kv_lengths).tolist()
    mask = kw.pop("mask", None)
    rows = []
    for b, n in enumerate(lengths):
        own = None if mask is None else np.broadcast_to(mask, (q.shape[0], *np.shape(mask)[-3:]))[b, ..., :n]
        rows.append(attention(q[b], k[b, :, :n], v[b, :, :n], mask=own, **kw))
    return np.stack(rows)


@_batched
def splits_by_chunk_size(q: Array, k: Array, v: Array, **kw: Any) -> Array:
    # a short chunk of queries leaves the machine idle, so its keys are split in two: a chunked
    # prefill rounds differently from one call on the whole prompt
    return split_kv(q, k, v, np.full(q.shape[0], 2 if q.shape[-2] < 4 else 1), align="bottom_right", **kw)


def split_parts(q: Array, k: Array, v: Array, num_splits: int, *, causal: bool = False, mask: Any = None,
                scale: float | None = None) -> list[tuple[Array, Array]]:
    # q [..., n_q, d_k], k [..., n_k, d_k], v [..., n_k, d_v] -> num_splits × (out, lse)
    """Each of ``num_splits`` near-equal contiguous parts of the keys attended to on its own, as a
    ``(out, lse)`` state (causal top-left and ``mask`` applied at the keys' own positions; a part
    with no key the empty state)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    keep = causal_mask(n_q, n_k) if causal else None
    if mask is not None:
        keep = np.asarray(mask) if keep is None else keep & np.asarray(mask)
    cuts = [g * n_k // num_splits for g in range(num_splits + 1)]
    return [attention(q, k[..., lo:hi, :], v[..., lo:hi, :], mask=None if keep is None else keep[..., lo:hi],
                      scale=scale, return_lse=True) for lo, hi in itertools.pairwise(cuts)]


def splits_merged_in_turn(q: Array, k: Array, v: Array, *, num_splits: int = 1, **kw: Any) -> Array:
    # the splits' states folded into a running state one by one as they finish: each merge rounds,
    # so the count of merges (the split count) changes the last bits; it still promises one output
    out, lse = (parts := split_parts(q, k, v, num_splits, **kw))[0]
    for part_out, part_lse in parts[1:]:
        out, lse = merge_states(out, lse, part_out, part_lse)
    return out


def drops_last_split(q: Array, k: Array, v: Array, *, num_splits: int = 1, **kw: Any) -> Array:
    # the combine reads the splits of a full grid only: with n_k not a multiple of the count, the
    # last (shorter) split's state is never merged and its keys never reach the output
    parts = split_parts(q, k, v, num_splits, **kw)
    if k.shape[-2] % num_splits and len(parts) > 1:
        parts = parts[:-1]
    out, _ = merge_states_n(np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts]))
    return out


def one_split_whatever_asked(q: Array, k: Array, v: Array, *, num_splits: int = 1, **kw: Any) -> Array:
    """Takes ``num_splits=`` and computes every call in one pass (a batch-invariant mode that fixes
    the split count): the same bits at every count."""
    return attention(q, k, v, **kw)


def lse_base2_undeclared(q: Array, k: Array, v: Array, *, return_lse: bool = False, **kw: Any) -> Any:
    if not return_lse:
        return attention(q, k, v, **kw)
    out, lse = attention(q, k, v, return_lse=True, **kw)
    return out, lse / np.log(2.0)  # log2 Σ 2^(s·log2 e), FlashInfer's, without lse_base=2


_DECLARED = dict(supports_mask=True, supports_scale=True, ndims=(2, 3, 4))
_SPLITS = dict(supports_num_splits=True, **_DECLARED)  # any count: 1, 2, 3, 4 and 8 drawn

BROKEN = [
    broken(splits_by_batch_size, "batch_invariant",
           "split count chosen from the batch size: alone, a row's keys are split in four and merged; "
           "beside another, in two", invariant=("batch",), **_DECLARED),
    broken(last_row_split_further, "position_invariant",
           "the last row of the batch splits its keys in two: a sequence rounds differently where it sits",
           invariant=("position",), **_DECLARED),
    broken(splits_by_total, "neighbours_invariant",
           "split count from the call's total key count: one neighbour growing by a key re-splits every "
           "row (the tile scheduler switching)", invariant=("neighbours",), supports_kv_lengths=True,
           **_DECLARED),
    broken(splits_by_chunk_size, "chunked_prefill_matches_one_call",
           "split count from the chunk's query count: chunks of fewer than 4 queries split their keys in "
           "two, the one call does not", invariant=("chunked_prefill",), causal_alignment="bottom_right",
           **_DECLARED),
    broken(splits_merged_in_turn, "splits_invariant",
           "the splits' states merged one by one into a running state: each merge rounds, so a call split "
           "in 2 and in 4 differ in their last bits, and it declares invariant=('splits',)",
           invariant=("splits",), **_SPLITS),
    broken(drops_last_split, "num_splits_matches_golden",
           "the split-KV combine merges the splits of a full grid only: when n_k is not a multiple of the "
           "split count the last split is dropped, its keys never reach the output", **_SPLITS),
    broken(lse_base2_undeclared, "cascade_shared_prefix",
           "a base-2 LSE returned as the natural one: the cascade weighs prefix and suffix wrongly",
           returns_lse=True, **_DECLARED),
]

CORRECT = [
    Target(each_row_alone, name="each_row_alone", invariant=("batch", "position", "neighbours"),
           supports_kv_lengths=True, **_DECLARED),
    Target(one_split_whatever_asked, name="one_split_whatever_asked", invariant=("splits",), **_SPLITS),
]
