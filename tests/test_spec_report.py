"""One renderer: ``str(report)`` is what the CLI prints; observed figures travel as data."""

from __future__ import annotations

import json

import numpy as np

import spec
from impl import attention
from spec.cli import main
from spec.report import render


def _half_scaled(q, k, v, *, causal=False):
    return attention(q * 0.5, k, v, causal=causal)


def test_str_of_a_report_is_what_the_cli_prints(capsys):
    only = ["matches_golden", "rows_sum_to_one"]
    report = spec.check("reference", profile="quick", only=only)
    main(["check", "reference", "--profile", "quick", "--only", *only])
    printed = capsys.readouterr().out
    ours = str(report)
    # Everything but the timings (seconds per law and in the summary) must be the same text.
    def no_numbers(text):
        return [line.split()[:3] for line in text.splitlines()]
    assert no_numbers(ours) == no_numbers(printed)
    assert ours == render(report) and ours.splitlines()[-1].startswith("reference: conforms — 2 passed")


def test_observed_figures_are_data_in_the_result_and_the_json():
    only = ["matches_golden", "rows_sum_to_one"]
    report = spec.check(spec.Target(_half_scaled), profile="quick", only=only)
    golden, rows = report.results
    assert golden.status == "fail"
    ratios = [v for key, v in golden.observed.items() if key.startswith("error ratio")]
    assert ratios and max(ratios) > 1  # the failing example's ratio, as a number
    assert rows.status == "pass" and all(0 <= v <= 1 for v in rows.observed.values())
    data = json.loads(report.to_json())
    assert data["results"][0]["observed"] == {k: v for k, v in golden.observed.items() if np.isfinite(v)}
