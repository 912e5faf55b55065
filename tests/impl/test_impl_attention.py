"""impl.attention, the NumPy reference: worked examples, softmax, the laws on random inputs, masks,
bad input; every keyword and grouped K/V heads against an independent golden; and the argument
checks at their edges.

``golden`` below is written from the definitions, one query row at a time with ``math.exp`` in
float64; it shares no code with impl (no mask builders, no softmax). The laws of each keyword are
checked on their own (shift invariance of a bias, a -inf sink = no sink, the logsumexp merge ...).
"""

import math

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from impl import (
    attention,
    causal_mask,
    flash_attention,
    multi_head_attention,
    padding_mask,
    softmax,
)


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


# --- the independent golden -----------------------------------------------------------------------


def golden(q, k, v, *, causal=False, mask=None, scale=None, bias=None, window=None, align="top_left",
           softcap=None, sinks=None, kv_lengths=None, alibi_slopes=None):
    """(out, lse) for 4-D q [B, H, n_q, d_k], k/v [B, G, n_k, ·] by loops over (b, h, i, j).

    ALiBi slopes are [H] or [B, H]; the distance is FlashAttention's, |i + n_k − n_q − j|."""
    b_, h_, n_q, d_k = q.shape
    g_, n_k = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d_k) if scale is None else scale
    full = (b_, h_, n_q, n_k)
    mask = np.ones(full, bool) if mask is None else np.broadcast_to(mask, full)
    bias = np.zeros(full) if bias is None else np.broadcast_to(bias, full)
    slopes = np.zeros((b_, h_)) if alibi_slopes is None else np.broadcast_to(alibi_slopes, (b_, h_))
    out = np.zeros((b_, h_, n_q, v.shape[-1]))
    lse = np.full((b_, h_, n_q), -math.inf)
    for b in range(b_):
        for h in range(h_):
            kv = h // (h_ // g_)  # grouped-query attention
            for i in range(n_q):
                diag = i if align == "top_left" else i + n_k - n_q
                logits = {}
                for j in range(n_k):
                    seen = mask[b, h, i, j]
                    seen &= not causal or j <= diag
                    seen &= window is None or diag - window[0] <= j <= diag + window[1]
                    seen &= kv_lengths is None or j < kv_lengths[b]
                    s = scale * sum(float(q[b, h, i, t]) * float(k[b, kv, j, t]) for t in range(d_k))
                    s = s if softcap is None else softcap * math.tanh(s / softcap)
                    s += float(bias[b, h, i, j]) - float(slopes[b, h]) * abs(i + n_k - n_q - j)
                    if seen and s != -math.inf:
                        logits[j] = s
                every = [*logits.values()] + ([] if sinks is None else [float(sinks[h])])
                every = [x for x in every if x != -math.inf]
                if not every:
                    continue
                m = max(every)
                lse[b, h, i] = m + math.log(sum(math.exp(x - m) for x in every))
                for j, s in logits.items():
                    out[b, h, i] += math.exp(s - lse[b, h, i]) * v[b, kv, j].astype(np.float64)
    return out, lse


def as_4d(x):
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def golden_any(q, k, v, **kw):
    """The golden for 2-D, 3-D or 4-D inputs (the output keeps q's leading dims)."""
    out, lse = golden(as_4d(q), as_4d(k), as_4d(v), **kw)
    return out.reshape(*q.shape[:-1], v.shape[-1]), lse.reshape(q.shape[:-1])


