"""Laws of ragged batches: per-row key lengths (``kv_lengths=``) and packed sequences
(``cu_seqlens_q=``, ``cu_seqlens_k=``).

Both say the same thing in two layouts: a sequence's output is what it would be on its own. The
comparisons call the target a second time on each row or sequence alone, so an implementation is
judged against itself, and against the float64 golden of the whole call.
"""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import strategies as st

from spec.cases import Case, admissible_lengths, between, cases
from spec.keywords import Geometry, Keyword, Realigns, Restricts
from spec.laws import _needs
from spec.laws._helpers import (
    assert_empty_rows_follow_policy,
    assert_hidden_unmoved,
    assert_matches,
    assert_same,
    run,
)
from spec.registry import law
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


def _causal_choices(t: Target) -> tuple[bool, ...]:
    # Truncating a row moves a bottom-right diagonal (it sits at i + n_k − n_q) unless the target
    # aligns each row on its own keys: then, as top-left, the mask is the same before and after.
    # (top_left_kv_lengths: the row alone, without kv_lengths, is top-left, its diagonal moved.)
    return (False, True) if t.causal_alignment in ("top_left", "kv_lengths") else (False,)


def length_range(target: Target, case: Case) -> tuple[int, int]:
    """The key lengths a case may draw: [0, n_k], or [n_q, n_k] for a target whose causal mode
    and windows need every row to hold at least n_q keys (`Target.queries_within_keys`)."""
    low = case.n_q if target.queries_within_keys and case.n_q <= case.n_k else 0
    return low, case.n_k


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

needs_kv_lengths = _needs.keyword(KV_LENGTHS) & _needs.ndim(4)


def kv_length_cases(t: Target) -> st.SearchStrategy[Case]:
    """4-D cases with one key length per batch row in [0, n_k], some short, sometimes 0."""
    return cases(t, ndims=(4,), causal=_causal_choices(t), masks=("none", "random"), n_max=48,
                 values=("normal",), keywords=(KV_LENGTHS,))


@law(strategy=kv_length_cases, needs=needs_kv_lengths)
def kv_lengths_is_truncation(target: Target, case: Case) -> None:
    """With ``kv_lengths=L`` each batch row b gives what the same call gives on that row alone
    with only its first L_b keys and values (within tolerance; rows that see no key are the
    masked-rows law's), matches the float64 golden, and is bit-identical when the keys and values
    past L_b are replaced by others (within tolerance if exact_masking=False). L_b = 0 is
    allowed.

    Catches: jax#23349 — ``jax.nn.dot_product_attention`` ignored ``key_value_seq_lengths`` unless
    ``query_seq_lengths`` was given too; a length applied to the wrong batch row (lengths indexed
    by head); ``j ≤ L`` instead of ``j < L``, so one padded key leaks in.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    assert_matches(target, inputs, out, what="with kv_lengths, the output")
    lengths = np.asarray(case.param("kv_lengths"))
    mask = inputs.mask
    for b, n in enumerate(lengths.tolist()):
        if n == 0:
            continue
        row, keys = slice(b, b + 1), slice(0, n)
        alone = inputs.replace(q=inputs.q[row], k=inputs.k[row, :, keys], v=inputs.v[row, :, keys],
                               kv_lengths=None, mask=None if mask is None else mask[row, ..., keys])
        assert_same(target, alone, out[row], run(target, alone),
                    what=f"batch row {b} called alone with its first {n} keys, against kv_lengths={n}")
    past = np.arange(case.n_k) >= lengths[:, None, None]  # [batch, 1, n_k]
    assert_hidden_unmoved(target, case, inputs, past, before=out,
                          what="changing the keys/values past kv_lengths")


@st.composite
def _zero_length_cases(draw: st.DrawFn, t: Target) -> Case:
    case = draw(kv_length_cases(t))
    lengths = list(case.param("kv_lengths"))
    lengths[draw(st.integers(0, len(lengths) - 1))] = 0
    if t.queries_within_keys:  # a row of no keys has its queries before its first key
        case = case.replace(causal=False)
    return case.with_keyword("kv_lengths", tuple(lengths))


@law(strategy=_zero_length_cases, needs=needs_kv_lengths & _needs.policy_declared)
def kv_lengths_zero_rows(target: Target, case: Case) -> None:
    """A batch row with ``kv_lengths = 0`` sees no key: each of its rows holds what the target
    declares for rows emptied by ``kv_lengths`` (zeros by default), and the other rows match the
    golden.

    Catches: onnxruntime#27831 — a row of length 0 gave NaN (0/0 in the softmax) where the
    operator promises zeros; a length of 0 read as "no lengths given", so the row attends to all
    of its padding.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    assert_empty_rows_follow_policy(target, inputs, out)
    assert_matches(target, inputs, out, what="with a zero key length in the batch, the rows that see a key")


# --- packed sequences --------------------------------------------------------------------------


def _offsets(lengths: list[int]) -> tuple[int, ...]:
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


