"""One call path (spec.calling) for forward, forward-with-lse and gradients, and the keyword
plumbing of Target: each keyword passed only when given, refused unless declared."""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest

import spec
from impl import attention
from spec.call import call, call_grad, invoke
from spec.inputs import Inputs
from spec.target import Target, TargetError, TargetFailed


def _q_k_v(lead=(), n_q=3, n_k=4, d=2):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((*lead, n, d)) for n in (n_q, n_k, n_k))


def test_grad_fn_calling_sys_exit_is_a_failure_naming_the_law():
    """Before: the gradient path caught only Exception, so sys.exit(3) ended the whole run."""

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


def test_caller_isolation_runs_in_the_callers_thread():
    threads = []

    def fn(q, k, v):
        threads.append(threading.current_thread())
        return attention(q, k, v)

    q, k, v = _q_k_v()
    call(Target(fn, isolation="caller"), Inputs(q, k, v), deadline=5.0)
    call(Target(fn), Inputs(q, k, v), deadline=5.0)
    assert threads[0] is threading.current_thread() and threads[1] is not threading.current_thread()


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


def _as_list(q, k, v, *, causal=False):
    return attention(q, k, v, causal=causal).tolist()


@pytest.mark.parametrize("isolation", ["thread", "caller", "process"])
def test_a_list_returned_is_called_a_list(isolation):
    """Before: NumPy read the list as float64, and the report said "output dtype is float64, inputs
    are float32" of a function that computed in float32."""
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
