"""spec.tolerance: the float64 golden it compares against, the baseline in the target's dtype
(float16's and bfloat16's steps done in float32 and rounded: bit for bit the dtype's), the floors,
and compare: a perturbed output or a NaN fails, a row left out is not compared."""

from __future__ import annotations

import numpy as np
import pytest

from impl import attention, causal_mask
from spec import dtypes, tolerance
from spec.cases import Case


def _inputs(dtype, n_q=5, n_k=7, d_k=4, d_v=3, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in ((n_q, d_k), (n_k, d_k), (n_k, d_v)))


def test_golden_agrees_with_the_reference_in_float64():
    q, k, v = _inputs(np.float64)
    vis = causal_mask(5, 7)
    gold, weights = tolerance.golden(q, k, v, visible=vis, scale=0.5)
    ref, ref_w = attention(q, k, v, causal=True, scale=0.5, return_weights=True)
    np.testing.assert_allclose(gold, ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(weights, ref_w, rtol=1e-13, atol=1e-15)


def test_golden_gives_zeros_for_a_row_that_sees_nothing():
    q, k, v = _inputs(np.float64)
    vis = np.ones((5, 7), dtype=bool)
    vis[2] = False
    gold, weights = tolerance.golden(q, k, v, visible=vis, scale=1.0)
    assert np.all(gold[2] == 0) and np.all(weights[2] == 0) and np.all(np.isfinite(gold))


def test_a_hand_computed_example():
    q = np.array([[1.0, 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0]])
    v = np.array([[10.0], [20.0]])
    gold, _ = tolerance.golden(q, k, v, visible=np.ones((1, 2), bool), scale=np.log(3.0))
    np.testing.assert_allclose(gold, [[12.5]], rtol=1e-15)  # weights 3/4, 1/4


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_the_reference_passes_the_policy_and_a_perturbed_output_does_not(dtype):
    q, k, v = _inputs(dtype, n_q=33, n_k=40, d_k=16, d_v=8)
    vis = np.ones((33, 40), dtype=bool)
    scale = 0.25
    gold, _ = tolerance.golden(q, k, v, visible=vis, scale=scale)
    base = tolerance.baseline(q, k, v, visible=vis, scale=scale)
    floor = tolerance.floor(q, k, v, scale=scale)
    rows = np.ones(33, dtype=bool)
    out = attention(q, k, v, scale=scale)
    good = tolerance.compare(out, gold, base, rows=rows, tolerance=2.0, floor_=floor)
    assert good.ok and 0 <= good.ratio <= 1
    bad_out = out.astype(np.float64)
    bad_out[3, 2] += 100 * good.allowed + 1e-3
    bad = tolerance.compare(bad_out, gold, base, rows=rows, tolerance=2.0, floor_=floor)
    assert not bad.ok and bad.where == (3, 2) and bad.ratio > 1


def test_nan_where_the_golden_is_finite_always_fails():
    q, k, v = _inputs(np.float32)
    vis = np.ones((5, 7), dtype=bool)
    gold, _ = tolerance.golden(q, k, v, visible=vis, scale=0.5)
    out = gold.copy()
    out[1, 1] = np.nan
    cmp = tolerance.compare(out, gold, gold, rows=np.ones(5, bool), tolerance=1e9, floor_=1e9)
    assert not cmp.ok and cmp.error == np.inf


def test_a_non_finite_error_fails_with_an_infinite_ratio_whatever_is_allowed():
    """An allowance that overflows (the floor at scores near the dtype's edge) lets a finite error
    pass; a NaN or inf where the golden is finite still fails, with the ratio inf, never NaN."""
    gold = np.ones((2, 3))
    out = gold.copy()
    out[1, 2] = np.inf
    cmp = tolerance.compare(out, gold, gold, rows=np.ones(2, bool), tolerance=2.0, floor_=np.inf)
    assert not cmp.ok and cmp.ratio == np.inf and "ratio inf" in cmp.explain()
    out[1, 2] = 1.5
    assert tolerance.compare(out, gold, gold, rows=np.ones(2, bool), tolerance=2.0, floor_=np.inf).ok


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_golden_past_the_output_dtypes_range_is_the_laws_bug(dtype):
    """No output in the dtype is right where the golden lies past its largest finite value: the
    comparison says the case is the law's bug instead of judging the target."""
    top = float(np.finfo(dtype).max)
    gold = np.array([[1.0, 2 * top]])
    with np.errstate(over="ignore"):
        out = gold.astype(dtype)  # the correctly rounded output: inf
    with pytest.raises(tolerance.UnrepresentableGolden, match=rf"a bug in the law.*past {dtype}"):
        tolerance.compare(out, gold, gold, rows=np.ones(1, bool), tolerance=2.0, floor_=0.0, dtype=dtype)
    # rows left out, or a dtype that holds it, are no such case
    tolerance.compare(out, gold, gold, rows=np.zeros(1, bool), tolerance=2.0, floor_=0.0, dtype=dtype)
    tolerance.compare(gold, gold, gold, rows=np.ones(1, bool), tolerance=2.0, floor_=0.0, dtype="float64")


def test_rows_left_out_are_not_compared():
    q, k, v = _inputs(np.float32)
    gold, _ = tolerance.golden(q, k, v, visible=np.ones((5, 7), bool), scale=0.5)
    out = gold.copy()
    out[4] = 1e6
    rows = np.array([True, True, True, True, False])
    assert tolerance.compare(out, gold, gold, rows=rows, tolerance=2.0, floor_=1e-9).ok


def test_baseline_in_float16_is_worse_than_in_float32():
    vis = np.ones((5, 7), dtype=bool)
    errors = []
    for dtype in (np.float16, np.float32):
        q, k, v = _inputs(dtype)
        gold, _ = tolerance.golden(q, k, v, visible=vis, scale=0.5)
        errors.append(np.max(np.abs(tolerance.baseline(q, k, v, visible=vis, scale=0.5) - gold)))
    assert errors[0] > 100 * errors[1] > 0


def _in_the_dtype_throughout(q, k, *, visible, scale, bias=None, sinks=None):
    """The baseline's softmax with every step a ufunc of q's dtype (NumPy's float16, ml_dtypes'
    bfloat16), as `baseline_pattern` was written before it did their steps in float32; the
    sums as `tolerance._sum_last` defines them."""
    h = q.dtype.type
    if q.dtype == np.float16:
        s = (q.astype(np.float32) @ np.swapaxes(k, -1, -2).astype(np.float32)).astype(h)
    else:
        s = np.asarray(q @ np.swapaxes(k, -1, -2)).astype(h)
    s = s * h(scale)
    if bias is not None:
        s = s + bias.astype(h)
    s = np.where(visible, s, h(-np.inf))
    top = np.max(s, axis=-1, keepdims=True)
    sink = None if sinks is None else sinks.astype(h)[..., None]
    top = top if sink is None else np.maximum(top, sink)
    shift = np.where(np.isfinite(top), top, h(0))
    e = np.exp(s - shift)
    total = np.sum(e, axis=-1, keepdims=True) if q.dtype == np.float16 else \
        np.sum(e.astype(np.float32), axis=-1, keepdims=True).astype(h)
    if sink is not None:
        e_sink = np.exp(sink - shift)
        total = total + e_sink
    denominator = np.where(total > 0, total, h(1))
    return e / denominator, None if sink is None else e_sink / denominator


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_16_bit_baselines_done_in_float32_are_the_dtype_throughout_bit_for_bit(dtype):
    """`tolerance.baseline_pattern` does float16's and bfloat16's adds, subtracts, products,
    quotients, maxima and masks in float32, rounding each to the dtype: it must give
    exactly the dtype's weights, with masks, a bias, sinks, rows that see nothing and scores that
    overflow."""
    from spec import dtypes, golden

    if dtype == "bfloat16" and not dtypes.has_bfloat16():
        pytest.skip("bfloat16 needs ml_dtypes")
    dt = dtypes.as_dtype(dtype)
    rng = np.random.default_rng(20261202)
    for trial in range(200):
        lead, n_q, n_k, d = (int(rng.integers(1, 4)),), int(rng.integers(1, 20)), int(rng.integers(1, 70)), 8
        amplitude = float(rng.choice([1e-2, 1.0, 8.0, 60.0]))  # 60: float16 products past 65504
        q, k = ((rng.standard_normal((*lead, n, d)) * amplitude).astype(dt) for n in (n_q, n_k))
        visible = rng.random((*lead, n_q, n_k)) < 0.8
        visible[..., 0, :] = trial % 3 != 0  # every third trial: a row that sees nothing
        bias = rng.standard_normal((*lead, n_q, n_k)) * 4 if trial % 2 else None
        sinks = rng.standard_normal((*lead, n_q)) if trial % 5 == 0 else None
        scale = float(rng.choice([0.125, 1 / np.sqrt(8), 0.7]))
        terms = golden.Terms(added=() if bias is None else (bias,), sinks=sinks)
        with np.errstate(all="ignore"):
            got = tolerance.baseline_pattern(q, k, visible=visible, scale=scale, terms=terms)
            want, want_sink = _in_the_dtype_throughout(q, k, visible=visible, scale=scale, bias=bias,
                                                       sinks=sinks)
        assert got.weights.dtype == dt
        np.testing.assert_array_equal(got.weights.astype(np.float64), want.astype(np.float64),
                                      err_msg=f"trial {trial}")
        if sinks is not None:
            np.testing.assert_array_equal(got.sink.astype(np.float64), want_sink.astype(np.float64),
                                          err_msg=f"trial {trial}")


def test_baseline_is_bfloat16_and_keeps_every_key_of_a_long_row():
    BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    # 1,024 equal scores: a key-by-key bfloat16 denominator would stop at 256 and give 4.
    n_k = 1024
    q = np.zeros((1, 8), dtype=BF16)
    k = np.ones((n_k, 8), dtype=BF16)
    v = np.ones((n_k, 2), dtype=BF16)
    out = tolerance.baseline(q, k, v, visible=np.ones((1, n_k), dtype=bool), scale=0.25)
    assert out.dtype == BF16
    assert np.array_equal(out.astype(np.float64), np.ones((1, 2)))


def test_baseline_rounds_to_bfloat16_so_its_error_is_bfloat16_sized():
    pytest.importorskip("ml_dtypes")
    case = Case(dtype="bfloat16", ndim=2, batch=1, heads=1, n_q=16, n_k=64, d_k=32, d_v=16, seed=3)
    q, k, v = case.arrays()
    vis = np.ones((16, 64), dtype=bool)
    gold, _ = tolerance.golden(q, k, v, visible=vis, scale=32**-0.5)
    err = np.max(np.abs(tolerance.baseline(q, k, v, visible=vis, scale=32**-0.5).astype(np.float64) - gold))
    # Above float32's rounding, within a few bfloat16 ulps of outputs of size ≲ 3.
    assert 1e-5 < err < 8 * dtypes.eps("bfloat16")


def test_the_weights_floor_by_hand():
    """Two keys of equal score: p = [1, 1], each rounded by up to eps/2 = 1/16 in e4m3, ℓ = 2:
    2·max|V|·(1/8)/2 = max|V|/8; a weight in e4m3's subnormals costs half their spacing, 2⁻¹⁰."""
    pytest.importorskip("ml_dtypes")
    w = np.array([[0.5, 0.5]])
    assert tolerance.weights_floor(w, np.array([[2.0], [-4.0]]), "float8_e4m3fn") == pytest.approx(0.5)
    tiny = np.array([[1.0, 1e-4]]) / (1 + 1e-4)  # p = [1, 1e-4]: 1/16 + 2⁻¹⁰ over ℓ = 1 + 1e-4
    assert tolerance.weights_floor(tiny, np.ones((2, 1)), "float8_e4m3fn") == pytest.approx(
        2 * (1 / 16 + 2 ** -10) / (1 + 1e-4))
    assert tolerance.weights_floor(np.zeros((1, 2)), np.ones((2, 1)), "float8_e4m3fn") == 0.0
