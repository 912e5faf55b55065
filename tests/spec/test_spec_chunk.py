"""The oracle's chunks (``attention_chunk=C``, `spec.keywords.chunk`): its visibility against loops
written from the definition — positions on the declared diagonal, restarting in each packed
sequence and cache row, floored before the first key — its rows evaluated alone, its argument
refused, and the causes of the rows it empties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from spec import oracle
from spec.inputs import Inputs

ALIGNMENTS = ("top_left", "bottom_right")


def loop_visible(n_q, n_k, chunk, *, shift):
    """[n_q, n_k]: query i at position i + shift, key j at j, visible in the same chunk (Python's
    // floors: −1 // C = −1)."""
    seen = np.zeros((n_q, n_k), dtype=bool)
    for i, j in itertools.product(range(n_q), range(n_k)):
        seen[i, j] = (i + shift) // chunk == j // chunk
    return seen


@pytest.mark.parametrize("align", ALIGNMENTS)
@pytest.mark.parametrize(("n_q", "n_k", "chunk"), list(itertools.product([1, 3, 7], [1, 4, 9], [1, 2, 3, 8])))
def test_chunk_visibility_is_the_definition_on_each_diagonal(n_q, n_k, chunk, align):
    q, k, v = np.zeros((n_q, 1)), np.zeros((n_k, 1)), np.zeros((n_k, 1))
    got = oracle.visibility(align, Inputs(q, k, v, keywords={"attention_chunk": chunk}))
    shift = 0 if align == "top_left" else n_k - n_q
    np.testing.assert_array_equal(got, loop_visible(n_q, n_k, chunk, shift=shift))


def test_a_query_before_the_first_key_floors_and_sees_nothing():
    """Bottom-right, 5 queries over 2 keys, C = 2: queries 0..2 sit at −3, −2, −1 (chunks −2, −1,
    −1) and see nothing; with causal their cause is causal's, without it the chunk's."""
    q, k, v = np.zeros((5, 1)), np.zeros((2, 1)), np.ones((2, 1))
    inputs = Inputs(q, k, v, keywords={"attention_chunk": 2})
    np.testing.assert_array_equal(oracle.visibility("bottom_right", inputs).astype(int),
                                  [[0, 0], [0, 0], [0, 0], [1, 1], [1, 1]])
    assert oracle.causes("bottom_right", inputs).tolist() == ["chunk"] * 3 + [""] * 2
    causal = inputs.replace(causal=True)
    assert oracle.causes("bottom_right", causal).tolist() == ["causal"] * 3 + [""] * 2


@pytest.mark.parametrize("align", ALIGNMENTS)
def test_positions_restart_in_each_packed_sequence(align):
    """Three sequences of 3, 0 and 6 queries over 5, 2 and 7 keys, C = 3: each query's chunk is
    that of its position in its own sequence, on its own diagonal (the third sequence starts at
    packed key 7, mid-chunk: a chunk on the packed index would differ)."""
    cu_q, cu_k = np.array([0, 3, 3, 9]), np.array([0, 5, 7, 14])
    q, k, v = np.zeros((1, 9, 1)), np.zeros((1, 14, 1)), np.zeros((1, 14, 1))
    inputs = Inputs(q, k, v, keywords={"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "attention_chunk": 3})
    want = np.zeros((9, 14), dtype=bool)
    for q0, q1, k0, k1 in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:], strict=True):
        shift = 0 if align == "top_left" else (k1 - k0) - (q1 - q0)
        want[q0:q1, k0:k1] = loop_visible(q1 - q0, k1 - k0, 3, shift=shift)
    np.testing.assert_array_equal(np.broadcast_to(oracle.visibility(align, inputs), (1, 9, 14))[0], want)
    rows = np.array([0, 4, 8])
    np.testing.assert_array_equal(oracle.visibility(align, inputs, rows)[0], want[rows])


def test_cache_rows_count_from_their_own_lengths():
    """causal_alignment="kv_lengths": batch row b's query i sits at i + kv_lengths[b] − n_q."""
    lengths = np.array([1, 4, 6])
    q, k, v = np.zeros((3, 1, 2, 1)), np.zeros((3, 1, 6, 1)), np.zeros((3, 1, 6, 1))
    inputs = Inputs(q, k, v, keywords={"kv_lengths": lengths, "attention_chunk": 2})
    got = oracle.visibility("kv_lengths", inputs)
    for b, n in enumerate(lengths.tolist()):
        want = loop_visible(2, 6, 2, shift=n - 2) & (np.arange(6) < n)
        np.testing.assert_array_equal(got[b, 0], want)


@pytest.mark.parametrize("bad", [0, -3, True])
def test_a_chunk_that_is_not_a_positive_integer_is_refused_naming_it(bad):
    q = np.zeros((2, 1))
    with pytest.raises(ValueError, match="attention_chunk"):
        oracle.visibility("top_left", Inputs(q, q, q, keywords={"attention_chunk": bad}))
