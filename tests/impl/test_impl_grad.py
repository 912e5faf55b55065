"""The hand-written attention backward against central differences and torch autograd."""

from __future__ import annotations

import doctest
from typing import Any

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import impl.grad
from impl.attention import attention
from impl.grad import attention_backward, gradcheck, relative_difference

# Central differences at h = 1e-5 in float64 carry an absolute error of about ε·|f|/h + h²·|f‴|
# (|f| up to a few hundred for the problems drawn here). Gradients are compared relatively down to
# a floor of 1e-2 and absolutely (1e-8) below it. Worst seen over 1,000 drawn problems:
# 8.9e-9 relative, 1.1e-9 absolute — a margin of ~100 under the tolerance, while a gradient
# wrong by 0.1 % of anything above the floor fails it by 1,000.
FD_STEP = 1e-5
FD_TOLERANCE = 1e-6
FD_FLOOR = 1e-2

values = st.floats(-2.0, 2.0, allow_nan=False, width=64)


@st.composite
def attention_problems(draw: st.DrawFn, *, max_batch_dims: int = 2, max_n: int = 4, max_d: int = 3) -> dict:
    """q, k, v whose leading dims broadcast (each may drop or squeeze dims), d_out, causal, mask."""
    batch = draw(hnp.array_shapes(min_dims=0, max_dims=max_batch_dims, min_side=1, max_side=3))
    n_q, n_k = draw(st.integers(1, max_n)), draw(st.integers(1, max_n))
    d_k, d_v = draw(st.integers(1, max_d)), draw(st.integers(1, max_d))

    def leading(full: tuple[int, ...] = batch) -> tuple[int, ...]:
        dropped = draw(st.integers(0, len(full)))
        return tuple(draw(st.sampled_from([1, n])) for n in full[dropped:])

    def arr(shape: tuple[int, ...]) -> np.ndarray:
        return draw(hnp.arrays(np.float64, shape, elements=values))

    q = arr((*leading(), n_q, d_k))
    k = arr((*leading(), n_k, d_k))
    v = arr((*leading(), n_k, d_v))
    out_batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out_shape = (*out_batch, n_q, d_v)
    # The mask broadcasts to the scores' shape, so its leading dims come from q, k and v's.
    mask = draw(st.none() | hnp.arrays(np.bool_, (*leading(out_batch), n_q, n_k)))
    return dict(
        q=q, k=k, v=v, d_out=arr(out_shape), causal=draw(st.booleans()), mask=mask,
        scale=draw(st.none() | st.floats(0.1, 2.0)),
    )


def _options(problem: dict) -> dict[str, Any]:
    return {key: problem[key] for key in ("causal", "mask", "scale")}


def _loss(problem: dict):
    """L(q, k, v) = Σ d_out ∘ attention(q, k, v): its gradient is the backward of d_out."""
    def f(params):
        out = attention(params["q"], params["k"], params["v"], **_options(problem))
        return float(np.sum(out * problem["d_out"]))
    return f


@settings(max_examples=60, deadline=None)
@given(attention_problems())
def test_backward_matches_central_differences(problem: dict) -> None:
    params = {name: problem[name] for name in "qkv"}
    grads = dict(zip("qkv", attention_backward(*params.values(), problem["d_out"], **_options(problem)),
                     strict=True))
    for name in "qkv":
        assert grads[name].shape == params[name].shape, f"d{name} is not shaped like {name}"
    check = gradcheck(_loss(problem), params, grads, n_samples=None, eps=FD_STEP, floor=FD_FLOOR)
    note(f"worst sample: {max(check.samples, key=lambda r: r[4])}")
    assert check.max_rel_diff <= FD_TOLERANCE


