"""Per-row key lengths (``kv_lengths=``): batch row b sees its first kv_lengths[b] keys.

Its declaration (`KV_LENGTHS`) and the functions it is made of; its laws are `spec.laws.lengths`'s.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from spec.draws import admissible_lengths, between
from spec.keywords.record import Geometry, Keyword, Realigns, Restricts

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


def lengths_visible(geo: Geometry, kv_lengths: Array) -> Array:  # [batch] -> [batch, 1, 1, n_k] bool
    """Batch row b sees keys j < kv_lengths[b] (broadcasts over heads and queries)."""
    lengths = np.asarray(kv_lengths)
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu":
        raise ValueError(f"kv_lengths must be a 1-D integer array [batch], "
                         f"got {lengths.dtype} {lengths.shape}")
    return (np.arange(geo.n_k) < lengths[:, None])[:, None, None, :]


def lengths_diagonal(geo: Geometry, kv_lengths: Array) -> Array:  # [batch] -> [batch, 1, n_q, 1]
    """With ``causal_alignment="kv_lengths"`` batch row b's diagonal is at i + kv_lengths[b] − n_q
    (bottom-right on each row's own keys: FlashAttention's ``cache_seqlens``); in any other
    alignment the key lengths leave the diagonal where it is (``top_left_kv_lengths``: the same as
    ``kv_lengths`` here)."""
    if geo.align not in ("kv_lengths", "top_left_kv_lengths"):
        return geo.diagonal
    return per_row_diagonal(geo.n_q, kv_lengths)


def per_row_diagonal(n_q: int, kv_lengths: Array) -> Array:  # [batch] -> [batch, 1, n_q, 1]
    """i + kv_lengths[b] − n_q: the last query of batch row b is aligned with its last key."""
    lengths = np.asarray(kv_lengths).astype(np.int64)
    return np.arange(n_q)[None, None, :, None] + (lengths - n_q)[:, None, None, None]


def length_range(target: Target, case: Case) -> tuple[int, int]:
    """The key lengths a case may draw: [0, n_k], or [n_q, n_k] for a target whose causal mode
    and windows need every row to hold at least n_q keys (`Target.queries_within_keys`), or whose
    every call does (`Target.keys_cover_queries`); [n_q, n_q] for one that declares
    ``self_attention_only``."""
    covers = target.queries_within_keys or target.keys_cover_queries or target.self_attention_only
    low = case.n_q if covers and case.n_q <= case.n_k else 0
    return low, low if target.self_attention_only else case.n_k


def draw_lengths(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """Two or three batch rows, each with a key length in [0, n_k] (some short, sometimes 0; at
    least n_q for a target that declares ``queries_within_keys``)."""
    batch = draw(between(2, 3))
    low, high = length_range(target, case)
    allowed = admissible_lengths(target, low, high)
    if allowed is None:
        lengths = draw(_length_lists(low, high, batch))
    else:  # within the target's limits (multiples of seq_multiple, at most n_k)
        lengths = draw(st.lists(st.sampled_from((0, *allowed) if low == 0 else allowed or (high,)),
                                min_size=batch, max_size=batch))
        lengths = [min(n, high) for n in lengths]
    return case.replace(batch=batch).with_keyword("kv_lengths", tuple(lengths))


@functools.cache
def _length_lists(low: int, n_k: int, batch: int) -> st.SearchStrategy[list[int]]:
    one = st.one_of(st.integers(low, n_k), st.sampled_from((low, min(low + 1, n_k), n_k)))
    return st.lists(one, min_size=batch, max_size=batch)


KV_LENGTHS = Keyword(
    name="kv_lengths",
    field="supports_kv_lengths",
    passes=("kv_lengths",),
    meaning="An int array [batch] (4-D inputs): keys at positions >= kv_lengths[b] are hidden for "
            "batch row b; for a target with causal_alignment='kv_lengths' it also puts row b's diagonal "
            "at i + kv_lengths[b] - n_q.",
    terms=(Restricts(lengths_visible, cause="kv_lengths"), Realigns(lengths_diagonal)),
    received=lambda case, lengths: (np.asarray(lengths, dtype=np.int64),),
    draw=draw_lengths,
    lengths=lambda n_q, lengths: ([n_q] * len(lengths), [int(n) for n in lengths]),
    reshapes=True,
    ndims=(4,),
)
