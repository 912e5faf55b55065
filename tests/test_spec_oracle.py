"""The golden backward under every keyword (spec.oracle.gradients), checked against central
differences of the golden forward in float64; its baseline and floors; and the calling contract of
``grad_fn`` (every forward keyword, layouts, the extras dbias and dsinks, the forward's residuals)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pytest

import spec
from impl import attention
from impl.grad import attention_backward
from spec import golden, oracle, tolerance
from spec.call import call, call_grad
from spec.cases import Case, cases
from spec.inputs import Inputs
from spec.keywords import Keyword, Leaves, gradient_extras
from spec.laws.grad_keywords import keyword_grid, keyword_matters
from spec.laws.gradients import differentiable
from spec.signature import SignatureMismatch
from spec.target import Target, TargetError, TargetFailed

Array = np.ndarray
STEP = 1e-6


def _target(**declared: Any) -> Target:
    return Target(attention, ndims=(2, 3, 4), grad_fn=lambda *a, **k: None, **declared)


def _numeric(loss: Any, x: Array) -> Array:
    """Central differences of ``loss()`` in each entry of ``x`` (changed in place, then restored)."""
    grad = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        keep = x[idx]
        x[idx] = keep + STEP
        up = loss()
        x[idx] = keep - STEP
        down = loss()
        x[idx] = keep
        grad[idx] = (up - down) / (2 * STEP)
    return grad


def _check_against_differences(
    inputs: Inputs, d_out: Array, *, align: str = "top_left", keep: Array | None = None,
    extras: tuple[str, ...] = (),
) -> oracle.ExpectedGradients:
    """Every gradient of the golden backward (q, k, v and ``extras``) against central differences of
    ``Σ golden_out ∘ d_out`` in float64; returns the expected gradients."""
    target = _target(causal_alignment=align)
    want = oracle.gradients(target, inputs, d_out, keep=keep)
    arrays = {"dq": inputs.q, "dk": inputs.k, "dv": inputs.v}
    arrays |= {name: inputs.get(gradient_extras()[name].passes[0]) for name in extras}
    for name, x in arrays.items():
        x = np.array(x, dtype=np.float64)  # a writable copy the loss reads

        def loss(name: str = name, x: Array = x) -> float:
            given = {name[1:]: x} if name in ("dq", "dk", "dv") else {gradient_extras()[name].passes[0]: x}
            call_inputs = inputs.replace(**given)
            geo = oracle.geometry(align, call_inputs)  # type: ignore[arg-type]
            terms = dataclasses.replace(oracle.terms(call_inputs, geo), keep=keep)
            q, k, v = call_inputs.q, call_inputs.k, call_inputs.v
            out, _, _ = golden.forward(q, k, v, visible=oracle.visibility(align, call_inputs),  # type: ignore[arg-type]
                                       scale=call_inputs.scale_value, terms=terms)
            return float(np.sum(out * d_out))

        np.testing.assert_allclose(want.golden[name], _numeric(loss, x), rtol=1e-6, atol=1e-8, err_msg=name)
    return want


def _arrays(lead: tuple[int, ...], n_q: int, n_k: int, d: int = 3, *, kv_lead: tuple[int, ...] | None = None,
            seed: int = 0) -> tuple[Array, Array, Array, Array]:
    rng = np.random.default_rng(seed)
    kv = lead if kv_lead is None else kv_lead
    return (rng.standard_normal((*lead, n_q, d)), rng.standard_normal((*kv, n_k, d)),
            rng.standard_normal((*kv, n_k, 2)), rng.standard_normal((*lead, n_q, 2)))


# --- the golden backward against central differences, keyword by keyword --------------------------


@pytest.mark.parametrize("shape", [(2, 1, 4, 5), (1, 3, 4, 5), (2, 3, 4, 5)],
                         ids=["over heads", "over batch", "full"])
def test_bias_and_its_dbias_summed_over_broadcast_axes(shape):
    q, k, v, d_out = _arrays((2, 3), 4, 5)
    bias = np.random.default_rng(1).standard_normal(shape)
    want = _check_against_differences(Inputs(q, k, v, causal=True, keywords={"bias": bias}), d_out,
                                      extras=("dbias",))
    assert want.golden["dbias"].shape == shape


def test_a_minus_inf_bias_entry_gets_no_gradient_and_hides_its_key():
    q, k, v, d_out = _arrays((2,), 3, 4)
    bias = np.random.default_rng(2).standard_normal((2, 3, 4))
    bias[:, :, 1] = -np.inf  # key 1 hidden from everyone
    bias[0, 2, :] = -np.inf  # head 0's last row sees nothing
    want = _check_against_differences(Inputs(q, k, v, keywords={"bias": bias}), d_out)
    assert np.all(want.golden["dk"][:, 1] == 0) and np.all(want.golden["dv"][:, 1] == 0)
    assert np.all(want.golden["dq"][0, 2] == 0)
    assert np.all(want.golden["dbias"][np.isneginf(bias)] == 0)


def test_alibi():
    q, k, v, d_out = _arrays((1, 2), 3, 5)
    _check_against_differences(Inputs(q, k, v, causal=True, keywords={"alibi_slopes": np.array([0.5, 0.25])}),
                               d_out, align="bottom_right")


def test_softcap_through_its_derivative():
    q, k, v, d_out = _arrays((2,), 4, 4, d=4)
    want = _check_against_differences(Inputs(q * 3, k * 3, v, scale=0.9, keywords={"softcap": 1.5}), d_out)
    plain = oracle.gradients(_target(), Inputs(q * 3, k * 3, v, scale=0.9), d_out)
    assert np.max(np.abs(want.golden["dq"] - plain.golden["dq"])) > 1e-2  # the cap bends these scores


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_sinks_and_dsinks_per_head(lead):
    q, k, v, d_out = _arrays(lead, 3, 4)
    sinks = np.array([0.3, -1.0, 2.0][:lead[-1]] if lead else [0.7])
    want = _check_against_differences(Inputs(q, k, v, causal=True, keywords={"sinks": sinks}), d_out,
                                      extras=("dsinks",))
    assert want.golden["dsinks"].shape == sinks.shape


def test_a_sink_with_a_row_that_sees_nothing():
    q, k, v, d_out = _arrays((1,), 3, 2)
    mask = np.array([[True, True], [False, False], [True, False]])
    _check_against_differences(Inputs(q, k, v, mask=mask, keywords={"sinks": np.array([0.5])}), d_out,
                               extras=("dsinks",))


def test_window_both_alignments():
    q, k, v, d_out = _arrays((2,), 4, 6)
    for align in ("top_left", "bottom_right"):
        inputs = Inputs(q, k, v, causal=True, keywords={"window": (1, 0)})
        _check_against_differences(inputs, d_out, align=align)


def test_kv_lengths_zero_included():
    q, k, v, d_out = _arrays((3, 1), 2, 4)
    want = _check_against_differences(Inputs(q, k, v, keywords={"kv_lengths": np.array([2, 0, 4])}), d_out)
    assert np.all(want.golden["dk"][0, :, 2:] == 0) and np.all(want.golden["dq"][1] == 0)


def test_packed_sequences_aligned_per_sequence_with_grouped_heads():
    q, k, v, d_out = _arrays((4,), 5, 6, kv_lead=(2,))
    packing = {"cu_seqlens_q": np.array([0, 2, 2, 5]), "cu_seqlens_k": np.array([0, 3, 4, 6])}
    _check_against_differences(Inputs(q, k, v, causal=True, keywords=packing), d_out, align="bottom_right")


def test_mask_and_scale():
    q, k, v, d_out = _arrays((2,), 3, 4)
    mask = np.random.default_rng(3).random((2, 3, 4)) < 0.6
    mask[:, :, 0] = True
    _check_against_differences(Inputs(q, k, v, mask=mask, scale=1.7), d_out)


def test_dropout_keep_in_the_backward():
    q, k, v, d_out = _arrays((2,), 3, 4)
    keep = np.where(np.random.default_rng(4).random((2, 3, 4)) < 0.3, 0.0, 1 / 0.7)
    inputs = Inputs(q, k, v, causal=True, keywords={"dropout_p": 0.3, "seed": 1})
    want = _check_against_differences(inputs, d_out, keep=keep)
    assert np.max(np.abs(want.golden["dv"] - oracle.gradients(_target(), inputs, d_out).golden["dv"])) > 1e-2


def test_every_keyword_at_once_against_impls_backward():
    """Two derivations (the full Jacobian here, the D = rowsum(dO ∘ O) form in impl) meet in float64."""
    q, k, v, d_out = _arrays((2, 4), 5, 6, kv_lead=(2, 2), d=4)
    rng = np.random.default_rng(5)
    keywords = {"bias": rng.standard_normal((2, 1, 5, 6)), "window": (2, 1), "softcap": 2.0,
                "sinks": rng.standard_normal(4), "kv_lengths": np.array([6, 3]), "alibi_slopes": np.array(
                    [0.5, 0.25, 0.125, 0.0625])}
    inputs = Inputs(q, k, v, causal=True, scale=0.8, keywords=keywords)
    want = oracle.gradients(_target(), inputs, d_out).golden
    *grads, extras = attention_backward(q, k, v, d_out, causal=True, scale=0.8, return_extras=True,
                                        **keywords)
    for name, got in zip(golden.GRADS, grads, strict=True):
        np.testing.assert_allclose(got, want[name], rtol=1e-10, atol=1e-12, err_msg=name)
    for name, got in extras.items():
        np.testing.assert_allclose(got, want[name], rtol=1e-10, atol=1e-12, err_msg=name)


# --- the baseline and the floors ---------------------------------------------------------------


def _every_keyword() -> Inputs:
    q, k, v, _ = _arrays((2, 2), 4, 5, d=4)
    rng = np.random.default_rng(6)
    return Inputs(q, k, v, causal=True, scale=0.7, keywords={
        "bias": rng.standard_normal((2, 1, 4, 5)), "softcap": 1.5, "sinks": np.array([0.2, -0.5]),
        "window": (2, 2), "kv_lengths": np.array([5, 4])})


def test_the_backward_baseline_takes_the_same_terms():
    """float64 baseline == golden (both exact to rounding) through every term; float32 within
    float32 rounding; without the terms it differs (the test can fail)."""
    inputs = _every_keyword()
    d_out = np.random.default_rng(7).standard_normal((2, 2, 4, 2))
    want = oracle.gradients(_target(), inputs, d_out)
    for name, gold in want.golden.items():
        np.testing.assert_allclose(want.baseline[name], gold, rtol=1e-10, atol=1e-12, err_msg=name)
    narrow = _target(dtypes=("float32", "float64"), computes={"float64": "float32"})
    f32 = oracle.gradients(narrow, inputs, d_out)
    for name, gold in want.golden.items():
        assert f32.baseline[name].dtype == np.float32
        assert 0 < np.max(np.abs(f32.baseline[name] - gold)) < 1e-4, name
        assert f32.floors[name] > 0, name
    plain = tolerance.baseline_backward(inputs.q, inputs.k, inputs.v, d_out,
                                        visible=np.ones((2, 2, 4, 5), bool), scale=0.7)
    assert np.max(np.abs(plain.dq - want.golden["dq"])) > 1e-2


def test_the_floors_bound_a_correct_float32_backward():
    """impl's backward computed in float32 stays within the floors alone (no baseline term)."""
    inputs = _every_keyword()
    d_out = np.random.default_rng(8).standard_normal((2, 2, 4, 2))
    f32 = {name: x.astype(np.float32) for name, x in (("q", inputs.q), ("k", inputs.k), ("v", inputs.v))}
    keywords = {n: x.astype(np.float32) if n in ("bias", "sinks") else x for n, x in inputs.keywords.items()}
    narrow = inputs.replace(**f32, **keywords)
    want = oracle.gradients(_target(dtypes=("float32",)), narrow, d_out.astype(np.float32))
    *grads, extras = attention_backward(narrow.q, narrow.k, narrow.v, d_out.astype(np.float32), causal=True,
                                        scale=0.7, return_extras=True, **keywords)
    for name, got in {**dict(zip(golden.GRADS, grads, strict=True)), **extras}.items():
        assert np.max(np.abs(got - want.golden[name])) <= want.floors[name], name


