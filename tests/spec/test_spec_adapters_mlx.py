"""spec.adapters.mlx: arrays cross to MLX and back bit for bit (bfloat16 and float64 included);
spec.from_mlx makes a target of an MLX function in one line, its grad_fn by mx.vjp; the built-in
mlx target loads, conforms on the laws its declarations allow, honours its declared expected
failure, and the behaviours its declarations rest on are re-measured (a new MLX that behaves
otherwise fails here before it shows up as a wrong declaration)."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from impl import attention
from impl.grad import attention_backward
from spec import dtypes
from spec.call import call_grad
from spec.inputs import Inputs

mx = pytest.importorskip("mlx.core")

from spec.adapters.mlx import _from_mlx, _to_mlx, mlx_attention, mlx_attention_grad  # noqa: E402

BF16 = dtypes.as_dtype(dtypes.BFLOAT16) if dtypes.has_bfloat16() else None
DTYPES = ["float16", "float32", "float64", "bfloat16"]


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16" and BF16 is None:
        pytest.skip("needs ml_dtypes")
    return dtypes.as_dtype(name)


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def _awkward(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Values whose bits a lossy conversion would change: subnormals, ±0, ±inf, NaN, extremes."""
    info = np.finfo(np.float32) if dtype == BF16 else np.finfo(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, float(info.max), float(info.tiny) / 4, 1 / 3],
                       dtype=np.float64)
    values = np.resize(special, int(np.prod(shape))).reshape(shape)
    with np.errstate(over="ignore"):
        return values.astype(dtype)


def _qkv(shape_q, shape_k, d_v, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape_q).astype(dtype)
    k = rng.standard_normal(shape_k).astype(dtype)
    v = rng.standard_normal((*shape_k[:-1], d_v)).astype(dtype)
    return q, k, v


def _golden(q, k, v, **kw):
    return attention(*(x.astype(np.float64) for x in (q, k, v)), **kw)


# --- arrays in and out, bit for bit -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_arrays_cross_to_mlx_and_back_bit_for_bit(dtype):
    dt = _dtype(dtype)
    x = _awkward(dt, (2, 3, 4))
    native = _to_mlx(x)
    assert str(native.dtype) == f"mlx.core.{dtype}"
    x_before = x.copy()
    x[...] = 0  # the mx.array has its own memory
    back = _from_mlx(native)
    assert back.dtype == dt and back.flags.writeable and np.array_equal(_bits(back), _bits(x_before))
    # a NaN's payload crosses too
    if dt.itemsize == 2:
        payload = np.array([0x7E01, 0xFE42], dtype=np.uint16).view(dt)
        assert np.array_equal(_bits(_from_mlx(_to_mlx(payload))), _bits(payload))


@pytest.mark.parametrize("dtype", DTYPES)
def test_from_mlx_passes_every_bit_both_ways(dtype):
    dt = _dtype(dtype)
    seen = {}

    def echo(q, k, v, *, causal=False):
        seen["types"] = [type(x).__name__ for x in (q, k, v)]
        seen["dtype"] = str(q.dtype)
        return mx.array(q)  # a copy, made by MLX

    target = spec.from_mlx(echo, dtypes=(dtype,), ndims=(4,))
    q = _awkward(dt, (1, 2, 3, 4))
    out = target(q, q[..., :2, :], q[..., :2, :], causal=True)
    assert seen["types"] == ["array"] * 3 and seen["dtype"] == f"mlx.core.{dtype}"
    assert out.dtype == dt and np.array_equal(_bits(out), _bits(q))


def test_from_mlx_wraps_mlx_attention_and_conforms():
    def sdpa(q, k, v, *, causal=False, mask=None, scale=None):
        given = "causal" if causal else None if mask is None else mask
        chosen = q.shape[-1] ** -0.5 if scale is None else scale
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=chosen, mask=given)

    target = spec.from_mlx(sdpa, ndims=(4,), supports_scale=True, causal_alignment="bottom_right",
                           masked_rows="uniform", dtypes=("float32",))
    assert target.name.endswith("sdpa")
    laws = ["matches_golden", "causal_no_leak", "bottom_right_causal_mask"]
    report = spec.check(target, profile="quick", only=laws)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    # declared top-left, the same function fails: the suite sees MLX's alignment
    top_left = target.replace(causal_alignment="top_left")
    (result,) = spec.check(top_left, profile="quick", only=["causal_no_leak"]).results
    assert result.status == "fail"


