"""impl.masks against independent definitions: each expected mask is written as a double loop over
(i, j) straight from the definition, never through the builders' own arithmetic, so a wrong
bottom-right causal mask or sliding window cannot pass by agreeing with itself; and the builders'
argument checks at their edges, each case the first value past a boundary that a mutated comparison
or boolean would let through."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from impl.masks import (
    causal_mask,
    chunk_mask,
    key_distance,
    packed_mask,
    padding_mask,
    per_sequence,
    sliding_window_mask,
)

# Small sizes in every combination (0 and 1 included, n_q < n_k, n_q = n_k, n_q > n_k), plus a few
# sizes past the usual tile edges.
SIZES = [*itertools.product(range(6), range(6)), (17, 5), (5, 17), (33, 64), (64, 33)]
WINDOWS = [(0, 0), (1, 0), (0, 1), (2, 1), (1, 3), (4, 0), (40, 40)]


def diagonal(i, n_q, n_k, align):
    """The key that query i is aligned with: i (top-left) or i + n_k - n_q (bottom-right)."""
    return i if align == "top_left" else i + n_k - n_q


def loop_mask(n_q, n_k, sees):
    out = np.zeros((n_q, n_k), dtype=bool)
    for i in range(n_q):
        for j in range(n_k):
            out[i, j] = sees(i, j)
    return out


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize(("n_q", "n_k"), SIZES)
def test_causal_mask_is_the_definition(n_q, n_k, align):
    def sees(i, j):
        return j <= diagonal(i, n_q, n_k, align)

    got = causal_mask(n_q, n_k, align=align)
    assert got.dtype == bool and got.shape == (n_q, n_k)
    np.testing.assert_array_equal(got, loop_mask(n_q, n_k, sees))


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize(("n_q", "n_k"), SIZES)
def test_sliding_window_mask_is_the_definition(n_q, n_k, window, align):
    left, right = window

    def sees(i, j):
        d = diagonal(i, n_q, n_k, align)
        return d - left <= j <= d + right

    got = sliding_window_mask(n_q, n_k, window=window, align=align)
    assert got.dtype == bool and got.shape == (n_q, n_k)
    np.testing.assert_array_equal(got, loop_mask(n_q, n_k, sees))


@given(n_q=st.integers(0, 40), n_k=st.integers(0, 40), left=st.integers(0, 45), right=st.integers(0, 45),
       align=st.sampled_from(["top_left", "bottom_right"]))
def test_window_and_causal_match_their_definitions_at_any_size(n_q, n_k, left, right, align):
    def in_window(i, j):
        return diagonal(i, n_q, n_k, align) - left <= j <= diagonal(i, n_q, n_k, align) + right

    np.testing.assert_array_equal(
        sliding_window_mask(n_q, n_k, window=(left, right), align=align), loop_mask(n_q, n_k, in_window)
    )
    np.testing.assert_array_equal(
        causal_mask(n_q, n_k, align=align),
        loop_mask(n_q, n_k, lambda i, j: j <= diagonal(i, n_q, n_k, align)),
    )


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 40])
@pytest.mark.parametrize(("n_q", "n_k"), SIZES)
def test_chunk_mask_is_the_definition(n_q, n_k, chunk, align):
    def sees(i, j):  # Python's // floors, so a query before the first key lies in a chunk below 0
        return diagonal(i, n_q, n_k, align) // chunk == j // chunk

    got = chunk_mask(n_q, n_k, attention_chunk=chunk, align=align)
    assert got.dtype == bool and got.shape == (n_q, n_k)
    np.testing.assert_array_equal(got, loop_mask(n_q, n_k, sees))


def test_chunk_mask_per_cache_row_and_its_argument_checks():
    got = chunk_mask(2, 5, attention_chunk=2, align="kv_lengths", kv_lengths=[1, 5])
    for b, length in enumerate([1, 5]):
        want = loop_mask(2, 5, lambda i, j, n=length: (i + n - 2) // 2 == j // 2)
        np.testing.assert_array_equal(got[b, 0], want)
    assert not got[0, 0, 0].any()  # query 0 of row 0 sits at position −1: no key is in its chunk
    refused = ((0, ValueError), (-2, ValueError), (1.5, TypeError), (True, TypeError), ("2", TypeError))
    for bad, error in refused:
        with pytest.raises(error, match="attention_chunk"):
            chunk_mask(3, attention_chunk=bad)


def test_square_defaults_and_the_default_alignment():
    np.testing.assert_array_equal(causal_mask(4), loop_mask(4, 4, lambda i, j: j <= i))
    np.testing.assert_array_equal(causal_mask(2, 4), loop_mask(2, 4, lambda i, j: j <= i))
    np.testing.assert_array_equal(
        sliding_window_mask(5, window=(1, 2)), loop_mask(5, 5, lambda i, j: i - 1 <= j <= i + 2)
    )


@pytest.mark.parametrize("n_k", [0, 1, 4, 9])
def test_padding_mask_is_the_definition(n_k):
    lengths = np.array([0, n_k, n_k // 2, min(1, n_k)])
    got = padding_mask(lengths, n_k)
    assert got.shape == (4, 1, n_k)
    for b, length in enumerate(lengths.tolist()):
        np.testing.assert_array_equal(got[b, 0], [j < length for j in range(n_k)])


def sequence_of(position, cu):
    """The packed sequence s with cu[s] <= position < cu[s + 1], by a plain search."""
    for s in range(len(cu) - 1):
        if cu[s] <= position < cu[s + 1]:
            return s
    raise AssertionError(position)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize(
    ("cu_q", "cu_k"),
    [([0, 3], [0, 5]), ([0, 2, 2, 5], [0, 1, 4, 4]), ([0, 0], [0, 3]), ([0], [0]),
     ([0, 1, 4, 6], [0, 3, 4, 9])],
)
def test_packed_mask_is_the_definition(cu_q, cu_k, align):
    def sees(i, j):
        s = sequence_of(i, cu_q)
        if not cu_k[s] <= j < cu_k[s + 1]:
            return False
        n_q_s, n_k_s = cu_q[s + 1] - cu_q[s], cu_k[s + 1] - cu_k[s]
        return j - cu_k[s] <= diagonal(i - cu_q[s], n_q_s, n_k_s, align)

    got = packed_mask(np.array(cu_q), np.array(cu_k), lambda a, b: causal_mask(a, b, align=align))
    np.testing.assert_array_equal(got, loop_mask(cu_q[-1], cu_k[-1], sees))
    same_sequence = loop_mask(cu_q[-1], cu_k[-1], lambda i, j: cu_k[sequence_of(i, cu_q)] <= j
                              < cu_k[sequence_of(i, cu_q) + 1])
    np.testing.assert_array_equal(packed_mask(np.array(cu_q), np.array(cu_k)), same_sequence)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize(("n_q", "n_k"), SIZES)
def test_key_distance_is_the_definition(n_q, n_k, align):
    got = key_distance(n_q, n_k, align=align)
    want = np.zeros((n_q, n_k), dtype=int)
    for i, j in np.ndindex(n_q, n_k):
        want[i, j] = abs(diagonal(i, n_q, n_k, align) - j)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(key_distance(n_q, n_k), key_distance(n_q, n_k, align="bottom_right"))


@pytest.mark.parametrize(
    ("cu_q", "cu_k"), [([0, 3], [0, 5]), ([0, 2, 2, 5], [0, 1, 4, 4]), ([0, 1, 4, 6], [0, 3, 4, 9])]
)
def test_per_sequence_counts_positions_from_each_sequences_start(cu_q, cu_k):
    def want(i, j):
        s = sequence_of(i, cu_q)
        if not cu_k[s] <= j < cu_k[s + 1]:
            return -1
        n_q_s, n_k_s = cu_q[s + 1] - cu_q[s], cu_k[s + 1] - cu_k[s]
        return abs(diagonal(i - cu_q[s], n_q_s, n_k_s, "bottom_right") - (j - cu_k[s]))

    got = per_sequence(np.array(cu_q), np.array(cu_k), key_distance, outside=-1)
    expected = np.array([[want(i, j) for j in range(cu_k[-1])] for i in range(cu_q[-1])]).reshape(got.shape)
    np.testing.assert_array_equal(got, expected)


def test_kv_lengths_outside_the_keys_are_refused_and_the_message_says_which_was_given():
    for lengths in ([-1], [4], [-1, 4]):  # one bad length alone is enough
        with pytest.raises(ValueError, match=r"kv_lengths must lie in \[0, n_k=3\]"):
            causal_mask(2, 3, align="kv_lengths", kv_lengths=lengths)
    with pytest.raises(ValueError, match="align='kv_lengths' with kv_lengths absent"):
        causal_mask(2, 3, align="kv_lengths")
    with pytest.raises(ValueError, match="align='top_left' with kv_lengths given"):
        causal_mask(2, 3, kv_lengths=[1])


def test_the_alignment_and_the_outside_value_are_keyword_only():
    with pytest.raises(TypeError):
        key_distance(2, 3, "top_left")  # type: ignore[misc]
    with pytest.raises(TypeError):
        per_sequence(np.array([0, 2]), np.array([0, 3]), lambda n_q, n_k: np.zeros((n_q, n_k)), 0)  # type: ignore[misc]


def test_mask_builders_reject_bad_arguments():
    with pytest.raises(ValueError, match="align"):
        causal_mask(3, align="diagonal")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="align"):
        sliding_window_mask(3, window=(1, 1), align="center")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_k"):
        sliding_window_mask(3, -2, window=(1, 1))
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(3, window=(0, -1))
    with pytest.raises(TypeError, match="window"):
        sliding_window_mask(3, window=(1.5, 0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="window"):
        sliding_window_mask(3, window=3)  # type: ignore[arg-type]


# --- the builders' own examples and refusals -----------------------------------------------------


def test_causal_alignments_differ_only_when_lengths_differ():
    np.testing.assert_array_equal(causal_mask(4), causal_mask(4, align="bottom_right"))
    np.testing.assert_array_equal(causal_mask(2, 4, align="bottom_right"), [[1, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(causal_mask(2, 4), [[1, 0, 0, 0], [1, 1, 0, 0]])


def test_sliding_window_is_a_band():
    m = sliding_window_mask(5, window=(1, 1))
    np.testing.assert_array_equal(m, np.abs(np.subtract.outer(np.arange(5), np.arange(5))) <= 1)
    np.testing.assert_array_equal(sliding_window_mask(6, window=(5, 0)), causal_mask(6))


def test_causal_padding_and_window_builders_reject_bad_arguments():
    with pytest.raises(ValueError, match="align"):
        causal_mask(3, align="diagonal")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_q"):
        causal_mask(-1)
    with pytest.raises(ValueError, match="key_lengths"):
        padding_mask([4], 3)
    with pytest.raises(TypeError, match="key_lengths"):
        padding_mask([1.5], 3)
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(3, window=(-1, 0))


# --- argument checks at their edges: the first value past each boundary -------------------------


@pytest.mark.parametrize("bad", [-1, True, 2.0])
def test_sizes_must_be_non_negative_integers(bad):
    with pytest.raises(ValueError, match="n_q"):
        causal_mask(bad)
    with pytest.raises(ValueError, match="n_k"):
        causal_mask(2, bad)
    with pytest.raises(ValueError, match="n_k"):
        sliding_window_mask(2, bad, window=(1, 0))


def test_align_is_keyword_only_and_sizes_positional():
    with pytest.raises(TypeError):
        causal_mask(2, 3, "bottom_right")  # type: ignore[misc]
    assert causal_mask(2, 3, align="bottom_right").shape == (2, 3)


@pytest.mark.parametrize("lengths", [[-1], [4], [0, 4], [-1, 3]])
def test_key_lengths_outside_0_to_n_k_are_refused(lengths):
    with pytest.raises(ValueError, match="key_lengths"):
        padding_mask(lengths, 3)


@pytest.mark.parametrize("lengths", [[0], [3], [0, 3]])
def test_key_lengths_at_the_ends_are_accepted(lengths):
    got = padding_mask(lengths, 3)
    assert got.shape == (len(lengths), 1, 3) and got.sum() == sum(lengths)


def test_packed_sequences_must_pair_up():
    with pytest.raises(ValueError):
        packed_mask(np.array([0, 1, 2]), np.array([0, 2]))
    with pytest.raises(ValueError):
        packed_mask(np.array([0, 2]), np.array([0, 1, 2]))