def test_unbroadcast_sums_the_copies_and_refuses_a_shape_that_does_not_broadcast():
    grad = np.arange(24.0).reshape(2, 3, 4)
    want = grad.sum(axis=0).sum(axis=-1, keepdims=True)
    np.testing.assert_array_equal(oracle.unbroadcast(grad, (3, 1)), want)
    with pytest.raises(ValueError, match=re.escape("(2,) does not broadcast to (2, 3, 4)")):
        oracle.unbroadcast(grad, (2,))


# --- declarations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("declared", "words"), [
    ({"grad_extras": ("dbias",), "supports_bias": True, "grad_fn": None}, "needs a grad_fn"),
    ({"grad_extras": ("dq",)}, "the gradients the keywords define are dbias, dsinks"),
    ({"grad_extras": "dbias", "supports_bias": True}, "must be a tuple of names"),
    ({"grad_extras": ("dsinks",)}, "which needs supports_sinks=True"),
    ({"grad_takes_residuals": True}, "needs a grad_fn and returns_lse=True"),
    ({"grad_takes_residuals": 1, "returns_lse": True}, "must be True or False"),
])
def test_gradient_declarations_are_validated(declared, words):
    with pytest.raises(TargetError, match=re.escape(words)):
        Target(attention, **({"grad_fn": attention_backward} | declared))