def test_from_mlx_refuses_a_device_mlx_lacks_and_a_non_callable():
    with pytest.raises(ValueError, match="'tpu'"):
        spec.from_mlx(lambda q, k, v: q, device="tpu")
    if not mx.is_available(mx.gpu):
        with pytest.raises(ValueError, match="no gpu backend"):
            spec.from_mlx(lambda q, k, v: q, device="gpu")
    with pytest.raises(TypeError, match="callable"):
        spec.from_mlx(3)


# --- gradients by mx.vjp ------------------------------------------------------------------------------


def _against_reference(target, inputs, d_out, *, rtol):
    got = call_grad(target, inputs, d_out, deadline=120.0)
    kwargs = dict(inputs.keywords) | ({"mask": inputs.mask} if inputs.mask is not None else {})
    *want, extras = attention_backward(inputs.q, inputs.k, inputs.v, d_out, scale=inputs.scale,
                                       causal=inputs.causal, align="bottom_right", return_extras=True,
                                       **kwargs)
    for a, b in zip(got[:3], want, strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)
    assert set(got[3]) == set(extras)
    for name in extras:
        np.testing.assert_allclose(got[3][name], extras[name], rtol=rtol, atol=rtol)


def test_from_mlx_with_grad_uses_vjp_for_q_k_v_the_bias_and_the_sinks():
    def sdpa(q, k, v, *, causal=False, scale=None, bias=None, sinks=None):
        mask = bias if bias is not None else "causal" if causal else None
        if causal and bias is not None:
            n_q, n_k = q.shape[-2], k.shape[-2]
            visible = mx.arange(n_k)[None] <= mx.arange(n_q)[:, None] + (n_k - n_q)
            mask = mx.where(visible, bias, mx.array(-np.inf, bias.dtype))
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale or q.shape[-1] ** -0.5, mask=mask,
                                                    sinks=sinks)

    target = spec.from_mlx(sdpa, grad=True, ndims=(4,), supports_scale=True, supports_bias=True,
                           supports_sinks=True, grad_extras=("dbias", "dsinks"),
                           causal_alignment="bottom_right", dtypes=("float32",))
    rng = np.random.default_rng(3)
    q, k, v = _qkv((2, 3, 4, 5), (2, 3, 6, 5), 2)
    d_out = rng.standard_normal((2, 3, 4, 2)).astype(np.float32)
    keywords = {"bias": rng.standard_normal((2, 1, 4, 6)).astype(np.float32),
                "sinks": rng.standard_normal(3).astype(np.float32)}
    _against_reference(target, Inputs(q, k, v, causal=True, scale=0.6, keywords=keywords), d_out, rtol=1e-4)
    _against_reference(target, Inputs(q, k, v), d_out, rtol=1e-4)
    # a bias's gradient is the gradient of that bias: a grad_fn that swapped dbias for zeros fails
    got = call_grad(target, Inputs(q, k, v, keywords=keywords), d_out, deadline=120.0)
    assert np.abs(got[3]["dbias"]).max() > 1e-3 and got[3]["dbias"].shape == (2, 1, 4, 6)


def test_the_mlx_target_differentiates_every_keyword_it_declares():
    target = spec.load_target("mlx")
    assert target.grad_extras == ("dbias", "dsinks")
    # grouped K/V heads, d_v ≠ d_k, n_q < n_k with causal (bottom-right), a mask, a bias broadcast
    # over the heads (dbias summed back) and sinks, at once
    q, k, v = _qkv((2, 4, 5, 3), (2, 2, 7, 3), 2)
    rng = np.random.default_rng(11)
    d_out = rng.standard_normal((2, 4, 5, 2)).astype(np.float32)
    mask = (rng.random((2, 4, 5, 7)) < 0.8) | np.eye(5, 7, 2, dtype=bool)  # every row keeps its diagonal key
    keywords = {"bias": rng.standard_normal((2, 1, 5, 7)).astype(np.float32),
                "sinks": rng.standard_normal(4).astype(np.float32)}
    inputs = Inputs(q, k, v, causal=True, mask=mask, scale=0.6, keywords=keywords)
    got = call_grad(target, inputs, d_out, deadline=120.0)
    *want, extras = attention_backward(q, k, v, d_out, causal=True, align="bottom_right", mask=mask,
                                       scale=0.6, return_extras=True, **keywords)
    for mine, theirs in zip(got[:3], want, strict=True):
        np.testing.assert_allclose(mine, theirs, atol=1e-5)
    np.testing.assert_allclose(got[3]["dbias"], extras["dbias"], atol=1e-5)
    np.testing.assert_allclose(got[3]["dsinks"], extras["dsinks"], atol=1e-5)
    laws = ["grad_matches_golden", "grad_keywords_match_golden", "grad_bias_broadcast_summed",
            "grad_sinks_per_head", "grad_hidden_keys_get_nothing"]
    report = spec.check(target, profile="quick", max_examples=4, only=laws)
    assert report.ok and all(r.status == "pass" for r in report.results), [
        (r.name, r.status, r.message) for r in report.results]


