"""spec.report: one renderer (``str(report)`` is what the CLI prints); observed figures travel as
data, in the JSON too, with one error ratio per dtype and non-finite numbers spelled as strings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import spec
from impl import attention
from spec.cli import main
from spec.registry import SCOPES
from spec.report import (
    Counterexample,
    Report,
    Result,
    failure_groups,
    figures,
    render,
    reproduce_lines,
    scope,
    terminal_width,
)


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
    note = result["message"]  # one label, then each dtype's figure, in a fixed order
    assert note.startswith("error/allowed: float16 ") and note.count("error/allowed") == 1, note
    at = [note.index(f" {dtype} ") for dtype in ("float16", "bfloat16", "float32", "float64")]
    assert at == sorted(at), note
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        assert f"error ratio {dtype}" in result["observed"]


# --- one block per cause, the most telling first, every line within the width ---------------------

def _raises(q, k, v, *, causal=False):
    raise RuntimeError("kernel not built")


def _wrong_shape(q, k, v, *, causal=False):
    return attention(q, k, v, causal=causal)[None]  # an extra leading axis


def _as_list(q, k, v, *, causal=False):
    return attention(q, k, v, causal=causal).tolist()


def _causal_off_by_one(q, k, v, *, causal=False):
    """Causal attention that lets query i see key i + 1 too (``tril`` with offset 1)."""
    if not causal:
        return attention(q, k, v)
    return attention(q, k, v, mask=np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool), k=1))


ONE_CAUSE = {"always raises": _raises, "wrong shape": _wrong_shape, "a list": _as_list}


@pytest.mark.parametrize("name", ONE_CAUSE)
def test_one_cause_prints_one_block_naming_every_law(name):
    """A target that fails every law the same way (its messages alike but for the shapes of each
    law's case): one FAIL block naming each failed law, its counterexample shown once; the table
    and the JSON keep one row and one result per law."""
    report = spec.check(spec.Target(ONE_CAUSE[name], name=name), profile="quick", keep_going=True)
    failed = [r.name for r in report.results if r.status == "fail"]
    assert len(failed) > 5 and len({re.sub(r"\(.*?\)", "", r.message) for r in report.failures}) == 1
    text = render(report)
    blocks = [line for line in text.splitlines() if line.startswith("FAIL ")]
    assert len(blocks) == 1 and text.count("reproduce:") == 1 and text.count("broken:") == 1, text
    head = text[text.index("\nFAIL ") + 1:text.index("  law (")]
    assert sorted(head[5:].split(" (")[0].replace("\n", " ").replace(",", " ").split()) == sorted(failed)
    assert f"({len(failed)} laws, the same failure" in " ".join(head.split())
    rows = text[:text.index("\n\nskipped: ")].splitlines()[2:]
    assert [row.split()[0] for row in rows if row[:1].strip()] == [r.name for r in report.results
                                                                  if r.status != "skip"]
    data = json.loads(report.to_json())
    assert [r["name"] for r in data["results"]] == [r.name for r in report.results]
    assert sum(r["status"] == "fail" for r in data["results"]) == len(failed)


def test_the_law_named_for_the_bug_comes_first():
    """A causal mask off by one (query i also sees key i + 1) fails several laws with different
    messages; causal_no_leak's block comes first, the generic comparisons with the golden last."""
    report = spec.check(spec.Target(_causal_off_by_one, name="off by one"), profile="quick")
    heads = [line.split()[1].rstrip(",") for line in render(report).splitlines() if line.startswith("FAIL ")]
    assert heads[0] == "causal_no_leak" and len(heads) > 3, heads
    assert next(r.name for r in report.results if r.status == "fail") != "causal_no_leak"  # not run first
    scopes = [scope(name) for name in heads]
    assert scopes == sorted(scopes, key=SCOPES.index) and scopes[-1] == "generic", scopes


def test_groups_and_order_are_plain_functions():
    """`failure_groups`: one group per message, each and all in `telling_order` (a signature
    mismatch first, then the call, named, broad and generic laws; run order within one)."""
    def failed(name, message, fatal=False):
        return Result(name, "fail", 1, 0.0, message, fatal=fatal)

    results = [failed("matches_golden", "A"), failed("convex_combination", "B"),
               failed("rows_sum_to_one", "A"), Result("deterministic_calls", "pass", 1, 0.0),
               failed("large_values", "B"), failed("strided_views", "C", fatal=True)]
    groups = failure_groups(Report("t", "quick", None, results))
    assert [[r.name for r in group] for group in groups] == [
        ["strided_views"], ["rows_sum_to_one", "matches_golden"], ["convex_combination", "large_values"]]


def _big_array_report():
    """A failure as a future or foreign runner might hand it over: arrays far past what the
    runner stores (48 entries), the failure naming output [1, 57, 2]."""
    rng = np.random.default_rng(0)
    arrays = {"q": rng.normal(size=(2, 64, 3)).tolist(), "k": rng.normal(size=(2, 200, 3)).tolist(),
              "mask": (rng.random((2, 64, 200)) < 0.5).tolist()}
    example = Counterexample(case={"dtype": "float64", "n_q": 64, "n_k": 200}, reproduce="no command",
                             call="fn", shapes={k: list(np.shape(v)) for k, v in arrays.items()},
                             dtypes={"q": "float64", "k": "float64", "mask": "bool"}, arrays=arrays)
    message = "output differs from the float64 golden: max|out − golden| = 3 at index [1, 57, 2]"
    return Report("big", "quick", None, [Result("matches_golden", "fail", 1, 0.1, message, example,
                                                law="The output equals the golden.")])


def _lines(text):
    return text.splitlines()


@pytest.mark.parametrize("name", ["always raises", "wrong shape", "off by one", "big arrays"])
def test_every_line_fits_the_width(name):
    """Every line of the report within 100 columns when stdout is not a terminal (as here, under
    pytest's capture), and within the width given to render; a big array is elided, the row of
    the index the failure names shown."""
    if name == "big arrays":
        report = _big_array_report()
    else:
        fn = _causal_off_by_one if name == "off by one" else ONE_CAUSE[name]
        report = spec.check(spec.Target(fn, name=name), profile="quick")
    assert terminal_width() == 100
    for width in (None, 72, 100, 140):
        text = render(report, width=width)
        widest = max(map(len, _lines(text)))
        assert widest <= (width or 100), next(x for x in _lines(text) if len(x) == widest)
    if name == "big arrays":
        text = render(report, width=80)
        assert "..." in text and len(_lines(text)) < 80, text
        assert "  q[1, 57] = " in text and "  mask[1, 57][" in text, text  # the failing row, elided


def test_the_cli_report_fits_100_columns_in_a_pipe(tmp_path):
    """The real command, piped: no line of the report past 100 columns."""
    (tmp_path / "off_by_one.py").write_text(
        "import numpy as np\nfrom impl import attention\n\n"
        "def attention_off_by_one(q, k, v, *, causal=False):\n"
        "    mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool), k=1) if causal else None\n"
        "    return attention(q, k, v, mask=mask)\n")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    env.pop("COLUMNS", None)
    command = [sys.executable, "-m", "spec", "check", "off_by_one:attention_off_by_one", "--profile", "quick"]
    run = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert run.returncode == 1 and "FAIL causal_no_leak" in run.stdout, run.stderr
    assert max(map(len, run.stdout.splitlines())) <= 100


def test_a_reproduce_line_broken_to_fit_still_runs():
    """The ``reproduce:`` command broken over lines runs as the one line does (here: the law holds
    for the reference, exit 0); a command that cannot be broken safely stays whole."""
    line = ("python -c \"import spec; spec.replay('reference', 'matches_golden', dtype='float32', ndim=2, "
            "batch=1, heads=1, n_q=3, n_k=4, d_k=3, d_v=2, seed=11)\"")
    lines = reproduce_lines(line, width=60)
    assert len(lines) > 1 and max(map(len, lines)) <= 60
    command = "\n".join([lines[0].removeprefix("  reproduce: "), *lines[1:]])
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=root, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stderr
    commas = line.replace("'reference'", "'a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p.py:f'")
    kept = reproduce_lines(commas, width=60)  # a break inside the name would change it: one line
    assert kept == ["  reproduce: " + commas]


def test_the_note_labels_one_figure_per_dtype_in_a_fixed_order():
    observed = {"error ratio float64": 0.057, "scale error ratio float32": 0.5, "error ratio float16": 0.0292,
                "error ratio bfloat16": 0.1, "dropped fraction error / band": 0.2,
                "error ratio float8_e4m3fn": 0.3, "error ratio float32": float("inf")}
    assert figures(observed) == ("error/allowed: float8_e4m3fn 0.3, float16 0.0292, bfloat16 0.1, "
                                 "float64 0.057; scale error/allowed: float32 0.5; "
                                 "dropped fraction error / band: 0.2")


def test_no_pass_note_has_an_unlabelled_figure():
    """Every figure of the reference's notes follows its dtype (the laws that compare two outputs
    of the target and the scale law observe theirs per dtype too)."""
    report = spec.check("reference", profile="quick", max_examples=5)
    notes = [r.message for r in report.results if r.status == "pass" and "error/allowed" in r.message]
    assert any("kv_permutation" in r.name and "error/allowed: float" in r.message for r in report.results)
    for note in notes:
        for part in note.split("; "):
            _, _, values = part.partition(": ")
            for value in values.split(", "):
                assert re.fullmatch(r"b?float\w+(?: \(computed in \w+\))? \S+", value), note


def test_skipped_laws_are_listed_once_under_each_reason_and_the_laws_not_run_counted_apart():
    """Below the table, each skipped law is named once, under its reason, each reason once; the
    summary counts the laws a run ended before (`Result.not_run`) apart from those skipped for a
    capability, and the JSON marks them."""
    report = spec.check(spec.Target(_raises, name="always raises"), profile="quick")
    skipped = [r for r in report.results if r.status == "skip"]
    ended = [r for r in skipped if r.not_run]
    assert ended and len(ended) < len(skipped)
    text = render(report, width=100)
    section = text[text.index("\nskipped: "):text.index("\nFAIL ")]
    assert f"skipped: {len(skipped)} laws, under each reason" in section
    flat = " ".join(section.split())
    for r in skipped:
        assert len(re.findall(rf"[:,] {r.name}(?=[,\s]|$)", flat)) == 1, r.name
    for reason in {r.message for r in skipped}:
        assert flat.count(" ".join(reason.split()) + ":") == 1, reason
    table_rows = text[:text.index("\nskipped: ")].splitlines()[2:]
    assert not any(row.split()[1:2] == ["skip"] for row in table_rows if row[:1].strip())
    summary_line = " ".join(text.splitlines()[-2:])
    assert f"{len(skipped) - len(ended)} skipped, {len(ended)} not run" in summary_line
    data = json.loads(report.to_json())
    assert sum(r.get("not_run", False) for r in data["results"]) == len(ended)
