"""spec.adapters.onnx: the ONNX Attention operator's arrays go in bit for bit, its graphs are built
once per dtype, keyword set and attribute, both built-in targets load and conform on the laws
they declare (the past-cache laws among them, which reject a broken cache), and the declarations
and findings of the module's docstring and docs/peers.md still hold (measured again here)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import spec
from spec import dtypes, oracle
from spec.adapters import builtin
from spec.adapters.onnx import FRAMEWORK, _four_d, _graph, onnx_attention
from spec.inputs import Inputs
from spec.target import Target

RUNTIMES = ("onnxruntime", "onnx_reference")
PAST_LAWS = ["past_kv_matches_concatenation", "present_kv_is_concatenation"]


def _qkv(shape_q, shape_k, d_v=None, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape_q).astype(dtype)
    k = rng.standard_normal(shape_k).astype(dtype)
    v = rng.standard_normal((*shape_k[:-1], d_v or shape_k[-1])).astype(dtype)
    return q, k, v


def _golden(q, k, v, mask=None, scale=None):
    out, _, _ = oracle.golden_of(Inputs(q, k, v, mask=mask, scale=scale), "top_left")
    return out


# --- the arrays and the graphs -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "float32", *dtypes.bfloat16_if_installed()])
def test_arrays_go_in_and_come_back_bit_for_bit_in_their_own_memory(dtype):
    bits = np.array([0x7E01, 0x8000, 0x0001, 0x3C00, 0xFBFF], dtype=np.uint16)  # NaN payload, −0, subnormal
    x = bits.view(dtypes.as_dtype(dtype)) if dtype != "float32" else bits.astype(np.uint32).view(np.float32)
    there = FRAMEWORK.to_native(x, "cpu")
    back = FRAMEWORK.to_numpy(there)
    assert back.dtype == x.dtype and back.tobytes() == x.tobytes()
    assert not np.shares_memory(there, x) and not np.shares_memory(back, there)
    with pytest.raises(ValueError, match="device"):
        FRAMEWORK.to_native(x, "cuda")


def test_ranks_reach_the_operator_as_views():
    x = np.zeros((3, 5, 4), np.float32)
    assert _four_d(x).shape == (1, 3, 5, 4) and np.shares_memory(_four_d(x), x)
    with pytest.raises(ValueError, match="q, k, v"):
        _four_d(np.zeros(4))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_graph_is_built_once_per_dtype_keyword_set_and_attribute(runtime):
    q, k, v = _qkv((1, 2, 3, 4), (1, 2, 5, 4))
    _graph.cache_clear()
    onnx_attention(q, k, v, causal=True, runtime=runtime)
    onnx_attention(*(x * 2 for x in (q, k, v)), causal=True, runtime=runtime)
    assert (_graph.cache_info().misses, _graph.cache_info().hits) == (1, 1)
    onnx_attention(q, k, v, causal=True, scale=0.5, runtime=runtime)  # scale is an attribute
    onnx_attention(*(x.astype(np.float16) for x in (q, k, v)), causal=True, runtime=runtime)
    onnx_attention(q, k, v, causal=True, mask=np.ones((3, 5), bool), runtime=runtime)
    assert _graph.cache_info().misses == 4


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_each_target_loads_and_conforms_on_a_few_laws(runtime):
    target = builtin("onnx", runtime)
    assert "Attention" in target.name and target.supports_past_kv
    assert target.causal_alignment == "top_left_kv_lengths"
    laws = ["matches_golden", "gqa_matches_repeated_kv", "mask_semantics", "bias_matches_golden",
            "softcap_matches_golden", "kv_lengths_zero_rows", "causal_aligned_per_sequence"]
    report = spec.check(runtime, profile="quick", only=laws, seed=1)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert all(r.status == "pass" for r in report.results), [(r.name, r.status) for r in report.results]


def test_from_onnx_makes_a_target_of_a_function_running_the_operator():
    """spec.from_onnx: a function of NumPy arrays that runs an ONNX graph is a target in one line, its
    bias reaching the function as the operator's attn_mask."""

    def attend(q, k, v, *, causal=False, attn_mask=None):
        return onnx_attention(q, k, v, causal=causal, bias=attn_mask, runtime="onnx_reference")

    target = spec.from_onnx(attend, supports_bias=True, dtypes=("float32",), ndims=(2, 3, 4),
                            masked_rows="zeros", empty_keys="raise", deadline_s=60.0)
    assert target.name.endswith("attend")
    report = spec.check(target, profile="quick", only=["matches_golden", "bias_matches_golden"], seed=1)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert all(r.status == "pass" for r in report.results), [(r.name, r.status) for r in report.results]