# --- the built-in target ------------------------------------------------------------------------------


def test_the_mlx_target_loads_and_conforms_on_the_laws_it_declares():
    target = spec.load_target("mlx")
    assert target.name.startswith("mlx ") and "fast.scaled_dot_product_attention" in target.name
    assert target.ndims == (4,) and target.causal_alignment == "bottom_right"
    assert {"float16", "float32", "float64"} <= set(target.dtypes)
    laws = ["matches_golden", "mask_semantics", "bottom_right_causal_mask", "gqa_matches_repeated_kv",
            "bias_matches_golden", "sinks_matches_golden", "masked_rows_policy", "empty_keys"]
    report = spec.check(target, profile="quick", only=laws)
    assert report.ok and all(r.status == "pass" for r in report.results), [
        (r.name, r.status, r.message) for r in report.results]


def test_the_mlx_target_honours_its_expected_failure():
    target = spec.load_target("mlx")
    assert "sinks_at_range_edge[float16]" in target.expected_failures
    (result,) = spec.check(target.with_dtypes(("float16",)), profile="quick",
                           only=["sinks_at_range_edge"]).results
    assert result.status == "xfail" and "q's dtype" in result.expected
    # the other dtypes take the sinks the law draws: they pass it
    report = spec.check(target.with_dtypes(("float32",)), profile="quick", only=["sinks_at_range_edge"])
    assert report.ok and report.results[0].status == "pass"


def test_float16_sinks_beyond_float16s_range_are_inf_and_at_its_edge_are_right():
    """The finding behind the declared expected failure: MLX refuses float32 sinks for float16 q
    (they must promote to q's dtype), so the float32 sink 1.7e38 goes in as float16 +inf and the
    row is NaN; a sink at float16's own edge, 65504, takes all the weight (the output is 0)."""
    q, k, v = (np.full((1, 1, 1, 1), x, dtype=np.float16) for x in (0.125, -0.132, 0.64))
    with pytest.raises(ValueError, match="sinks must promote"):
        mx.fast.scaled_dot_product_attention(*(_to_mlx(x) for x in (q, k, v)), scale=1.0,
                                             sinks=mx.array(np.array([1.0], np.float32)))
    assert np.isnan(mlx_attention(q, k, v, sinks=np.array([1.7e38], np.float32))).all()
    assert np.array_equal(mlx_attention(q, k, v, sinks=np.array([65504.0], np.float32)),
                          np.zeros((1, 1, 1, 1), np.float16))


# --- the behaviours the declarations rest on ---------------------------------------------------------


def test_causal_is_bottom_right_when_n_q_differs_from_n_k():
    q, k, v = _qkv((1, 2, 3, 4), (1, 2, 6, 4), 4)
    out = mlx_attention(q, k, v, causal=True)
    np.testing.assert_allclose(out, _golden(q, k, v, causal=True, align="bottom_right"), atol=1e-5)
    assert np.abs(out - _golden(q, k, v, causal=True, align="top_left")).max() > 1e-2


