"""spec.power: the power guard judges the suite's own cases — each trivial kernel is one the laws
reject, each is told from the golden by the cases of some law, a case that cannot tell one apart
says so — and never changes the verdict on the target or the report when it is off."""

from __future__ import annotations

import json

import numpy as np
import pytest

import spec
from spec import oracle, power
from spec.cli import main
from spec.context import RunContext, running
from spec.inputs import Inputs
from spec.report import Report, Result, render
from spec.target import Target


def _inputs(*, n_q: int = 5, n_k: int = 6, d_k: int = 4, d_v: int = 3, causal: bool = True,
            seed: int = 0, dtype: str = "float32") -> Inputs:
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((2, n, d_k)).astype(dtype) * 2 for n in (n_q, n_k))
    v = rng.standard_normal((2, n_k, d_v)).astype(dtype)
    return Inputs(q, k, v, causal=causal)


REFERENCE = spec.load_target("reference")


@pytest.mark.parametrize("name", power.NAMES)
def test_each_trivial_kernel_fails_the_quick_profile(name):
    """The laws reject every trivial kernel: wrapped as a target, none conforms at --profile quick."""
    report = spec.check(power.as_target(name), profile="quick")
    assert not report.ok, f"trivial kernel {name} conforms at --profile quick"


def test_a_generic_case_tells_every_trivial_kernel_from_the_golden():
    assert power.rejected(REFERENCE, _inputs()) == frozenset(power.NAMES)


@pytest.mark.parametrize(("inputs", "blind"), [
    (_inputs(d_k=1), {"ignores_scale"}),  # 1/√1 = 1: the scale changes nothing
    (_inputs(causal=False), {"ignores_mask"}),  # nothing is hidden
    (_inputs(n_k=1, causal=False), {"mean_v", "uniform_weights", "ignores_mask", "ignores_scale"}),
    (_inputs(n_q=1, n_k=1), {"mean_v", "uniform_weights", "ignores_mask", "ignores_scale"}),
])
def test_a_case_that_cannot_tell_a_kernel_apart_does_not_reject_it(inputs, blind):
    """Cases that make a trivial kernel exact: d_k = 1 (the scale is 1), no restriction, one key
    (its weight is 1)."""
    found = power.rejected(REFERENCE, inputs)
    assert blind.isdisjoint(found), f"rejected {sorted(blind & found)}, which equal the golden here"
    assert found == frozenset(power.NAMES) - blind


def test_values_of_zero_reject_nothing():
    inputs = _inputs()
    inputs = inputs.replace(v=np.zeros_like(inputs.v))
    assert power.rejected(REFERENCE, inputs) == frozenset()


def test_the_guard_compares_with_the_targets_own_tolerance():
    """A target that allows any finite error makes every trivial kernel pass the case's comparison."""
    lax = REFERENCE.replace(tolerance=1e30)
    assert power.rejected(lax, _inputs()) == frozenset()


def test_lower_precision_is_one_dtype_below_the_declared_one():
    assert power.rejected(REFERENCE, _inputs(dtype="float64")) >= {"lower_precision"}
    # declared to compute float64 in float32: its lower precision is float16
    narrow = REFERENCE.replace(computes={"float64": "float32"})
    inputs = _inputs(dtype="float64")
    out = power.lower_precision(narrow, inputs)
    assert out is not None
    np.testing.assert_array_equal(out, oracle.expected(narrow, inputs, baseline_in="float16").baseline)


def test_judging_leaves_the_runs_last_comparison_as_it_was():
    run = RunContext(power=power.Power())
    marker = object()
    run.compared = marker
    with running(run):
        power.see(REFERENCE, _inputs())
    assert run.compared is marker
    assert run.power.judged == 1 and run.power.rejected == set(power.NAMES)


def test_calls_past_the_limit_are_not_judged(monkeypatch):
    monkeypatch.setattr(power, "LIMIT", 10)
    judged = power.Power()
    judged.see(REFERENCE, _inputs())
    assert (judged.judged, judged.too_large, judged.rejected) == (0, 1, set())


def test_a_law_that_compares_no_output_with_the_golden_is_not_applicable():
    judged = power.Power(rejected={"zeros"}, judged=3, golden=False)
    assert judged.verdict() is None
    judged.golden = True
    assert judged.verdict() == ["zeros"]