# --- the past cache ----------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_past_cache_laws_pass(runtime):
    report = spec.check(runtime, profile="quick", only=PAST_LAWS, seed=2)
    assert report.ok and {r.status for r in report.results} == {"pass"}, [
        (r.name, r.status, r.message) for r in report.results]


def test_the_presents_law_rejects_an_onnx_cache_that_keeps_only_the_past():
    def past_only(q, k, v, **kw):
        got = onnx_attention(q, k, v, **kw)
        return (got[0], kw["past_key"], kw["past_value"]) if isinstance(got, tuple) else got

    declared = builtin("onnx", "onnxruntime")
    broken = declared.replace(fn=past_only, name="ONNX Runtime, presents = the past", expected_failures={})
    report = spec.check(broken, profile="quick", only=["present_kv_is_concatenation"])
    (result,) = report.results
    assert result.status == "fail" and "present_key of shape" in result.message


# --- the declarations, measured ----------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_causal_is_top_left_then_per_row_with_lengths_and_after_the_past(runtime):
    q, k, v = _qkv((2, 2, 3, 4), (2, 2, 5, 4))
    i, j = np.arange(3)[:, None], np.arange(5)
    top_left = onnx_attention(q, k, v, causal=True, runtime=runtime)
    np.testing.assert_allclose(top_left, _golden(q, k, v, mask=j <= i), atol=2e-6)
    lengths = np.array([4, 5])
    per_row = onnx_attention(q, k, v, causal=True, kv_lengths=lengths, runtime=runtime)
    seen = (j <= i + (lengths - 3)[:, None, None, None]) & (j < lengths[:, None, None, None])
    np.testing.assert_allclose(per_row, _golden(q, k, v, mask=seen), atol=2e-6)
    # a past of 3 keys and 2 new ones for 3 queries: query i sees keys j <= 3 + i (not i + 5 - 3)
    out, present_key, present_value = onnx_attention(q, k[..., 3:, :], v[..., 3:, :], causal=True,
                                                     past_key=k[..., :3, :], past_value=v[..., :3, :],
                                                     runtime=runtime)
    np.testing.assert_allclose(out, _golden(q, k, v, mask=j <= i + 3), atol=2e-6)
    assert present_key.tobytes() == k.tobytes() and present_value.tobytes() == v.tobytes()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_row_that_sees_no_key_is_zeros_whatever_hid_its_keys(runtime):
    q, k, v = _qkv((2, 2, 3, 4), (2, 2, 5, 4), d_v=6)
    mask = np.ones((3, 5), bool)
    mask[1] = False
    bias = np.where(mask, 0.0, -np.inf).astype(np.float32)
    for out in (onnx_attention(q, k, v, mask=mask, runtime=runtime),
                onnx_attention(q, k, v, bias=bias, runtime=runtime),
                onnx_attention(q, k, v, mask=mask, bias=np.zeros((3, 5), np.float32), runtime=runtime)):
        assert np.array_equal(out[..., 1, :], np.zeros((2, 2, 6), np.float32))
        assert np.isfinite(out).all()
    out = onnx_attention(q, k, v, kv_lengths=np.array([0, 5]), runtime=runtime)
    assert np.array_equal(out[0], np.zeros((2, 3, 6), np.float32)) and np.abs(out[1]).max() > 0


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_call_with_no_keys_is_refused(runtime):
    q, k, v = _qkv((1, 1, 2, 4), (1, 1, 0, 4))
    with pytest.raises(Exception, match=r"KV sequence length must be greater than 0|no identity"):
        onnx_attention(q, k, v, runtime=runtime)


