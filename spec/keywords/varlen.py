"""Packed sequences (``cu_seqlens_q=``, ``cu_seqlens_k=``): attention within each sequence.

Its declaration (`VARLEN`) and the functions it is made of; its laws are `spec.laws.lengths`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from spec.draws import admissible_lengths
from spec.keywords.record import Geometry, Keyword, Realigns, Restricts

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


def offsets(lengths: list[int]) -> tuple[int, ...]:  # [b] -> [b + 1]
    """Packed sequences' offsets (``cu_seqlens``) for these lengths: 0, then the running sums."""
    return tuple(int(x) for x in np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]))


def _sequence_ids(offsets: Array, n: int) -> Array:  # [b + 1] -> [n]: which sequence each row is in
    return np.searchsorted(np.asarray(offsets), np.arange(n), side="right") - 1


def packed_visible(geo: Geometry, cu_q: Array, cu_k: Array) -> Array:  # -> [n_q, n_k] bool
    """Query i sees key j only when both are in the same sequence (the queries of ``geo.queries``)."""
    seq_q = np.searchsorted(np.asarray(cu_q), geo.queries, side="right") - 1
    return seq_q[:, None] == _sequence_ids(cu_k, geo.n_k)[None, :]


def packed_diagonal(geo: Geometry, cu_q: Array, cu_k: Array) -> Array:  # -> [n_q, 1]
    """Each query's diagonal within its own sequence: its position in the sequence, moved to the
    sequence's keys, plus the sequence's own n_k − n_q where the alignment is bottom-right."""
    cu_q, cu_k = np.asarray(cu_q), np.asarray(cu_k)
    seq = _sequence_ids(cu_q, geo.n_q)
    within = np.arange(geo.n_q) - cu_q[seq]
    top_left = geo.align in ("top_left", "top_left_kv_lengths")
    shift = 0 if top_left else (cu_k[seq + 1] - cu_k[seq]) - (cu_q[seq + 1] - cu_q[seq])
    return (cu_k[seq] + within + shift)[:, None]


def packed_origin(geo: Geometry, cu_q: Array, cu_k: Array) -> Array:  # -> [n_q, 1]
    """The first key of each query's own sequence (``cu_seqlens_k[s]``): positions in a sequence
    count from it."""
    cu_k = np.asarray(cu_k)
    return cu_k[_sequence_ids(np.asarray(cu_q), geo.n_q)][:, None]


def draw_packing(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """1–4 packed sequences, each with its own query and key count (0 allowed, not all 0; with
    ``queries_within_keys`` and causal, no sequence has more queries than keys; narrowed to the
    serving declarations, `_serving_packing`)."""
    count = draw(st.integers(1, 4))
    allowed = admissible_lengths(target, 0, 12)
    each = st.integers(0, 12) if allowed is None else st.sampled_from((0, *allowed[:2]))  # within the limits
    n_qs = draw(st.lists(each, min_size=count, max_size=count))
    n_ks = draw(st.lists(each, min_size=count, max_size=count))
    if target.queries_within_keys and case.causal:
        n_ks = [max(n, m) for n, m in zip(n_ks, n_qs, strict=True)]
    one = 1 if allowed is None else allowed[0]  # the smallest sequence the limits admit
    n_qs[0], n_ks[0] = max(n_qs[0], one if sum(n_qs) == 0 else 0), max(n_ks[0], one if sum(n_ks) == 0 else 0)
    n_qs, n_ks = _serving_packing(target, n_qs, n_ks)
    return case.replace(n_q=sum(n_qs), n_k=sum(n_ks)).with_keyword("varlen", (offsets(n_qs), offsets(n_ks)))


def _serving_packing(target: Target, n_qs: list[int], n_ks: list[int]) -> tuple[list[int], list[int]]:
    """Each sequence's counts narrowed to the serving declarations: one query each (``decode_only``),
    as many keys as queries (``self_attention_only``), at least as many (``keys_cover_queries``)."""
    if target.decode_only:
        n_qs = [1] * len(n_qs)
    if target.self_attention_only:
        n_ks = list(n_qs)
    elif target.keys_cover_queries:
        n_ks = [max(n, m) for n, m in zip(n_ks, n_qs, strict=True)]
    return n_qs, n_ks


VARLEN = Keyword(
    name="varlen",
    field="supports_varlen",
    passes=("cu_seqlens_q", "cu_seqlens_k"),
    meaning="Int arrays of length b + 1 (0 first, non-decreasing): packed sequences; inputs are 3-D "
            "(heads, total, d) in bhnd ((total, heads, d) in bnhd); attention only within a sequence; "
            "causal alignment per sequence.",
    terms=(Restricts(packed_visible, cause="varlen"), Realigns(packed_diagonal, origin=packed_origin)),
    received=lambda case, packing: tuple(np.asarray(offsets, dtype=np.int64) for offsets in packing),
    draw=draw_packing,
    lengths=lambda n_q, cu_q, cu_k: ([int(n) for n in np.diff(cu_q)], [int(n) for n in np.diff(cu_k)]),
    reshapes=True,
    arrangement="packed",
    ndims=(3,),
)
