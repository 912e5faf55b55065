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
