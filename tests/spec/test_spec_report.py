"""spec.report: one renderer (``str(report)`` is what the CLI prints); observed figures travel as
data, in the JSON too, with one error ratio per dtype and non-finite numbers spelled as strings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import spec
from impl import attention
from spec.cli import main
from spec.report import Counterexample, Report, Result, render


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
    assert data["results"][0]["observed"] == golden.observed


def _strict_json(text):
    """``text`` parsed by a parser that refuses NaN and Infinity (RFC 8259 has neither)."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_json_spells_non_finite_numbers_as_strings():
    arrays = {"q": [[1.0, float("inf")]], "k": [[np.float32("-inf"), float("nan")]]}
    failed = Result("matches_golden", "fail", 1, 0.1, "NaN where the golden is finite",
                    Counterexample(case={"dtype": "float32"}, reproduce="", call="fn", shapes={"q": [1, 2]},
                                   arrays=arrays),
                    observed={"error ratio float32": float("inf"), "error ratio float64": float("nan")})
    data = _strict_json(Report("t", "quick", None, [failed]).to_json())
    (result,) = data["results"]
    assert result["observed"] == {"error ratio float32": "Infinity", "error ratio float64": "NaN"}
    assert result["counterexample"]["arrays"] == {"q": [[1.0, "Infinity"]], "k": [["-Infinity", "NaN"]]}


def test_cli_json_of_an_infinite_error_ratio_is_strict(tmp_path):
    """The real command on a target that returns inf: exit 1, the report written, the ratio kept."""
    (tmp_path / "returns_inf.py").write_text(
        "import numpy as np\n\n"
        "def attention(q, k, v, *, causal=False):\n"
        "    return np.full(q.shape[:-1] + v.shape[-1:], np.inf, dtype=q.dtype)\n")
    path = tmp_path / "report.json"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    run = subprocess.run([sys.executable, "-m", "spec", "check", "returns_inf:attention", "--profile",
                          "quick", "--only", "matches_golden", "--json", str(path)],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    (result,) = _strict_json(path.read_text(encoding="utf-8"))["results"]
    assert result["status"] == "fail" and "Infinity" in result["observed"].values()


def test_json_report_carries_the_ratio_per_dtype(tmp_path, capsys):
    pytest.importorskip("ml_dtypes")
    path = tmp_path / "report.json"
    code = main(["check", "reference", "--profile", "quick", "--max-examples", "30",
                 "--only", "matches_golden", "--json", str(path)])
    capsys.readouterr()
    assert code == 0
    (result,) = json.loads(path.read_text(encoding="utf-8"))["results"]
    for dtype in ("float16", "float32", "float64", "bfloat16"):
        assert f"error ratio {dtype}" in result["message"]