def rand(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def grouped_qkv(rng, b, h, g, n_q, n_k, d_k=3, d_v=2, dtype=np.float64):
    return rand(rng, b, h, n_q, d_k, dtype=dtype), rand(rng, b, g, n_k, d_k, dtype=dtype), rand(
        rng, b, g, n_k, d_v, dtype=dtype)


# --- every keyword together against the golden (Hypothesis) ---------------------------------------


@st.composite
def problems(draw):
    """Shapes with grouped heads and a random choice of every keyword; the arrays from a seed."""
    b, g = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    h = g * draw(st.integers(1, 3))
    n_q, n_k = draw(st.integers(0, 6)), draw(st.integers(0, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q, k, v = grouped_qkv(rng, b, h, g, n_q, n_k)
    kw = {
        "causal": draw(st.booleans()),
        "align": draw(st.sampled_from(["top_left", "bottom_right"])),
        "window": draw(st.none() | st.tuples(st.integers(0, 4), st.integers(0, 4))),
        "softcap": draw(st.none() | st.floats(0.3, 5.0)),
        "scale": draw(st.none() | st.floats(0.1, 3.0)),
    }
    if draw(st.booleans()):
        bias = rng.standard_normal((b, h, n_q, n_k))
        bias[rng.random(bias.shape) < 0.2] = -np.inf
        kw["bias"] = bias
    if draw(st.booleans()):
        kw["mask"] = rng.random((n_q, n_k)) < 0.7
    if draw(st.booleans()):
        kw["sinks"] = rng.standard_normal(h)
    if draw(st.booleans()):
        kw["kv_lengths"] = rng.integers(0, n_k + 1, size=b)
    if draw(st.booleans()):
        kw["alibi_slopes"] = rng.uniform(0, 1, size=draw(st.sampled_from([(h,), (b, h)])))
    note({name: val for name, val in kw.items() if not isinstance(val, np.ndarray)})
    return q, k, v, kw


@given(problems())
def test_every_keyword_matches_the_golden(problem):
    q, k, v, kw = problem
    out, weights, lse = attention(q, k, v, return_weights=True, return_lse=True, **kw)
    gold_out, gold_lse = golden(q, k, v, **kw)
    np.testing.assert_allclose(out, gold_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, gold_lse, rtol=1e-12, atol=1e-12)
    assert lse.dtype == np.float64 and lse.shape == q.shape[:-1]
    sink_weight = np.exp(kw["sinks"][:, None] - lse) if "sinks" in kw else 0.0
    seen = np.isfinite(lse)
    # Weights sum to 1 minus the sink's weight on every row that sees something, 0 elsewhere.
    np.testing.assert_allclose(weights.sum(-1), np.where(seen, 1 - sink_weight, 0.0), atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("ndim", [2, 3, 4])
def test_dtypes_and_ranks_against_the_golden(dtype, ndim):
    rng = np.random.default_rng(ndim)
    q, k, v = (x.reshape(x.shape[4 - ndim:]) if ndim < 4 else x
               for x in grouped_qkv(rng, 1, 1, 1, 5, 7, dtype=dtype))
    heads = q.shape[-3] if ndim > 2 else 1
    kw = {"causal": True, "align": "bottom_right", "window": (3, 1), "softcap": 2.0,
          "bias": rng.standard_normal((5, 7)), "sinks": rng.standard_normal(heads)}
    out, lse = attention(q, k, v, return_lse=True, **kw)
    gold_out, gold_lse = golden_any(q, k, v, **kw)
    assert out.dtype == dtype and out.shape == gold_out.shape
    assert lse.dtype == (np.float64 if dtype == np.float64 else np.float32) and lse.shape == q.shape[:-1]
    tol = {np.float16: 3e-3, np.float32: 1e-6, np.float64: 1e-13}[dtype]
    np.testing.assert_allclose(out, gold_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, gold_lse, rtol=tol, atol=tol)


def test_bfloat16_lse_is_float32():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in grouped_qkv(np.random.default_rng(0), 1, 2, 1, 3, 4))
    out, lse = attention(q, k, v, return_lse=True)
    assert out.dtype == ml_dtypes.bfloat16 and lse.dtype == np.float32


# --- grouped-query attention ------------------------------------------------------------------------


@pytest.mark.parametrize(("h", "g"), [(4, 2), (4, 1), (6, 3), (6, 2), (3, 3)])
def test_grouped_heads_equal_repeated_kv_heads(h, g):
    rng = np.random.default_rng(h * 10 + g)
    q, k, v = grouped_qkv(rng, 2, h, g, 5, 6)
    bias, sinks = rng.standard_normal((2, h, 5, 6)), rng.standard_normal(h)
    kw = {"causal": True, "bias": bias, "sinks": sinks, "window": (2, 0)}
    out, w, lse = attention(q, k, v, return_weights=True, return_lse=True, **kw)
    k_rep, v_rep = np.repeat(k, h // g, axis=-3), np.repeat(v, h // g, axis=-3)  # head i reads i // (h/g)
    ref_out, ref_w, ref_lse = attention(q, k_rep, v_rep, return_weights=True, return_lse=True, **kw)
    np.testing.assert_allclose(out, ref_out, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(w, ref_w, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-14)
    assert out.shape == (2, h, 5, 2)


def test_grouped_heads_equal_multi_head_attention_per_head():
    rng = np.random.default_rng(3)
    h, g, d, d_k, n = 6, 2, 12, 2, 5
    x = rng.standard_normal((n, d))
    wq = rng.standard_normal((d, h * d_k))
    wk, wv = rng.standard_normal((d, g * d_k)), rng.standard_normal((d, g * d_k))
    wo = rng.standard_normal((h * d_k, d))
    heads = []
    for i in range(h):  # the slow, obvious way: query head i with K/V head i // (h/g)
        j = i // (h // g)
        cols_q, cols_kv = slice(i * d_k, (i + 1) * d_k), slice(j * d_k, (j + 1) * d_k)
        heads.append(attention(x @ wq[:, cols_q], x @ wk[:, cols_kv], x @ wv[:, cols_kv], causal=True))
    expected = np.concatenate(heads, axis=-1) @ wo
    got = multi_head_attention(x, wq, wk, wv, wo, n_heads=h, n_kv_heads=g)
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_grouped_heads_that_do_not_divide_are_refused_by_name():
    rng = np.random.default_rng(0)
    q, k, v = grouped_qkv(rng, 1, 6, 4, 3, 3)
    says = r"q's heads \(h = 6.*divisible.*\(g = 4\).*q \(1, 6, 3, 3\), k \(1, 4"
    with pytest.raises(ValueError, match=says):
        attention(q, k, v)


# --- laws of each keyword ------------------------------------------------------------------------------

rng0 = np.random.default_rng(42)
Q, K, V = grouped_qkv(rng0, 2, 4, 2, 6, 7)


def test_a_row_constant_added_to_the_bias_changes_nothing():
    bias = rng0.standard_normal((2, 4, 6, 7))
    shift = 50 * rng0.standard_normal((2, 4, 6, 1))
    shifted = attention(Q, K, V, bias=bias + shift)
    np.testing.assert_allclose(shifted, attention(Q, K, V, bias=bias), atol=1e-12)


def test_minus_inf_bias_equals_the_boolean_mask_bit_for_bit():
    mask = rng0.random((2, 4, 6, 7)) < 0.5
    bias = np.where(mask, 0.0, -np.inf)
    np.testing.assert_array_equal(attention(Q, K, V, bias=bias), attention(Q, K, V, mask=mask))


def test_per_head_bias_reaches_its_head():
    slopes = np.array([0.0, 0.0, 3.0, 0.0])[:, None, None]
    alibi = slopes * -np.abs(np.subtract.outer(np.arange(6), np.arange(7)))  # [4, 6, 7]
    out = attention(Q, K, V, bias=alibi)
    plain = attention(Q, K, V)
    np.testing.assert_array_equal(out[:, [0, 1, 3]], plain[:, [0, 1, 3]])
    assert np.abs(out[:, 2] - plain[:, 2]).max() > 1e-3


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_a_window_wider_than_the_sequence_is_no_window(align):
    for causal in (False, True):
        wide = attention(Q, K, V, window=(13, 13), causal=causal, align=align)
        np.testing.assert_array_equal(wide, attention(Q, K, V, causal=causal, align=align))


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_keys_outside_the_window_cannot_leak(align):
    out = attention(Q, K, V, window=(1, 0), align=align)
    k2, v2 = K.copy(), V.copy()
    k2[..., 0, :] += 100.0  # key 0: inside the window only of rows whose diagonal is 0 or 1
    v2[..., 0, :] -= 100.0
    out2 = attention(Q, k2, v2, window=(1, 0), align=align)
    diag = np.arange(6) + (0 if align == "top_left" else 7 - 6)
    far = diag - 1 > 0
    np.testing.assert_array_equal(out[..., far, :], out2[..., far, :])
    assert (out[..., ~far, :] != out2[..., ~far, :]).any()


def test_causal_equals_a_zero_right_window_of_full_left():
    for align in ("top_left", "bottom_right"):
        np.testing.assert_array_equal(
            attention(Q, K, V, causal=True, align=align), attention(Q, K, V, window=(99, 0), align=align)
        )


def test_a_cap_far_above_the_scores_is_no_cap():
    np.testing.assert_allclose(attention(Q, K, V, softcap=1e7), attention(Q, K, V), rtol=1e-12, atol=1e-13)


def test_capped_scores_stay_within_the_cap_for_huge_logits():
    q, k = 1e4 * Q, 1e4 * K  # scores ~1e8
    c = 3.0
    _, w = attention(q, k, V, softcap=c, return_weights=True)
    assert np.isfinite(w).all()
    # Scores in [-c, c]: any two weights of a row differ by at most exp(2c).
    assert (w.max(-1) / w.min(-1) <= np.exp(2 * c) * (1 + 1e-12)).all()
    gold, _ = golden(q, k, V, softcap=c)
    np.testing.assert_allclose(attention(q, k, V, softcap=c), gold, rtol=1e-9, atol=1e-9)


def test_a_hidden_key_stays_hidden_after_capping():
    mask = rng0.random((6, 7)) < 0.5
    _, w = attention(Q, K, V, softcap=0.5, mask=mask, return_weights=True)
    assert (w[..., ~mask] == 0).all()


def test_a_minus_inf_sink_is_no_sink():
    out, lse = attention(Q, K, V, sinks=np.full(4, -np.inf), return_lse=True)
    plain, plain_lse = attention(Q, K, V, return_lse=True)
    np.testing.assert_array_equal(out, plain)
    np.testing.assert_array_equal(lse, plain_lse)


def test_sink_weight_read_through_identity_values():
    sinks = np.array([-1.0, 0.0, 1.0, 2.0])
    v_eye = np.broadcast_to(np.eye(7), (2, 2, 7, 7))
    pattern, lse = attention(Q, K, v_eye, sinks=sinks, return_lse=True)
    np.testing.assert_allclose(pattern.sum(-1), 1 - np.exp(sinks[:, None] - lse), rtol=1e-13)
    assert (pattern.sum(-1) < 1).all()
    # Each head uses its own sink: larger sinks take more weight.
    assert (np.diff(pattern.sum(-1).mean((0, 2))) < 0).all()


def test_kv_lengths_equal_truncating_each_batch_row():
    lengths = np.array([3, 7])
    out, lse = attention(Q, K, V, kv_lengths=lengths, causal=True, return_lse=True)
    for b, n in enumerate(lengths):
        ref_out, ref_lse = attention(Q[b], K[b, :, :n], V[b, :, :n], causal=True, return_lse=True)
        np.testing.assert_allclose(out[b], ref_out, rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(lse[b], ref_lse, rtol=1e-14)


def test_kv_lengths_are_padding_and_leave_the_bottom_right_diagonal_at_n_k():
    # kv_lengths hide keys; they do not move the diagonal (diag = i + n_k - n_q with the padded n_k).
    lengths = np.array([5, 2])
    out = attention(Q, K, V, kv_lengths=lengths, causal=True, align="bottom_right")
    for b, n in enumerate(lengths):
        sees = np.arange(7)[None, :] <= np.arange(6)[:, None] + 7 - 6
        sees &= np.arange(7)[None, :] < n
        np.testing.assert_array_equal(out[b], attention(Q[b], K[b], V[b], mask=sees))


def test_zero_kv_length_gives_zeros_and_minus_inf_lse():
    out, lse = attention(Q, K, V, kv_lengths=np.array([0, 7]), return_lse=True)
    assert (out[0] == 0).all() and np.isneginf(lse[0]).all() and np.isfinite(lse[1]).all()


def packed_problem(rng, lengths_q, lengths_k, h=4, g=2):
    cu_q, cu_k = np.concatenate([[0], np.cumsum(lengths_q)]), np.concatenate([[0], np.cumsum(lengths_k)])
    q = rand(rng, h, cu_q[-1], 3)
    k, v = rand(rng, g, cu_k[-1], 3), rand(rng, g, cu_k[-1], 2)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize(
    ("lengths_q", "lengths_k"), [([3, 0, 4, 2], [5, 2, 4, 0]), ([1], [1]), ([0, 0], [0, 3])]
)
def test_packed_sequences_equal_calling_each_sequence_alone(lengths_q, lengths_k, align):
    q, k, v, cu_q, cu_k = packed_problem(np.random.default_rng(len(lengths_q)), lengths_q, lengths_k)
    kw = {"causal": True, "align": align, "sinks": np.array([0.5, -1.0, 0.0, 2.0]), "softcap": 4.0,
          "alibi_slopes": np.array([0.5, 0.25, 0.125, 1 / 3])}
    out, lse = attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True, **kw)
    assert out.shape == (4, cu_q[-1], 2) and lse.shape == (4, cu_q[-1])
    for s in range(len(lengths_q)):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        gold_out, gold_lse = golden_any(q[:, rows], k[:, keys], v[:, keys], **kw)
        np.testing.assert_allclose(out[:, rows], gold_out, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(lse[:, rows], gold_lse, rtol=1e-12)


def test_nothing_crosses_a_packed_sequence_boundary():
    q, k, v, cu_q, cu_k = packed_problem(np.random.default_rng(9), [3, 4], [5, 2])
    out = attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    k2, v2 = k.copy(), v.copy()
    k2[:, 5:] += 50.0  # change every key and value of sequence 1
    v2[:, 5:] *= -3.0
    out2 = attention(q, k2, v2, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    np.testing.assert_array_equal(out[:, :3], out2[:, :3])
    assert (out[:, 3:] != out2[:, 3:]).all()


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_follows_the_documented_rng(p):
    out, w = attention(Q, K, V, dropout_p=p, seed=7, return_weights=True)
    _, undropped = attention(Q, K, V, return_weights=True)
    kept = np.random.default_rng(7).random((2, 4, 6, 7)) >= p
    np.testing.assert_allclose(w, np.where(kept, undropped / (1 - p), 0.0), rtol=1e-15)
    np.testing.assert_allclose(out, w @ np.repeat(V, 2, axis=1), rtol=1e-13, atol=1e-14)


def test_dropout_zero_is_bit_identical_and_a_seed_repeats():
    np.testing.assert_array_equal(attention(Q, K, V, dropout_p=0.0, seed=3), attention(Q, K, V))
    np.testing.assert_array_equal(attention(Q, K, V, dropout_p=0.0), attention(Q, K, V))
    once = attention(Q, K, V, dropout_p=0.3, seed=5)
    np.testing.assert_array_equal(once, attention(Q, K, V, dropout_p=0.3, seed=5))
    assert (attention(Q, K, V, dropout_p=0.3, seed=5) != attention(Q, K, V, dropout_p=0.3, seed=6)).any()


def test_dropout_is_unbiased_over_seeds():
    # o = Σ_j w_j v_j z_j / (1 - p), z_j ~ Bernoulli(1 - p): E[o] = the undropped output and
    # Var[o] = p/(1 - p) Σ_j (w_j v_j)². The mean of N seeds is then within 6 standard errors of
    # E[o] except with probability ~2e-9 per entry (Gaussian tail; 96 entries: ~2e-7 per run).
    p, n = 0.3, 4000
    q, k, v = Q[:1], K[:1], V[:1]
    mean = sum(attention(q, k, v, dropout_p=p, seed=s) for s in range(n)) / n
    plain, w = attention(q, k, v, return_weights=True)
    wv = w[..., :, :, None] * np.repeat(v, 2, axis=1)[..., None, :, :]  # [1, 4, n_q, n_k, d_v]
    stderr = np.sqrt(p / (1 - p) * (wv**2).sum(-2) / n)
    assert (np.abs(mean - plain) <= 6 * stderr).all()


def test_dropped_fraction_is_p():
    # Over m visible weights the dropped count is Binomial(m, p); 6 standard deviations bound it.
    p = 0.25
    _, w = attention(Q, K, V, dropout_p=p, seed=1, return_weights=True)
    m = w.size
    dropped = int((w == 0).sum())
    assert abs(dropped - p * m) <= 6 * math.sqrt(m * p * (1 - p))


def test_lse_merge_of_two_key_halves_gives_the_full_output():
    # Split-KV / ring attention: softmax over all keys = the two halves' outputs weighted by exp(lse_i - lse).
    mask = rng0.random((2, 4, 6, 7)) < 0.8
    kw = {"sinks": None, "softcap": 3.0}
    full, full_lse = attention(Q, K, V, mask=mask, return_lse=True, **kw)
    o1, l1 = attention(Q, K[..., :3, :], V[..., :3, :], mask=mask[..., :3], return_lse=True, **kw)
    o2, l2 = attention(Q, K[..., 3:, :], V[..., 3:, :], mask=mask[..., 3:], return_lse=True, **kw)
    lse = np.logaddexp(l1, l2)
    merged = np.nan_to_num(np.exp(l1 - lse))[..., None] * o1 + np.nan_to_num(np.exp(l2 - lse))[..., None] * o2
    np.testing.assert_allclose(lse, full_lse, rtol=1e-14)
    np.testing.assert_allclose(merged, full, rtol=1e-12, atol=1e-14)


def test_rows_that_see_nothing_give_zeros_and_minus_inf_lse():
    mask = np.ones((6, 7), bool)
    mask[2] = False
    out, w, lse = attention(Q, K, V, mask=mask, return_weights=True, return_lse=True)
    assert (out[..., 2, :] == 0).all() and (w[..., 2, :] == 0).all() and np.isneginf(lse[..., 2]).all()
    assert np.isfinite(lse[..., [0, 1, 3, 4, 5]]).all()


def test_no_keys_gives_zeros_and_no_queries_an_empty_result():
    q, k, v = grouped_qkv(np.random.default_rng(0), 2, 4, 2, 3, 0)
    out, w, lse = attention(q, k, v, causal=True, window=(1, 1), return_weights=True, return_lse=True)
    assert out.shape == (2, 4, 3, 2) and (out == 0).all()
    assert w.shape == (2, 4, 3, 0) and lse.shape == (2, 4, 3) and np.isneginf(lse).all()
    q, k, v = grouped_qkv(np.random.default_rng(0), 2, 4, 2, 0, 5)
    out, lse = attention(q, k, v, causal=True, sinks=np.zeros(4), return_lse=True)
    assert out.shape == (2, 4, 0, 2) and lse.shape == (2, 4, 0)


def test_return_weights_still_works_alone():
    out, w = attention(Q, K, V, return_weights=True)
    np.testing.assert_allclose(w @ np.repeat(V, 2, axis=1), out, rtol=1e-13)


# --- bad input: each keyword's error names it -------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"bias": np.zeros((6, 6))}, ValueError, r"bias of shape \(6, 6\) does not broadcast"),
        ({"bias": np.zeros((6, 7), bool)}, TypeError, "bias must be a real floating array"),
        ({"bias": np.zeros((6, 7), int)}, TypeError, "bias must be a real floating array"),
        ({"window": (-1, 2)}, ValueError, "window must be"),
        ({"window": (1, 2, 3)}, TypeError, "window must be a pair"),
        ({"window": (1.0, 2)}, TypeError, "window must be a pair"),
        ({"align": "center"}, ValueError, "align must be"),
        ({"softcap": 0.0}, ValueError, "softcap must be a finite number > 0"),
        ({"softcap": -2.0}, ValueError, "softcap must be a finite number > 0"),
        ({"softcap": float("inf")}, ValueError, "softcap must be a finite number > 0"),
        ({"softcap": "1"}, TypeError, "softcap must be a real number"),
        ({"sinks": np.zeros(3)}, ValueError, r"sinks must have shape \(heads,\) = \(4,\)"),
        ({"sinks": np.zeros((4, 1))}, ValueError, "sinks must have shape"),
        ({"sinks": np.zeros(4, int)}, TypeError, "sinks must be a real floating array"),
        ({"kv_lengths": np.array([1, 2, 3])}, ValueError, r"kv_lengths must have shape \(batch,\) = \(2,\)"),
        ({"kv_lengths": np.array([1, 8])}, ValueError, r"kv_lengths must lie in \[0, n_k=7\]"),
        ({"kv_lengths": np.array([-1, 2])}, ValueError, "kv_lengths must lie in"),
        ({"kv_lengths": np.array([1.0, 2.0])}, TypeError, "kv_lengths must be an integer array"),
        ({"cu_seqlens_q": np.array([0, 6])}, ValueError, "cu_seqlens_q and cu_seqlens_k must be given"),
        ({"cu_seqlens_q": np.array([0, 6]), "cu_seqlens_k": np.array([0, 7])}, ValueError, "packed 3-D"),
        ({"dropout_p": 1.0, "seed": 0}, ValueError, r"dropout_p must lie in \[0, 1\)"),
        ({"dropout_p": -0.1, "seed": 0}, ValueError, "dropout_p must lie in"),
        ({"dropout_p": True, "seed": 0}, TypeError, "dropout_p must be a real number"),
        ({"dropout_p": 0.1}, ValueError, "seed is required when dropout_p > 0"),
        ({"dropout_p": 0.1, "seed": -1}, ValueError, "seed must be >= 0"),
        ({"dropout_p": 0.1, "seed": 1.5}, TypeError, "seed must be an integer"),
        ({"alibi_slopes": np.ones(3)}, ValueError, r"alibi_slopes must have shape \(heads,\) = \(4,\) or "
         r"\(batch, heads\) = \(2, 4\)"),
        ({"alibi_slopes": np.ones((4, 2))}, ValueError, "alibi_slopes must have shape"),
        ({"alibi_slopes": np.ones((1, 2, 4))}, ValueError, "alibi_slopes must have shape"),
        ({"alibi_slopes": np.ones(4, int)}, TypeError, "alibi_slopes must be a real floating array"),
        ({"alibi_slopes": np.array([1, np.inf, 1, 1])}, ValueError, "alibi_slopes must be finite"),
        ({"alibi_slopes": np.array([1, 1, np.nan, 1])}, ValueError, "alibi_slopes must be finite"),
    ],
)
def test_bad_keywords_are_refused_by_name(kw, error, match):
    with pytest.raises(error, match=match):
        attention(Q, K, V, **kw)


@pytest.mark.parametrize(
    ("cu_q", "cu_k", "match"),
    [
        ([0, 4, 3, 6], [0, 2, 4, 7], "cu_seqlens_q must start at 0, never decrease"),
        ([1, 6], [0, 7], "cu_seqlens_q must start at 0"),
        ([0, 5], [0, 7], r"cu_seqlens_q .*end at the packed length 6"),
        ([0, 6], [0, 8], r"cu_seqlens_k .*end at the packed length 7"),
        ([0, 3, 6], [0, 7], "must count the same sequences"),
        ([], [0, 7], "cu_seqlens_q must start at 0"),
    ],
)
def test_bad_packed_offsets_are_refused_by_name(cu_q, cu_k, match):
    q, k, v = Q[0], K[0], V[0]
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, cu_seqlens_q=np.array(cu_q, dtype=int), cu_seqlens_k=np.array(cu_k))


def test_packed_offsets_must_be_integers_and_kv_lengths_needs_4d():
    with pytest.raises(TypeError, match="cu_seqlens_k must be an integer array"):
        attention(Q[0], K[0], V[0], cu_seqlens_q=np.array([0, 6]), cu_seqlens_k=np.array([0.0, 7.0]))
    with pytest.raises(ValueError, match=r"kv_lengths needs 4-D inputs"):
        attention(Q[0], K[0], V[0], kv_lengths=np.array([3]))


def test_a_huge_sink_takes_all_the_weight_without_overflow():
    # The sink joins the row maximum; without that, exp(800 - max score) overflows to inf.
    sinks = np.array([800.0, 0.0, 0.0, 0.0])
    out, w, lse = attention(Q, K, V, sinks=sinks, return_weights=True, return_lse=True)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    np.testing.assert_allclose(lse[:, 0], 800.0, rtol=1e-15)
    assert (w[:, 0] < 1e-300).all()


# --- ALiBi ----------------------------------------------------------------------------------------------


def alibi_slopes_of(heads):
    """The ALiBi paper's slopes for any head count (Press et al., 2022, and its reference code): the
    geometric series 2^(-8i/n) for the power of two n ≤ heads, then every other slope of 2n's."""
    n = 2 ** math.floor(math.log2(heads))
    first = [2 ** (-8 * (i + 1) / n) for i in range(n)]
    extra = [2 ** (-8 * (i + 1) / (2 * n)) for i in range(0, 2 * n, 2)][: heads - n]
    return np.array(first + extra)


def alibi_as_bias(slopes, n_q, n_k):
    """The bias ALiBi defines, built by loops: −slope·|i + n_k − n_q − j|, [B or 1, H, n_q, n_k]."""
    slopes = np.atleast_2d(slopes)
    bias = np.zeros((*slopes.shape, n_q, n_k))
    for b, h, i, j in np.ndindex(bias.shape):
        bias[b, h, i, j] = -slopes[b, h] * abs(i + n_k - n_q - j)
    return bias


def test_alibi_slopes_of_match_the_papers_figures():
    np.testing.assert_allclose(alibi_slopes_of(8), [2.0**-i for i in range(1, 9)])
    np.testing.assert_allclose(alibi_slopes_of(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


@pytest.mark.parametrize("heads", [1, 3, 5, 6, 8, 12])
@pytest.mark.parametrize(("n_q", "n_k"), [(5, 5), (3, 7), (7, 3)])
def test_alibi_equals_the_explicit_bias_it_defines_bit_for_bit(heads, n_q, n_k):
    # Head counts that are not powers of two included: nothing in the keyword assumes one.
    q, k, v = grouped_qkv(np.random.default_rng(heads), 2, heads, heads, n_q, n_k)
    slopes = alibi_slopes_of(heads)
    for causal, align in [(False, "top_left"), (True, "top_left"), (True, "bottom_right")]:
        got = attention(q, k, v, causal=causal, align=align, alibi_slopes=slopes)
        want = attention(q, k, v, causal=causal, align=align, bias=alibi_as_bias(slopes, n_q, n_k))
        np.testing.assert_array_equal(got, want)


def test_alibi_per_batch_row_equals_each_row_alone_and_each_head_reads_its_own_slope():
    q, k, v = grouped_qkv(np.random.default_rng(5), 2, 3, 3, 4, 6)
    slopes = np.array([[0.5, 0.1, 2.0], [1.5, 0.0, 0.3]])
    both = attention(q, k, v, causal=True, alibi_slopes=slopes)
    for b in range(2):
        alone = attention(q[b], k[b], v[b], causal=True, alibi_slopes=slopes[b])
        np.testing.assert_array_equal(both[b], alone)
    moved = slopes.copy()
    moved[1, 2] = 4.0  # batch row 1, head 2 only
    changed = attention(q, k, v, causal=True, alibi_slopes=moved) != both
    assert changed[1, 2].any() and not np.delete(changed.reshape(6, -1), 5, axis=0).any()


def test_alibi_on_two_dimensional_inputs_takes_one_slope():
    q, k, v = (x[0, 0] for x in grouped_qkv(np.random.default_rng(6), 1, 1, 1, 4, 5))
    got = attention(q, k, v, alibi_slopes=np.array([0.7]))
    np.testing.assert_array_equal(got, attention(q, k, v, bias=alibi_as_bias(np.array([0.7]), 4, 5)[0, 0]))
    says = r"alibi_slopes must have shape \(heads,\) = \(1,\) \(or \(batch, heads\), 4-D inputs\)"
    with pytest.raises(ValueError, match=says):
        attention(q, k, v, alibi_slopes=np.array([[0.7]]))


def test_alibi_comes_after_the_softcap():
    # c·tanh(s/c) caps the scores, not ALiBi's term: far keys stay far below the cap.
    q, k, v = grouped_qkv(np.random.default_rng(7), 1, 2, 2, 3, 9)
    q *= 30  # scores far beyond the cap
    slopes = np.array([2.0, 3.0])
    _, w = attention(q, k, v, softcap=1.0, alibi_slopes=slopes, return_weights=True)
    _, capped_only = attention(q, k, v, softcap=1.0, return_weights=True)
    bias = alibi_as_bias(slopes, 3, 9)
    _, want = attention(q, k, v, softcap=1.0, bias=bias, return_weights=True)
    np.testing.assert_array_equal(w, want)
    assert w[0, 0, 2, 0] < 1e-7 < capped_only[0, 0, 2, 0]  # 8 keys away: e^(−16) of the diagonal's weight


def test_dropout_keeps_a_weight_whose_draw_equals_p():
    # kept = draw >= p (the docstring's rule): the caller picks p, so p can be one of the draws
    # exactly, and that weight is kept (a `>` would drop it). The draws are the documented ones:
    # default_rng(seed).random(pattern shape), float64, in C order.
    rng = np.random.default_rng(11)
    q, k, v = rng.standard_normal((4, 3)), rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    draws = np.random.default_rng(2).random((4, 5))
    at = np.unravel_index(np.argsort(draws, axis=None)[10], draws.shape)  # 10 draws below it, 9 above
    p = float(draws[at])
    _, plain = attention(q, k, v, return_weights=True)
    _, w = attention(q, k, v, dropout_p=p, seed=2, return_weights=True)
    assert w[at] == plain[at] / (1 - p) != 0
    np.testing.assert_array_equal(w == 0, draws < p)


# --- argument checks and keyword paths at their edges (the mutants tools/mutation found alive): each
# case is the first value past a boundary that a mutated comparison or boolean would let through ----


def _qkv(*lead: int, n_q: int = 5, n_k: int = 6, d: int = 3, kv_heads: int | None = None):
    rng = np.random.default_rng(sum(lead) + n_q + n_k)
    kv_lead = (*lead[:-1], kv_heads) if kv_heads else lead
    return (rng.standard_normal((*lead, n_q, d)), rng.standard_normal((*kv_lead, n_k, d)),
            rng.standard_normal((*kv_lead, n_k, d + 1)))


def _spec_golden(q, k, v, **kw):
    """The output of spec's float64 oracle for the call: a second reference that owes impl nothing."""
    from spec import oracle
    from spec.inputs import Inputs

    return oracle.golden_of(Inputs(q, k, v, keywords=kw))[0]


def test_softmax_defaults_to_the_last_axis():
    from impl.attention import softmax

    got = softmax(np.arange(24.0).reshape(2, 3, 4))
    np.testing.assert_allclose(got.sum(axis=-1), 1.0)


@pytest.mark.parametrize(("lead", "kv_heads", "n_q"), [((4,), 2, 5), ((2, 6), 3, 7), ((2, 4), 2, 4)])
def test_grouped_kv_heads_equal_repeated_heads(lead, kv_heads, n_q):
    from impl import attention

    q, k, v = _qkv(*lead, n_q=n_q, kv_heads=kv_heads)
    rep = lead[-1] // kv_heads
    want = attention(q, np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3))
    np.testing.assert_allclose(attention(q, k, v), want, rtol=1e-12, atol=1e-12)


def test_grouped_heads_must_agree_between_k_and_v():
    from impl import attention

    q, k, _ = _qkv(4, kv_heads=2)
    with pytest.raises(ValueError):
        attention(q, k, np.ones((4, 6, 3)))


def test_sinks_join_the_denominator_per_head():
    from impl import attention

    q, k, v = _qkv(3)
    sinks = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(attention(q, k, v, sinks=sinks), _spec_golden(q, k, v, sinks=sinks),
                               rtol=1e-10)


def test_softcap_is_accepted_and_applied():
    from impl import attention

    q, k, v = _qkv(2)
    np.testing.assert_allclose(attention(q, k, v, softcap=1.5), _spec_golden(q, k, v, softcap=1.5),
                               rtol=1e-10)


def test_bias_must_be_floats():
    from impl import attention

    q, k, v = _qkv(2)
    with pytest.raises(TypeError, match="bias"):
        attention(q, k, v, bias=np.ones((5, 6), dtype=np.int64))
    np.testing.assert_allclose(attention(q, k, v, bias=np.zeros((5, 6))), attention(q, k, v))


def test_kv_lengths_accepted_in_range_and_refused_outside():
    from impl import attention

    q, k, v = _qkv(1, 2)
    out = attention(q, k, v, kv_lengths=np.array([4]))
    np.testing.assert_allclose(out, attention(q, k[..., :4, :], v[..., :4, :]), rtol=1e-12)
    for bad in ([-1], [7]):
        with pytest.raises(ValueError, match="kv_lengths"):
            attention(q, k, v, kv_lengths=np.array(bad))


def test_packed_sequences_valid_and_invalid_offsets():
    from impl import attention

    q, k, v = _qkv(2, n_q=3, n_k=5)
    out = attention(q, k, v, cu_seqlens_q=np.array([0, 1, 3]), cu_seqlens_k=np.array([0, 2, 5]))
    np.testing.assert_allclose(out[:, :1], attention(q[:, :1], k[:, :2], v[:, :2]), rtol=1e-12)
    with pytest.raises(ValueError, match="same sequences, got lengths 2 and 3"):
        attention(q, k, v, cu_seqlens_q=np.array([0, 3]), cu_seqlens_k=np.array([0, 2, 5]))
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        attention(q, k, v, cu_seqlens_q=np.array([0, 1, 2]), cu_seqlens_k=np.array([0, 2, 5]))


def test_mask_that_does_not_broadcast_is_named():
    from impl import attention

    q, k, v = _qkv(2)
    with pytest.raises(ValueError, match="does not broadcast"):
        attention(q, k, v, mask=np.ones((4, 6), dtype=bool))


def test_inputs_need_two_dims_and_a_positive_width():
    from impl import attention

    with pytest.raises(ValueError, match="2 dims"):
        attention(np.ones(3), np.ones((4, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="d_k"):
        attention(np.ones((2, 0)), np.ones((4, 0)), np.ones((4, 2)))


def test_grouped_heads_still_need_broadcasting_batches():
    from impl import attention

    with pytest.raises(ValueError, match="must broadcast"):
        attention(np.ones((2, 4, 5, 3)), np.ones((3, 2, 6, 3)), np.ones((2, 2, 6, 4)))
    with pytest.raises(ValueError, match="must broadcast"):  # v's batch too, not only k's
        attention(np.ones((2, 4, 5, 3)), np.ones((2, 2, 6, 3)), np.ones((3, 2, 6, 4)))


def test_empty_packed_offsets_are_refused():
    from impl import attention

    q, k, v = _qkv(2, n_q=5, n_k=6)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        attention(q, k, v, cu_seqlens_q=np.array([], dtype=np.int64), cu_seqlens_k=np.array([0, 6]))


@pytest.mark.parametrize(("q_shape", "k_shape"), [((3, 5, 3), (2, 6, 3)), ((1, 3, 5, 3), (1, 2, 6, 3))])
def test_indivisible_heads_are_explained(q_shape, k_shape):
    from impl import attention

    with pytest.raises(ValueError, match=r"divisible by k's and v's \(g = 2\)"):
        attention(np.ones(q_shape), np.ones(k_shape), np.ones(k_shape))


def test_dropout_scales_kept_weights_by_one_over_keep_probability():
    from impl import attention

    q, k, v = _qkv(2, n_q=8, n_k=9)
    _, plain_w = attention(q, k, v, return_weights=True)
    _, w = attention(q, k, v, dropout_p=0.25, seed=0, return_weights=True)
    kept = w != 0
    assert kept.any() and not kept.all()
    np.testing.assert_allclose(w[kept], plain_w[kept] / 0.75, rtol=1e-12)
    with pytest.raises(ValueError, match="seed"):
        attention(q, k, v, dropout_p=0.25, seed=-1)


@pytest.mark.parametrize("lead", [(), (2,), (1, 2)])
def test_no_queries_give_an_empty_output(lead):
    from impl import attention, flash_attention

    q, k, v = np.ones((*lead, 0, 3)), np.ones((*lead, 4, 3)), np.ones((*lead, 4, 2))
    for fn in (attention, flash_attention):
        for causal in (False, True):
            assert fn(q, k, v, causal=causal).shape == (*lead, 0, 2)


def test_no_query_heads_over_grouped_kv_heads_give_an_empty_output():
    from impl import attention

    # h = 0 query heads is divisible by g = 2 K/V heads: grouped, not a broadcasting error
    assert attention(np.ones((0, 5, 3)), np.ones((2, 6, 3)), np.ones((2, 6, 4))).shape == (0, 5, 4)


@pytest.mark.parametrize(("h", "g"), [(2, 0), (3, 0), (4, 0)])
def test_no_kv_heads_under_several_query_heads_are_refused_as_unbroadcastable(h, g):
    from impl import attention

    # g = 0 K/V heads serve no query head: a ValueError naming the shapes, never a division by zero.
    with pytest.raises(ValueError, match=rf"leading dims of q, k and v must broadcast.*q \({h}, 5, 3\)"):
        attention(np.ones((h, 5, 3)), np.ones((g, 6, 3)), np.ones((g, 6, 4)))
    assert attention(np.ones((1, 5, 3)), np.ones((0, 6, 3)), np.ones((0, 6, 4))).shape == (0, 5, 4)
    assert attention(np.ones((0, 5, 3)), np.ones((0, 6, 3)), np.ones((0, 6, 4))).shape == (0, 5, 4)


def test_flags_are_keyword_only():
    from impl import attention, flash_attention, flash_attention_backward

    x = np.ones((3, 2))
    for fn in (attention, flash_attention):
        with pytest.raises(TypeError):
            fn(x, x, x, True)  # type: ignore[call-overload]
    out, lse = flash_attention(x, x, x, return_lse=True)
    with pytest.raises(TypeError):
        flash_attention_backward(x, x, x, out, lse, x, True)  # type: ignore[misc]


def test_softmax_lse_without_sinks_and_softmax_on_any_axis():
    from impl.attention import softmax, softmax_lse

    x = np.array([[0.0, np.log(3.0)], [1.0, 1.0]])
    weights, lse = softmax_lse(x)
    np.testing.assert_allclose(weights, [[0.25, 0.75], [0.5, 0.5]])
    np.testing.assert_allclose(lse[:, 0], np.log(np.exp(x).sum(axis=-1)))
    np.testing.assert_allclose(softmax(x, axis=0).sum(axis=0), 1.0)


def test_lse_is_the_log_of_the_denominator():
    from impl import attention
    from spec import golden

    q, k, v = _qkv(2)
    _, lse = attention(q, k, v, return_lse=True)
    vis = np.ones((2, 5, 6), dtype=bool)
    np.testing.assert_allclose(lse, golden.forward(q, k, v, visible=vis, scale=1 / np.sqrt(3))[2], rtol=1e-12)


@pytest.mark.parametrize("cap", [0.0, -1.0, np.inf, np.nan])
def test_softcap_must_be_positive_and_finite(cap):
    from impl import attention

    q, k, v = _qkv(2)
    with pytest.raises(ValueError, match="softcap"):
        attention(q, k, v, softcap=cap)


def test_packed_offsets_come_in_pairs_and_start_at_zero():
    from impl import attention

    q, k, v = _qkv(2, n_q=3, n_k=5)
    with pytest.raises(ValueError, match="together"):
        attention(q, k, v, cu_seqlens_q=np.array([0, 3]))
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        attention(q, k, v, cu_seqlens_q=np.array([1, 2, 3]), cu_seqlens_k=np.array([0, 2, 5]))


def test_the_grouped_query_hint_only_for_grouped_calls():
    from impl import attention, flash_attention

    with pytest.raises(ValueError) as raised:
        flash_attention(np.ones((3, 5, 3)), np.ones((2, 6, 3)), np.ones((2, 6, 3)))
    assert "grouped-query" not in str(raised.value)
    with pytest.raises(ValueError, match="must broadcast") as raised:  # k without a head axis: no hint
        attention(np.ones((2, 4, 5, 3)), np.ones((6, 3)), np.ones((3, 6, 4)))
    assert "grouped-query" not in str(raised.value)


def test_bias_that_does_not_broadcast_is_named():
    from impl import attention

    q, k, v = _qkv(2)
    with pytest.raises(ValueError, match="bias of shape"):
        attention(q, k, v, bias=np.zeros((4, 6)))
