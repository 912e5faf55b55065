"""A verdict in seconds for a broken target (spec.runner.Stopping): a target that misses its
deadline in two laws, or raises the same exception in three laws in a row, ends the run, the laws
left reported not run and why, through the Python, command-line and pytest doors; ``keep_going``
runs every law; and a signature problem's counterexample is shrunk.

``always_raises`` and ``raises_differently`` are importable (``test_spec_stopping:always_raises``)
for the pytest door's test."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time

import pytest
from test_spec_pytest_plugin import ENV, _plugin_args

import spec
from impl import attention
from spec.cli import main
from spec.report import Result
from spec.runner import LawRun, Stopping


def hangs(q, k, v, *, causal=False):
    while True:  # Python that never returns (interruptible: the thread unwinds at its deadline)
        time.sleep(0.01)


def always_raises(q, k, v, *, causal=False):
    raise ValueError("this kernel is not built")


_calls = itertools.count()


def raises_differently(q, k, v, *, causal=False):
    raise ValueError(f"call {next(_calls)} failed")


def _not_run(report):
    return [r for r in report.results if r.message.startswith("not run:")]


def test_a_hanging_target_gets_its_verdict_within_three_deadlines():
    deadline = 1.0
    start = time.perf_counter()
    report = spec.check(hangs, "ci", deadline=deadline)
    seconds = time.perf_counter() - start
    assert seconds < 3 * deadline + 3.0, seconds  # each law waited its own: about 18 deadlines
    failed = report.failures
    assert [r.name for r in failed] == ["output_shape_dtype", "inputs_not_mutated"]
    assert all("did not return within the 1 s deadline" in r.message and r.hung for r in failed)
    left = _not_run(report)
    assert len(left) >= 10 and all(r.status == "skip" for r in left)
    assert left[0].message == ("not run: the target missed its deadline in output_shape_dtype and "
                               "inputs_not_mutated; --keep-going runs every law")
    assert not report.ok


def test_an_always_raising_target_stops_after_three_laws():
    report = spec.check(always_raises, "ci")
    assert [r.name for r in report.failures] == ["output_shape_dtype", "inputs_not_mutated", "matches_golden"]
    assert all(r.raised == "ValueError: this kernel is not built" for r in report.failures)
    left = _not_run(report)
    assert left and left[0].message == ("not run: the target raised the same ValueError in "
                                        "output_shape_dtype, inputs_not_mutated and matches_golden; "
                                        "--keep-going runs every law")
    # laws the target skips anyway say why, as in any run
    assert any(r.status == "skip" and r.message.startswith("needs mask=") for r in report.results)


def test_a_target_raising_different_errors_is_not_stopped():
    report = spec.check(raises_differently, "quick")
    assert not _not_run(report)
    assert len(report.failures) >= 15


def test_keep_going_runs_every_law():
    report = spec.check(always_raises, "quick", keep_going=True)
    assert not _not_run(report)
    assert len(report.failures) >= 15


def test_the_command_line_stops_early_unless_keep_going(capsys):
    target = "test_spec_stopping:always_raises"
    assert main(["check", target, "--profile", "quick"]) == 1
    assert "not run: the target raised the same ValueError" in " ".join(capsys.readouterr().out.split())
    assert main(["check", target, "--profile", "quick", "--keep-going"]) == 1
    assert "not run:" not in capsys.readouterr().out


def test_the_pytest_door_skips_the_laws_left_unless_keep_going(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "pytest", *_plugin_args(), "-p", "no:cacheprovider",
                               "-q", "-rs", "--attention-profile=quick", "--attention-only",
                               "--attention-target=test_spec_stopping:always_raises", *args],
                              capture_output=True, text=True, env={**ENV, "COLUMNS": "250"}, cwd=tmp_path,
                              timeout=600)

    stopped = run()
    assert stopped.returncode == 1
    assert "3 failed" in stopped.stdout, stopped.stdout[-2000:]
    assert ("not run: the target raised the same ValueError in output_shape_dtype, inputs_not_mutated and "
            "matches_golden; --attention-keep-going runs every law") in stopped.stdout
    going = run("--attention-keep-going")
    assert going.returncode == 1 and "not run:" not in going.stdout
    assert "3 failed" not in going.stdout


# --- the rule itself, on results as the runner judges them ------------------------------------

def _result(name, status="fail", raised="", hung=False):
    return Result(name, status, 1, 0.0, raised, raised=raised, hung=hung)


def _stops_after(*results, keep_going=False):
    stopping = Stopping(keep_going=keep_going)
    for result in results:
        stopping.see(result)
    return stopping.why()


BOOM = "ValueError: boom"


def test_three_identical_exceptions_in_a_row_stop_and_a_skip_does_not_break_the_row():
    assert _stops_after(_result("a", raised=BOOM), _result("b", raised=BOOM)) is None
    row = [_result("a", raised=BOOM), _result("b", "skip"), _result("b2", raised=BOOM),
           _result("c", raised=BOOM)]
    assert _stops_after(*row) == ("the target raised the same ValueError in a, b2 and c; "
                                  "--keep-going runs every law")


@pytest.mark.parametrize("between", [_result("p", "pass"), _result("f"),  # passed; failed otherwise
                                     _result("f", raised="ValueError: other"),
                                     _result("x", "xfail", raised=BOOM)])  # declared: no failure
def test_a_law_that_passes_or_fails_otherwise_starts_the_count_again(between):
    assert _stops_after(_result("a", raised=BOOM), _result("b", raised=BOOM), between,
                        _result("c", raised=BOOM)) is None


def test_two_missed_deadlines_stop_in_a_row_or_not_and_keep_going_never_stops():
    hung = [_result("a", hung=True), _result("p", "pass"), _result("b", hung=True)]
    assert _stops_after(*hung).startswith("the target missed its deadline in a and b")
    assert _stops_after(_result("a", hung=True), _result("b", "xfail", hung=True)) is None
    assert _stops_after(*hung, keep_going=True) is None


def test_a_law_the_target_skips_anyway_says_its_own_reason_after_a_stop():
    stopping = Stopping()
    for name in "abc":
        stopping.see(_result(name, raised=BOOM))
    needs_mask, runs = spec.LAWS["mask_semantics"], spec.LAWS["rows_sum_to_one"]
    target = spec.Target(always_raises)
    assert stopping.not_run(LawRun("mask_semantics", needs_mask, target, None), "ci") is None
    left = stopping.not_run(LawRun("rows_sum_to_one", runs, target, None), "ci")
    assert left is not None and left.status == "skip"
    assert left.message.startswith("not run: the target raised")


# --- a signature problem: said once, its case shrunk -------------------------------------------

def sdpa(q, k, v, is_causal=False):
    """PyTorch's spelling, correct otherwise: the first call with causal=True does not bind."""
    return attention(q, k, v, causal=is_causal)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_signature_mismatch_shows_a_shrunk_case(isolation):
    report = spec.check(sdpa, "ci", isolation=isolation)
    (failed,) = report.failures
    assert failed.fatal and "does not take the keyword causal=" in failed.message
    case = failed.counterexample.case
    assert case["causal"] is True  # the keyword it does not take, kept
    assert (case["n_q"], case["n_k"], case["d_k"], case["d_v"]) == (1, 1, 1, 1), case
    assert "n_q=1 n_k=1 d_k=1 d_v=1" in str(report)
    assert failed.counterexample.keywords == {"causal": True}


