"""The declarations of issue 10: causal_alignment="square_or_decoding", masked_rows="unmasked",
computes={"float64": "float32"}, long_rows_every_dtype on any rank, and the edge-of-range
amplitudes (spec.laws._range)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings

from impl import attention, causal_mask
from spec import Target, TargetError
from spec.cases import Case, cases
from spec.dtypes import finfo
from spec.laws._range import score_edge
from spec.runner import check

CAUSAL_LAWS = ["matches_golden", "causal_no_leak", "uniform_scores_average"]


@pytest.mark.parametrize(
    ("value", "message"),
    [([("float64", "float32")], "dict"), ({"float16": "float16"}, "not among the declared"),
     ({"float64": "float64"}, "narrower"), ({"float32": "float64"}, "narrower"),
     ({"float64": "int8"}, "narrower"),
     ({"float64": "nope"}, "dtype names")],
)
def test_bad_computes_is_refused_naming_the_field(value, message):
    with pytest.raises(TargetError, match="computes") as err:
        Target(attention, dtypes=("float32", "float64"), computes=value)
    assert message in str(err.value)


def test_new_choices_are_accepted_and_others_refused():
    t = Target(attention, causal_alignment="square_or_decoding", masked_rows="unmasked")
    assert t.alignment == "bottom_right" and t.causal_shape_ok(1, 7) and not t.causal_shape_ok(3, 7)
    with pytest.raises(TargetError, match="masked_rows"):
        Target(attention, masked_rows="unmask")


def _sdpa_like(q, k, v, *, causal=False):
    # transformers' SDPA path: is_causal only when n_q > 1 (top-left); one query sees every key.
    return attention(q, k, v, causal=causal and q.shape[-2] > 1)


@settings(max_examples=60, database=None)
@given(cases(Target(_sdpa_like, causal_alignment="square_or_decoding"), causal=(True,)))
def test_square_or_decoding_draws_only_the_defined_shapes(case):
    assert case.causal and case.n_q in (1, case.n_k)


def test_square_or_decoding_target_conforms_and_the_others_do_not():
    good = Target(_sdpa_like, name="sdpa-like", causal_alignment="square_or_decoding")
    report = check(good, "quick", only=CAUSAL_LAWS)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    for alignment in ("top_left", "bottom_right"):
        bad = check(good.replace(causal_alignment=alignment), "ci", only=["matches_golden"])
        assert not bad.ok, alignment


def _pico(q, k, v, *, causal=False, mask=None):
    # picoGPT: a finite -1e10 added where hidden; a fully hidden row then behaves as unmasked.
    keep = np.ones((q.shape[-2], k.shape[-2]), dtype=bool) if mask is None else mask
    if causal:
        keep = keep & causal_mask(q.shape[-2], k.shape[-2])
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]) + np.where(keep, 0.0, -1e10)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def test_unmasked_policy_fits_a_finite_fill_and_nothing_else():
    pico = Target(_pico, name="pico", dtypes=("float64",), supports_mask=True, masked_rows="unmasked")
    (result,) = check(pico, "ci", only=["masked_rows_policy"]).results
    assert result.status == "pass", result.message
    (result,) = check(pico.replace(masked_rows="zeros"), "ci", only=["masked_rows_policy"]).results
    assert result.status == "fail"
    zeros = Target(attention, name="zeros", dtypes=("float64",), supports_mask=True, masked_rows="unmasked")
    (result,) = check(zeros, "ci", only=["masked_rows_policy"]).results
    assert result.status == "fail" and "nothing masked" in result.message


def _float64_in_float32(q, k, v, *, causal=False):
    out = attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), causal=causal)
    return out.astype(q.dtype)


def test_computes_narrower_gets_the_narrower_tolerance_and_says_so():
    narrow = Target(_float64_in_float32, name="f64-in-f32", dtypes=("float64",))
    (result,) = check(narrow, "ci", only=["matches_golden"]).results
    assert result.status == "fail"
    declared = narrow.replace(computes={"float64": "float32"})
    (result,) = check(declared, "ci", only=["matches_golden"]).results
    assert result.status == "pass", result.message
    assert "error ratio float64 (computed in float32)" in result.observed


def _sequential_float16_4d(q, k, v, *, causal=False):
    w = attention(q.astype(np.float32), k.astype(np.float32), np.eye(k.shape[-2], dtype=np.float32),
                  causal=causal).astype(q.dtype)
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    for j in range(k.shape[-2]):  # one key at a time in float16
        out += w[..., :, j:j + 1] * v[..., j:j + 1, :]
    return out


def test_long_rows_run_on_a_four_d_only_target():
    (good,) = check(Target(attention, ndims=(4,)), "quick", only=["long_rows_every_dtype"]).results
    assert good.status == "pass" and good.examples > 0
    bad = Target(_sequential_float16_4d, name="seq-fp16-4d", dtypes=("float16",), ndims=(4,))
    (result,) = check(bad, "quick", only=["long_rows_every_dtype"]).results
    assert result.status == "fail" and "float16" in result.message


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_score_edge_reaches_the_edge_of_the_dtype(dtype):
    case = Case(dtype=dtype, ndim=2, batch=1, heads=1, n_q=16, n_k=16, d_k=64, d_v=4, seed=5)
    scale = 1 / 8
    edge = dataclasses.replace(case, score_max=score_edge(Target(attention), case, scale))
    q, k, _ = edge.arrays()
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    scaled = np.abs(q64 @ k64.T) * scale
    top = float(finfo(dtype).max) if dtype in ("float16", "bfloat16") else float(finfo(dtype).max) / 8
    assert np.isfinite(q64).all() and float(scaled.max()) <= float(finfo(dtype).max) / 2
    assert float(scaled.max()) >= top / 2 / 64  # within a factor √d_k·8 of the bound
    if dtype == "float16":  # q·kᵀ formed in float16 before the scale overflows (pytorch#60939)
        with np.errstate(over="ignore"):
            assert np.isinf(q @ k.T).any()
