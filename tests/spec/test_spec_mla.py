"""MLA in the suite: ``qv=`` (`spec.keywords.qv`, a `Widens` term) and ``Target(v_from_k=True)``.

The oracle's qv golden against scores written from the definition, its gradients (dq, dk, dv,
dqv) against finite differences of that golden, the folded dk of a latent call, the calling
layer's ``v=None, d_v=``, the declarations refused, the MLA shapes drawn, and the correct NumPy
MLA targets of the gallery conforming at ``ci``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gallery import mla
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

import spec
from spec import oracle
from spec.call import call, call_grad
from spec.cases import Case, cases, is_latent, outside_limits
from spec.inputs import Inputs
from spec.keywords.qv import MLA_D_K, MLA_D_V, QV
from spec.target import Target, TargetError, TargetFailed

RNG = np.random.default_rng(7)


def _qv_inputs(*, heads=2, kv_heads=2, n_q=3, n_k=5, d_k=4, d_v=3, scale=0.7, causal=False):
    q = RNG.standard_normal((1, heads, n_q, d_k))
    k = RNG.standard_normal((1, kv_heads, n_k, d_k))
    v = RNG.standard_normal((1, kv_heads, n_k, d_v))
    qv = RNG.standard_normal((1, heads, n_q, d_v))
    return Inputs(q, k, v, causal=causal, scale=scale, keywords={"qv": qv})


def _definition(inputs):  # -> [..., n_q, d_v]: softmax(scale · (q kᵀ + qv vᵀ)) v, loops over the heads
    q, k, v, qv = inputs.q, inputs.k, inputs.v, inputs.get("qv")
    out = np.zeros((*q.shape[:-1], v.shape[-1]))
    group = q.shape[1] // k.shape[1]
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            kh, vh = k[b, h // group], v[b, h // group]
            s = inputs.scale * (q[b, h] @ kh.T + qv[b, h] @ vh.T)
            if inputs.causal:
                s = np.where(np.arange(s.shape[1]) <= np.arange(s.shape[0])[:, None], s, -np.inf)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            out[b, h] = (p / p.sum(axis=-1, keepdims=True)) @ vh
    return out


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_qv_golden_is_the_definition(kv_heads, causal):
    inputs = _qv_inputs(kv_heads=kv_heads, causal=causal)
    np.testing.assert_allclose(oracle.golden_of(inputs)[0], _definition(inputs), rtol=1e-12, atol=1e-12)


def test_qv_of_zeros_is_no_qv_and_qv_moves_the_golden():
    inputs = _qv_inputs()
    zero = inputs.replace(qv=np.zeros_like(inputs.get("qv")))
    plain = inputs.replace(qv=None)
    np.testing.assert_allclose(oracle.golden_of(zero)[0], oracle.golden_of(plain)[0], rtol=1e-13, atol=1e-13)
    assert np.max(np.abs(oracle.golden_of(inputs)[0] - oracle.golden_of(plain)[0])) > 0.05


def test_the_floor_counts_products_of_d_k_plus_d_v_terms():
    inputs = _qv_inputs(d_k=4, d_v=64)
    target = Target(mla.forward, supports_qv=True, supports_scale=True, ndims=(4,))
    plain = inputs.replace(qv=None)
    assert oracle.expected(target, inputs).floor > oracle.expected(target, plain).floor


def _numeric(f, x, eps=1e-6):  # central differences of a scalar f at every entry of x
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = eps
        grad[i] = (f(x + step) - f(x - step)) / (2 * eps)
    return grad


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_qv_gradients_are_the_derivatives_of_the_golden(kv_heads):
    """dq, dk, dv and dqv of Σ out ∘ dO, against central differences of the golden forward: dv
    includes the part through the scores, dqv is among the extras."""
    inputs = _qv_inputs(kv_heads=kv_heads, causal=True)
    d_out = RNG.standard_normal((1, 2, 3, 3))
    target = Target(mla.forward, supports_qv=True, supports_scale=True, supports_gqa=True, ndims=(4,))
    got = oracle.gradients(target, inputs, d_out).golden
    assert set(got) == {"dq", "dk", "dv", "dqv"}
    for name, arg in (("dq", "q"), ("dk", "k"), ("dv", "v"), ("dqv", "qv")):
        x = inputs.get("qv") if arg == "qv" else getattr(inputs, arg)

        def loss(x, arg=arg):
            changed = inputs.replace(**{arg: x})
            return float(np.sum(oracle.golden_of(changed)[0] * d_out))

        np.testing.assert_allclose(got[name], _numeric(loss, x), rtol=1e-6, atol=1e-7, err_msg=name)


def test_a_latent_backward_folds_dv_into_dk():
    """For a v_from_k target the golden dk is the latent's: dk with dv added into its first d_v
    columns (the derivative through both uses of k), and dv is zeros."""
    k = RNG.standard_normal((2, 6, 5))
    inputs = Inputs(RNG.standard_normal((2, 3, 5)), k, k[..., :3], scale=0.5)
    d_out = RNG.standard_normal((2, 3, 3))
    plain = Target(mla.forward, supports_scale=True, ndims=(3,))
    latent = plain.replace(v_from_k=True)
    split, folded = oracle.gradients(plain, inputs, d_out), oracle.gradients(latent, inputs, d_out)
    want = split.golden["dk"].copy()
    want[..., :3] += split.golden["dv"]
    np.testing.assert_allclose(folded.golden["dk"], want, rtol=1e-13)
    assert not folded.golden["dv"].any() and folded.floors["dv"] == 0

    def loss(x):
        return float(np.sum(oracle.golden_of(Inputs(inputs.q, x, x[..., :3], scale=0.5))[0] * d_out))

    np.testing.assert_allclose(folded.golden["dk"], _numeric(loss, k), rtol=1e-6, atol=1e-7)


def test_a_qv_of_the_wrong_shape_is_refused_naming_it():
    inputs = _qv_inputs()
    with pytest.raises(ValueError, match="qv"):
        oracle.golden_of(inputs.replace(qv=np.zeros((1, 2, 3, 4))))


# --- declarations -----------------------------------------------------------------------------


def test_qv_without_scale_is_refused_naming_both():
    with pytest.raises(TargetError, match=r"supports_qv.*supports_scale"):
        Target(mla.forward, supports_qv=True)


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_v_from_k_must_be_a_bool(bad):
    with pytest.raises(TargetError, match="v_from_k"):
        Target(mla.forward, v_from_k=bad)


def test_v_from_k_needs_widths_with_d_v_at_most_d_k(monkeypatch):
    from spec import target as target_module

    assert target_module.v_from_k_widths(Target(mla.forward, head_dims=(64, 128))) == [(64, 64), (128, 64),
                                                                                      (128, 128)]
    assert target_module.v_from_k_widths(Target(mla.forward, head_dims=(64, 128), equal_head_dims=True)) == [
        (64, 64), (128, 128)]
    monkeypatch.setattr(target_module, "v_from_k_widths", lambda t: [])
    with pytest.raises(TargetError, match="v_from_k"):
        Target(mla.forward, v_from_k=True, head_dims=(64,))


# --- the calling layer --------------------------------------------------------------------------


def _latent_inputs(d_k=5, d_v=3):
    k = RNG.standard_normal((4, d_k)).astype(np.float32)
    return Inputs(RNG.standard_normal((2, d_k)).astype(np.float32), k, k[..., :d_v], scale=0.5)


def test_a_latent_target_is_called_with_v_none_and_d_v():
    seen = {}

    def fn(q, k, v, **kw):
        seen.update(v=v, **kw)
        return mla.forward(q, k, v, **kw)

    target = Target(fn, v_from_k=True, supports_scale=True)
    inputs = _latent_inputs()
    out = call(target, inputs)
    assert seen["v"] is None and seen["d_v"] == 3
    np.testing.assert_allclose(out, oracle.golden_of(inputs)[0], rtol=1e-5)


def test_a_call_whose_v_is_not_the_prefix_lies_outside_the_declarations():
    target = Target(mla.forward, v_from_k=True, supports_scale=True)
    inputs = _latent_inputs()
    assert is_latent(inputs) and not is_latent(inputs.replace(v=inputs.v + 1))
    assert outside_limits(target, inputs) is None
    assert outside_limits(target, inputs.replace(v=inputs.v + 1)) == "v_from_k"
    assert outside_limits(target.replace(v_from_k=False), inputs.replace(v=inputs.v + 1)) is None


def test_a_latent_backward_returns_dk_and_none():
    target = mla.latent_target(dtypes=("float32",))
    inputs = _latent_inputs()
    d_out = RNG.standard_normal((2, 3)).astype(np.float32)
    dq, dk, dv, extras = call_grad(target, inputs, d_out)
    want = oracle.gradients(target, inputs, d_out).golden
    np.testing.assert_allclose(dq, want["dq"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dk, want["dk"], rtol=1e-4, atol=1e-5)
    assert not dv.any() and extras == {}

    def returns_dv(q, k, v, d_out, **kw):
        dq, dk, _, extras = mla.backward(q, k, v, d_out, **kw)
        return dq, dk, np.zeros((4, 3), np.float32), extras

    with pytest.raises(TargetFailed, match="v_from_k"):
        call_grad(target.replace(grad_fn=returns_dv), inputs, d_out)


# --- the cases ----------------------------------------------------------------------------------


FIND = settings(database=None, max_examples=300, phases=[Phase.generate], deadline=None,
                suppress_health_check=list(HealthCheck))


def _is_mla(case: Case) -> bool:
    return (case.d_k, case.d_v) == (MLA_D_K, MLA_D_V) and case.n_q <= 4 and case.n_k <= 64


def test_qv_cases_are_drawn_at_mla_shapes_many_heads_over_one():
    target = mla.mla_target()
    case = find(cases(target, keywords=(QV,), gqa=True, ndims=(4,)), _is_mla, settings=FIND)
    assert case.kv_heads == 1 and case.heads >= 16 and case.scale is not None


def test_a_target_whose_head_dims_exclude_mla_never_gets_them():
    target = mla.mla_target(head_dims=(8, 16))
    strategy = cases(target, keywords=(QV,), gqa=True)
    with pytest.raises(NoSuchExample):
        find(strategy, lambda c: c.d_k > 16 or c.d_v > 16, settings=FIND)


def test_a_latent_targets_cases_read_v_from_k():
    target = mla.latent_target()
    case = find(cases(target, keywords=(QV,), gqa=True), lambda c: c.d_v < c.d_k, settings=FIND)
    inputs = case.inputs()
    assert case.v_prefix and is_latent(inputs)
    np.testing.assert_array_equal(inputs.v, inputs.k[..., :case.d_v])


# --- conformance -------------------------------------------------------------------------------


MLA_LAWS = ["qv_matches_golden", "qv_zero_is_no_qv", "qv_scale_applied", "qv_with_causal",
            "qv_gradients_match_golden", "v_from_k_matches_golden", "v_from_k_reads_prefix",
            "v_from_k_gradients_match_golden", "grad_keywords_match_golden", "grad_matches_golden",
            "matches_golden"]


@pytest.mark.parametrize("make", [mla.mla_target, mla.latent_target], ids=["qv", "latent"])
def test_a_correct_numpy_mla_target_conforms_at_ci(make):
    report = spec.check(make(), profile="ci", only=MLA_LAWS, seed=5)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    ran = {r.name for r in report.results if r.status == "pass"}
    assert {"qv_matches_golden", "qv_gradients_match_golden"} <= ran
    assert make is mla.mla_target or {"v_from_k_matches_golden", "v_from_k_reads_prefix"} <= ran


def test_a_latent_target_skips_what_it_cannot_be_called_with_naming_v_from_k():
    """V = I (the pattern laws) is not any k's prefix: such laws are skipped, naming v_from_k."""
    report = spec.check(mla.latent_target(), profile="quick", only=["rows_sum_to_one"], seed=5)
    (result,) = report.results
    assert result.status == "skip" and "v_from_k" in result.message


