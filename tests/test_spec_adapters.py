"""The peers' adapters, and the framework behaviours their declarations rest on, re-measured.

Each behaviour test would fail on the framework version that behaves otherwise (e.g. PyTorch's
math kernel before 2.5 gave NaN for a query that sees no key), so a new version that changes a
behaviour shows up here before it shows up as a wrong declaration.
"""

from __future__ import annotations

import numpy as np
import pytest

from impl import attention, causal_mask

FRAMEWORKS = ["torch", "jax"]


def _peer(name: str):  # -> (adapter, target factory), or skip when the framework is absent
    pytest.importorskip(name)
    from spec import adapters

    module = adapters.module(name)
    return getattr(module, f"{name}_attention"), module.TARGETS[name]


def _qkv(shape_q, shape_k, d_v, dtype="float64", seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape_q).astype(dtype)
    k = rng.standard_normal(shape_k).astype(dtype)
    v = rng.standard_normal((*shape_k[:-1], d_v)).astype(dtype)
    return q, k, v


def _golden(q, k, v, **kw):
    return attention(*(x.astype(np.float64) for x in (q, k, v)), **kw)


@pytest.mark.parametrize("name", FRAMEWORKS)
@pytest.mark.parametrize("shape_q, shape_k, d_v", [
    ((5, 4), (7, 4), 3),            # 2-D, d_v < d_k
    ((3, 5, 4), (3, 7, 4), 9),      # 3-D (heads, n, d), d_v > d_k: JAX is called per slice of V
    ((2, 3, 5, 8), (2, 3, 7, 8), 8),
])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"scale": 0.3}], ids=["plain", "causal", "scale"])
def test_adapter_matches_golden(name, shape_q, shape_k, d_v, kw):
    fn, _ = _peer(name)
    q, k, v = _qkv(shape_q, shape_k, d_v, dtype="float32")
    out = fn(q, k, v, **kw)
    assert out.shape == (*shape_q[:-1], d_v) and out.dtype == np.float32
    np.testing.assert_allclose(out, _golden(q, k, v, **kw), atol=1e-5)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_causal_is_top_left_when_n_q_differs_from_n_k(name):
    fn, target = _peer(name)
    q, k, v = _qkv((1, 3, 4), (1, 6, 4), 4, dtype="float32")
    out = fn(q, k, v, causal=True)
    top_left = _golden(q, k, v, mask=causal_mask(3, 6))
    bottom_right = _golden(q, k, v, mask=causal_mask(3, 6, align="bottom_right"))
    np.testing.assert_allclose(out, top_left, atol=1e-5)
    assert np.abs(out - bottom_right).max() > 1e-2
    assert target().causal_alignment == "top_left"


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_mask_and_causal_are_anded(name):
    fn, _ = _peer(name)
    q, k, v = _qkv((2, 6, 4), (2, 6, 4), 4, dtype="float32", seed=1)
    mask = np.random.default_rng(2).random((2, 6, 6)) < 0.6
    mask[..., 0] = True  # every row keeps key 0, so no row is empty
    out = fn(q, k, v, causal=True, mask=mask)
    np.testing.assert_allclose(out, _golden(q, k, v, causal=True, mask=mask), atol=1e-5)


@pytest.mark.parametrize("name", FRAMEWORKS)
@pytest.mark.parametrize("g", [1, 2], ids=["mqa", "gqa"])
def test_query_head_i_reads_kv_head_i_div_group(name, g):
    fn, target = _peer(name)
    h = 6
    q, k, v = _qkv((2, h, 5, 4), (2, g, 7, 4), 4, dtype="float32")
    out = fn(q, k, v)
    group = h // g
    # np.repeat gives K/V head order 0,0,0,1,1,1: query head i ↔ K/V head i // group.
    repeated = _golden(q, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1))
    np.testing.assert_allclose(out, repeated, atol=1e-5)
    if g > 1:  # the other plausible order (tiling, i % g) must be told apart
        tiled = _golden(q, np.tile(k, (1, group, 1, 1)), np.tile(v, (1, group, 1, 1)))
        assert np.abs(out - tiled).max() > 1e-2
    assert target().supports_gqa


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_torch_row_that_sees_no_key_gives_zeros(dtype):
    fn, target = _peer("torch")
    dtype = _dtype(dtype)
    # n = d_v = d_k: the shape SDPA's flash CPU kernel takes, besides the math kernel's d_v ≠ d_k.
    for d_v in (4, 3):
        q, k, v = _qkv((2, 5, 4), (2, 7, 4), d_v, dtype=dtype)
        mask = np.ones((5, 7), dtype=bool)
        mask[1] = False
        out = fn(q, k, v, mask=mask).astype(np.float64)
        assert np.all(out[:, 1] == 0), out[:, 1]
        assert np.all(np.isfinite(out))
    assert target().masked_rows == "zeros"