@settings(max_examples=60, deadline=None)
@given(attention_problems())
def test_backward_matches_torch_autograd(problem: dict) -> None:
    torch = pytest.importorskip("torch")
    q, k, v = (torch.tensor(problem[name], requires_grad=True) for name in "qkv")
    n_q, n_k = q.shape[-2], k.shape[-2]
    scores = (q @ k.transpose(-1, -2)) * (problem["scale"] or q.shape[-1] ** -0.5)
    keep = torch.ones(n_q, n_k, dtype=torch.bool)
    if problem["causal"]:
        keep = torch.ones(n_q, n_k, dtype=torch.bool).tril()
    if problem["mask"] is not None:
        keep = keep & torch.tensor(problem["mask"])
    # torch's softmax turns an all -inf row into NaN; the reference's law is zeros, so compare on
    # that law: rows with nothing visible get zero weights (as torch's own SDPA does).
    weights = torch.softmax(scores.masked_fill(~keep, -torch.inf), dim=-1).nan_to_num(0.0)
    out = weights @ v
    (out * torch.tensor(problem["d_out"])).sum().backward()
    ours = attention_backward(problem["q"], problem["k"], problem["v"], problem["d_out"], **_options(problem))
    for name, mine, theirs in zip("qkv", ours, (q.grad, k.grad, v.grad), strict=True):
        np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"d{name}")


def test_backward_matches_torch_sdpa_with_causal_mask() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    q, k, v, d_out = (rng.standard_normal((2, 3, 5, 4)) for _ in range(4))
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    (out * torch.tensor(d_out)).sum().backward()
    ours = attention_backward(q, k, v, d_out, causal=True)
    for mine, theirs in zip(ours, (tq.grad, tk.grad, tv.grad), strict=True):
        np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-10, atol=1e-12)


def test_fully_masked_row_gets_zero_gradient_and_sends_none() -> None:
    rng = np.random.default_rng(2)
    q, k, v, d_out = (rng.standard_normal((3, 2)) for _ in range(4))
    mask = np.array([[True, True, False], [False, False, False], [True, False, True]])
    dq, dk, dv = attention_backward(q, k, v, d_out, mask=mask)
    assert np.all(dq[1] == 0)
    # Row 1's upstream gradient must not reach any key or value: changing it changes nothing.
    d_out2 = d_out.copy()
    d_out2[1] = 100.0
    _, dk2, dv2 = attention_backward(q, k, v, d_out2, mask=mask)
    np.testing.assert_array_equal(dk, dk2)
    np.testing.assert_array_equal(dv, dv2)


def test_hidden_keys_get_no_gradient() -> None:
    rng = np.random.default_rng(3)
    q, k, v, d_out = (rng.standard_normal((4, 2)) for _ in range(4))
    mask = np.array([True, True, False, True])  # key 2 hidden from every query
    _, dk, dv = attention_backward(q, k, v, d_out, mask=mask)
    assert np.all(dk[2] == 0) and np.all(dv[2] == 0)
    assert np.all(dk[[0, 1, 3]] != 0)


def test_float32_runs_in_float32_and_agrees_with_float64() -> None:
    rng = np.random.default_rng(4)
    q, k, v, d_out = (rng.standard_normal((2, 5, 3)) for _ in range(4))
    exact = attention_backward(q, k, v, d_out, causal=True)
    single = attention_backward(*(x.astype(np.float32) for x in (q, k, v, d_out)), causal=True)
    for a, b in zip(single, exact, strict=True):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_nan_propagates_to_gradients() -> None:
    q, k, v, d_out = (np.ones((2, 2)) for _ in range(4))
    v[1, 0] = np.nan
    dq, dk, dv = attention_backward(q, k, v, d_out)
    assert np.isnan(dq).all() and np.isnan(dk).all()
    assert np.isfinite(dv).all()  # dv = Pᵀ dO does not read v


def test_empty_lengths_give_empty_or_zero_gradients() -> None:
    q, k, v = np.ones((0, 2)), np.ones((3, 2)), np.ones((3, 4))
    dq, dk, dv = attention_backward(q, k, v, np.ones((0, 4)))
    assert dq.shape == (0, 2) and np.all(dk == 0) and np.all(dv == 0)
    dq, dk, dv = attention_backward(np.ones((2, 2)), np.ones((0, 2)), np.ones((0, 4)), np.ones((2, 4)))
    assert np.all(dq == 0) and dk.shape == (0, 2) and dv.shape == (0, 4)