def slow_but_right(q, k, v, *, causal=False):
    time.sleep(0.02)
    return attention(q, k, v, causal=causal)


def test_a_time_budget_bounds_the_whole_check_and_says_the_run_is_incomplete():
    """``budget_s``: once spent no call starts; the law in progress stops where it is (skip, not
    run to its end, its examples counted), the laws left are not run, the report is incomplete
    and still conforms (nothing failed), keep_going or not; the JSON says both."""
    for budget in (2.0, 3.0, 4.0):  # a budget spent during a law's last call ends the check between
        # two laws, with no law stopped in the middle: another budget then ends it elsewhere
        start = time.perf_counter()
        report = spec.check(slow_but_right, "ci", budget_s=budget, keep_going=True)
        seconds = time.perf_counter() - start
        # a call of 0.02 s and the law's own work after it, on a loaded machine; without the budget
        # the ci profile takes minutes at 0.02 s a call
        assert seconds < budget + 8.0, seconds
        assert report.ok and not report.complete
        stopped = [r for r in report.results if r.message.startswith("not run to its end:")]
        assert len(stopped) <= 1
        if stopped:
            break
    assert len(stopped) == 1 and stopped[0].examples >= 1 and stopped[0].not_run
    left = _not_run(report)
    spent = f"not run: the check's time budget of {budget:g} s was spent"
    assert left and all(r.message == spent for r in left)
    assert "no failure in the laws run (incomplete)" in str(report)
    data = report.to_dict()
    assert data["budget_s"] == budget and data["complete"] is False and data["ok"] is True
    whole = spec.check(slow_but_right, "quick", only=["rows_sum_to_one"], budget_s=600)
    assert whole.complete and "conforms —" in str(whole) and whole.to_dict()["complete"] is True


def test_a_time_budget_must_be_a_positive_number_of_seconds(capsys):
    for bad in (0, -1.0, float("nan"), "10", True):
        with pytest.raises(ValueError, match="budget_s must be a positive number of seconds"):
            spec.check("reference", budget_s=bad)
    assert main(["check", "reference", "--budget-s", "0"]) == 2
    assert "--budget-s" in capsys.readouterr().err
