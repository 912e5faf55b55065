"""spec.oracle at chosen query rows: its golden, expectation, visibility and backward at some rows
equal the full oracle's restricted to those rows, for every keyword the suite declares (drawn as
the laws draw them) in each causal alignment; the golden's own ``rows``; and mutants of the rows
(terms read one row off, the other alignment) are told apart."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spec import dtypes, golden, oracle
from spec.builtin import load_target
from spec.cases import cases
from spec.inputs import Inputs
from spec.keywords import registered
from spec.sampled import sample_rows, upstream

REFERENCE = load_target("reference")
ALIGNMENTS = ("top_left", "bottom_right", "kv_lengths")


def assert_rows_match(inputs: Inputs, rows: np.ndarray, align: str) -> None:
    """The golden at ``rows`` is the full golden's rows (out, weights, lse), and so is what they see."""
    out, weights, lse = oracle.golden_of(inputs, align)
    got_out, got_weights, got_lse = oracle.golden_of(inputs, align, rows=rows)
    np.testing.assert_allclose(got_out, out[..., rows, :], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got_weights, weights[..., rows, :], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(lse[..., rows]))
    finite = np.isfinite(lse[..., rows])
    np.testing.assert_allclose(got_lse[finite], lse[..., rows][finite], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(oracle.visibility(align, inputs, rows),
                                  oracle.visibility(align, inputs)[..., rows, :])


def assert_expected_match(target, inputs: Inputs, rows: np.ndarray) -> None:
    """The expectation at ``rows`` is the full one's rows: golden, baseline, seen; its floor at most
    the full one's."""
    want, got = oracle.expected(target, inputs), oracle.expected(target, inputs, rows=rows)
    np.testing.assert_allclose(got.out, want.out[..., rows, :], rtol=1e-12, atol=1e-14)
    base, full = got.baseline.astype(np.float64), want.baseline[..., rows, :].astype(np.float64)
    both = np.isfinite(full)
    np.testing.assert_array_equal(np.isfinite(base), both)
    # the baseline is the naive computation in the inputs' dtype: computed over other rows, its products
    # and sums may be ordered apart (BLAS blocking; NumPy's float16 loops), so the two may differ by as much
    # as each lies from the golden (seen: 4 ulps of float16 at 0.14 over 36 keys with alibi; 30 ulps of
    # float32 with d_k = 115 at scale 1), never more; the golden beside it is held to 1e-12
    magnitude = max(1.0, np.abs(full[both]).max(initial=0.0))
    spread = np.abs(full[both] - want.out[..., rows, :][both]).max(initial=0.0)
    np.testing.assert_allclose(base[both], full[both], rtol=0, atol=2 * spread + 16 * dtypes.eps(
        got.baseline.dtype) * magnitude)
    np.testing.assert_array_equal(got.seen, want.seen[..., rows])
    assert got.floor <= want.floor * (1 + 1e-12) and (got.floor > 0 or want.floor == 0)
    np.testing.assert_array_equal(got.rows, rows)


def assert_gradients_match(target, inputs: Inputs, rows: np.ndarray) -> None:
    """The backward of an upstream gradient zero off ``rows``, at those rows, is the full one."""
    d_out = upstream(inputs, rows)
    want = oracle.gradients(target, inputs, d_out)
    got = oracle.gradients(target, inputs, d_out, rows=rows)
    np.testing.assert_allclose(got.golden["dq"], want.golden["dq"][..., rows, :], rtol=1e-10, atol=1e-12)
    for name in ("dk", "dv"):
        np.testing.assert_allclose(got.golden[name], want.golden[name], rtol=1e-10, atol=1e-12, err_msg=name)
        assert got.floors[name] <= want.floors[name] * (1 + 1e-12)


def _rows(n_q: int, data: st.DataObject) -> np.ndarray:
    extra = data.draw(st.lists(st.integers(0, max(0, n_q - 1)), max_size=3))
    return sample_rows(n_q, extra=extra, random=2, seed=data.draw(st.integers(0, 9)))


DRAWN = sorted(name for name, kw in registered().items() if kw.draw is not None)
"""Every keyword a case draws (``return_lse``'s laws build their own cases; it changes no number)."""


@pytest.mark.parametrize("keyword", DRAWN)
@pytest.mark.parametrize("align", ALIGNMENTS)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_the_oracle_at_rows_equals_the_full_oracle_for_every_keyword(keyword, align, data):
    target = REFERENCE.replace(causal_alignment=align)
    kw = registered()[keyword]
    case = data.draw(cases(target, n_max=40, masks=("none", "random", "rows"), keywords=(kw,), scale=True))
    inputs = case.inputs()
    rows = _rows(inputs.n_q, data)
    assert_rows_match(inputs, rows, align)
    assert_expected_match(target, inputs, rows)
    if all(isinstance(term, oracle.BACKWARD_TERMS) for _, term, _ in oracle.bound(inputs)):
        assert_gradients_match(target, inputs, rows)


@pytest.mark.parametrize("align", ALIGNMENTS)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_the_oracle_at_rows_with_several_keywords_and_grouped_heads(align, data):
    target = REFERENCE.replace(causal_alignment=align)
    kws = tuple(registered()[n] for n in ("window", "softcap", "sinks", "kv_lengths", "alibi", "bias"))
    case = data.draw(cases(target, ndims=(4,), n_max=30, gqa=True, masks=("none", "random"), keywords=kws))
    inputs = case.inputs()
    rows = _rows(inputs.n_q, data)
    assert_rows_match(inputs, rows, align)
    assert_expected_match(target, inputs, rows)
    assert_gradients_match(target, inputs, rows)


def _packed() -> Inputs:
    """Three packed sequences (5, 0 and 4 queries over 3, 2 and 6 keys), two heads."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, n, 3)) for n in (9, 11, 11))
    return Inputs(q, k, v, causal=True, keywords={"cu_seqlens_q": np.array([0, 5, 5, 9]),
                                                    "cu_seqlens_k": np.array([0, 3, 5, 11])})


def test_the_rows_mutants_are_told_apart(monkeypatch):
    """Reading each term one row off, or cutting the diagonals to the wrong rows, or taking the other
    alignment, no longer equals the full golden."""
    inputs, rows = _packed(), np.array([0, 4, 5, 8])
    assert_rows_match(inputs, rows, "bottom_right")
    with pytest.raises(AssertionError):  # the other alignment
        np.testing.assert_allclose(oracle.golden_of(inputs, "top_left", rows=rows)[0],
                                   oracle.golden_of(inputs, "bottom_right")[0][..., rows, :])
    real = oracle.geometry

    def off_by_one(align, inputs, rows=None):
        return real(align, inputs, None if rows is None else np.minimum(np.asarray(rows) + 1, inputs.n_q - 1))

    monkeypatch.setattr(oracle, "geometry", off_by_one)
    with pytest.raises(AssertionError):
        assert_rows_match(inputs, rows, "bottom_right")


def test_rows_must_increase_within_the_queries():
    inputs = _packed()
    for bad in ([3, 3], [4, 2], [-1], [9], [[0, 1]], [0.5]):
        with pytest.raises(ValueError, match="rows must"):
            oracle.golden_of(inputs, "bottom_right", rows=np.array(bad))
    with pytest.raises(ValueError, match="zero outside the rows"):
        oracle.gradients(REFERENCE, inputs, np.ones(inputs.out_shape), rows=np.array([0, 4]))


def test_the_goldens_rows_are_those_of_a_call_with_those_queries():
    """`spec.golden.forward` and `backward` at rows evaluate the queries given, with what those
    rows see: out, weights and lse are the full ones' rows; dq is the full dq's rows and dk, dv
    the full ones' for an upstream gradient zero elsewhere."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 7, 4)) for _ in range(3))
    visible = golden.causal_visible(7, 7)
    rows = np.array([1, 4, 6])
    out, weights, lse = golden.forward(q, k, v, visible=visible, scale=0.5)
    got = golden.forward(q, k, v, visible=visible[rows], scale=0.5, rows=rows)
    for whole, part in zip((out, weights, lse), got, strict=True):
        np.testing.assert_allclose(part, whole[..., rows, :] if whole.ndim == 3 else whole[..., rows],
                                   rtol=1e-13, atol=1e-15)
    d_out = np.zeros((2, 7, 4))
    d_out[:, rows] = rng.standard_normal((2, 3, 4))
    full = golden.backward(q, k, v, d_out, visible=visible, scale=0.5)
    part = golden.backward(q, k, v, d_out[:, rows], visible=visible[rows], scale=0.5, rows=rows)
    np.testing.assert_allclose(part.dq, full.dq[:, rows], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(part.dk, full.dk, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(part.dv, full.dv, rtol=1e-12, atol=1e-14)


def test_the_jacobian_applied_unformed_equals_the_formed_one(monkeypatch):
    """Past `spec.golden.JACOBIAN_ENTRIES` the backward applies each row's Jacobian without forming
    it: the same gradients, to rounding."""
    rng = np.random.default_rng(6)
    q, k, v, d_out = (rng.standard_normal((3, 9, 5)) for _ in range(4))
    visible = golden.causal_visible(9, 9, "bottom_right")
    terms = golden.Terms(sinks=np.array([0.5]))
    formed = golden.backward(q, k, v, d_out, visible=visible, scale=0.4, terms=terms)
    monkeypatch.setattr(golden, "JACOBIAN_ENTRIES", 0)
    applied = golden.backward(q, k, v, d_out, visible=visible, scale=0.4, terms=terms)
    for name in ("dq", "dk", "dv", "sinks"):
        np.testing.assert_allclose(getattr(applied, name), getattr(formed, name), rtol=1e-12, atol=1e-14)
