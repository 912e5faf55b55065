"""The NumPy reference: worked examples, the laws on random inputs, masks, layers, bad input."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from impl import (
    attention,
    causal_mask,
    flash_attention,
    multi_head_attention,
    padding_mask,
    self_attention,
    sliding_window_mask,
    softmax,
)
from impl.leak import leak_experiment


def qkv(rng, n_q, n_k, d_k=8, d_v=8, lead=(), dtype=np.float64):
    return (
        rng.standard_normal((*lead, n_q, d_k)).astype(dtype),
        rng.standard_normal((*lead, n_k, d_k)).astype(dtype),
        rng.standard_normal((*lead, n_k, d_v)).astype(dtype),
    )


# --- worked examples, computed on paper -------------------------------------------------------


def test_two_by_two_by_hand():
    # Scores q·k/√2: row 0 = [2, 0]/√2 ... choose q so that the scaled scores are [ln 3, 0]:
    # softmax([ln 3, 0]) = [3/4, 1/4], out = 3/4·10 + 1/4·20 = 12.5.
    d_k = 2
    q = np.array([[np.log(3.0) * np.sqrt(d_k), 0.0], [0.0, 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0]])
    v = np.array([[10.0, 1.0], [20.0, -1.0]])
    out, w = attention(q, k, v, return_weights=True)
    np.testing.assert_allclose(w, [[0.75, 0.25], [0.5, 0.5]], rtol=1e-15)
    np.testing.assert_allclose(out, [[12.5, 0.5], [15.0, 0.0]], rtol=1e-15)


def test_three_by_three_causal_by_hand():
    # All scores equal: causal row i averages values 0..i, the running mean.
    q = np.zeros((3, 4))
    k = np.ones((3, 4))
    v = np.array([[3.0], [6.0], [12.0]])
    out, w = attention(q, k, v, causal=True, return_weights=True)
    np.testing.assert_allclose(w, [[1, 0, 0], [1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-15)
    np.testing.assert_allclose(out[:, 0], [3.0, 4.5, 7.0], rtol=1e-15)


def test_default_scale_is_inverse_sqrt_dk():
    # One query, two keys, d_k = 4: raw scores [4, 0]; scaled by 1/2 they are [2, 0].
    q = np.array([[2.0, 0, 0, 0]])
    k = np.array([[2.0, 0, 0, 0], [0.0, 0, 0, 0]])
    _, w = attention(q, k, np.eye(2), return_weights=True)
    np.testing.assert_allclose(w[0], [np.e**2 / (np.e**2 + 1), 1 / (np.e**2 + 1)], rtol=1e-15)
    _, w_explicit = attention(q, k, np.eye(2), scale=1.0, return_weights=True)
    np.testing.assert_allclose(w_explicit[0, 0], np.e**4 / (np.e**4 + 1), rtol=1e-15)


# --- softmax ------------------------------------------------------------------------------------


def test_softmax_all_masked_row_is_zero_not_nan():
    out = softmax(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]))
    np.testing.assert_array_equal(out, [[0.0, 0.0], [1.0, 0.0]])


def test_softmax_stable_for_huge_logits():
    out = softmax(np.array([1e4, 1e4 - np.log(3.0)]))
    np.testing.assert_allclose(out, [0.75, 0.25], rtol=1e-9)


def test_softmax_propagates_nan():
    assert np.isnan(softmax(np.array([0.0, np.nan]))).all()


def test_softmax_axis():
    x = np.array([[0.0, 0.0], [np.log(3.0), 0.0]])
    np.testing.assert_allclose(softmax(x, axis=0), [[0.25, 0.5], [0.75, 0.5]])


# --- the laws on random inputs ----------------------------------------------------------------

shapes = st.tuples(st.integers(1, 9), st.integers(1, 9), st.integers(1, 6), st.integers(1, 5))


@given(shapes, st.booleans(), st.integers(0, 2**32 - 1))
def test_rows_sum_to_one_and_output_is_convex(shape, causal, seed):
    n_q, n_k, d_k, d_v = shape
    q, k, v = qkv(np.random.default_rng(seed), n_q, n_k, d_k, d_v)
    out, w = attention(q, k, v, causal=causal, return_weights=True)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-12)
    assert (w >= 0).all()
    assert (out <= v.max(0) + 1e-12).all() and (out >= v.min(0) - 1e-12).all()
    if causal:
        assert (w[np.triu_indices(n_q, 1, n_k)] == 0).all()


@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_uniform_scores_give_the_plain_average(n_q, n_k, seed):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((n_k, 3))
    out = attention(np.zeros((n_q, 4)), rng.standard_normal((n_k, 4)), v)
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(0), out.shape), rtol=1e-12, atol=1e-15)


def test_leading_dims_broadcast_and_equal_per_slice_calls():
    rng = np.random.default_rng(1)
    q, _, _ = qkv(rng, 5, 7, lead=(2, 3))
    _, k, v = qkv(rng, 5, 7, lead=(2, 1))  # one K/V head shared by three query heads
    out = attention(q, k, v, causal=True)
    assert out.shape == (2, 3, 5, 8)
    for b in range(2):
        for h in range(3):
            np.testing.assert_array_equal(out[b, h], attention(q[b, h], k[b, 0], v[b, 0], causal=True))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_output_dtype_is_input_dtype(dtype):
    q, k, v = qkv(np.random.default_rng(0), 4, 4, dtype=dtype)
    assert attention(q, k, v).dtype == dtype
    assert flash_attention(q, k, v).dtype == dtype


def test_float32_close_to_float64():
    q, k, v = qkv(np.random.default_rng(2), 33, 47, 16, 8)
    exact = attention(q, k, v, causal=True)
    single = attention(*(x.astype(np.float32) for x in (q, k, v)), causal=True)
    np.testing.assert_allclose(single, exact, atol=1e-5)


def test_large_logits_are_finite_and_pick_the_max():
    # |scores| ~ 1e4: exp would overflow without the max subtraction.
    q = np.array([[100.0, 0.0]])
    k = np.array([[141.0, 0.0], [-141.0, 0.0], [140.0, 0.0]])
    v = np.array([[1.0], [2.0], [3.0]])
    out, w = attention(q, k, v, return_weights=True)
    assert np.isfinite(out).all()
    gap = np.exp(-100.0 * (141 - 140) / np.sqrt(2))  # weight ratio of key 2 to key 0
    np.testing.assert_allclose(w[0], [1 / (1 + gap), 0.0, gap / (1 + gap)], rtol=1e-9, atol=0)


def test_nan_and_inf_propagate():
    q, k, v = qkv(np.random.default_rng(3), 3, 3)
    q[1, 0] = np.nan
    out = attention(q, k, v)
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()
    v[0, 0] = np.inf
    assert not np.isfinite(flash_attention(q, k, v)[0]).all()


# --- masks --------------------------------------------------------------------------------------


def test_causal_alignments_differ_only_when_lengths_differ():
    np.testing.assert_array_equal(causal_mask(4), causal_mask(4, align="bottom_right"))
    np.testing.assert_array_equal(causal_mask(2, 4, align="bottom_right"), [[1, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(causal_mask(2, 4), [[1, 0, 0, 0], [1, 1, 0, 0]])


def test_causal_flag_equals_top_left_mask():
    q, k, v = qkv(np.random.default_rng(4), 3, 6)
    np.testing.assert_array_equal(attention(q, k, v, causal=True), attention(q, k, v, mask=causal_mask(3, 6)))


def test_fully_masked_rows_give_zeros_and_zero_weights():
    # Bottom-right with n_q > n_k: the first n_q - n_k queries see nothing.
    q, k, v = qkv(np.random.default_rng(5), 5, 3)
    out, w = attention(q, k, v, mask=causal_mask(5, 3, align="bottom_right"), return_weights=True)
    np.testing.assert_array_equal(out[:2], 0.0)
    np.testing.assert_array_equal(w[:2], 0.0)
    np.testing.assert_allclose(w[2:].sum(-1), 1.0)


def test_mask_may_carry_leading_dims_that_only_v_has():
    q, k = np.ones((1, 2)), np.ones((3, 2))
    v = np.arange(24.0).reshape(2, 3, 4)
    mask = np.array([[[True, False, False]], [[True, True, True]]])  # [2, 1, 3]
    out = attention(q, k, v, mask=mask)
    assert out.shape == (2, 1, 4)
    np.testing.assert_allclose(out[0], v[0, :1])
    np.testing.assert_allclose(out[1], v[1].mean(0, keepdims=True))


def test_padding_mask_ignores_padded_keys():
    rng = np.random.default_rng(6)
    q, k, v = qkv(rng, 4, 6, lead=(2,))
    out = attention(q, k, v, mask=padding_mask([3, 6], 6))
    np.testing.assert_allclose(out[0], attention(q[0], k[0, :3], v[0, :3]), rtol=1e-14)
    np.testing.assert_allclose(out[1], attention(q[1], k[1], v[1]), rtol=1e-14)


def test_sliding_window_is_a_band():
    m = sliding_window_mask(5, window=(1, 1))
    np.testing.assert_array_equal(m, np.abs(np.subtract.outer(np.arange(5), np.arange(5))) <= 1)
    np.testing.assert_array_equal(sliding_window_mask(6, window=(5, 0)), causal_mask(6))


def test_mask_builders_reject_bad_arguments():
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


# --- the source article's mask experiment -----------------------------------------------------


def test_causal_mask_blocks_the_leak_bit_for_bit():
    masked = leak_experiment(n_tokens=16, changed=10, causal=True)
    unmasked = leak_experiment(n_tokens=16, changed=10, causal=False)
    assert (masked[:10] == 0.0).all()  # positions 0-9 bit-identical
    assert (masked[10:] > 0).all()
    assert (unmasked[:10] > 1e-3).all()  # without the mask every earlier position moves


# --- layers -------------------------------------------------------------------------------------


def test_self_attention_is_attention_of_projections():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 10))
    wq, wk, wv = (rng.standard_normal((10, 4)) for _ in range(3))
    out, pattern = self_attention(x, wq, wk, wv)
    np.testing.assert_array_equal(out, attention(x @ wq, x @ wk, x @ wv, causal=True))
    assert pattern.shape == (6, 6) and (np.triu(pattern, 1) == 0).all()


def mha_by_loops(x, wq, wk, wv, wo, h, g, causal):
    """Multi-head attention the slow, obvious way: one head at a time, K/V head i // (h/g)."""
    d_k, d_v = wq.shape[1] // h, wv.shape[1] // g
    heads = []
    for i in range(h):
        j = i // (h // g)
        q = x @ wq[:, i * d_k : (i + 1) * d_k]
        k = x @ wk[:, j * d_k : (j + 1) * d_k]
        v = x @ wv[:, j * d_v : (j + 1) * d_v]
        heads.append(attention(q, k, v, causal=causal))
    return np.concatenate(heads, axis=-1) @ wo