def test_gradient_extras_are_read_from_the_keywords_terms():
    extras = gradient_extras()
    assert {name: kw.passes[0] for name, kw in extras.items()} == {"dbias": "bias", "dsinks": "sinks"}


def test_a_keyword_is_drawn_only_at_its_ranks():
    with pytest.raises(ValueError, match="ndims must be a non-empty subset"):
        Keyword(name="x", field="supports_bias", passes=("x",), meaning="", terms=(Leaves("test"),),
                received=lambda case, p: (p,), ndims=(5,))
    kv_lengths = spec.keywords.registered()["kv_lengths"]
    assert kv_lengths.ndims == (4,) and spec.keywords.registered()["varlen"].ndims == (3,)
    from hypothesis import given, settings

    @settings(max_examples=20, deadline=None, database=None)
    @given(cases(spec.load_target("reference"), keywords=(kv_lengths,)))
    def drawn(case: Case) -> None:
        assert case.ndim == 4

    drawn()


def test_every_differentiable_keyword_has_a_grid_case_where_it_matters():
    reference = spec.load_target("reference")
    keywords = differentiable(reference)
    names = {"bias", "alibi", "window", "softcap", "sinks", "kv_lengths", "varlen"}
    assert {kw.name for kw in keywords} == names
    grid = keyword_grid(reference)
    assert [next(iter(c.keywords)) for c in grid] == [kw.name for kw in keywords]
    assert all(keyword_matters(reference, c, kw) for c, kw in zip(grid, keywords, strict=True))
    assert {c.dtype for c in grid} == set(reference.dtypes)  # the dtypes taken in turn


