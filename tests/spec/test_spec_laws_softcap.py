"""The softcap laws and the tolerance of a cap far above the scores: a tanh through exponentials,
off by about c·eps in each capped score, conforms at caps of 3e4–6e4; a cap ignored at small caps
and a tanh by exponentials that overflows to NaN are still rejected."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from spec import Target, oracle
from spec.inputs import Inputs
from spec.keywords.softcap import capped_error
from spec.runner import check

Array = np.ndarray


def _sinh_over_cosh(x: Array) -> Array:
    """tanh as (e^x − e^(−x))/(e^x + e^(−x)) in float32: inf/inf = NaN once |x| > 88.7."""
    with np.errstate(over="ignore", invalid="ignore"):
        e, inv = np.exp(x), np.exp(-x)
        return (e - inv) / (e + inv)


def _by_sigmoid(x: Array) -> Array:
    """tanh as 2σ(2x) − 1 in float32 (never NaN: σ saturates at 0 and 1)."""
    one = x.dtype.type(1)
    with np.errstate(over="ignore"):
        return 2 * (one / (one + np.exp(-2 * x))) - one


def _attention(tanh: Any, *, ignore_below: float = 0.0) -> Any:
    def fn(q: Array, k: Array, v: Array, *, causal: bool = False, softcap: Any = None,
           scale: Any = None) -> Array:
        f32 = np.float32
        s = (q.astype(f32) @ np.swapaxes(k.astype(f32), -1, -2)) * f32(
            1 / math.sqrt(q.shape[-1]) if scale is None else scale)
        if softcap is not None and softcap >= ignore_below:
            c = f32(softcap)
            s = c * tanh(s / c)
        if causal:
            s = np.where(np.tri(*s.shape[-2:], dtype=bool), s, -np.inf)
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        return ((e / e.sum(axis=-1, keepdims=True)) @ v.astype(f32)).astype(q.dtype)
    return fn


def _target(fn: Any, name: str) -> Target:
    return Target(fn, name=name, dtypes=("float32",), supports_scale=True, supports_softcap=True)


def _one(target: Target, law: str, **kw: Any) -> Any:
    (result,) = check(target, "ci", only=[law], **kw).results
    return result


@pytest.mark.parametrize("tanh", [_sinh_over_cosh, _by_sigmoid], ids=["sinh_over_cosh", "sigmoid"])
def test_softcap_by_exponentials_is_no_cap_far_above_the_scores(tanh):
    result = _one(_target(_attention(tanh), f"softcap-{tanh.__name__}"), "softcap_far_above_is_no_cap")
    assert result.status == "pass", result.message


@pytest.mark.parametrize("tanh", [_sinh_over_cosh, _by_sigmoid], ids=["sinh_over_cosh", "sigmoid"])
@pytest.mark.parametrize("cap", [3e4, 4.5e4, 6e4])
def test_a_cap_far_above_costs_its_rounding_and_the_law_allows_it(tanh, cap):
    """At a cap of 3e4–6e4 over scores of ~1 the exponentials are off by more than the floor
    without the cap's term (so the term is needed), and within it."""
    rng = np.random.default_rng(int(cap))
    q, k, v = (rng.standard_normal((2, 24, 16)).astype(np.float32) for _ in range(3))
    inputs = Inputs(q, k, v, keywords={"softcap": cap})
    out = _attention(tanh)(q, k, v, softcap=cap).astype(np.float64)
    want = oracle.expected(_target(_attention(tanh), "t"), inputs)
    error = float(np.max(np.abs(out - want.out)))
    eps, vmax = float(np.finfo(np.float32).eps), float(np.max(np.abs(v)))
    assert want.floor - 2 * capped_error(cap) * eps * vmax < error <= want.floor


def test_a_cap_ignored_at_small_caps_is_rejected():
    bad = _target(_attention(_by_sigmoid, ignore_below=1e3), "softcap-ignored-below-1e3")
    result = _one(bad, "softcap_matches_golden")
    assert result.status == "fail", result.message
    assert "softcap=" in result.message


def test_tanh_by_exponentials_overflowing_to_nan_is_rejected():
    """|s/c| > 88.7 overflows e^(s/c) in float32: softcap_bounds_scores draws scores to the edge
    of the dtype's range, so the NaN shows there."""
    bad = _target(_attention(_sinh_over_cosh), "softcap-sinh-over-cosh")
    result = _one(bad, "softcap_bounds_scores")
    assert result.status == "fail", result.message
    assert "nan" in result.message.lower()
