"""Shards (spec.shard): ``--shard I/N`` runs every law under the shard's own seed, so N shards draw N
times the examples; ``python -m spec merge`` makes one report of them, with the verdicts of the
same examples run in one process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

import spec
from examples.my_attention import attention, undeclared
from spec.cli import main
from spec.profiles import PROFILES
from spec.report import Counterexample, Result
from spec.shard import Shard, merge, merge_results, parse_shard, report_from_dict, shard_seed

ROOT = Path(__file__).resolve().parents[2]
LAWS = ["rows_sum_to_one", "masked_rows_policy", "output_shape_dtype"]
"""Laws quick to run, one of which ``undeclared`` (NaN rows, declared as zeros) fails."""


@pytest.mark.parametrize(("text", "shard"),
                         [("1/1", Shard(1, 1)), ("2/3", Shard(2, 3)), (" 3 / 3 ", Shard(3, 3))])
def test_a_shard_is_i_of_n_counted_from_one(text, shard):
    assert parse_shard(text) == shard and str(shard) == f"{shard.index}/{shard.count}"


@pytest.mark.parametrize("text", ["3/2", "0/2", "0/0", "x", "1", "1/2/3", "-1/2", ""])
def test_a_shard_that_is_not_i_of_n_is_refused_naming_the_argument(text):
    with pytest.raises(ValueError, match=r"^--shard: expected I/N"):
        parse_shard(text, name="--shard")


@pytest.mark.parametrize("text", ["3/2", "0/0", "x"])
def test_the_cli_refuses_a_bad_shard_in_one_line_exit_2(text, capsys):
    assert main(["check", "reference", "--shard", text]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--shard" in err and "Traceback" not in err


def test_the_python_door_refuses_a_bad_shard_naming_it():
    with pytest.raises(ValueError, match=r"^shard: expected I/N with 1 <= I <= N"):
        spec.check("reference", shard="2/1")


def test_shard_one_draws_with_the_checks_seed_the_others_each_their_own():
    for seed in (None, 0, 7):
        drawn = [shard_seed(Shard(i, 4), seed, derandomized=True) for i in range(1, 5)]
        assert drawn[0] == seed and shard_seed(None, seed, derandomized=True) == seed
        assert len(set(drawn)) == 4  # every shard a stream of its own
        assert drawn == [shard_seed(Shard(i, 9), seed, derandomized=True) for i in range(1, 5)]  # whatever N
    assert shard_seed(Shard(2, 2), 0, derandomized=True) != shard_seed(Shard(2, 2), 1, derandomized=True)
    assert shard_seed(Shard(2, 2), None, derandomized=False) is None  # a random profile stays random


def drawn_inputs(**options) -> list[bytes]:
    """The query arrays one law's run hands the target, in order."""
    seen: list[bytes] = []

    def recording(q, k, v, *, causal=False):
        seen.append(np.asarray(q).tobytes())
        return attention(q, k, v, causal=causal)

    spec.check(spec.Target(recording, name="recording"), profile="quick", only=["rows_sum_to_one"], **options)
    return seen


def test_shards_draw_other_examples_and_shard_one_the_unsharded_runs():
    alone, first, second = drawn_inputs(), drawn_inputs(shard="1/2"), drawn_inputs(shard="2/2")
    assert first == alone  # adding shards keeps the examples a check had
    # the boundary grid runs in both; the drawn examples are new
    assert len(set(second) - set(first)) >= PROFILES["quick"].max_examples // 2
    assert drawn_inputs(shard="2/2") == second  # and each shard a fixed stream
    assert drawn_inputs(seed=shard_seed(Shard(2, 2), None, derandomized=True)) == second  # replayed by --seed


def run_shards(tmp_path, count: int) -> list[str]:
    paths = []
    for index in range(1, count + 1):
        path = tmp_path / f"shard{index}.json"
        code = main(["check", "examples/my_attention.py:undeclared", "--profile", "quick", "--shard",
                     f"{index}/{count}", "--json", str(path), "--only", *LAWS])
        assert code == 1
        paths.append(str(path))
    return paths


