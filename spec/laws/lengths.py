"""Laws of ragged batches: per-row key lengths (``kv_lengths=``) and packed sequences
(``cu_seqlens_q=``, ``cu_seqlens_k=``).

Both say the same thing in two layouts: a sequence's output is what it would be on its own. The
comparisons call the target a second time on each row or sequence alone, so an implementation is
judged against itself, and against the float64 golden of the whole call.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from spec.cases import Case, cases
from spec.keywords.kv_lengths import KV_LENGTHS
from spec.keywords.varlen import VARLEN
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


def _causal_choices(t: Target) -> tuple[bool, ...]:
    # Truncating a row moves a bottom-right diagonal (it sits at i + n_k − n_q) unless the target
    # aligns each row on its own keys: then, as top-left, the mask is the same before and after.
    # (top_left_kv_lengths: the row alone, without kv_lengths, is top-left, its diagonal moved.)
    return (False, True) if t.causal_alignment in ("top_left", "kv_lengths") else (False,)


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
