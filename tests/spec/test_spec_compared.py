"""What a failing law compared (spec.compared): recorded by tolerance.compare and the bit-identity
checks into the run's context, the last one kept by a failing Result — through process isolation
too — cut to the worst slice and downsampled by block max; nothing kept by a pass."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from spec import compared, context, tolerance
from spec.compared import Compared, compact, downsample, worst_slice
from spec.context import RunContext, running


def _compare(out, gold, *, floor=1e-3):
    rows = np.ones(gold.shape[:-1], dtype=bool)
    return tolerance.compare(out, gold, gold, rows=rows, tolerance=2.0, floor_=floor)


def test_compare_records_the_last_comparison_into_the_run():
    gold = np.arange(6.0).reshape(2, 3)
    run = RunContext()
    with running(run):
        _compare(gold + 1, gold)
        _compare(gold + 0.5, gold, floor=0.25)
    last = run.compared
    assert isinstance(last, Compared)
    np.testing.assert_array_equal(last.expected, gold)
    np.testing.assert_array_equal(last.returned, gold + 0.5)
    assert last.allowance == 0.25 and not last.held
    np.testing.assert_allclose(last.ratio(), np.full((2, 3), 2.0))


def test_outside_a_run_nothing_is_recorded():
    idle = RunContext()
    assert context.current() is None
    _compare(np.zeros((2, 2)), np.ones((2, 2)))  # no run in progress: no error, nowhere to keep it
    assert idle.compared is None


def test_allowance_is_what_compare_allows():
    rng = np.random.default_rng(1)
    gold, base = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 4, 5))
    rows = rng.random((3, 4)) < 0.5
    cmp = tolerance.compare(gold, gold, base, rows=rows, tolerance=2.0, floor_=0.1)
    assert tolerance.allowance(gold, base, rows=rows, tolerance=2.0, floor_=0.1) == cmp.allowed


def test_the_ratio_is_inf_for_nan_against_finite_and_nan_for_rows_not_compared():
    c = Compared("x", np.array([[1.0, np.nan], [1.0, 1.0]]), np.array([[np.nan, np.nan], [1.0, 3.0]]), 1.0,
                 rows=np.array([True, False]))
    ratio = c.ratio()
    assert ratio[0, 0] == np.inf and ratio[0, 1] == 0.0
    assert np.isnan(ratio[1]).all()  # row 1 not compared: its 3 against 1 is not over
    assert not c.held


def test_nothing_allowed_makes_any_difference_infinite():
    c = Compared("bits", np.zeros((1, 3)), np.array([[0.0, -0.0, 1e-300]]), 0.0)
    assert c.ratio().tolist() == [[0.0, 0.0, np.inf]]


def test_worst_slice_and_downsample_keep_the_worst_entry():
    ratio = np.zeros((2, 3, 10, 4))
    ratio[1, 2, 7, 1] = 5.0
    assert worst_slice(ratio) == (1, 2)
    values = np.arange(40.0).reshape(10, 4)
    block, (small, picked) = downsample(ratio[1, 2], values, most=3)
    assert block == (4, 2) and small.shape == (3, 2)
    assert small[1, 0] == 5.0 and picked[1, 0] == values[7, 1]  # the block's worst entry, its value


def test_compact_keeps_the_worst_slice_small_and_says_where():
    gold = np.zeros((2, 2, 600, 8))
    out = gold.copy()
    out[1, 0, 500, 3] = 1.0
    kept = compact(Compared("output", gold, out, 0.1), limits={"seq_multiple": 64})
    assert kept.slice_ == (1, 0) and kept.full_shape == (2, 2, 600, 8)
    assert kept.expected.shape[0] <= compared.KEPT and kept.block == (3, 1)
    assert float(np.nanmax(kept.ratio())) == pytest.approx(10.0) and kept.limits == {"seq_multiple": 64}


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_failure_carries_its_last_comparison_and_a_pass_none(isolation):
    report = spec.check("gallery.core:mask_off_by_one", profile="quick", isolation=isolation,
                        only=["causal_no_leak", "rows_sum_to_one", "matches_golden"])
    by = {r.name: r for r in report.results}
    leak, golden = by["causal_no_leak"].compared, by["matches_golden"].compared
    assert by["rows_sum_to_one"].status == "pass" and by["rows_sum_to_one"].compared is None
    assert leak is not None and "after changing keys/values" in leak.label and not leak.held
    assert float(np.max(leak.allowance)) == 0.0  # bit-identity: nothing allowed
    assert golden is not None and golden.label.startswith("output against the float64 golden")
    assert golden.expected.shape == golden.returned.shape and not golden.held
    assert "compared" not in report.to_json()  # not written to the JSON report