def test_scale_is_passed_whenever_qv_is():
    target = mla.mla_target()
    case = find(cases(target, keywords=(QV,)), lambda c: True, settings=FIND)
    assert case.inputs().scale is not None
    assert math.isfinite(case.scale)


def _bnhd(fn):  # a bhnd function taking and returning (batch, n, heads, d): qv=, like q, swapped too
    def swapped(*arrays, **kw):
        moved = [None if a is None else np.swapaxes(a, 1, 2) for a in arrays]
        if kw.get("qv") is not None:
            kw["qv"] = np.swapaxes(kw["qv"], 1, 2)
        got = fn(*moved, **kw)
        if isinstance(got, tuple):  # a backward: (dq, dk, dv, extras)
            dq, dk, dv, extras = got
            return (*(None if g is None else np.swapaxes(g, 1, 2) for g in (dq, dk, dv)),
                    {name: np.swapaxes(g, 1, 2) for name, g in extras.items()})
        return np.swapaxes(got, 1, 2)
    return swapped


@pytest.mark.parametrize("latent", [False, True])
def test_qv_moves_with_q_in_a_bnhd_layout_forward_and_backward(latent):
    """qv is laid out as q: a bnhd target gets it (batch, n_q, heads, d_v), and its dqv is read back."""
    target = Target(_bnhd(mla.forward), name="mla_bnhd", layout="bnhd", grad_fn=_bnhd(mla.backward),
                    grad_extras=("dqv",), **(mla.QV | {"ndims": (4,), "v_from_k": latent}))
    report = spec.check(target, profile="ci", seed=3,
                        only=["qv_matches_golden", "qv_with_causal", "qv_gradients_match_golden"])
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert all(r.status == "pass" for r in report.results)


def test_a_latent_case_at_the_range_edge_scales_the_queries_alone():
    """Scores drawn to float64's edge for a latent target: q takes the whole factor, so the values
    (the keys' prefix) stay at their own scale and the golden's floor stays finite — scaling k
    too made V ~1e152 and the floor infinite, judging nothing."""
    from spec import oracle
    from spec.cases import Case

    case = Case(dtype="float64", ndim=2, batch=1, heads=1, n_q=5, n_k=5, d_k=3, d_v=2, seed=0,
                score_max=4.494232837155789e+304, v_prefix=True)
    inputs = case.inputs()
    assert np.abs(inputs.v).max() < 10 and np.abs(inputs.q).max() > 1e300
    target = spec.Target(lambda q, k, v, **kw: q, v_from_k=True)
    assert np.isfinite(oracle.expected(target, inputs).floor)