def test_the_merged_report_has_the_verdicts_of_the_same_examples_run_in_one_process(tmp_path, capsys):
    paths = run_shards(tmp_path, 2)
    assert main(["merge", *reversed(paths), "--json", str(tmp_path / "merged.json")]) == 1  # fails: exit 1
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert "2 shards merged" in capsys.readouterr().out
    # the same examples in this process: the check under each shard's seed, one after the other
    seeds = [shard_seed(Shard(i, 2), None, derandomized=PROFILES["quick"].derandomize) for i in (1, 2)]
    runs = [spec.check(undeclared, profile="quick", only=LAWS, seed=seed) for seed in seeds]
    assert merged["ok"] is False and merged["seed"] is None
    assert [s["seed"] for s in merged["shards"]] == seeds
    for at, law in enumerate(merged["results"]):
        alone = [run.results[at] for run in runs]
        assert law["name"] == alone[0].name
        assert law["status"] == ("fail" if any(r.status == "fail" for r in alone) else "pass")
        assert law["examples"] == sum(r.examples for r in alone)
    passed = next(law for law in merged["results"] if law["name"] == "rows_sum_to_one")
    assert passed["status"] == "pass" and passed["examples"] > runs[0].results[0].examples  # more examples
    failed = next(law for law in merged["results"] if law["status"] == "fail")
    assert failed["name"] == "masked_rows_policy"
    assert failed["counterexample"]["reproduce"].startswith("python")


def result(status: str, examples: int = 5, **fields) -> Result:
    return Result("matches_golden", status, examples, 1.0, law="the law", **fields)


def test_a_law_fails_if_it_failed_in_any_shard_its_counterexample_kept():
    found = Counterexample(case={"n_q": 3}, reproduce="python -c ...")
    merged = merge_results([result("pass", observed={"error ratio float32": 0.5}),
                            result("fail", 2, message="broken", counterexample=found,
                                   observed={"error ratio float32": 3.0, "error ratio float64": 0.1}),
                            result("pass", observed={"error ratio float32": math.nan})])
    assert merged.status == "fail" and merged.message == "broken" and merged.counterexample == found
    assert merged.examples == 12 and merged.seconds == 3.0
    assert math.isnan(merged.observed["error ratio float32"])  # the worst figure: NaN worst of all
    assert merged.observed["error ratio float64"] == 0.1


def test_a_passing_laws_note_says_the_worst_figure_of_any_shard():
    shards = [result("pass", message=f"error/allowed: float32 {ratio}; a note",
                     observed={"error ratio float32": ratio}) for ratio in (0.25, 0.5)]
    assert merge_results(shards).message == "error/allowed: float32 0.5; a note"


@pytest.mark.parametrize(("statuses", "status"), [(["pass", "skip"], "pass"), (["skip", "skip"], "skip"),
                                                  (["xpass", "xfail"], "xfail"),
                                                  (["xpass", "xpass"], "xpass")])
def test_a_merged_status_is_the_most_telling_of_the_shards(statuses, status):
    assert merge_results([result(s) for s in statuses]).status == status


def test_a_report_reads_back_from_its_json_as_it_was():
    report = spec.check(undeclared, profile="quick", only=LAWS, shard="2/3", seed=5)
    report.results[0].observed["error ratio float32"] = math.inf  # written as "Infinity"
    again = report_from_dict(json.loads(report.to_json()))
    assert again.to_dict() == report.to_dict()
    assert again.shard == Shard(2, 3) and again.base_seed == 5 and again.seed == shard_seed(Shard(2, 3), 5,
                                                                                         derandomized=True)


