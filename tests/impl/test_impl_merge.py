"""impl.merge: attention states merged by their logsumexps equal the attention over the union of
their keys, stay empty when every part is, and never overflow."""

from __future__ import annotations

import numpy as np
import pytest

from impl import attention
from impl.merge import merge_states, merge_states_n


def _parts(rng, n_q=3, d=4):
    q = rng.standard_normal((n_q, d))
    k, v = rng.standard_normal((7, d)), rng.standard_normal((7, d))
    a = attention(q, k[:3], v[:3], return_lse=True)
    b = attention(q, k[3:], v[3:], return_lse=True)
    return a, b, attention(q, k, v, return_lse=True)


def test_two_parts_merge_into_the_union():
    (out_a, lse_a), (out_b, lse_b), (out, lse) = _parts(np.random.default_rng(0))
    merged, merged_lse = merge_states(out_a, lse_a, out_b, lse_b)
    np.testing.assert_allclose(merged, out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(merged_lse, lse, rtol=1e-12)


def test_empty_merged_with_empty_stays_empty_without_nan():
    out, lse = merge_states(np.zeros((2, 3)), np.full(2, -np.inf), np.zeros((2, 3)), np.full(2, -np.inf))
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_an_empty_part_is_the_identity():
    (out_a, lse_a), _, _ = _parts(np.random.default_rng(1))
    out, lse = merge_states(np.zeros_like(out_a), np.full_like(lse_a, -np.inf), out_a, lse_a)
    np.testing.assert_array_equal(out, out_a)
    np.testing.assert_array_equal(lse, lse_a)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_large_lse_do_not_overflow(dtype):
    out_a, out_b = np.ones((1, 2), dtype), -np.ones((1, 2), dtype)
    lse = np.array([5000.0], np.float32)
    out, merged = merge_states(out_a, lse, out_b, lse)
    assert out.dtype == dtype and np.all(out == 0)
    assert merged[0] == pytest.approx(5000 + np.log(2), rel=1e-6)


def test_n_way_equals_pairwise():
    rng = np.random.default_rng(2)
    outs, lses = rng.standard_normal((3, 2, 4, 5)), rng.standard_normal((3, 2, 4)) * 50
    pair = merge_states(*merge_states(outs[0], lses[0], outs[1], lses[1]), outs[2], lses[2])
    n = merge_states_n(outs, lses)
    np.testing.assert_allclose(n[0], pair[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(n[1], pair[1], rtol=1e-12)


def test_mismatched_states_are_refused_naming_the_arguments():
    with pytest.raises(ValueError, match="out_a, out_b"):
        merge_states(np.zeros((2, 3)), np.zeros(2), np.zeros((2, 4)), np.zeros(2))
    with pytest.raises(ValueError, match="outs must be"):
        merge_states_n(np.zeros((2, 3)), np.zeros(2))