# --- the findings (docs/peers.md), measured ------------------------------------------------------


def test_onnxruntime_refuses_a_mask_broadcast_along_the_queries():
    q, k, v = _qkv((2, 1, 3, 4), (2, 1, 5, 4))
    padding = np.array([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]  # [batch, 1, 1, n_k]
    with pytest.raises(Exception, match="inconsistent q_sequence_length"):
        onnx_attention(q, k, v, mask=padding)
    full = np.ascontiguousarray(np.broadcast_to(padding, (2, 1, 3, 5)))
    np.testing.assert_allclose(onnx_attention(q, k, v, mask=full), _golden(q, k, v, mask=full), atol=2e-6)


def test_the_reference_evaluator_gives_every_query_query_zeros_causal_row_under_a_broadcast_mask():
    q, k, v = _qkv((1, 1, 3, 4), (1, 1, 3, 4))
    padding = np.array([True, True, False])[None, :]  # [1, n_k]
    got = onnx_attention(q, k, v, causal=True, mask=padding, runtime="onnx_reference")
    first_key = np.broadcast_to(v[..., :1, :], got.shape)  # every query sees key 0 alone
    assert np.array_equal(got, first_key)
    i, j = np.arange(3)[:, None], np.arange(3)
    right = _golden(q, k, v, mask=(j <= i) & padding)
    assert np.abs(got - right).max() > 0.1
    full = np.ascontiguousarray(np.broadcast_to(padding, (3, 3)))
    fixed = onnx_attention(q, k, v, causal=True, mask=full, runtime="onnx_reference")
    np.testing.assert_allclose(fixed, right, atol=2e-6)


def test_the_reference_evaluator_sums_bfloat16_in_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert float(np.sum(np.ones(4096, ml_dtypes.bfloat16))) == 256.0  # what its softmax's sum does
    q = np.zeros((1, 1, 1, 4), ml_dtypes.bfloat16)
    k = np.zeros((1, 1, 4096, 4), ml_dtypes.bfloat16)
    v = np.ones((1, 1, 4096, 1), ml_dtypes.bfloat16)  # uniform weights: the mean of ones is 1
    out = onnx_attention(q, k, v, runtime="onnx_reference")
    assert abs(float(out.ravel()[0]) - 1.0) > 0.5


def test_onnxruntime_refuses_bfloat16_and_computes_float64_in_float32():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = _qkv((1, 2, 3, 8), (1, 2, 4, 8), dtype=np.float64)
    with pytest.raises(Exception, match="Expand"):
        onnx_attention(*(x.astype(ml_dtypes.bfloat16) for x in (q, k, v)))
    error = np.abs(onnx_attention(q, k, v) - _golden(q, k, v)).max()
    assert 1e-9 < error < 1e-5  # float32's accuracy, not float64's
    assert np.abs(onnx_attention(q, k, v, runtime="onnx_reference") - _golden(q, k, v)).max() < 1e-12


def test_a_float64_scale_reaches_the_operator_as_a_float32_attribute():
    q, k, v = _qkv((1, 1, 2, 4), (1, 1, 3, 4), dtype=np.float64)
    scale = 0.1  # not a float32
    got = onnx_attention(q, k, v, scale=scale, runtime="onnx_reference")
    # the evaluator multiplies q and k each by sqrt(scale), taken of the float32 attribute in float32
    at32 = _golden(q, k, v, scale=float(np.sqrt(np.float32(scale)).astype(np.float64) ** 2))
    assert np.abs(got - at32).max() < 1e-12 < np.abs(got - _golden(q, k, v, scale=scale)).max()


def test_the_targets_declare_what_was_measured():
    for runtime, declared in (("onnxruntime", ("float16", "float32")),
                              ("onnx_reference", ("float16", "float32", *dtypes.bfloat16_if_installed()))):
        target: Target = builtin("onnx", runtime)
        assert target.dtypes == declared and target.masked_rows == "zeros" and target.empty_keys == "raise"
        assert target.supports_gqa and target.supports_bias and target.supports_softcap
        assert target.supports_kv_lengths
        assert "padding_mask_is_truncation" in target.expected_failures
