"""spec.adapters, one module per framework behind one protocol: arrays in and out bit for bit,
renames checked, each framework's keyword spellings read from its adapter's declaration, grad_fn
built by autograd or jax.vjp; and each framework's attention, with the behaviours its declarations
rest on re-measured.

Each behaviour test would fail on the framework version that behaves otherwise (e.g. PyTorch's
math kernel before 2.5 gave NaN for a query that sees no key), so a new version that changes a
behaviour shows up here before it shows up as a wrong declaration.
"""

from __future__ import annotations

import numpy as np
import pytest

import spec
from impl import attention, causal_mask
from impl.grad import attention_backward
from spec import dtypes
from spec.adapters import (
    Framework,
    fold_masks,
    installed_version,
    named_after,
    numpy_bfloat16,
    on_device,
    wrap,
)
from spec.call import call_grad
from spec.inputs import Inputs
from spec.target import Target

# --- the protocol: arrays in and out bit for bit, renames checked, each framework's spellings -----


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


BF16 = dtypes.as_dtype(dtypes.BFLOAT16) if dtypes.has_bfloat16() else None


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32 if x.dtype.itemsize == 4 else np.uint64)


def _awkward(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Values whose bits a lossy conversion would change: subnormals, ±0, ±inf, NaN, extremes."""
    info = np.finfo(np.float32) if dtype == BF16 else np.finfo(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, float(info.max), float(info.tiny) / 4, 1 / 3],
                       dtype=np.float64)
    values = np.resize(special, int(np.prod(shape))).reshape(shape)
    with np.errstate(over="ignore"):
        return values.astype(dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_from_torch_passes_every_bit_both_ways(torch, dtype):
    if dtype == "bfloat16" and BF16 is None:
        pytest.skip("needs ml_dtypes")
    dt = dtypes.as_dtype(dtype)
    seen = {}

    def echo(q, k, v, *, is_causal=False):
        seen["types"] = [type(x).__name__ for x in (q, k, v)]
        seen["dtype"] = str(q.dtype)
        return q.clone()

    target = spec.from_torch(echo, rename={"causal": "is_causal"}, dtypes=(dtype,))
    q = _awkward(dt, (2, 3, 4))
    out = target(q, q[..., :2, :], q[..., :2, :], causal=True)
    assert seen["types"] == ["Tensor"] * 3 and seen["dtype"] == f"torch.{dtype}"
    assert out.dtype == dt and np.array_equal(_bits(out), _bits(q))


def test_from_jax_passes_every_bit_and_enables_float64():
    jnp = pytest.importorskip("jax.numpy")
    seen = {}

    def echo(q, k, v):
        seen["dtype"] = str(q.dtype)
        return jnp.asarray(q)

    for dtype in ("float16", "float32", "float64", *(("bfloat16",) if BF16 is not None else ())):
        dt = dtypes.as_dtype(dtype)
        q = _awkward(dt, (3, 4))
        out = spec.from_jax(echo, dtypes=(dtype,))(q, q, q)
        assert seen["dtype"] == dtype and out.dtype == dt and np.array_equal(_bits(out), _bits(q))
        assert out.flags.writeable


def test_rename_is_checked():
    with pytest.raises(ValueError, match="rename names 'is_causal'"):
        spec.from_torch(lambda q, k, v: q, rename={"is_causal": "causal"})
    with pytest.raises(TypeError, match="rename must be a dict"):
        spec.from_torch(lambda q, k, v: q, rename=[("causal", "is_causal")])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fn must be callable"):
        spec.from_jax(3)


def test_jax_row_with_no_key_has_a_finite_lse_and_torch_all_minus_inf_bias_row_gives_zeros(torch):
    # The measurements behind two declarations: jax's lse_empty_row_as_declared is skipped (its
    # masked_rows is "uniform", the empty row's lse is the finite fill's), torch takes bias.
    pytest.importorskip("jax")
    from spec.adapters.jax import jax_attention
    from spec.adapters.torch import torch_attention

    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 1, n, 4)).astype(np.float32) for n in (3, 5, 5))
    out, lse = jax_attention(q, k, v, kv_lengths=np.array([0, 5]), return_lse=True)
    assert np.all(np.isfinite(lse[0])) and np.all(lse[0] < -1e37)
    np.testing.assert_allclose(out[0, 0], np.broadcast_to(v[0, 0].mean(axis=0), (3, 4)), atol=1e-6)
    bias = np.zeros((2, 1, 3, 5), dtype=np.float32)
    bias[0, 0, 1] = -np.inf
    assert np.array_equal(torch_attention(q, k, v, bias=bias)[0, 0, 1], np.zeros(4, dtype=np.float32))


def _recorder(seen: dict):
    def fn(q, k, v, **kwargs):
        seen.clear()
        seen.update(kwargs)
        return q
    return fn


def test_the_adapters_spell_keywords_as_each_adapter_declares_and_rename_overrides(torch):
    from spec.adapters import spellings

    assert spellings("jax")["window"] == "local_window_size"
    assert spellings("torch")["bias"] == "attn_mask"
    seen: dict = {}
    q = np.zeros((2, 1, 3, 4), dtype=np.float32)
    bias = np.zeros((2, 1, 3, 3), dtype=np.float32)
    sdpa_like = spec.from_torch(_recorder(seen), supports_bias=True, supports_mask=True, ndims=(4,))
    sdpa_like(q, q, q, bias=bias, mask=np.ones((3, 3), dtype=bool))
    assert set(seen) == {"attn_mask", "mask"}
    # the user's rename wins: a spelling it gives to another keyword drops that keyword's default
    spec.from_torch(_recorder(seen), rename={"mask": "attn_mask"}, supports_bias=True, supports_mask=True,
                    ndims=(4,))(q, q, q, bias=bias, mask=np.ones((3, 3), dtype=bool))
    assert set(seen) == {"attn_mask", "bias"} and seen["attn_mask"].dtype == torch.bool
    keep = spec.from_torch(_recorder(seen), rename={"bias": "bias"}, supports_bias=True, ndims=(4,))
    keep(q, q, q, bias=bias)
    assert set(seen) == {"bias"}
    with pytest.raises(ValueError, match="gives 'x' to more than one keyword"):
        spec.from_torch(_recorder(seen), rename={"mask": "x", "bias": "x"})


def test_from_onnx_spells_keywords_as_the_operator_does_and_passes_copies():
    """spec.from_onnx needs no onnx to wrap a function (ONNX's arrays are NumPy's): its keywords are
    spelled as the Attention operator spells them, rename overrides, and fn gets copies."""
    from spec.adapters.onnx import from_onnx

    assert spec.from_onnx is from_onnx
    seen: dict = {}
    q = np.zeros((2, 1, 3, 4), dtype=np.float32)
    bias = np.zeros((2, 1, 3, 3), dtype=np.float32)
    target = spec.from_onnx(_recorder(seen), supports_bias=True, supports_kv_lengths=True, ndims=(4,))
    assert target.name.endswith("_recorder.<locals>.fn")
    out = target(q, q, q, bias=bias, kv_lengths=np.array([3, 2]))
    assert set(seen) == {"attn_mask", "nonpad_kv_seqlen"}
    assert not np.shares_memory(seen["attn_mask"], bias) and not np.shares_memory(out, q)
    kept = spec.from_onnx(_recorder(seen), rename={"bias": "bias"}, supports_bias=True, ndims=(4,))
    kept(q, q, q, bias=bias)
    assert set(seen) == {"bias"}
    with pytest.raises(TypeError, match="fn must be callable"):
        spec.from_onnx(3)
    with pytest.raises(ValueError, match="rename names 'nope'"):
        spec.from_onnx(_recorder(seen), rename={"nope": "x"})


def test_from_jax_spells_keywords_as_jax_does():
    pytest.importorskip("jax")
    seen: dict = {}
    q = np.zeros((2, 1, 3, 4), dtype=np.float32)
    target = spec.from_jax(_recorder(seen), supports_window=True, supports_kv_lengths=True, returns_lse=True,
                           ndims=(4,))
    target(q, q, q, window=(1, 0), kv_lengths=np.array([3, 2]))
    assert set(seen) == {"local_window_size", "key_value_seq_lengths"}
    renamed = spec.from_jax(_recorder(seen), rename={"window": "window_size"}, supports_window=True)
    renamed(q, q, q, window=(1, 0))
    assert set(seen) == {"window_size"}


def test_a_libraries_spelling_is_read_from_its_adapters_declaration(monkeypatch):
    pytest.importorskip("jax")
    from spec.adapters import jax as adapter
    from spec.adapters import spellings
    from spec.adapters.jax import jax_attention

    monkeypatch.setitem(adapter.SPELLINGS, "window", "my_window")
    assert spellings("jax")["window"] == "my_window"
    seen: dict = {}
    spec.from_jax(_recorder(seen), supports_window=True)(np.zeros((3, 4)), np.zeros((3, 4)), np.zeros((3, 4)),
                                                         window=(1, 0))
    assert set(seen) == {"my_window"}
    # the built-in wrapper reads it too (float16 runs eagerly, so the call is traced again)
    q = np.zeros((3, 4), dtype=np.float16)
    with pytest.raises(TypeError, match="my_window"):
        jax_attention(q, q, q, window=(1, 0))
# --- each framework's attention, and the behaviours its declarations rest on -----------------------


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
    from spec import dtypes

    monkeypatch.setattr(dtypes, "has_ml_dtypes", lambda: False)
    monkeypatch.setattr(dtypes, "has_bfloat16", lambda: False)
    q, k, v = _qkv((3, 4), (5, 4), 2, dtype="float64")
    out = fn(q, k, v)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, _golden(q, k, v), atol=1e-12)


# --- the gradient builder: grad_fn by autograd and by jax.vjp -------------------------------------


Array = np.ndarray


def _arrays(lead: tuple[int, ...], n_q: int, n_k: int, d: int = 3, *, kv_lead: tuple[int, ...] | None = None,
            seed: int = 0) -> tuple[Array, Array, Array, Array]:
    rng = np.random.default_rng(seed)
    kv = lead if kv_lead is None else kv_lead
    return (rng.standard_normal((*lead, n_q, d)), rng.standard_normal((*kv, n_k, d)),
            rng.standard_normal((*kv, n_k, 2)), rng.standard_normal((*lead, n_q, 2)))


def _against_reference(target: Target, inputs: Inputs, d_out: Array, *, rtol: float) -> None:
    got = call_grad(target, inputs, d_out, deadline=120.0)
    kwargs = {n: x for n, x in inputs.keywords.items()} | ({"causal": True} if inputs.causal else {}) | (
        {} if inputs.mask is None else {"mask": inputs.mask})
    *want, extras = attention_backward(inputs.q, inputs.k, inputs.v, d_out, scale=inputs.scale,
                                       return_extras=True, **kwargs)
    for a, b in zip(got[:3], want, strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)
    assert set(got[3]) == set(extras)
    for name in extras:
        np.testing.assert_allclose(got[3][name], extras[name], rtol=rtol, atol=rtol)


def test_from_torch_with_grad_differentiates_the_function_and_its_bias():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    def sdpa(q, k, v, *, causal=False, scale=None, attn_mask=None):  # bias= arrives as torch spells it
        if attn_mask is not None and causal:
            future = ~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
            attn_mask = attn_mask.masked_fill(future, float("-inf"))
            causal = False
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale)

    target = spec.from_torch(sdpa, grad=True, supports_scale=True, supports_bias=True, grad_extras=("dbias",))
    q, k, v, d_out = _arrays((2, 3), 4, 5)
    bias = np.random.default_rng(9).standard_normal((2, 1, 4, 5))
    inputs = Inputs(q, k, v, causal=True, scale=0.6, keywords={"bias": bias})
    _against_reference(target, inputs, d_out, rtol=1e-12)
    _against_reference(target, Inputs(q, k, v), d_out, rtol=1e-12)
    with pytest.raises(TypeError, match="grad=True or grad_fn="):
        spec.from_torch(sdpa, grad=True, grad_fn=attention_backward)


def test_from_jax_with_grad_uses_vjp():
    pytest.importorskip("jax")
    import jax
    import jax.numpy as jnp

    def attend(q, k, v, *, causal=False, scale=None, bias=None, sinks=None):
        s = (q @ jnp.swapaxes(k, -1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale) + (
            0 if bias is None else bias)
        if causal:
            s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
        if sinks is not None:  # an extra logit per head that carries no value
            column = jnp.broadcast_to(sinks[:, None, None], (*s.shape[:-1], 1))
            return jax.nn.softmax(jnp.concatenate([s, column], axis=-1), axis=-1)[..., :-1] @ v
        return jax.nn.softmax(s, axis=-1) @ v

    target = spec.from_jax(attend, grad=True, supports_scale=True, supports_bias=True, supports_sinks=True,
                           grad_extras=("dbias", "dsinks"), dtypes=("float64",))
    q, k, v, d_out = _arrays((2, 3), 4, 5)
    rng = np.random.default_rng(10)
    keywords = {"bias": rng.standard_normal((1, 3, 4, 5)), "sinks": rng.standard_normal(3)}
    _against_reference(target, Inputs(q, k, v, causal=True, scale=0.6, keywords=keywords), d_out, rtol=1e-10)


def test_the_jax_target_differentiates_every_keyword_it_declares_and_its_bias():
    pytest.importorskip("jax")
    jax_target = spec.load_target("jax")
    assert jax_target.grad_extras == ("dbias",)
    # grouped K/V heads, d_v ≠ d_k (JAX is called per slice of V), a bias broadcast over the
    # heads (dbias summed back), key lengths, a window, mask= and causal at once
    q, k, v, d_out = (x.astype(np.float32) for x in _arrays((2, 4), 5, 7, kv_lead=(2, 2)))
    rng = np.random.default_rng(11)
    # every query keeps its diagonal key and the one before: no row is empty
    mask = (rng.random((2, 4, 5, 7)) < 0.8) | np.eye(5, 7, dtype=bool) | np.eye(5, 7, -1, dtype=bool)
    keywords = {"bias": rng.standard_normal((2, 1, 5, 7)).astype(np.float32), "kv_lengths": np.array([7, 4]),
                "window": (2, 1)}
    inputs = Inputs(q, k, v, causal=True, mask=mask, scale=0.6, keywords=keywords)
    _against_reference(jax_target, inputs, d_out, rtol=1e-5)
    laws = ["grad_keywords_match_golden", "grad_bias_broadcast_summed", "grad_hidden_keys_get_nothing"]
    report = spec.check(jax_target, profile="quick", max_examples=4, only=laws)
    assert report.ok, [(r.name, r.message, r.counterexample) for r in report.failures]
    assert all(r.status == "pass" for r in report.results)


def test_the_torch_target_differentiates_its_bias_and_drops_the_forwards_weights():
    pytest.importorskip("torch")
    torch_target = spec.load_target("torch")
    assert torch_target.grad_extras == ("dbias",)
    report = spec.check(torch_target, profile="quick", max_examples=6,
                        only=["grad_keywords_match_golden", "grad_bias_broadcast_summed",
                              "grad_dropout_uses_forward_kept_set", "grad_hidden_keys_get_nothing"])
    assert report.ok, [(r.name, r.message, r.counterexample) for r in report.failures]
    assert all(r.status == "pass" for r in report.results)


def test_a_framework_call_is_placed_on_its_device_and_synchronized_before_it_returns():
    events = []
    record = Framework(name="fake", to_native=lambda x, device: events.append(("to", device)) or x,
                       to_numpy=lambda x: events.append(("back",)) or np.asarray(x),
                       synchronize=lambda device: events.append(("sync", device)))

    def fn(q, k, v, *, causal=False):
        events.append(("call",))
        return attention(q, k, v, causal=causal)

    target = wrap(record, fn, device="gpu:7")
    q = np.ones((2, 3))
    target.fn(q, q, q)
    assert events == [("to", "gpu:7")] * 3 + [("call",), ("sync", "gpu:7"), ("back",)]
    with pytest.raises(TypeError, match="device must be a device name"):
        wrap(record, fn, device="")


# --- what the framework modules share ----------------------------------------------------------------


def _hide(visible, bias):  # the framework's where(visible, bias, fill), here NumPy's with fill -99
    return np.where(visible, bias, -99.0)


def test_fold_masks_leaves_causal_alone_to_the_frameworks_flag():
    assert fold_masks(None, None, causal=True, n_q=2, n_k=3, where=_hide) == (None, True)
    assert fold_masks(None, None, where=_hide) == (None, False)


def test_fold_masks_ands_the_mask_with_the_causal_mask_of_either_alignment():
    mask = np.array([[True, False, True, True]] * 2)  # [n_q = 2, n_k = 4]
    top_left, causal = fold_masks(mask, None, causal=True, n_q=2, n_k=4, where=_hide)
    assert not causal
    np.testing.assert_array_equal(top_left, [[True, False, False, False], [True, False, False, False]])
    bottom_right, _ = fold_masks(mask, None, causal=True, n_q=2, n_k=4, bottom_right=True, where=_hide)
    np.testing.assert_array_equal(bottom_right, [[True, False, True, False], [True, False, True, True]])
    plain, causal = fold_masks(mask, None, n_q=2, n_k=4, where=_hide)
    assert plain is mask and not causal


def test_fold_masks_puts_the_frameworks_fill_in_the_bias_where_a_key_is_hidden():
    bias = np.arange(6.0).reshape(2, 3)
    assert fold_masks(None, bias, where=_hide)[0] is bias
    folded, causal = fold_masks(None, bias, causal=True, n_q=2, n_k=3, where=_hide)
    assert not causal
    np.testing.assert_array_equal(folded, [[0.0, -99.0, -99.0], [3.0, 4.0, -99.0]])
    seen = []
    folded, _ = fold_masks(np.array([True, False, True]), bias, native=lambda x: seen.append(x) or x,
                           where=_hide)
    np.testing.assert_array_equal(folded, [[0.0, -99.0, 2.0], [3.0, -99.0, 5.0]])
    assert len(seen) == 1 and seen[0].dtype == bool  # the visibility made native once, as a boolean
    with pytest.raises(TypeError, match="mask must be boolean"):
        fold_masks(np.ones(3), bias, where=_hide)


def test_on_device_binds_the_device_and_keeps_the_name():
    def attend(q, *, device="cpu"):
        return device

    assert on_device(attend, "cpu") is attend
    placed = on_device(attend, "cuda:1")
    assert placed(None) == "cuda:1" and placed.__name__ == "attend"


def test_named_after_names_a_wrapper_after_its_function_or_its_type():
    class Kernel:
        def __call__(self, q):
            return q

    def wrapper():
        pass

    assert named_after(wrapper, attention, "_grad").__name__ == "attention_grad"
    assert wrapper.__qualname__ == "attention_grad"
    assert named_after(wrapper, Kernel()).__name__ == "Kernel"


def test_numpy_bfloat16_is_ml_dtypes_or_none(monkeypatch):
    assert numpy_bfloat16() == BF16
    monkeypatch.setattr(dtypes, "has_bfloat16", lambda: False)
    assert numpy_bfloat16() is None


def test_installed_version_reads_the_package_metadata():
    assert installed_version("numpy") == np.__version__
