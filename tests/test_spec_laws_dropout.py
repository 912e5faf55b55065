"""The helpers of the ragged-batch, dropout, lse and call laws, and the statistical laws'
false-alarm rates measured on the reference (each law's own power is the gallery's test)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import spec
from spec import golden
from spec.laws.calls import VIEWS, as_view
from spec.laws.dropout import FALSE_ALARM, bernstein_threshold
from spec.laws.lse import merge


def test_bernstein_threshold_solves_the_bound():
    variance, bound = 3.0, 0.5
    t = bernstein_threshold(variance, bound)
    assert 2 * math.exp(-t * t / (2 * (variance + bound * t / 3))) == pytest.approx(FALSE_ALARM, rel=1e-9)
    assert bernstein_threshold(variance, bound, delta=1e-3) < t


@pytest.mark.parametrize("kind", VIEWS)
def test_views_hold_the_same_values_in_another_layout(kind):
    x = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    view = as_view(x, kind)
    assert np.array_equal(view, x) and view.dtype == x.dtype
    assert not view.flags.c_contiguous


def test_as_view_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown view kind 'diagonal'"):
        as_view(np.zeros((2, 2)), "diagonal")


def test_merging_two_key_blocks_by_logsumexp_gives_the_full_attention():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((7, 4)), rng.standard_normal((7, 2))
    visible = np.ones((3, 7), dtype=bool)
    visible[1, :3] = False  # row 1 sees nothing in the first block
    visible[2] = False  # row 2 sees nothing at all
    full, _, full_lse = golden.forward(q, k, v, visible=visible, scale=0.5)
    a = golden.forward(q, k[:3], v[:3], visible=visible[:, :3], scale=0.5)
    b = golden.forward(q, k[3:], v[3:], visible=visible[:, 3:], scale=0.5)
    out, lse = merge(a[0], a[2], b[0], b[2])
    np.testing.assert_allclose(out, full, atol=1e-12)
    np.testing.assert_allclose(lse[:2], full_lse[:2], atol=1e-12)
    assert np.isneginf(lse[2]) and np.all(out[2] == 0)


@pytest.mark.parametrize("law", ["dropout_drops_fraction_p", "dropout_unbiased"])
def test_statistical_dropout_laws_raise_no_false_alarm_on_the_reference(law):
    # 300 fresh examples: the derived bound allows a false alarm with probability ≤ 300·1e-9.
    report = spec.check("reference", profile="thorough", max_examples=300, seed=20261130, only=[law])
    (result,) = report.results
    assert result.status == "pass" and result.examples == 300, (result.message, result.counterexample)
    worst = max(result.observed.values())
    assert 0 < worst < 1

