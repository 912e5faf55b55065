"""spec.call, the one call into a target for the forward, the forward with its lse and the
gradients: each keyword passed only when given and refused unless declared, in the target's
layout; what comes back checked (shape, dtype, a list named as a list, the gradient extras); the
target given its own copy of the inputs; grad_fn called with every forward keyword and the
forward's residuals."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import numpy as np
import pytest

import spec
from impl import attention
from impl.grad import attention_backward
from spec.call import call, call_grad, invoke
from spec.cases import Case
from spec.inputs import Inputs
from spec.signature import SignatureMismatch
from spec.target import Target, TargetError, TargetFailed


def _q_k_v(lead=(), n_q=3, n_k=4, d=2):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((*lead, n, d)) for n in (n_q, n_k, n_k))


def _only(target, name="matches_golden", **kw):
    (result,) = spec.check(target, profile="quick", only=[name], **kw).results
    return result


def test_grad_fn_calling_sys_exit_is_a_failure_naming_the_law():
    """A grad_fn that calls sys.exit fails its law, naming SystemExit, and the run goes on: the
    gradient path guards every exception as the forward's does, not only Exception's subclasses."""

    def exits(q, k, v, d_out, *, causal=False):
        sys.exit(3)

    report = spec.check(Target(attention, grad_fn=exits), profile="quick", only=["grad_matches_golden"])
    (result,) = report.results
    assert (result.name, result.status) == ("grad_matches_golden", "fail")
    assert "grad_fn raised SystemExit: 3" in result.message


def test_forward_and_gradient_share_the_guarded_path():
    def exits(*args, **kwargs):
        sys.exit(4)

    q, k, v = _q_k_v()
    with pytest.raises(TargetFailed, match="the target raised SystemExit: 4"):
        call(Target(exits), Inputs(q, k, v), deadline=5.0)
    with pytest.raises(TargetFailed, match="grad_fn raised SystemExit: 4"):
        call_grad(Target(attention, grad_fn=exits), Inputs(q, k, v), np.ones((3, 2)), deadline=5.0)


def test_a_keyword_is_passed_only_when_given_and_refused_unless_declared():
    seen = {}

    def fn(q, k, v, **kwargs):
        seen.update(kwargs)
        return attention(q, k, v)

    q, k, v = _q_k_v()
    call(Target(fn, supports_softcap=True), Inputs(q, k, v, keywords={"softcap": None, "bias": None}),
         deadline=5.0)
    assert seen == {}
    call(Target(fn, supports_softcap=True), Inputs(q, k, v, keywords={"softcap": 30.0}), deadline=5.0)
    assert seen == {"softcap": 30.0}
    with pytest.raises(TargetError, match="bias= needs supports_bias=True"):
        call(Target(fn), Inputs(q, k, v, keywords={"bias": np.zeros((3, 4))}), deadline=5.0)
    with pytest.raises(TargetError, match="unknown keyword 'is_causal'"):
        call(Target(fn), Inputs(q, k, v, keywords={"is_causal": True}), deadline=5.0)


def _paged_case(**keywords):
    fields = dict(dtype="float32", ndim=4, batch=2, heads=2, n_q=3, n_k=7, d_k=4, d_v=2, seed=5)
    return Case(**fields, keywords={"kv_lengths": (7, 2), "paged": (3, "nan")} | keywords)


def test_kv_lengths_reaches_a_target_only_with_a_block_table_when_it_declares_no_kv_lengths():
    target = Target(attention, ndims=(4,), supports_paged_kv=True)
    case = _paged_case()
    assert set(spec.call.arguments(target, case.inputs())) == {"block_table", "kv_lengths"}
    with pytest.raises(TargetError, match="kv_lengths= needs supports_kv_lengths=True"):
        spec.call.arguments(target, case.inputs().replace(block_table=None))


def test_return_lse_gives_out_and_lse_and_checks_the_lse_shape():
    q, k, v = _q_k_v((2, 3))

    def with_lse(q, k, v, *, return_lse=False):
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
        lse = np.log(np.sum(np.exp(s), axis=-1))
        return attention(q, k, v), (lse if return_lse else None)

    out, lse = call(Target(with_lse, returns_lse=True), Inputs(q, k, v, keywords={"return_lse": True}),
                    deadline=5.0)
    assert out.shape == (2, 3, 3, 2) and lse.shape == (2, 3, 3)
    gold = spec.golden.forward(q, k, v, visible=np.ones((3, 4), bool), scale=2**-0.5)
    np.testing.assert_allclose(lse, gold[2], rtol=1e-12)

    def wrong_lse(q, k, v, *, return_lse=False):
        return attention(q, k, v), np.zeros((*q.shape[:-1], 1))

    with pytest.raises(TargetFailed, match=r"lse of shape \(2, 3, 3, 1\), expected \(2, 3, 3\)"):
        call(Target(wrong_lse, returns_lse=True), Inputs(q, k, v, keywords={"return_lse": True}),
             deadline=5.0)


def test_packed_inputs_are_heads_first_and_bnhd_sees_tokens_first():
    got = {}

    def fn(q, k, v, *, cu_seqlens_q, cu_seqlens_k):
        got["shape"] = q.shape
        return np.zeros((q.shape[0], q.shape[1], v.shape[-1]))

    q, k, v = _q_k_v((2,), n_q=5, n_k=5)  # (heads, total, d)
    cu = np.array([0, 2, 5])
    out = call(Target(fn, layout="bnhd", supports_varlen=True, ndims=(3,)),
               Inputs(q, k, v, keywords={"cu_seqlens_q": cu, "cu_seqlens_k": cu}), deadline=5.0)
    assert got["shape"] == (5, 2, 2) and out.shape == (2, 5, 2)


def test_isolation_and_keyword_fields_are_validated():
    with pytest.raises(TargetError, match="isolation must be one of"):
        Target(attention, isolation="fork")
    with pytest.raises(TargetError, match="supports_bias must be True or False"):
        Target(attention, supports_bias="yes")
    # Any zero-argument callable runs in process mode too (a one-off fork that inherits it).
    assert invoke(Target(attention, isolation="process"), "the target", os.getpid, 5.0) != os.getpid()


def _keyword_attention(q, k, v, *, causal=False, bias=None, softcap=None, sinks=None, window=None):
    """A direct NumPy forward that takes the keywords of real kernels (float64 inside, cast back)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]  # top-left: query i's diagonal is key i
    vis = (j <= i if causal else True) & ((j >= i - window[0]) & (j <= i + window[1]) if window else True)
    s = (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)) / np.sqrt(q.shape[-1])
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    s = np.where(vis, s, -np.inf)
    sink = np.full(s.shape[:-1], -np.inf) if sinks is None else np.broadcast_to(sinks[:, None], s.shape[:-1])
    top = np.maximum(s.max(axis=-1), sink)
    e = np.exp(s - top[..., None])
    p = e / (e.sum(axis=-1) + np.exp(sink - top))[..., None]
    return (p @ v.astype(np.float64)).astype(q.dtype)


