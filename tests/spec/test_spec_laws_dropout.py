"""The dropout laws (spec.laws.dropout): the Bernstein threshold solves its bound, and the
statistical laws' false-alarm rate measured on the reference (each law's own power is the
gallery's test)."""

from __future__ import annotations

import math

import pytest

import spec
from spec.laws.dropout import FALSE_ALARM, bernstein_threshold


def test_bernstein_threshold_solves_the_bound():
    variance, bound = 3.0, 0.5
    t = bernstein_threshold(variance, bound)
    assert 2 * math.exp(-t * t / (2 * (variance + bound * t / 3))) == pytest.approx(FALSE_ALARM, rel=1e-9)
    assert bernstein_threshold(variance, bound, delta=1e-3) < t


@pytest.mark.parametrize("law", ["dropout_drops_fraction_p", "dropout_unbiased"])
def test_statistical_dropout_laws_raise_no_false_alarm_on_the_reference(law):
    # 300 fresh examples: the derived bound allows a false alarm with probability ≤ 300·1e-9.
    report = spec.check("reference", profile="thorough", max_examples=300, seed=20261130, only=[law])
    (result,) = report.results
    assert result.status == "pass" and result.examples == 300, (result.message, result.counterexample)
    worst = max(result.observed.values())
    assert 0 < worst < 1