def test_the_power_table_of_the_reference_at_quick_rejects_every_kernel():
    """Each trivial kernel is told from the golden by the cases of some law; the verdict on the
    target is what it is without the guard; laws that compare no output with the golden say n/a."""
    report = spec.check("reference", profile="quick", power=True)
    assert report.ok
    table = report.power_table()
    unrejected = [name for name, entry in table["kernels"].items() if not entry["rejected_by"]]
    assert unrejected == []
    by_name = {r.name: r.power for r in report.results}
    assert by_name["matches_golden"] == list(power.NAMES)
    assert by_name["causal_no_leak"] is None and by_name["grad_matches_golden"] is None
    # tied scores: uniform weights are the right output there
    assert "uniform_weights" not in by_name["uniform_scores_average"]
    assert table["powerless"] == [r.name for r in report.results if r.power == []]
    data = report.to_dict()
    assert data["power"] == table
    assert all("power" in r for r in data["results"])


def test_power_off_keeps_the_report_and_the_verdict_unchanged():
    only = ["matches_golden", "causal_no_leak", "uniform_scores_average"]
    off = spec.check("reference", profile="quick", only=only)
    on = spec.check("reference", profile="quick", only=only, power=True)
    assert [(r.name, r.status, r.examples, r.observed) for r in off.results] == \
        [(r.name, r.status, r.examples, r.observed) for r in on.results]
    assert "power" not in render(off, width=100) and "power" not in off.to_dict()
    assert all("power" not in r for r in off.to_dict()["results"])
    assert "power 6/6" in render(on, width=100) and "power n/a" in render(on, width=100)


def test_a_law_whose_cases_reject_nothing_is_flagged():
    report = Report(target="t", profile="quick", seed=None, power=True, results=[
        Result("strong", "pass", 10, 0.1, power=list(power.NAMES)),
        Result("weak", "pass", 10, 0.1, power=[]),
        Result("other", "pass", 10, 0.1, power=None),
    ])
    text = render(report, width=100)
    assert "POWERLESS (their cases reject no trivial kernel): weak" in text
    assert "POWER 0/6" in text and "power 6/6" in text and "power n/a" in text
    table = report.power_table()
    assert table["powerless"] == ["weak"] and table["not_applicable"] == ["other"]
    assert all(entry["rejected_by"] == ["strong"] for entry in table["kernels"].values())


def test_a_kernel_no_law_rejects_is_flagged():
    report = Report(target="t", profile="quick", seed=None, power=True, results=[
        Result("law", "pass", 10, 0.1, power=[name for name in power.NAMES if name != "ignores_scale"])])
    lines = render(report, width=100).splitlines()
    flagged = [line.split()[0] for line in lines if "REJECTED BY NO LAW" in line]
    assert flagged == ["ignores_scale"]


def test_trivial_kernels_as_targets_refuse_an_unknown_name():
    with pytest.raises(ValueError, match="name must be one of zeros, mean_v"):
        power.as_target("ones")


def test_cli_power_writes_the_json_keys(tmp_path, capsys):
    path = tmp_path / "report.json"
    code = main(["check", "reference", "--profile", "quick", "--only", "matches_golden", "causal_no_leak",
                 "--power", "--json", str(path)])
    assert code == 0
    report = json.loads(path.read_text())
    assert [r["power"] for r in report["results"]] == [list(power.NAMES), None]
    assert set(report["power"]) == {"kernels", "powerless", "not_applicable"}
    assert report["power"]["not_applicable"] == ["causal_no_leak"]
    assert "power: the trivial kernels" in capsys.readouterr().out


def test_process_isolation_judges_the_power_in_the_worker():
    report = spec.check("reference", profile="quick", only=["matches_golden"], isolation="process",
                        power=True)
    assert report.results[0].power == list(power.NAMES)


def test_a_trivial_target_computes_what_the_guard_judges():
    """as_target's output is the kernel's output for the same arguments (the guard and the meta-test
    judge one kernel)."""
    inputs = _inputs()
    for name in power.NAMES:
        target = power.as_target(name)
        got = target.fn(inputs.q, inputs.k, inputs.v, causal=True)
        want = power.output(power.kernel(name), target, inputs)
        np.testing.assert_array_equal(got.astype(np.float64), want)


def test_a_trivial_target_is_a_plain_target():
    target = power.as_target("zeros")
    assert isinstance(target, Target) and target.supports_mask and target.supports_scale


def test_the_guards_own_error_never_fails_a_law(monkeypatch):
    """An error of the guard's (not the target's) leaves the law's verdict alone and is said in its note."""
    def broken(target, inputs):
        raise RuntimeError("guard broke")

    monkeypatch.setattr(power, "rejected", broken)
    report = spec.check("reference", profile="quick", only=["matches_golden"], power=True)
    (result,) = report.results
    assert result.status == "pass" and result.power is None
    assert "power: RuntimeError: guard broke" in result.message
