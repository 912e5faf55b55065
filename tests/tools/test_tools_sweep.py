"""The false-alarm sweep (tools/sweep.py): a table of targets × seeds, each cell its own spec check run
outside the checkout; a failing law fails the sweep."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tools import sweep, sweep_cells

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def on_path(monkeypatch):
    """The checkout importable from the cells' empty folder (as an installed package would be)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_a_cell_that_fails_names_its_law_and_fails_the_sweep(on_path, capsys):
    code = sweep.main(["--targets", "examples.my_attention:target", "examples.my_attention:undeclared",
                       "--seeds", "default", "1", "--profile", "quick", "--allow-checkout",
                       "--only", "masked_rows_policy", "--only", "rows_sum_to_one"])
    table = capsys.readouterr().out
    assert code == 1
    assert "| examples.my_attention:target | conforms | conforms |" in table
    assert "| examples.my_attention:undeclared | masked_rows_policy | masked_rows_policy |" in table
    assert "2 of 4 runs conform" in table


def test_the_sweep_checks_an_installed_package_unless_told(on_path, capsys):
    code = sweep.main(["--targets", "reference", "--seeds", "0"])
    assert code == 2 and "a checkout" in capsys.readouterr().err


def test_a_target_that_cannot_be_checked_is_an_error(on_path, capsys):
    code = sweep.main(["--targets", "no_such_target", "--seeds", "0", "--allow-checkout"])
    assert code == 2 and "error: " in capsys.readouterr().out


@pytest.mark.parametrize(("words", "seeds"),
                         [(["0-2", "7"], ["0", "1", "2", "7"]), (["default"], ["default"])])
def test_seed_ranges(words, seeds):
    assert sweep.seeds(words) == seeds


def test_a_bad_seed_is_refused(capsys):
    assert sweep.main(["--seeds", "two"]) == 2
    assert "--seeds: 'two'" in capsys.readouterr().err


def test_the_gallery_group_is_every_correct_variant_each_loadable(on_path):
    from gallery import CORRECT

    import spec
    from spec.builtin import load_merge_target, load_rank_target

    found = sweep.entries(["gallery"])
    assert [e.label for e in found] == [f"gallery/{t.name}" for t in CORRECT]
    assert all(e.path == (str(ROOT / "tests" / "spec"),) for e in found)
    loaded = [load_merge_target(e.target) or load_rank_target(e.target) or spec.load_target(e.target)
              for e in found]  # merge operators and context-parallel targets too
    assert {t.name for t in loaded} == {t.name for t in CORRECT}  # names unique


def test_the_builtins_group_leaves_the_slow_ones_aside():
    builtins, slow = sweep.entries(["builtins"]), sweep.entries(["slow"])
    assert [e.label for e in builtins][:2] == ["reference", "flash"]
    assert not {e.label for e in builtins} & set(sweep.SLOW)
    assert all(e.slow and e.label in sweep.SLOW for e in slow)
    torch = importlib.util.find_spec("torch") is not None
    assert ("torch" in [e.label for e in builtins]) == torch
    assert [e.label for e in sweep.entries(["all"])][-1] == "examples/my_attention.py:target"


def test_a_gallery_variant_is_swept_from_outside_the_checkout(on_path, capsys):
    code = sweep.main(["--targets", "gallery/fp8_float64_paged", "examples", "--seeds", "0",
                       "--profile", "quick", "--allow-checkout",
                       "--only", "rows_sum_to_one", "--only", "fp8_matches_golden"])
    table = capsys.readouterr().out
    assert code == 0, table
    assert "| gallery/fp8_float64_paged | conforms |" in table
    assert "| examples/my_attention.py:target | conforms |" in table


def test_sharded_sweeps_merge_into_the_table_of_the_whole_sweep(on_path, capsys, tmp_path):
    words = ["--targets", "examples.my_attention:target", "examples.my_attention:undeclared", "--seeds",
             "default", "1", "--profile", "quick", "--allow-checkout", "--only", "masked_rows_policy"]
    assert sweep.main(words) == 1
    whole = capsys.readouterr().out.split("\n\n")[0]
    shards = [str(tmp_path / f"sweep-{i}.json") for i in (1, 2)]
    for i, path in enumerate(shards, 1):
        assert sweep.main([*words, "--shard", f"{i}/2", "--json", path]) == 1  # undeclared: in each shard
        ran = capsys.readouterr().out
        assert "2 of 4 runs" not in ran and " of 2 runs conform" in ran  # half the cells each
    assert sweep.main(["--merge", *reversed(shards)]) == 1
    assert capsys.readouterr().out.split("\n\n")[0] == whole
    assert sweep.main(["--merge", shards[0], shards[0]]) == 2
    assert "--merge: a cell in two files" in capsys.readouterr().err


