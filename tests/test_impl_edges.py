"""impl's argument checks at their edges, written to kill the mutants of impl/masks.py that the
suite and tests/test_masks.py left alive (tools/mutation): each case is the first value past a
boundary that a mutated comparison or boolean would let through."""

import numpy as np
import pytest

from impl.masks import causal_mask, packed_mask, padding_mask, sliding_window_mask


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


@pytest.mark.parametrize("block", [0, (0, 4), (4, 0), -1, (2, 2, 2), True, 2.0])
def test_flash_block_must_be_positive_integers(block):
    from impl import flash_attention

    x = np.ones((3, 2))
    with pytest.raises(ValueError, match="block"):
        flash_attention(x, x, x, block=block)