# --- calling grad_fn ----------------------------------------------------------------------------


def _recording(returned: Any, seen: dict[str, Any]) -> Any:
    def grad_fn(q, k, v, d_out, **kwargs):
        seen.update(q=q.shape, d_out=d_out.shape, **{n: np.shape(x) if isinstance(x, np.ndarray) else x
                                                      for n, x in kwargs.items()})
        return returned(q, k, v, d_out, **kwargs)

    return grad_fn


def _impl_grads(q, k, v, d_out, **kwargs):
    kwargs.pop("out", None), kwargs.pop("lse", None)
    return attention_backward(q, k, v, d_out, return_extras=True, **kwargs)


def test_grad_fn_receives_every_forward_keyword_in_the_targets_layout_packed_included():
    seen: dict[str, Any] = {}

    def bnhd(x: Array) -> Array:  # packed (total, heads, d) <-> (heads, total, d)
        return np.ascontiguousarray(np.swapaxes(x, 0, 1))

    def grad_fn(q, k, v, d_out, **kw):
        *grads, extras = _impl_grads(*(bnhd(x) for x in (q, k, v, d_out)), **kw)
        return (*(bnhd(g) for g in grads), extras)

    target = Target(lambda q, k, v, **kw: bnhd(attention(bnhd(q), bnhd(k), bnhd(v), **kw)), layout="bnhd",
                    ndims=(3,), supports_varlen=True, supports_sinks=True, supports_scale=True,
                    grad_fn=_recording(grad_fn, seen), grad_extras=("dsinks",))
    q, k, v, d_out = _arrays((2,), 5, 6)
    inputs = Inputs(q, k, v, causal=True, scale=0.5, keywords={
        "cu_seqlens_q": np.array([0, 2, 5]), "cu_seqlens_k": np.array([0, 4, 6]),
        "sinks": np.array([0.1, 0.2]), "return_lse": False})
    dq, dk, dv, extras = call_grad(target, inputs, d_out, deadline=30.0)
    assert seen == {"q": (5, 2, 3), "d_out": (5, 2, 2), "causal": True, "scale": 0.5, "cu_seqlens_q": (3,),
                    "cu_seqlens_k": (3,), "sinks": (2,)}
    want = _impl_grads(q, k, v, d_out, causal=True, scale=0.5, sinks=inputs.get("sinks"),
                       cu_seqlens_q=inputs.get("cu_seqlens_q"), cu_seqlens_k=inputs.get("cu_seqlens_k"))
    for got, right in zip((dq, dk, dv, extras["dsinks"]), (*want[:3], want[3]["dsinks"]), strict=True):
        np.testing.assert_array_equal(got, right)


def _bias_inputs() -> tuple[Inputs, Array]:
    q, k, v, d_out = _arrays((2, 2), 3, 4)
    return Inputs(q, k, v, keywords={"bias": np.zeros((2, 1, 3, 4))}), d_out