@pytest.mark.parametrize(
    ("d_out", "error", "words"),
    [
        (np.ones((3, 4)), ValueError, "d_out must have the shape"),
        (np.ones((2, 3, 2)), ValueError, "d_out must have the shape"),
        (np.ones((2, 4), dtype=np.float32), TypeError, "dtype of q"),
        (1.0, TypeError, "d_out must be an array"),
    ],
)
def test_bad_d_out_is_refused(d_out: Any, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        attention_backward(np.ones((2, 3)), np.ones((5, 3)), np.ones((5, 4)), d_out)


def test_bad_qkv_is_refused_like_the_forward() -> None:
    q, k, v = np.ones((2, 3)), np.ones((5, 2)), np.ones((5, 4))
    with pytest.raises(ValueError) as forward:
        attention(q, k, v)
    with pytest.raises(ValueError) as backward:
        attention_backward(q, k, v, np.ones((2, 4)))
    assert str(backward.value) == str(forward.value)
    with pytest.raises(ValueError, match="mask"):
        attention_backward(np.ones((2, 3)), np.ones((5, 3)), np.ones((5, 4)), np.ones((2, 4)),
                           mask=np.ones((3, 5), bool))


# --- every forward keyword -------------------------------------------------------------------------
#
# Each problem draws a random choice of every keyword of attention (grouped K/V heads included)
# and checks every gradient — dq, dk, dv, and dbias and dsinks when drawn — against central
# differences of the forward itself, in float64, every entry.  Dropout keeps its seed, so the kept set
# is the same at θ ± h. Same step, floor and tolerance as above; worst seen over 1,000 drawn
# problems (74,722 parameters): 2.1e-8 relative, 2.1e-10 absolute below the floor — a margin of
# ~50 under the tolerance.


def _normals(rng: np.random.Generator, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    return [rng.standard_normal(shape) for shape in shapes]


def _bias_with_hidden_keys(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    bias = rng.standard_normal(shape)
    bias[rng.random(shape) < 0.15] = -np.inf  # a −∞ bias hides a key
    return bias


@st.composite
def keyword_problems(draw: st.DrawFn) -> tuple[dict, dict]:
    """(arrays, keywords): 4-D q, k, v (g K/V heads for h query heads), d_out, and any keywords."""
    b, g = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    h = g * draw(st.integers(1, 3))
    n_q, n_k = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays = dict(q=rng.standard_normal((b, h, n_q, 3)), k=rng.standard_normal((b, g, n_k, 3)),
                  v=rng.standard_normal((b, g, n_k, 2)), d_out=rng.standard_normal((b, h, n_q, 2)))
    kw: dict[str, Any] = {
        "causal": draw(st.booleans()),
        "align": draw(st.sampled_from(["top_left", "bottom_right"])),
        "window": draw(st.none() | st.tuples(st.integers(0, 3), st.integers(0, 3))),
        "softcap": draw(st.none() | st.floats(0.5, 4.0)),
        "scale": draw(st.none() | st.floats(0.2, 2.0)),
    }
    if draw(st.booleans()):  # broadcast over batch, over heads, over both, or not at all
        shape = draw(st.sampled_from([(b, h, n_q, n_k), (1, h, n_q, n_k), (b, 1, n_q, n_k), (n_q, n_k),
                                      (h, 1, n_k)]))
        kw["bias"] = _bias_with_hidden_keys(rng, shape)
    if draw(st.booleans()):
        kw["mask"] = rng.random((n_q, n_k)) < 0.7
    if draw(st.booleans()):
        kw["sinks"] = rng.standard_normal(h)
    if draw(st.booleans()):
        kw["kv_lengths"] = rng.integers(0, n_k + 1, size=b)
    if draw(st.booleans()):
        kw["alibi_slopes"] = rng.uniform(0, 1, size=draw(st.sampled_from([(h,), (b, h)])))
    if draw(st.booleans()):
        kw["dropout_p"], kw["seed"] = draw(st.sampled_from([0.2, 0.5])), draw(st.integers(0, 100))
    note({name: val for name, val in kw.items() if not isinstance(val, np.ndarray)})
    note({name: val.shape for name, val in kw.items() if isinstance(val, np.ndarray)})
    return arrays, kw


def _check_every_gradient(arrays: dict, kw: dict) -> None:
    """dq, dk, dv (and dbias, dsinks when given) against central differences of the forward."""
    extras = [name for name in ("bias", "sinks") if kw.get(name) is not None]
    *grads, got_extras = attention_backward(arrays["q"], arrays["k"], arrays["v"], arrays["d_out"],
                                            return_extras=True, **kw)
    assert sorted(got_extras) == sorted(f"d{name}" for name in extras)
    params = {name: arrays[name] for name in "qkv"} | {name: kw[name] for name in extras}
    analytic = dict(zip("qkv", grads, strict=True)) | {name: got_extras[f"d{name}"] for name in extras}
    for name, grad in analytic.items():
        assert grad.shape == np.shape(params[name]) and grad.dtype == np.float64, f"d{name}"
        assert np.isfinite(grad).all(), f"d{name} is not finite"

    def loss(p: dict) -> float:
        out = attention(p["q"], p["k"], p["v"], **(kw | {name: p[name] for name in extras}))
        return float(np.sum(out * arrays["d_out"]))

    check = gradcheck(loss, params, analytic, n_samples=None, eps=FD_STEP, floor=FD_FLOOR)
    assert check.max_rel_diff <= FD_TOLERANCE, f"worst sample: {max(check.samples, key=lambda r: r[4])}"


@settings(max_examples=80, deadline=None)
@given(keyword_problems())
def test_every_keywords_gradients_match_central_differences(problem: tuple[dict, dict]) -> None:
    _check_every_gradient(*problem)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("extra", [{}, {"window": (1, 0), "softcap": 2.0}, {"dropout_p": 0.3, "seed": 4},
                                   {"bias": "drawn", "sinks": "drawn", "alibi_slopes": "drawn"}])
def test_packed_sequences_gradients_match_central_differences(align: str, extra: dict) -> None:
    rng = np.random.default_rng(11)
    cu_q, cu_k = np.array([0, 2, 2, 5]), np.array([0, 3, 4, 4])  # an empty sequence on each side
    h, g = 4, 2
    arrays = dict(q=rng.standard_normal((h, 5, 3)), k=rng.standard_normal((g, 4, 3)),
                  v=rng.standard_normal((g, 4, 2)), d_out=rng.standard_normal((h, 5, 2)))
    drawn = {"bias": _bias_with_hidden_keys(rng, (h, 5, 4)), "sinks": rng.standard_normal(h),
             "alibi_slopes": rng.uniform(0, 1, h)}
    kw = {"causal": True, "align": align, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
          **{name: drawn[name] if value == "drawn" else value for name, value in extra.items()}}
    _check_every_gradient(arrays, kw)
    _, dk, dv = attention_backward(*arrays.values(), **kw)
    assert (dk[:, 3] == 0).all() and (dv[:, 3] == 0).all()  # key 3 is sequence 1's, which has no query


def test_dsinks_is_minus_the_sinks_share_times_d_summed_per_head() -> None:
    rng = np.random.default_rng(12)
    q, k, v, d_out = _normals(rng, (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2), (2, 3, 4, 2))
    sinks = np.array([0.5, -1.0, 2.0])
    out, lse = attention(q, k, v, sinks=sinks, return_lse=True)
    share = np.exp(sinks[:, None] - lse)  # [2, 3, 4]
    want = -(share * np.sum(d_out * out, axis=-1)).sum(axis=(0, 2))
    *_, extras = attention_backward(q, k, v, d_out, sinks=sinks, return_extras=True)
    np.testing.assert_allclose(extras["dsinks"], want, rtol=1e-12)
    assert extras["dsinks"].shape == (3,)
    *_, extras = attention_backward(q[0, 0], k[0, 0], v[0, 0], d_out[0, 0], sinks=sinks[:1],
                                    return_extras=True)
    assert extras["dsinks"].shape == (1,)


def test_dbias_is_summed_over_its_broadcast_axes_and_keeps_its_dtype() -> None:
    rng = np.random.default_rng(13)
    q, k, v, d_out = _normals(rng, (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2), (2, 3, 4, 2))
    full = rng.standard_normal((2, 3, 4, 6))
    *_, whole = attention_backward(q, k, v, d_out, bias=full, return_extras=True)
    for shape, axes in [((1, 3, 4, 6), (0,)), ((2, 1, 4, 6), (1,)), ((4, 6), (0, 1)), ((3, 1, 6), (0, 2))]:
        bias = rng.standard_normal(shape)
        *_, extras = attention_backward(q, k, v, d_out, bias=bias, return_extras=True)
        *_, as_full = attention_backward(q, k, v, d_out, bias=np.broadcast_to(bias, (2, 3, 4, 6)),
                                         return_extras=True)
        want = as_full["dbias"].sum(axis=axes, keepdims=True).reshape(shape)
        np.testing.assert_allclose(extras["dbias"], want, rtol=1e-12, atol=1e-15)
    *_, single = attention_backward(q, k, v, d_out, bias=full.astype(np.float32), return_extras=True)
    assert single["dbias"].dtype == np.float32 and whole["dbias"].dtype == np.float64
    assert attention_backward(q, k, v, d_out, return_extras=True)[3] == {}


@pytest.mark.parametrize(("h", "g"), [(4, 2), (6, 3), (6, 1), (3, 3)])
def test_grouped_kv_heads_sum_their_groups_gradients(h: int, g: int) -> None:
    rng = np.random.default_rng(h + g)
    q, d_out = rng.standard_normal((2, h, 4, 3)), rng.standard_normal((2, h, 4, 2))
    k, v = rng.standard_normal((2, g, 5, 3)), rng.standard_normal((2, g, 5, 2))
    kw = {"causal": True, "softcap": 2.0, "sinks": rng.standard_normal(h), "dropout_p": 0.25, "seed": 3}
    dq, dk, dv = attention_backward(q, k, v, d_out, **kw)
    repeat = h // g  # query head i reads K/V head i // repeat
    k_rep, v_rep = np.repeat(k, repeat, axis=1), np.repeat(v, repeat, axis=1)
    rq, rk, rv = attention_backward(q, k_rep, v_rep, d_out, **kw)
    np.testing.assert_allclose(dq, rq, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dk, rk.reshape(2, g, repeat, 5, 3).sum(axis=2), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dv, rv.reshape(2, g, repeat, 5, 2).sum(axis=2), rtol=1e-12, atol=1e-15)


HIDDEN_KEY_2 = {  # each hides key 2 from every query of the 4-D problem below, by a different cause
    "mask": {"mask": np.array([True, True, False, True, True])},
    "window": {"window": (0, 1), "align": "bottom_right", "causal": False},  # queries 3, 4 see keys ≥ 3
    "kv_lengths": {"kv_lengths": np.array([2, 2])},
    "bias": {"bias": np.where(np.arange(5) == 2, -np.inf, 0.0)},
}


@pytest.mark.parametrize("cause", sorted(HIDDEN_KEY_2))
def test_a_hidden_key_gets_exactly_zero_dk_and_dv(cause: str) -> None:
    rng = np.random.default_rng(14)
    q, k, v, d_out = _normals(rng, (2, 2, 5, 3), (2, 2, 5, 3), (2, 2, 5, 2), (2, 2, 5, 2))
    if cause == "window":
        q = q[:, :, 3:]  # 2 queries, 5 keys, bottom-right: query i sees keys i + 3 and i + 4
        d_out = d_out[:, :, 3:]
    kw = {"softcap": 3.0, "sinks": np.array([0.3, -0.2]), "alibi_slopes": np.array([0.5, 0.1]),
          "dropout_p": 0.2, "seed": 1} | HIDDEN_KEY_2[cause]
    dq, dk, dv = attention_backward(q, k, v, d_out, **kw)
    assert (dk[..., 2, :] == 0).all() and (dv[..., 2, :] == 0).all()
    assert np.isfinite(dq).all() and (dk != 0).any()


def test_a_query_that_sees_no_key_gets_zero_dq_never_nan() -> None:
    rng = np.random.default_rng(15)
    q, k, v, d_out = _normals(rng, (2, 2, 4, 3), (2, 2, 5, 3), (2, 2, 5, 2), (2, 2, 4, 2))
    bias = np.zeros((4, 5))
    bias[1] = -np.inf  # query 1 sees nothing through the bias
    for kw in ({"kv_lengths": np.array([0, 5])}, {"bias": bias},
               {"bias": bias, "sinks": np.array([1.0, 2.0])},
               {"window": (0, 0), "causal": True, "align": "bottom_right", "kv_lengths": np.array([3, 5])}):
        dq, dk, dv, extras = attention_backward(q, k, v, d_out, return_extras=True, **kw)
        assert all(np.isfinite(x).all() for x in (dq, dk, dv, *extras.values()))
        blind = attention(q, k, v, return_weights=True, **kw)[1].sum(-1) == 0  # [2, 2, 4]: blind rows
        assert blind.any() and (dq[blind] == 0).all()


def test_dropouts_backward_uses_its_forwards_kept_set_and_scale() -> None:
    rng = np.random.default_rng(16)
    q, k, v, d_out = _normals(rng, (2, 4, 3), (2, 6, 3), (2, 6, 2), (2, 4, 2))
    p = 0.4
    _, w = attention(q, k, v, dropout_p=p, seed=9, return_weights=True)
    *_, dv = attention_backward(q, k, v, d_out, dropout_p=p, seed=9)
    np.testing.assert_allclose(dv, np.swapaxes(w, -1, -2) @ d_out, rtol=1e-13)  # dv = Wᵀ dO, W the forward's
    other = attention_backward(q, k, v, d_out, dropout_p=p, seed=10)
    assert not np.allclose(dv, other[2])


def test_the_backward_refuses_what_the_forward_refuses_with_the_same_words() -> None:
    q, k, v, d_out = np.ones((2, 3, 4)), np.ones((2, 5, 4)), np.ones((2, 5, 2)), np.ones((2, 3, 2))
    for kw in ({"sinks": np.ones(3)}, {"alibi_slopes": np.ones((2, 2))}, {"dropout_p": 0.5},
               {"bias": np.ones((3, 4))}, {"cu_seqlens_q": np.array([0, 3])}, {"window": (-1, 0)}):
        with pytest.raises((ValueError, TypeError)) as forward:
            attention(q, k, v, **kw)
        with pytest.raises(type(forward.value)) as backward:
            attention_backward(q, k, v, d_out, **kw)
        assert str(backward.value) == str(forward.value)


# --- the checker itself --------------------------------------------------------------------------

def _quadratic() -> tuple[Any, dict, dict]:
    """f = Σ a² + 3 Σ b: gradients 2a and 3, known exactly."""
    rng = np.random.default_rng(5)
    params = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    grads = {"a": 2 * params["a"], "b": np.full(5, 3.0)}
    return (lambda p: float(np.sum(p["a"] ** 2) + 3 * np.sum(p["b"]))), params, grads


def test_gradcheck_passes_exact_gradients_and_spreads_samples() -> None:
    f, params, grads = _quadratic()
    check = gradcheck(f, params, grads, n_samples=7)
    assert check.max_rel_diff < 1e-8
    names = [row[0] for row in check.samples]
    assert names.count("a") == 4 and names.count("b") == 3


def test_gradcheck_catches_a_gradient_wrong_by_a_tenth_of_a_percent() -> None:
    f, params, grads = _quadratic()
    grads["b"] = grads["b"] * 1.001
    assert gradcheck(f, params, grads).max_rel_diff > 5e-4


def test_gradcheck_leaves_params_untouched() -> None:
    f, params, grads = _quadratic()
    before = {name: p.copy() for name, p in params.items()}
    gradcheck(f, params, grads, n_samples=None)
    for name in params:
        np.testing.assert_array_equal(params[name], before[name])


def test_gradcheck_refuses_what_it_cannot_check() -> None:
    f, params, grads = _quadratic()
    with pytest.raises(TypeError, match="float64"):
        gradcheck(f, {**params, "a": params["a"].astype(np.float32)}, grads)
    with pytest.raises(ValueError, match=r"grads\['b'\]"):
        gradcheck(f, params, {"a": grads["a"]})
    with pytest.raises(ValueError, match="eps"):
        gradcheck(f, params, grads, eps=0.0)


def test_relative_difference_uses_the_floor_only_for_small_gradients() -> None:
    assert relative_difference(2.0, 1.0, floor=1e-3) == 0.5
    assert relative_difference(0.0, 1e-6, floor=1e-3) == pytest.approx(1e-3)


def test_docstring_examples() -> None:
    assert doctest.testmod(impl.grad).failed == 0