@pytest.mark.parametrize("g", [1, 2], ids=["mqa", "gqa"])
def test_query_head_i_reads_kv_head_i_div_group(g):
    h = 4
    q, k, v = _qkv((2, h, 5, 4), (2, g, 7, 4), 3)
    out = mlx_attention(q, k, v)
    group = h // g
    np.testing.assert_allclose(out, _golden(q, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)),
                               atol=1e-5)
    if g > 1:  # the other plausible order (tiling, i % g) must be told apart
        tiled = _golden(q, np.tile(k, (1, group, 1, 1)), np.tile(v, (1, group, 1, 1)))
        assert np.abs(out - tiled).max() > 1e-2


def test_mask_and_causal_are_anded_and_a_bias_is_added_to_the_scaled_scores():
    q, k, v = _qkv((2, 2, 4, 4), (2, 2, 6, 4), 4, seed=1)
    rng = np.random.default_rng(2)
    mask = (rng.random((2, 2, 4, 6)) < 0.6) | np.eye(4, 6, 2, dtype=bool)  # every row keeps its diagonal key
    bias = rng.standard_normal((2, 2, 4, 6)).astype(np.float32)
    want = _golden(q, k, v, causal=True, align="bottom_right", mask=mask, bias=bias, scale=0.7)
    np.testing.assert_allclose(mlx_attention(q, k, v, causal=True, mask=mask, bias=bias, scale=0.7), want,
                               atol=1e-5)
    np.testing.assert_allclose(mlx_attention(q, k, v, causal=True, mask=mask),
                               _golden(q, k, v, causal=True, align="bottom_right", mask=mask), atol=1e-5)


def test_a_row_that_sees_no_key_is_the_mean_of_the_values_nan_for_an_all_minus_inf_bias():
    q, k, v = _qkv((1, 1, 5, 4), (1, 1, 3, 4), 4)
    mean = v.astype(np.float64).mean(axis=-2)[0, 0]
    causal = mlx_attention(q, k, v, causal=True)  # n_q > n_k: bottom-right hides every key from rows 0, 1
    np.testing.assert_allclose(causal[0, 0, :2], np.broadcast_to(mean, (2, 4)), atol=1e-6)
    mask = np.ones((1, 1, 5, 3), dtype=bool)
    mask[..., 3, :] = False
    np.testing.assert_allclose(mlx_attention(q, k, v, mask=mask)[0, 0, 3], mean, atol=1e-6)
    bias = np.zeros((1, 1, 5, 3), dtype=np.float32)
    bias[..., 3, :] = -np.inf
    out = mlx_attention(q, k, v, bias=bias)
    assert np.isnan(out[0, 0, 3]).all() and np.isfinite(np.delete(out, 3, axis=2)).all()
    # with a bias too, a row the mask empties is still the mean (the adapter folds the hidden keys
    # into the additive mask as finfo.min, the value MLX's boolean mask puts in their place)
    bias[...] = np.random.default_rng(4).standard_normal(bias.shape)
    np.testing.assert_allclose(mlx_attention(q, k, v, mask=mask, bias=bias)[0, 0, 3], mean, atol=1e-6)
    target = spec.load_target("mlx")
    assert target.masked_rows == {"causal": "uniform", "mask": "uniform", "bias": "nan"}
    # no keys at all: zeros
    empty = mlx_attention(q, k[..., :0, :], v[..., :0, :])
    assert empty.shape == (1, 1, 5, 4) and np.array_equal(empty, np.zeros_like(empty))


def test_only_rank_four_runs_and_float64_is_only_float32_accurate():
    q, k, v = _qkv((5, 4), (7, 4), 4)
    with pytest.raises(ValueError, match="rank 4"):
        mlx_attention(q, k, v)
    q, k, v = _qkv((1, 2, 5, 8), (1, 2, 7, 8), 8, dtype="float64")
    out = mlx_attention(q, k, v)
    error = np.abs(out - _golden(q, k, v)).max()
    assert out.dtype == np.float64 and 1e-10 < error < 1e-5
    assert spec.load_target("mlx").computes == {"float64": "float32"}


def test_the_target_grad_is_mx_vjp_of_the_same_call():
    q, k, v = _qkv((1, 2, 4, 3), (1, 2, 4, 3), 2)
    d_out = np.ones((1, 2, 4, 2), dtype=np.float32)
    dq, dk, dv, extras = mlx_attention_grad(q, k, v, d_out, causal=True)
    *want, _ = attention_backward(q, k, v, d_out, causal=True, return_extras=True)
    for a, b in zip((dq, dk, dv), want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert extras == {}
