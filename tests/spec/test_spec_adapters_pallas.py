"""spec.adapters.pallas: JAX's Pallas attention kernels under the Pallas interpreters as built-in
targets — each loads with its declared limits, conforms on a small check, and keeps the verified
findings its declarations rest on (docs/peers.md, "Pallas"); an expected failure is XFAIL, and a
stale one XPASS.

Every call compiles the kernel's grid for its shape under the interpreter (about a second a shape),
so the checks here run one or two laws on few examples; ``python -m spec check pallas_... --profile
quick`` (``tox -e pallas``) runs them all.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
for _ops in ("gpu.attention", "gpu.decode_attention", "gpu.paged_attention", "tpu.flash_attention",
             "tpu.paged_attention", "tpu.splash_attention"):
    pytest.importorskip(f"jax.experimental.pallas.ops.{_ops}")

import spec  # noqa: E402
from spec import oracle  # noqa: E402
from spec.builtin import load_target  # noqa: E402
from spec.inputs import Inputs  # noqa: E402

TARGETS = ("pallas_mha", "pallas_decode", "pallas_gpu_paged", "pallas_tpu_flash", "pallas_tpu_paged",
           "pallas_splash")

LIMITS = {
    "pallas_mha": {"seq_multiple": 128, "equal_head_dims": True, "supports_gqa": False, "layout": "bnhd",
                   "causal_alignment": "top_left", "returns_lse": True, "empty_keys": "raise"},
    "pallas_decode": {"seq_multiple": 256, "max_seq": 2048, "equal_head_dims": True, "supports_gqa": True,
                      "supports_kv_lengths": True, "causal_alignment": None},
    "pallas_gpu_paged": {"supports_paged_kv": True, "supports_kv_lengths": True, "supports_gqa": True,
                         "equal_head_dims": True, "causal_alignment": None},
    "pallas_tpu_flash": {"seq_multiple": 128, "equal_head_dims": True, "supports_varlen": True,
                         "causal_alignment": "top_left"},
    "pallas_tpu_paged": {"supports_paged_kv": True, "computes": {"float32": "bfloat16"}},
    "pallas_splash": {"seq_multiple": 128, "supports_mask": True, "ndims": (2, 3)},
}


@pytest.mark.parametrize("name", TARGETS)
def test_each_target_loads_with_its_declared_limits(name):
    target = load_target(name)
    assert target.compiles_per_shape and target.deadline_s is not None and target.deadline_s >= 120
    for field, value in LIMITS[name].items():
        assert getattr(target, field) == value, field
    assert "interpret" in target.name


@pytest.mark.parametrize("name", TARGETS)
def test_each_target_conforms_on_a_small_check(name):
    report = spec.check(name, "quick", max_examples=2, only=["matches_golden"])
    assert report.ok, report.to_text()
    assert [r.status for r in report.results] == ["pass"]


def test_mha_backward_conforms_on_a_small_check():
    report = spec.check("pallas_mha", "quick", max_examples=2, only=["grad_matches_golden"])
    assert report.ok and report.results[0].status == "pass", report.to_text()


def test_an_expected_failure_of_mha_is_xfail_and_a_stale_one_xpass():
    target = load_target("pallas_mha")
    report = spec.check(target, "quick", only=["empty_keys"])
    assert report.ok and report.results[0].status == "xfail"
    assert "ZeroDivisionError" in report.results[0].expected
    stale = target.replace(expected_failures={**target.expected_failures, "matches_golden": "stale"})
    report = spec.check(stale, "quick", max_examples=2, only=["matches_golden"])
    assert not report.ok and report.results[0].status == "xpass"


def _qkv(shape_q, shape_kv, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape_q).astype(dtype), rng.standard_normal(shape_kv).astype(dtype),
            rng.standard_normal(shape_kv).astype(dtype))


def test_mha_lse_is_the_kernels_base_2_residual_read_as_the_natural_log():
    from jax.experimental.pallas.ops.gpu import attention

    q, k, v = _qkv((1, 128, 2, 8), (1, 128, 2, 8))
    _, lse2 = attention.mha(*(jax.numpy.asarray(x) for x in (q, k, v)), None, sm_scale=0.3, interpret=True,
                            return_residuals=True)
    inputs = Inputs(*(np.swapaxes(x, 1, 2) for x in (q, k, v)), scale=0.3)
    _, _, want = oracle.golden_of(inputs, "top_left")
    np.testing.assert_allclose(np.asarray(lse2) * math.log(2), want, atol=1e-5)  # base 2 in the kernel
    _, lse = load_target("pallas_mha").fn(q, k, v, sm_scale=0.3, return_residuals=True)
    np.testing.assert_allclose(lse, want, atol=1e-5)


def test_mha_refuses_no_keys_with_zero_division():
    q, k, v = _qkv((1, 128, 1, 8), (1, 0, 1, 8))
    with pytest.raises(ZeroDivisionError):
        load_target("pallas_mha").fn(q, k, v)


def test_gpu_paged_gives_nan_for_an_empty_float16_sequence_and_zeros_in_float32():
    """The finding of docs/peers.md: o / (l + eps) with l = 0 and eps float32's, cast to float16,
    where it is subnormal and XLA:CPU flushes it to zero: 0 / 0."""
    fn = load_target("pallas_gpu_paged").fn
    for dtype, finite in ((np.float32, True), (np.float16, False)):
        q, k, v = _qkv((2, 2, 1, 8), (2, 4, 1, 8), dtype)
        out = fn(q, k, v, block_tables=np.array([[0], [1]], np.int32), lengths=np.array([0, 3]))
        assert np.isfinite(out[0]).all() == finite, dtype
        if finite:
            np.testing.assert_array_equal(out[0], 0.0)


def test_tpu_paged_loads_its_pages_as_bfloat16():
    """float32 in, bfloat16's accuracy out: the error is that of rounding K and V to bfloat16, far
    beyond float32's."""
    fn = load_target("pallas_tpu_paged").fn
    q, k, v = _qkv((1, 1, 17, 64), (1, 1, 17, 64))
    out = fn(q, k, v)
    want, _, _ = oracle.golden_of(Inputs(q, k, v), "top_left")
    error = np.abs(out - want).max()
    assert 1e-4 < error < 2e-2