@pytest.mark.parametrize("shard", ["3/2", "0/0", "x"])
def test_a_bad_shard_is_refused(shard, capsys):
    assert sweep.main(["--shard", shard]) == 2
    assert "error: --shard: expected I/N" in capsys.readouterr().err


FAILING = ["--targets", "examples.my_attention:target", "examples.my_attention:undeclared",
           "--seeds", "default", "1", "--profile", "quick", "--allow-checkout",
           "--only", "masked_rows_policy"]


def test_the_table_under_xdist_is_the_table_at_one_job(on_path, capsys):
    assert sweep.main([*FAILING, "--jobs", "1"]) == 1
    alone = capsys.readouterr().out
    assert sweep.main([*FAILING, "--jobs", "2"]) == 1
    spread = capsys.readouterr().out
    assert spread.split("\n\n")[0] == alone.split("\n\n")[0]
    assert "| examples.my_attention:undeclared | masked_rows_policy | masked_rows_policy |" in spread
    assert "2 of 4 runs conform" in spread and "2 at once" in spread


def test_a_cell_that_crashes_is_an_error_and_the_others_still_run(on_path, capsys, tmp_path):
    crash = tmp_path / "crash.py"  # its check's process dies as it loads the target
    crash.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", encoding="utf-8")
    code = sweep.main(["--targets", f"{crash}:target", "examples.my_attention:target", "--seeds", "0", "1",
                       "--profile", "quick", "--allow-checkout", "--only", "rows_sum_to_one", "--jobs", "2"])
    table = capsys.readouterr().out
    assert code == 2, table
    assert f"| {crash}:target | error: exit -9 | error: exit -9 |" in table
    assert "| examples.my_attention:target | conforms | conforms |" in table


def test_no_process_of_the_sweep_outlives_it(on_path, monkeypatch, capsys):
    proc = Path("/proc")
    if not (proc / str(os.getpid()) / "environ").exists():
        pytest.skip("needs /proc to find the sweep's processes")
    mark = f"SWEEP_MARK={os.getpid()}".encode()  # inherited by pytest, its workers and the cells
    monkeypatch.setenv("SWEEP_MARK", str(os.getpid()))
    assert sweep.main([*FAILING, "--jobs", "2"]) == 1
    capsys.readouterr()
    left = []
    for environ in proc.glob("[0-9]*/environ"):
        try:
            if environ.parent.name != str(os.getpid()) and mark in environ.read_bytes().split(b"\0"):
                left.append((proc / environ.parent.name / "cmdline").read_bytes().replace(b"\0", b" "))
        except OSError:  # gone meanwhile, or another user's
            continue
    assert not left


def test_a_lost_cell_is_an_error_named_by_its_test():
    # what pytest-xdist reports of a test whose worker died under it
    report = pytest.TestReport("/tmp/run/sweep-plan.json::gallery/tiled[3]", ("sweep-plan.json", None, ""),
                               {}, "failed", "worker 'gw1' crashed while running 'gallery/tiled[3]'", "???")
    cell = sweep_cells.lost(report)
    assert (cell.target, cell.seed, cell.failed, cell.error) == ("gallery/tiled", "3", True, True)
    assert cell.verdict == "error: worker 'gw1' crashed while running 'gallery/tiled[3]'"


def test_a_cell_gets_the_sweeps_environment_not_pytests(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-x")
    monkeypatch.setenv("SWEEP_KEPT", "1")
    env = sweep._env(("/gallery",))
    assert not set(env) & set(sweep.PYTEST_OWN) and "PYTEST_CURRENT_TEST" in os.environ
    assert env["SWEEP_KEPT"] == "1" and env["PYTHONPATH"].startswith("/gallery")


def test_jobs_without_xdist_is_refused(monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(sweep.importlib.util, "find_spec",
                        lambda name, *rest: None if name == "xdist" else find_spec(name, *rest))
    assert sweep.main(["--targets", "reference", "--seeds", "0", "--jobs", "2"]) == 2
    assert "--jobs 2: the cells run under pytest-xdist, which is not installed" in capsys.readouterr().err


def test_a_cell_pytest_never_ran_is_an_error_naming_pytests_last_words(on_path, monkeypatch, capsys):
    fails = [sys.executable, "-c", "print('ERROR: the sweep plugin did not load'); raise SystemExit(4)"]
    monkeypatch.setattr(sweep, "pytest_command", lambda plan, out, jobs: fails)
    assert sweep.main(["--targets", "reference", "--seeds", "0", "1", "--allow-checkout", "--jobs", "2"]) == 2
    out = capsys.readouterr()
    said = "error: not run (pytest exit 4: ERROR: the sweep plugin did not load)"
    assert f"| reference | {said} | {said} |" in out.out and "did not load" in out.err