def draw_packing(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """1–4 packed sequences, each with its own query and key count (0 allowed, not all 0; with
    ``queries_within_keys`` and causal, no sequence has more queries than keys)."""
    count = draw(st.integers(1, 4))
    allowed = admissible_lengths(target, 0, 12)
    each = st.integers(0, 12) if allowed is None else st.sampled_from((0, *allowed[:2]))  # within the limits
    n_qs = draw(st.lists(each, min_size=count, max_size=count))
    n_ks = draw(st.lists(each, min_size=count, max_size=count))
    if target.queries_within_keys and case.causal:
        n_ks = [max(n, m) for n, m in zip(n_ks, n_qs, strict=True)]
    one = 1 if allowed is None else allowed[0]  # the smallest sequence the limits admit
    n_qs[0], n_ks[0] = max(n_qs[0], one if sum(n_qs) == 0 else 0), max(n_ks[0], one if sum(n_ks) == 0 else 0)
    return case.replace(n_q=sum(n_qs), n_k=sum(n_ks)).with_keyword("varlen", (_offsets(n_qs), _offsets(n_ks)))


VARLEN = Keyword(
    name="varlen",
    field="supports_varlen",
    passes=("cu_seqlens_q", "cu_seqlens_k"),
    meaning="Int arrays of length b + 1 (0 first, non-decreasing): packed sequences; inputs are 3-D "
            "(heads, total, d) in bhnd ((total, heads, d) in bnhd); attention only within a sequence; "
            "causal alignment per sequence.",
    terms=(Restricts(packed_visible, cause="varlen"), Realigns(packed_diagonal)),
    received=lambda case, packing: tuple(np.asarray(offsets, dtype=np.int64) for offsets in packing),
    draw=draw_packing,
    lengths=lambda n_q, cu_q, cu_k: ([int(n) for n in np.diff(cu_q)], [int(n) for n in np.diff(cu_k)]),
    reshapes=True,
    arrangement="packed",
    ndims=(3,),
)

needs_varlen = _needs.keyword(VARLEN) & _needs.ndim(3)


def packed_cases(t: Target) -> st.SearchStrategy[Case]:
    """3-D packed cases: 1–4 sequences, each with its own query and key count (0 allowed)."""
    return cases(t, ndims=(3,), causal=_causal_choices(t), n_max=24, values=("normal",), keywords=(VARLEN,))


def _sequences(case: Case) -> list[tuple[slice, slice]]:
    """Each packed sequence's (query rows, key rows)."""
    cq, ck = case.param("varlen")
    return [(slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])) for i in range(len(cq) - 1)]


@law(strategy=packed_cases, needs=needs_varlen)
def varlen_is_each_sequence_alone(target: Target, case: Case) -> None:
    """With packed sequences (``cu_seqlens_q``, ``cu_seqlens_k``), the output matches the float64
    golden, causal alignment per sequence, and the rows of each sequence are what the same target
    gives on that sequence alone (within tolerance). Empty sequences (no queries or no keys) are
    allowed; rows of a sequence with no keys see nothing (the masked-rows policy's).

    Catches: flash-attention#1537 — ``flash_attn_varlen_func`` broke when a sequence had length 0;
    a causal diagonal taken from the packed position instead of the position within the sequence;
    a key range read from ``cu_seqlens_q`` instead of ``cu_seqlens_k``.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    assert_matches(target, inputs, out, what="the packed output")
    for i, (rows, keys) in enumerate(_sequences(case)):
        if rows.stop == rows.start or keys.stop == keys.start:
            continue
        alone = inputs.replace(q=inputs.q[:, rows], k=inputs.k[:, keys], v=inputs.v[:, keys],
                               cu_seqlens_q=None, cu_seqlens_k=None)
        assert_same(target, alone, out[:, rows], run(target, alone),
                    what=f"packed sequence {i} (queries {rows.start}:{rows.stop}, keys "
                         f"{keys.start}:{keys.stop}) called alone, against the packed call")


@law(strategy=packed_cases, needs=needs_varlen)
def varlen_no_cross_talk(target: Target, case: Case) -> None:
    """Replacing one packed sequence's queries, keys and values by others leaves every other
    sequence's output bit-identical (within tolerance if exact_masking=False): nothing crosses a
    sequence boundary.

    Catches: flash-attention#1155 — out-of-bounds writes for zero-length key sequences, which
    overwrote the next sequence's output; a tile that straddles two sequences and reads the
    neighbour's keys past ``cu_seqlens_k[i + 1]``.
    """
    seqs = _sequences(case)
    pick = int(case.rng(8).integers(0, len(seqs)))
    rows, keys = seqs[pick]
    changed = np.zeros(case.n_k, dtype=bool)
    changed[keys] = True
    queries = np.zeros(case.n_q, dtype=bool)
    queries[rows] = True
    assert_hidden_unmoved(target, case, case.inputs(), changed, queries=queries,
                          what=f"changing packed sequence {pick}")