@pytest.mark.parametrize(("returned", "words"), [
    (lambda *a, **kw: _impl_grads(*a, **kw)[:3], "returned 3 items, not (dq, dk, dv, extras)"),
    (lambda *a, **kw: (*_impl_grads(*a, **kw)[:3], [1]), "returned 4 items, not (dq, dk, dv, extras)"),
    (lambda *a, **kw: (*_impl_grads(*a, **kw)[:3], {}), "returned no dbias, though the call gave bias="),
    (lambda *a, **kw: (*_impl_grads(*a, **kw)[:3], {"dbias": np.zeros((2, 2, 3, 4))}),
     "dbias of shape (2, 2, 3, 4), expected (2, 1, 3, 4)"),
    (lambda *a, **kw: (*_impl_grads(*a, **kw)[:3], {"dbias": np.zeros((2, 1, 3, 4), np.float32)}),
     "dbias of dtype float32, expected float64"),
    (lambda *a, **kw: (*_impl_grads(*a, **kw), ), "returned 4 items"),
])
def test_extras_are_checked_against_what_they_are_the_gradient_of(returned, words):
    inputs, d_out = _bias_inputs()
    target = Target(attention, ndims=(4,), supports_bias=True, grad_fn=returned, grad_extras=("dbias",))
    if words == "returned 4 items":  # the right answer passes
        assert call_grad(target, inputs, d_out, deadline=30.0)[3]["dbias"].shape == (2, 1, 3, 4)
        return
    with pytest.raises(TargetFailed, match=re.escape(words)):
        call_grad(target, inputs, d_out, deadline=30.0)


def test_an_extra_for_a_keyword_not_given_or_not_declared_is_refused():
    inputs, d_out = _bias_inputs()
    plain = inputs.replace(bias=None)
    target = Target(attention, ndims=(4,), supports_bias=True, supports_sinks=True, grad_extras=("dbias",),
                    grad_fn=lambda *a, **kw: (*_impl_grads(*a, **kw)[:3], {"dbias": np.zeros((2, 1, 3, 4))}))
    with pytest.raises(TargetFailed, match="returned dbias though the call gave no bias="):
        call_grad(target, plain, d_out, deadline=30.0)
    target = target.replace(grad_fn=lambda *a, **kw: (*_impl_grads(*a, **kw)[:3], {"dsinks": np.zeros(2)}))
    with pytest.raises(TargetFailed, match="'dsinks' among its extras, which the target does not declare"):
        call_grad(target, plain, d_out, deadline=30.0)
    target = target.replace(grad_fn=lambda *a, **kw: (*_impl_grads(*a, **kw)[:3], {"dsinks": None}))
    assert call_grad(target, plain, d_out, deadline=30.0)[3] == {}  # None: not returned


def test_residuals_are_passed_in_the_targets_layout_and_a_grad_fn_without_them_is_told_the_fix():
    from impl import flash_attention

    seen: dict[str, Any] = {}
    q, k, v, d_out = _arrays((2, 3), 4, 5)

    def to_bnhd(x: Array) -> Array:
        return np.ascontiguousarray(np.swapaxes(x, 1, 2))

    def grad_fn(q, k, v, d_out, *, out=None, lse=None, **kw):
        seen.update(out=None if out is None else out.shape, lse=None if lse is None else lse.shape)
        return tuple(to_bnhd(g) for g in attention_backward(*(to_bnhd(x) for x in (q, k, v, d_out)), **kw))

    def forward(q, k, v, **kw):
        got = flash_attention(*(to_bnhd(x) for x in (q, k, v)), **kw)
        return (to_bnhd(got[0]), got[1]) if kw.get("return_lse") else to_bnhd(got)

    target = Target(forward, layout="bnhd", ndims=(4,), returns_lse=True, grad_fn=grad_fn,
                    grad_takes_residuals=True)
    inputs = Inputs(q, k, v)
    out, lse = call(target, inputs.replace(return_lse=True), deadline=30.0)
    call_grad(target, inputs, d_out, residuals=(out, lse), deadline=30.0)
    assert seen == {"out": (2, 4, 3, 2), "lse": (2, 3, 4)}

    def no_residuals(q, k, v, d_out, *, causal=False):
        return attention_backward(q, k, v, d_out, causal=causal)

    hint = r"does not take the keyword out=.*grad_takes_residuals=False"
    with pytest.raises(SignatureMismatch, match=hint):
        call_grad(target.replace(grad_fn=no_residuals), inputs, d_out, residuals=(out, lse), deadline=30.0)


# --- adapters: grad_fn by autograd and by jax.vjp -------------------------------------------------


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