def test_reports_that_are_not_the_shards_of_one_check_are_refused(tmp_path, capsys):
    one, two = run_shards(tmp_path, 2)
    unsharded = tmp_path / "whole.json"
    main(["check", "reference", "--profile", "quick", "--only", "output_shape_dtype",
          "--json", str(unsharded)])
    (tmp_path / "list.json").write_text("[]")
    capsys.readouterr()
    for given, said in [([one, one], "shard 1/2 given twice; shard 2/2 missing"),
                        ([two], "shard 1/2 missing"),
                        ([one, str(unsharded)], f"{unsharded} is not a shard"),
                        ([str(tmp_path / "list.json")], "not a report"),
                        ([str(tmp_path / "none.json")], "cannot read REPORT")]:
        assert main(["merge", *given]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_shards_of_another_check_are_refused():
    first = spec.check(undeclared, profile="quick", only=LAWS, shard="1/2")
    other = spec.check(undeclared, profile="quick", only=LAWS, shard="2/2", seed=3)
    with pytest.raises(ValueError, match="different checks: seed 3, None"):
        merge([first, other])
    with pytest.raises(ValueError, match="different counts"):
        merge([first, spec.check(undeclared, profile="quick", only=LAWS, shard="2/3")])
    assert merge([first, spec.check(undeclared, profile="quick", only=LAWS, shard="2/2")]).ok is False


# --- the pytest door ---------------------------------------------------------------------------------

RECORDING = '''
import hashlib, os
import numpy as np
import spec
from examples.my_attention import attention

def recording(q, k, v, *, causal=False):
    with open(os.environ["RECORD"], "a") as f:
        f.write(f"{os.getpid()} {hashlib.sha1(np.asarray(q).tobytes()).hexdigest()}\\n")
    return attention(q, k, v, causal=causal)

target = spec.Target(recording, name="recording")
process = spec.Target(recording, name="recording", isolation="process")
'''


def pytest_door(tmp_path, name: str, *args: str) -> tuple[subprocess.CompletedProcess, list[tuple[str, str]]]:
    """A real pytest run of the laws alone against ``recording.py:NAME``: the run, and each call the
    target received as (process id, digest of q)."""
    (tmp_path / "recording.py").write_text(RECORDING)
    record = tmp_path / f"calls-{len(list(tmp_path.glob('calls-*')))}.txt"
    record.touch()
    env = {**os.environ, "RECORD": str(record), "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    env.pop("CI", None)
    # the plugin by hand unless the installed package's pytest11 entry point already loads it
    installed = any(ep.value == "spec.pytest_plugin" for ep in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "spec.pytest_plugin"]
    run = subprocess.run([sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider", "-q",
                          "--attention-only", "--attention-profile=quick",
                          f"--attention-target=recording:{name}", *args],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    calls = [tuple(line.split()) for line in record.read_text().splitlines()]
    return run, calls  # type: ignore[return-value]


def test_the_pytest_door_refuses_a_bad_shard_naming_it(tmp_path):
    run, _ = pytest_door(tmp_path, "target", "--attention-shard=3/2")
    assert run.returncode == 4 and "--attention-shard: expected I/N" in run.stderr, run.stderr


def test_the_pytest_doors_shards_draw_as_the_clis(tmp_path):
    one_law = ("-k", "rows_sum_to_one")
    whole, first, second = (pytest_door(tmp_path, "target", *one_law, *shard)
                            for shard in ([], ["--attention-shard=1/2"], ["--attention-shard", "2/2"]))
    assert whole[0].returncode == first[0].returncode == second[0].returncode == 0, second[0].stdout
    drawn = [[digest for _, digest in calls] for _, calls in (whole, first, second)]
    assert drawn[0] == drawn[1] and len(set(drawn[2]) - set(drawn[1])) >= PROFILES["quick"].max_examples // 2


def test_under_xdist_process_isolation_forks_once_per_worker_not_per_law(tmp_path):
    laws = ("rows_sum_to_one", "output_shape_dtype", "inputs_not_mutated", "convex_combination",
            "matches_golden")
    run, calls = pytest_door(tmp_path, "process", "-n", "2", "-k", " or ".join(laws))
    assert run.returncode == 0 and f"{len(laws)} passed" in run.stdout, run.stdout + run.stderr
    assert 1 <= len({pid for pid, _ in calls}) <= 2  # the target's set-up once per xdist worker