KEYWORD_CASE = dict(dtype="float32", ndim=3, batch=1, heads=2, n_q=4, n_k=6, d_k=4, d_v=3, seed=1,
                    causal=True, bias=(1.0, ""), softcap=2.0, sinks=(0.5, -0.5), window=(2, 1))


def test_case_keywords_reach_the_target_and_the_golden():
    """matches_golden passes on a correct keyword target and fails on one that drops the bias."""
    declared = dict(supports_bias=True, supports_softcap=True, supports_sinks=True, supports_window=True,
                    ndims=(3,))
    spec.replay(Target(_keyword_attention, **declared), "matches_golden", **KEYWORD_CASE)

    def drops_bias(q, k, v, *, bias=None, **kwargs):
        return _keyword_attention(q, k, v, **kwargs)

    with pytest.raises(AssertionError, match="differs from the float64 golden"):
        spec.replay(Target(drops_bias, **declared), "matches_golden", **KEYWORD_CASE)


# --- what comes back is checked, and what goes in is the target's own copy -----------------------


def test_a_target_returning_the_wrong_shape_is_reported_not_crashed_on():
    def first_row_only(q, k, v, *, causal=False):
        return attention(q, k, v, causal=causal)[..., :1, :]

    report = spec.check(first_row_only, profile="quick", only=["output_shape_dtype", "matches_golden"])
    assert [r.status for r in report.results] == ["fail", "fail"]
    assert all("returned shape" in r.message for r in report.results)


