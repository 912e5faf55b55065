"""The edge of a dtype's range (spec.laws._range): the scores drawn reach it, and the laws that draw
scores and values up to it hand a target finite inputs only, whatever the drawn q, k and v."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import spec
from impl import attention
from spec import Target
from spec.cases import Case
from spec.dtypes import finfo, has_ml_dtypes
from spec.laws._range import score_edge

EDGE_LAWS = ["large_logits", "large_values", "masked_rows_policy", "mask_semantics",
             "padding_mask_is_truncation", "bottom_right_causal_mask", "softcap_bounds_scores"]
"""Every law whose cases are drawn at the edge (`at_edge`, `values_at_edge`)."""

TARGETS = {
    "float16-float64": Target(attention, dtypes=("float16", "float32", "float64"), supports_mask=True,
                              supports_scale=True, supports_softcap=True),
    "float64 computed in float32": Target(attention, dtypes=("float32", "float64"), supports_mask=True,
                                          computes={"float64": "float32"}, supports_softcap=True),
}
if has_ml_dtypes():
    TARGETS["bfloat16"] = Target(attention, dtypes=("bfloat16",), supports_mask=True, supports_softcap=True)


def tiny_case(dtype: str = "float64") -> Case:
    """One query, one key, one width, whose q·k is 0.026 and whose value is 0.099: the factor
    edge / P overflows float64 for both (the case of the first false alarm, seed 4294967294)."""
    return Case(dtype=dtype, ndim=2, batch=1, heads=1, n_q=1, n_k=1, d_k=1, d_v=1, seed=4294967294)


@pytest.mark.parametrize("law", EDGE_LAWS)
@pytest.mark.parametrize("name", list(TARGETS))
def test_cases_drawn_at_the_edge_are_finite(law, name):
    target = TARGETS[name]
    assert spec.LAWS[law].needs(target) is None

    @settings(max_examples=150, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(spec.LAWS[law].strategy(target))
    def finite(case):
        inputs = case.inputs()
        for which, x in (("q", inputs.q), ("k", inputs.k), ("v", inputs.v)):
            assert np.isfinite(x.astype(np.float64)).all(), (which, case)

    finite()


def test_large_values_of_tiny_drawn_values_are_finite_at_the_edge():
    target = Target(attention)
    (case,) = [c for c in [tiny_case()] if np.max(np.abs(c.arrays()[2])) < 1 / 4]
    edge = spec.laws._range.values_at_edge(target, case)
    v = edge.arrays()[2]
    assert np.isfinite(v).all() and float(np.max(np.abs(v))) == float(finfo("float64").max) / 4
    spec.replay(target, "large_values", **edge.describe())  # the reference conforms on it


def test_scores_of_tiny_drawn_products_reach_the_edge_finite():
    target = Target(attention)
    case = tiny_case()
    edge = spec.laws._range.score_edge(target, case, scale=1.0)
    q, k, _ = case.replace(score_max=edge).arrays()
    assert np.isfinite(q).all() and np.isfinite(k).all()
    assert float(np.abs(q @ k.T).max()) == pytest.approx(float(finfo("float64").max) / 4, rel=1e-12)
    for law in ("large_logits", "masked_rows_policy"):
        spec.replay("reference", law, **case.replace(score_max=edge).describe())


def test_the_edge_keeps_q_and_k_within_the_dtype_when_one_is_far_smaller():
    """Seed 1514235 draws q = 2.08 and k = −1.47e-6: reaching float16's score edge by scaling both
    alike would take q to 1.2e5, past float16's 65504 (inf handed to a correct target)."""
    case = Case(dtype="float16", ndim=2, batch=1, heads=1, n_q=1, n_k=1, d_k=1, d_v=1, seed=1514235)
    q, k, _ = case.arrays()
    assert abs(float(q[0, 0])) > 2 and abs(float(k[0, 0])) < 2e-6
    target = Target(attention, dtypes=("float16",))
    edge = spec.laws._range.score_edge(target, case, scale=1.0)
    q, k, _ = case.replace(score_max=edge).arrays()
    assert np.isfinite(q).all() and np.isfinite(k).all()
    assert max(abs(float(q[0, 0])), abs(float(k[0, 0]))) <= float(finfo("float16").max) / 2 * 1.001


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
