"""The gradient law of spec.laws.gradients: the golden backward is right, the reference and torch
pass, and each broken backward of gallery.gradients is rejected."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest
from gallery.gradients import BUGS, backward_with, max_before_mask, textbook_backward
from gallery.gradients import CORRECT as GRADIENT_TARGETS
from hypothesis import given, settings
from hypothesis import strategies as st

import spec
from impl import attention
from impl.grad import attention_backward, gradcheck
from spec import oracle, tolerance
from spec.call import call_grad
from spec.cases import Case
from spec.laws.gradients import baseline_backward, golden_backward, grad_cases
from spec.runner import check
from spec.target import Target, TargetFailed

LAW = "grad_matches_golden"
Array = np.ndarray


def _visible(n_q: int, n_k: int, causal: bool) -> Array:
    return np.tril(np.ones((n_q, n_k), dtype=bool)) if causal else np.ones((n_q, n_k), dtype=bool)


# --- the golden backward itself ------------------------------------------------------------------


@st.composite
def small_problems(draw: st.DrawFn) -> dict[str, Any]:
    n_q, n_k, d_k, d_v = (draw(st.integers(1, 4)) for _ in range(4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    amp = draw(st.sampled_from([0.5, 1.0, 3.0]))
    return dict(q=rng.standard_normal((n_q, d_k)) * amp, k=rng.standard_normal((n_k, d_k)) * amp,
                v=rng.standard_normal((n_k, d_v)), d_out=rng.standard_normal((n_q, d_v)),
                causal=draw(st.booleans()), scale=draw(st.floats(0.1, 2.0)))


@settings(max_examples=40, deadline=None)
@given(small_problems())
def test_golden_backward_matches_central_differences(problem: dict[str, Any]) -> None:
    q, k, v, d_out = (problem[n] for n in ("q", "k", "v", "d_out"))
    vis = _visible(q.shape[0], k.shape[0], problem["causal"])

    def loss(params: dict[str, Array]) -> float:
        out, _ = tolerance.golden(params["q"], params["k"], params["v"], visible=vis, scale=problem["scale"])
        return float(np.sum(out * d_out))

    got = golden_backward(q, k, v, d_out, visible=vis, scale=problem["scale"])
    dq, dk, dv = got.dq, got.dk, got.dv
    # Step and tolerances as tests/impl/test_impl_grad.py (measured there for problems of this size).
    result = gradcheck(loss, {"q": q, "k": k, "v": v}, {"q": dq, "k": dk, "v": dv},
                       n_samples=None, eps=1e-5, floor=1e-2)
    assert result.max_rel_diff < 1e-6, result.samples


@settings(max_examples=30, deadline=None)
@given(small_problems())
def test_golden_backward_agrees_with_the_hand_written_one(problem: dict[str, Any]) -> None:
    """Two derivations (Jacobian in full here, the D = rowsum(dO ∘ O) form in impl) meet in float64."""
    q, k, v, d_out = (problem[n] for n in ("q", "k", "v", "d_out"))
    vis = _visible(q.shape[0], k.shape[0], problem["causal"])
    got = golden_backward(q, k, v, d_out, visible=vis, scale=problem["scale"])
    gold = got.dq, got.dk, got.dv
    mine = attention_backward(q, k, v, d_out, causal=problem["causal"], scale=problem["scale"])
    for a, b in zip(gold, mine, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_baseline_backward_is_in_the_dtype_and_near_the_golden() -> None:
    rng = np.random.default_rng(0)
    q, k, v, d_out = (rng.standard_normal(s).astype(np.float32) for s in ((5, 4), (6, 4), (6, 3), (5, 3)))
    vis = _visible(5, 6, True)
    got = golden_backward(q, k, v, d_out, visible=vis, scale=0.5)
    gold = got.dq, got.dk, got.dv
    base = baseline_backward(q, k, v, d_out, visible=vis, scale=0.5)
    for g, b in zip(gold, (base.dq, base.dk, base.dv), strict=True):
        assert b.dtype == np.float32
        assert 0 < np.max(np.abs(b - g)) < 1e-5


# --- the gallery's backward passes (gallery.gradients) -------------------------------------------


BROKEN = BUGS


@pytest.mark.parametrize("dtypes", [("float32", "float64"), ("float16",)])
@pytest.mark.parametrize("bug", list(BROKEN))
def test_broken_backward_is_rejected(bug: str, dtypes: tuple[str, ...]) -> None:
    target = Target(attention, name=bug, ndims=(2, 3, 4), dtypes=dtypes, grad_fn=backward_with(bug))
    (result,) = check(target, "ci", only=[LAW]).results
    assert result.status == "fail", f"{LAW} missed: {BROKEN[bug]}"
    assert "differs from the float64 golden backward" in result.message
    # A Target built in the test is bound to no module-level name: the report says no line loads it.
    assert result.counterexample and "no command can load this target" in result.counterexample.reproduce


def test_max_before_mask_is_caught_by_grad_causal_no_leak_only() -> None:
    target = Target(attention, name="max-before-mask", ndims=(2, 3, 4), grad_fn=max_before_mask)
    (result,) = check(target, "ci", only=["grad_causal_no_leak"]).results
    assert result.status == "fail" and "changed dq" in result.message, result.message
    (result,) = check(target, "ci", only=[LAW]).results
    assert result.status == "pass", result.message


def test_causal_ignored_in_backward_is_caught_by_grad_causal_no_leak() -> None:
    target = Target(attention, name="causal-ignored", ndims=(2, 3, 4),
                    grad_fn=backward_with("causal_ignored"))
    (result,) = check(target, "ci", only=["grad_causal_no_leak"]).results
    assert result.status == "fail" and "though" in result.message, result.message


CORRECT = GRADIENT_TARGETS


@pytest.mark.parametrize("target", CORRECT, ids=[t.name for t in CORRECT])
@pytest.mark.parametrize("seed", [1, 2])
def test_correct_backward_passes(target: Target, seed: int) -> None:
    for result in check(target, "quick", only=[LAW, "grad_causal_no_leak"], seed=seed).results:
        assert result.status == "pass", (result.name, result.message, result.counterexample)


def test_reference_passes_and_reports_ratios() -> None:
    (result,) = check("reference", "quick", only=[LAW]).results
    assert result.status == "pass", result.message
    assert "error/allowed: float" in result.message
    (result,) = check("reference", "quick", only=["grad_causal_no_leak"]).results
    assert result.status == "pass", result.message


def test_torch_autograd_passes() -> None:
    pytest.importorskip("torch")
    for law in (LAW, "grad_causal_no_leak"):
        (result,) = check("torch", "quick", only=[law], max_examples=8).results
        assert result.status == "pass", (law, result.message, result.counterexample)


def _torch_math_grad(q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False) -> Any:
    """A hand-written attention in torch, differentiated by autograd (a correct variant)."""
    import torch

    q_, k_, v_ = (torch.from_numpy(x.copy()).requires_grad_() for x in (q, k, v))
    s = q_ @ k_.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.from_numpy(_visible(q.shape[-2], k.shape[-2], True)), float("-inf"))
    (torch.softmax(s, dim=-1) @ v_).backward(torch.from_numpy(d_out.copy()))
    return tuple(t.grad.numpy() for t in (q_, k_, v_))


def test_torch_autograd_of_a_hand_written_attention_passes() -> None:
    pytest.importorskip("torch")
    target = Target(attention, name="torch-math", ndims=(2, 3, 4), grad_fn=_torch_math_grad)
    (result,) = check(target, "quick", only=[LAW]).results
    assert result.status == "pass", (result.message, result.counterexample)


# --- skipping and misbehaving --------------------------------------------------------------------


def test_target_without_gradients_is_skipped_with_the_reason() -> None:
    for result in check(Target(attention), "quick", only=[LAW, "grad_causal_no_leak"]).results:
        assert result.status == "skip"
        assert "grad_fn" in result.message


def test_gradient_laws_are_registered_with_the_suite() -> None:
    for law in (LAW, "grad_causal_no_leak"):
        assert law in spec.LAWS
        assert spec.LAWS[law].catches.startswith("Catches")


def _textbook(q: Array, k: Array, v: Array, d_out: Array, causal: bool) -> tuple[Array, Array, Array]:
    return textbook_backward(q, k, v, d_out, causal=causal)


@pytest.mark.parametrize(("grad_fn", "words"), [
    (lambda q, k, v, d, causal=False: _textbook(q, k, v, d, causal)[:2],
     "returned 2 items, not the three (dq, dk, dv)"),
    (lambda q, k, v, d, causal=False: (*_textbook(q, k, v, d, causal)[:2], v[..., :0, :]), "dv of shape"),
    (lambda q, k, v, d, causal=False: (_textbook(q, k, v, d, causal)[0].astype(np.float64), k, v),
     "dq of dtype"),
    (lambda q, k, v, d, causal=False: 1 / 0, "grad_fn raised ZeroDivisionError"),
])
def test_misbehaving_grad_fn_is_a_failure_not_a_crash(grad_fn: Any, words: str) -> None:
    target = Target(attention, name="bad", dtypes=("float32",), grad_fn=grad_fn)
    case = Case(dtype="float32", ndim=2, batch=1, heads=1, n_q=3, n_k=4, d_k=2, d_v=5, seed=0)
    with pytest.raises(TargetFailed, match=re.escape(words)):
        call_grad(target, case.inputs(), np.ones((3, 5), np.float32))
    (result,) = check(target, "quick", only=[LAW]).results
    assert result.status == "fail" and words in result.message


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_rows_that_see_no_key_are_drawn_only_when_their_gradient_is_zero(data: st.DataObject) -> None:
    """Bottom-right causal with n_q > n_k leaves queries that see nothing: fine for a target whose
    such rows are zeros (zero gradient), not drawn for one whose rows are NaN or the mean."""
    nan_rows = Target(attention, causal_alignment="bottom_right", masked_rows="nan",
                      grad_fn=backward_with(""))
    case = data.draw(grad_cases(nan_rows))
    assert oracle.visibility(nan_rows.alignment, case.inputs()).any(axis=-1).all()