@pytest.mark.parametrize("returned", [None, "text", [[1, 2]]])
def test_a_target_returning_a_non_array_fails(returned):
    result = _only(lambda q, k, v, causal=False: returned, "output_shape_dtype")
    assert result.status == "fail"


def _as_list(q, k, v, *, causal=False):
    return attention(q, k, v, causal=causal).tolist()


@pytest.mark.parametrize("isolation", ["thread", "caller", "process"])
def test_a_list_returned_is_called_a_list(isolation):
    """A list is named as a list, in every isolation: NumPy reads it as float64, and "output dtype is
    float64, inputs are float32" said of a function that computed in float32 would send its author
    after the wrong bug."""
    (result,) = spec.check(Target(_as_list, isolation=isolation), profile="quick",
                           only=["output_shape_dtype"]).results
    assert result.status == "fail"
    assert result.message == ("the target returned its output as a list, which NumPy reads as float64 (the "
                              "inputs are float32): return a NumPy array in the inputs' dtype "
                              "(np.asarray(out, dtype=q.dtype))")


def test_an_lse_returned_as_a_list_is_named_too():
    def lse_as_list(q, k, v, *, return_lse=False):
        return attention(q, k, v), [0.0] * q.shape[-2]

    q, k, v = (x.astype(np.float32) for x in _q_k_v())
    with pytest.raises(TargetFailed, match="the target returned lse as a list, which NumPy reads as float64"):
        call(Target(lse_as_list, returns_lse=True), Inputs(q, k, v, keywords={"return_lse": True}),
             deadline=5.0)


def test_a_ragged_list_is_named():
    def ragged(q, k, v, *, causal=False):
        return [[0.0], [0.0, 1.0]]

    q, k, v = _q_k_v()
    with pytest.raises(TargetFailed, match="returned its output as a list NumPy cannot read as an array"):
        call(Target(ragged), Inputs(q, k, v), deadline=5.0)


def as_lists(q, k, v, *, causal=False):
    return attention(q, k, v, causal=causal).tolist()


def test_an_array_like_return_is_accepted():
    result = _only(spec.Target(as_lists, dtypes=("float64",)), "convex_combination")
    assert result.status == "pass", result.message


def test_a_list_is_not_silently_widened_to_float64():
    result = _only(spec.Target(as_lists, dtypes=("float32",)), "convex_combination")
    assert result.status == "fail"
    assert "returned its output as a list, which NumPy reads as float64" in result.message


def test_a_mutating_target_does_not_corrupt_other_properties():
    def mutating(q, k, v, *, causal=False):
        out = attention(q, k, v, causal=causal)
        q[...] = 0
        return out

    report = spec.check(mutating, profile="quick")
    assert [r.name for r in report.failures] == ["inputs_not_mutated"]


# --- calling grad_fn: every forward keyword, layouts, the extras, the forward's residuals -----------


Array = np.ndarray


def _arrays(lead: tuple[int, ...], n_q: int, n_k: int, d: int = 3, *, kv_lead: tuple[int, ...] | None = None,
            seed: int = 0) -> tuple[Array, Array, Array, Array]:
    rng = np.random.default_rng(seed)
    kv = lead if kv_lead is None else kv_lead
    return (rng.standard_normal((*lead, n_q, d)), rng.standard_normal((*kv, n_k, d)),
            rng.standard_normal((*kv, n_k, 2)), rng.standard_normal((*lead, n_q, 2)))


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
