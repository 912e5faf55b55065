"""Merge operators as targets (`spec.MergeTarget`): the merge laws run on them, and only those; the
built-ins conform; bad declarations are refused naming the field; a failure replays. Each law's
gallery bug is in tests/spec/gallery/merge.py (checked by test_spec_gallery)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gallery import merge as gallery

import spec
from spec.builtin import MERGE_BUILTIN
from spec.cli import main
from spec.merge_target import MergeTarget

ROOT = Path(__file__).resolve().parents[2]
MERGE_LAWS = [name for name, law in spec.LAWS.items() if law.family == "merge"]
HAS_TORCH_MERGER = importlib.util.find_spec("torch") is not None


def test_a_merge_target_runs_the_merge_laws_and_only_those():
    report = spec.check("merge", profile="quick", seed=1)
    assert [r.name for r in report.results] == MERGE_LAWS
    assert report.ok, [(r.name, r.message) for r in report.failures]
    skipped = {r.name: r.message for r in report.results if r.status == "skip"}
    assert skipped == {"merge_base2_lse": "needs a base-2 lse (target declares lse_base='e')"}


def test_an_attention_target_runs_no_merge_law_unless_named():
    report = spec.check("reference", profile="quick", only=["rows_sum_to_one", "merge_equals_union"])
    statuses = {r.name: (r.status, r.message) for r in report.results}
    assert statuses["merge_equals_union"] == ("skip", "needs a merge operator (a spec.MergeTarget)")
    assert not set(MERGE_LAWS) & {law.name for law in spec.runner.select(None)
                                  if law.family != "merge"}


def test_an_attention_law_named_for_a_merge_target_is_skipped_saying_why():
    (result,) = spec.check("merge", profile="quick", only=["rows_sum_to_one"]).results
    assert result.status == "skip" and "merge operator" in result.message


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_builtin_merge_conforms_at_ci(seed):
    report = spec.check("merge", profile="ci", seed=seed)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert sum(r.status == "pass" for r in report.results) == len(MERGE_LAWS) - 1


@pytest.mark.skipif(not HAS_TORCH_MERGER, reason="needs PyTorch")
def test_torchs_sdpa_merger_conforms_on_non_empty_states_and_fails_on_empty_ones():
    """As declared (empty_parts=False) it conforms; given empty states it returns NaN lse."""
    report = spec.check("torch_sdpa_merger", profile="quick", seed=1)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert {r.name for r in report.results if r.status == "skip"} == {
        "merge_empty_is_identity", "merge_empty_empty_is_empty", "merge_base2_lse"}
    undeclared = MERGE_BUILTIN["torch_sdpa_merger"]().replace(empty_parts=True)
    (result,) = spec.check(undeclared, profile="quick", only=["merge_empty_empty_is_empty"]).results
    assert result.status == "fail" and "nan" in result.message.lower()


def test_a_bnhd_target_gets_outputs_with_tokens_before_heads():
    """A merge written for bhnd states, declared bnhd, broadcasts the lse against the wrong axes."""
    ok = spec.check(MergeTarget(gallery.sigmoid_update_bnhd, layout="bnhd"), profile="quick", seed=2)
    assert ok.ok
    wrong = spec.check(MergeTarget(gallery.sigmoid_update, layout="bnhd"), profile="quick",
                       only=["merge_equals_union"], seed=2)
    assert not wrong.ok and "fn returned out" in wrong.results[0].message


def test_a_failure_gives_a_case_that_replays():
    target = MergeTarget(gallery.empty_empty_nan)
    (result,) = spec.check(target, profile="quick", only=["merge_empty_empty_is_empty"]).results
    assert result.status == "fail" and result.counterexample is not None
    case = result.counterexample.case
    with pytest.raises(AssertionError, match="empty ⊕ empty"):
        spec.replay(target, "merge_empty_empty_is_empty", **case)
    spec.replay("merge", "merge_empty_empty_is_empty", **case)  # the built-in holds on that case


def test_a_merge_that_raises_fails_naming_the_exception():
    def raises(out_a, lse_a, out_b, lse_b):
        raise RuntimeError("no kernel for this shape")

    (result,) = spec.check(MergeTarget(raises), profile="quick", only=["merge_equals_union"]).results
    assert result.status == "fail" and result.message.startswith("RuntimeError: no kernel")


def test_a_merge_returning_one_array_is_told_to_return_a_pair():
    (result,) = spec.check(MergeTarget(lambda oa, la, ob, lb: oa), profile="quick",
                           only=["merge_commutative"]).results
    assert result.status == "fail" and "must return (out, lse)" in result.message


@pytest.mark.parametrize(("declared", "named"), [
    ({}, "needs fn"),
    ({"fn": 3}, "fn must be callable"),
    ({"fn": gallery.max_shifted, "fn_n": "x"}, "fn_n must be callable"),
    ({"fn": gallery.max_shifted, "lse_base": 10}, "lse_base"),
    ({"fn": gallery.max_shifted, "lse_base": True}, "lse_base"),
    ({"fn": gallery.max_shifted, "empty_lse": math.nan}, "empty_lse"),
    ({"fn": gallery.max_shifted, "empty_lse": "-inf"}, "empty_lse"),
    ({"fn": gallery.max_shifted, "dtypes": "float32"}, "dtypes"),
    ({"fn": gallery.max_shifted, "dtypes": ("int8",)}, "dtypes"),
    ({"fn": gallery.max_shifted, "layout": "nhd"}, "layout"),
    ({"fn": gallery.max_shifted, "empty_parts": "no"}, "empty_parts"),
])
def test_a_bad_declaration_is_refused_naming_the_field(declared, named):
    with pytest.raises(spec.TargetError, match=named):
        MergeTarget(**declared)


def test_lse_base_two_given_as_text_is_read_as_the_number():
    assert MergeTarget(gallery.base2, lse_base="2").lse_base == 2


def test_a_merge_builtin_is_not_an_attention_target():
    with pytest.raises(spec.TargetError, match="merge operator"):
        spec.load_target("merge")


def test_isolation_is_refused_for_a_merge_target():
    with pytest.raises(spec.TargetError, match="isolation and deadline"):
        spec.check("merge", isolation="thread")


def test_the_cli_checks_a_merge_target(capsys):
    assert main(["check", "merge", "--profile", "quick", "--only", "merge_equals_union"]) == 0
    assert "merge_equals_union" in capsys.readouterr().out
    assert main(["check", "gallery:CORRECT_BY_NAME.max_shifted", "--profile", "quick", "--seed", "3"]) == 0


def test_the_cli_refuses_attention_options_for_a_merge_target(capsys):
    assert main(["check", "merge", "--isolation", "thread"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--isolation" in err and "Traceback" not in err


def test_the_cli_lists_attention_laws_as_skipped_for_a_merge_target(capsys):
    assert main(["check", "--list", "merge"]) == 0
    out = capsys.readouterr().out
    assert "an attention law" in out and "merge_large_lse" in out


def test_the_cli_in_a_process_fails_a_broken_merge_module_attr(tmp_path):
    script = tmp_path / "my_merge.py"
    script.write_text("import numpy as np\nimport spec\n\n"
                      "def bad(out_a, lse_a, out_b, lse_b):\n"
                      "    return out_a, np.maximum(lse_a, lse_b)\n\n"
                      "target = spec.MergeTarget(bad)\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "spec", "check", f"{script}:target", "--profile", "quick",
                           "--only", "merge_equals_union"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 1, done.stderr
    assert "merge_equals_union" in done.stdout and f"{script}:target" in done.stdout


def test_merge_call_reads_the_declared_base_and_empty_value():
    from spec.merge_target import merge_call

    seen = {}

    def spy(out_a, lse_a, out_b, lse_b):
        seen["lse"] = (lse_a.copy(), lse_b.copy())
        return out_a, lse_a  # b is empty here: the merge is a

    target = MergeTarget(spy, lse_base=2, empty_lse=math.inf)
    outs = [np.ones((2, 3)), np.zeros((2, 3))]
    lses = [np.array([math.log(2.0), 0.0]), np.array([-np.inf, -np.inf])]
    _, _, natural = merge_call(target, outs, lses, "float32")
    assert seen["lse"][0].tolist() == [1.0, 0.0] and seen["lse"][1].tolist() == [math.inf, math.inf]
    np.testing.assert_allclose(natural, lses[0], rtol=1e-6)