def test_jax_row_that_sees_no_key_gives_the_mean_of_all_values():
    fn, target = _peer("jax")
    q, k, v = _qkv((2, 5, 4), (2, 7, 4), 4, dtype="float32")
    mask = np.ones((5, 7), dtype=bool)
    mask[1, :] = False
    mask[3, 2:] = False  # an ordinary row, for contrast
    out = fn(q, k, v, mask=mask, causal=True)
    # JAX masks with the finite -0.7·max(float32): an empty row's scores tie, softmax is uniform
    # over all n_k keys — masked ones included, whatever the causal mask says.
    np.testing.assert_allclose(out[:, 1], v.mean(axis=-2), atol=1e-6)
    assert target().masked_rows == "uniform"


def test_jax_backward_a_row_whose_bias_is_all_minus_inf_turns_its_heads_key_gradients_nan():
    """The finding behind the jax target's comments: a row that an all −inf bias empties is NaN in
    JAX's forward (no finite fill: the mask fill replaces only masked scores), and ``jax.vjp``
    spreads the NaN to dk and dv of *every* key of that head (dbias: that row's), not to that
    row's share alone. The
    gradient laws draw no such row (they keep to rows whose declared output is zeros)."""
    pytest.importorskip("jax")
    from spec.adapters.jax import jax_attention, jax_attention_grad

    q, k, v = _qkv((1, 2, 3, 4), (1, 2, 5, 4), 4, dtype="float32")
    d_out = np.random.default_rng(4).standard_normal((1, 2, 3, 4)).astype(np.float32)
    bias = np.zeros((1, 2, 3, 5), dtype=np.float32)
    bias[0, 0, 1] = -np.inf  # head 0, query 1 sees no key
    assert np.isnan(jax_attention(q, k, v, bias=bias)[0, 0, 1]).all()
    dq, dk, dv, extras = jax_attention_grad(q, k, v, d_out, bias=bias)
    assert np.isnan(dq[0, 0, 1]).all() and np.isfinite(dq[0, 0, [0, 2]]).all()
    assert np.isnan(dk[0, 0]).all() and np.isnan(dv[0, 0]).all()
    assert np.isnan(extras["dbias"][0, 0, 1]).all() and np.isfinite(extras["dbias"][0, 0, [0, 2]]).all()
    assert np.isfinite(dk[0, 1]).all() and np.isfinite(dv[0, 1]).all()  # the other head is untouched


def test_jax_float64_is_only_float32_accurate():
    """The recorded deviation: JAX's logits and softmax run in float32 even for float64 inputs."""
    fn, target = _peer("jax")
    q, k, v = _qkv((2, 3, 16, 8), (2, 3, 16, 8), 8, dtype="float64")
    out = fn(q, k, v)
    assert out.dtype == np.float64
    err = np.abs(out - _golden(q, k, v)).max()
    assert 1e-12 < err < 1e-5, err
    assert "float64" not in target().dtypes


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_float_mask_is_refused_not_added(name):
    fn, _ = _peer(name)
    q, k, v = _qkv((3, 4), (3, 4), 4, dtype="float32")
    with pytest.raises(TypeError, match="mask must be boolean"):
        fn(q, k, v, mask=np.zeros((3, 3), dtype=np.float32))


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def test_torch_bfloat16_crosses_bit_for_bit():
    pytest.importorskip("torch")
    from spec.adapters.torch import _from_torch, _to_torch

    bf16 = _dtype("bfloat16")
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(bf16)
    x[0, 0], x[0, 1] = np.inf, np.nan
    back = _from_torch(_to_torch(x))
    assert back.dtype == bf16
    assert np.array_equal(back.view(np.uint16), x.view(np.uint16))


@pytest.mark.parametrize("name", FRAMEWORKS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_within_the_tolerance_policy(name, dtype):
    """max|out − golden| ≤ 2·max|naive − golden| + eps·max|golden|, the naive one in ``dtype``."""
    fn, _ = _peer(name)
    dt = _dtype(dtype)
    q, k, v = _qkv((2, 2, 32, 16), (2, 2, 32, 16), 16, dtype=dt, seed=3)
    golden = _golden(q, k, v)
    scores = (q @ np.swapaxes(k, -1, -2)) * dt.type(0.25)
    e = np.exp((scores - scores.max(-1, keepdims=True)).astype(dt)).astype(dt)
    naive = ((e / e.sum(-1, keepdims=True)).astype(dt) @ v).astype(dt)
    out = fn(q, k, v)
    assert out.dtype == dt
    err = np.abs(out.astype(np.float64) - golden).max()
    base = np.abs(naive.astype(np.float64) - golden).max()
    eps = float(np.finfo(dt).eps) if dtype == "float16" else 2.0**-7
    assert err <= 2 * base + eps * np.abs(golden).max(), (err, base)


def test_torch_adapter_works_without_ml_dtypes(monkeypatch):
    """Without ml_dtypes (torch alone installs no bfloat16 for NumPy) float64 must stay float64."""
    fn, _ = _peer("torch")
    from spec.adapters import torch as peers

    monkeypatch.setattr(peers, "_bfloat16", lambda: None)
    q, k, v = _qkv((3, 4), (5, 4), 2, dtype="float64")
    out = fn(q, k, v)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, _golden(q, k, v), atol=1e-12)
