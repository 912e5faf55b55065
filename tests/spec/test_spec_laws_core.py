"""The core laws (spec.laws.core) against targets that break them: the output's dtype, the
golden comparison, the recovered scale."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from impl import attention
from spec import Target
from spec.laws._helpers import differs_at, first_true


def _only(target, name="matches_golden", **kw):
    (result,) = spec.check(target, profile="quick", only=[name], **kw).results
    return result


def _as_float32(q, k, v, *, causal=False):
    # Right values, wrong dtype: bfloat16 in, float32 out.
    return attention(q, k, v, causal=causal).astype(np.float32)


def test_a_float32_result_for_bfloat16_inputs_is_rejected():
    pytest.importorskip("ml_dtypes")
    report = spec.check(Target(_as_float32, dtypes=("bfloat16",)), profile="quick", max_examples=5,
                        only=["output_shape_dtype"])
    (result,) = report.results
    assert result.status == "fail"
    assert "output dtype is float32, inputs are bfloat16" in result.message


def test_nan_output_fails_the_golden_comparison():
    result = _only(lambda q, k, v, causal=False: np.full_like(attention(q, k, v, causal=causal), np.nan))
    assert result.status == "fail" and "inf" in result.message


def test_the_scale_law_fails_a_pattern_with_no_finite_weight():
    """With no finite weight there is no scale to recover: the law fails rather than passing empty."""
    def inf_everywhere(q, k, v, *, causal=False):
        return np.full((*q.shape[:-1], v.shape[-1]), np.inf, dtype=q.dtype)

    (result,) = spec.check(inf_everywhere, profile="quick", only=["scale_is_inv_sqrt_dk"]).results
    assert result.status == "fail" and "is inf for the pattern" in result.message


def test_score_variance_measures_fewer_heads_for_wide_heads_at_the_same_false_alarm_rate():
    """score_variance measures the fewest heads, in batches of 64, that keep its estimate's spread
    within the band at every d_k: the spread shrinks as d_k grows, so 4,096 heads at every width
    would cost 4,096·3·d_k normal draws an example for nothing."""
    from spec.laws import core

    for d_k in range(1, 129):
        n = core.score_samples(d_k)
        sigma = ((8 + 24 / d_k) / n) ** 0.5 / 2  # the estimate's standard deviation (the law's docstring)
        assert n % 64 == 0 and sigma <= core.SCORE_VARIANCE_BAND / core.SCORE_BAND_SIGMAS
        assert core.SCORE_VARIANCE_BAND / core.SCORE_BAND_SIGMAS < ((8 + 24 / d_k) / (n - 64)) ** 0.5 / 2
    assert core.score_samples(1) == 4096 and core.score_samples(128) == 1088


# --- what laws share (spec.laws._helpers) --------------------------------------------------------


def test_first_true_is_the_first_index_in_c_order_as_plain_ints():
    bad = np.zeros((2, 3, 4), dtype=bool)
    bad[1, 0, 3] = bad[1, 2, 0] = bad[0, 2, 1] = True
    at = first_true(bad)
    assert at == (0, 2, 1) and all(type(i) is int for i in at)  # printed as [0, 2, 1], not np.int64(0)
    assert first_true(np.zeros((2, 3), dtype=bool)) is None
    assert first_true(np.zeros((0, 3), dtype=bool)) is None


def test_differs_at_takes_nan_as_equal_to_nan():
    a = np.array([[np.nan, 1.0], [2.0, 3.0]])
    b = np.array([[np.nan, 1.0], [2.0, -3.0]])
    assert differs_at(a, b) == (1, 1)