@pytest.mark.parametrize(("h", "g"), [(4, 4), (4, 2), (4, 1), (6, 3)])
@pytest.mark.parametrize("causal", [True, False])
def test_multi_head_matches_per_head_loop(h, g, causal):
    rng = np.random.default_rng(8)
    d, d_k, n = 12, 3, 7
    x = rng.standard_normal((2, n, d))
    wq = rng.standard_normal((d, h * d_k))
    wk = rng.standard_normal((d, g * d_k))
    wv = rng.standard_normal((d, g * d_k))
    wo = rng.standard_normal((h * d_k, d))
    out = multi_head_attention(x, wq, wk, wv, wo, n_heads=h, n_kv_heads=g, causal=causal)
    for b in range(2):
        np.testing.assert_allclose(out[b], mha_by_loops(x[b], wq, wk, wv, wo, h, g, causal), rtol=1e-12)


@pytest.mark.parametrize("g", [1, 2])
def test_grouped_query_equals_mha_with_repeated_kv(g):
    rng = np.random.default_rng(9)
    h, d, d_k, n = 4, 8, 2, 5
    x = rng.standard_normal((n, d))
    wq = rng.standard_normal((d, h * d_k))
    wk, wv = rng.standard_normal((d, g * d_k)), rng.standard_normal((d, g * d_k))
    wo = rng.standard_normal((h * d_k, d))
    # Repeat each K/V head's columns h/g times: K/V head j serves query heads j·(h/g) ... .
    repeat = np.repeat(np.arange(g), h // g)
    cols = (repeat[:, None] * d_k + np.arange(d_k)).ravel()
    gqa = multi_head_attention(x, wq, wk, wv, wo, n_heads=h, n_kv_heads=g)
    mha = multi_head_attention(x, wq, wk[:, cols], wv[:, cols], wo, n_heads=h)
    np.testing.assert_allclose(gqa, mha, rtol=1e-12)


# --- flash equals attention -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n_q", "n_k"), [(1, 1), (13, 13), (70, 45), (45, 70), (129, 129)])
def test_flash_equals_attention(dtype, causal, n_q, n_k):
    q, k, v = qkv(np.random.default_rng(n_q * 1000 + n_k), n_q, n_k, 16, 5, lead=(2,), dtype=dtype)
    tol = 2e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(
        flash_attention(q, k, v, causal=causal, block=32), attention(q, k, v, causal=causal), atol=tol
    )


# --- empty sequences ------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [attention, flash_attention])
def test_empty_sequences_give_shaped_results(fn):
    q, k, v = qkv(np.random.default_rng(0), 0, 4, lead=(2,))
    assert fn(q, k, v).shape == (2, 0, 8)
    q, k, v = qkv(np.random.default_rng(0), 3, 0, 8, 5, lead=(2,))
    out = fn(q, k, v, causal=True)
    assert out.shape == (2, 3, 5) and (out == 0).all()


# --- bad input --------------------------------------------------------------------------------

good = qkv(np.random.default_rng(0), 3, 4, 2, 5)


@pytest.mark.parametrize("fn", [attention, flash_attention])
@pytest.mark.parametrize(
    ("q", "k", "v", "error", "match"),
    [
        (good[0][0], good[1], good[2], ValueError, r"q must have at least 2 dims.*\(2,\)"),
        (good[0], good[1][:, :1], good[2], ValueError, r"same width d_k.*\(3, 2\).*\(4, 1\)"),
        (good[0], good[1], good[2][:3], ValueError, r"same length n_k.*\(4, 2\).*\(3, 5\)"),
        (np.zeros((3, 0)), np.zeros((4, 0)), good[2], ValueError, "d_k must be positive"),
        (good[0].astype(int), good[1], good[2], TypeError, "q must have a real floating dtype"),
        (good[0], good[1].astype(complex), good[2], TypeError, "k must have a real floating dtype"),
        (good[0], good[1], good[2].astype(object), TypeError, "v must have a real floating dtype"),
        (good[0], good[1], good[2].astype(np.float32), TypeError, "share one dtype"),
        (np.zeros((2, 3, 2)), np.zeros((3, 4, 2)), np.zeros((3, 4, 5)), ValueError, "leading dims"),
        (1.0, good[1], good[2], TypeError, "q must be an array"),
    ],
)
def test_bad_input_is_refused_with_the_argument_named(fn, q, k, v, error, match):
    with pytest.raises(error, match=match):
        fn(q, k, v)


def test_bad_mask_and_scale_are_refused():
    q, k, v = good
    with pytest.raises(TypeError, match="mask must be boolean"):
        attention(q, k, v, mask=np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 3\)"):
        attention(q, k, v, mask=np.ones((3, 3), bool))
    with pytest.raises(ValueError, match="scale must be finite"):
        attention(q, k, v, scale=float("nan"))
    with pytest.raises(TypeError, match="scale must be a real number"):
        attention(q, k, v, scale="0.5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block must be a positive integer"):
        flash_attention(q, k, v, block=0)


def test_bad_layer_arguments_are_refused():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 8))
    w = rng.standard_normal((8, 8))
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be divisible by n_kv_heads \(3\)"):
        multi_head_attention(x, w, w, w, w, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        multi_head_attention(x, w, w, w, w, n_heads=0)
    with pytest.raises(ValueError, match="wq width 8 is not divisible by n_heads"):
        multi_head_attention(x, w, w, w, w, n_heads=3)
    with pytest.raises(ValueError, match=r"wk must have shape"):
        multi_head_attention(x, w, w[:, :4], w, w, n_heads=4)
    with pytest.raises(ValueError, match=r"wo must have shape \(8, width\)"):
        multi_head_attention(x, w, w, w, w[:4], n_heads=4)
    with pytest.raises(ValueError, match=r"wq must have shape \(8, width\)"):
        self_attention(x, w[:4], w, w)
    with pytest.raises(ValueError, match="x must have shape"):
        self_attention(x[0], w, w, w)

