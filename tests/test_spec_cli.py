"""The CLI (in-process through main, plus one real subprocess) and the pytest plugin."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from spec.cli import main

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}


def test_conforming_target_exits_0_with_a_table(capsys):
    assert main(["check", "reference", "--profile", "quick", "--only", "rows_sum_to_one",
                 "--only", "causal_no_leak"]) == 0
    out = capsys.readouterr().out
    assert "rows_sum_to_one" in out and "causal_no_leak" in out and "conforms" in out
    assert "matches_golden" not in out


def test_broken_target_exits_1_naming_the_property_law_case_and_reproduction(capsys):
    assert main(["check", "gallery.core:mask_off_by_one", "--only", "causal_no_leak"]) == 1
    out = capsys.readouterr().out
    assert "FAIL causal_no_leak" in out and "law: Changing the keys" in out
    assert "case: dtype=" in out and "the target received (the law's last call): q (" in out
    assert "reproduce: python -c" in out
    assert "DOES NOT CONFORM" in out


def test_json_report_has_the_documented_schema(tmp_path, capsys):
    path = tmp_path / "report.json"
    code = main(["check", "gallery.core:missing_scale", "--profile", "quick", "--max-examples", "5",
                 "--only", "scale_is_inv_sqrt_dk", "output_shape_dtype", "--json", str(path)])
    assert code == 1
    report = json.loads(path.read_text())
    assert set(report) == {"target", "ok", "profile", "seed", "results"}
    assert report["ok"] is False and report["profile"] == "quick" and report["seed"] is None
    assert [r["name"] for r in report["results"]] == ["output_shape_dtype", "scale_is_inv_sqrt_dk"]
    passed, failed = report["results"]
    assert {"name", "status", "examples", "seconds", "message", "counterexample"} <= set(failed)
    assert passed["status"] == "pass" and passed["counterexample"] is None and passed["examples"] == 5
    assert failed["status"] == "fail" and failed["counterexample"]["case"]["d_k"] >= 2


def test_json_to_stdout(capsys):
    assert main(["check", "flash", "--profile", "quick", "--only", "mask_semantics", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["results"][0]["status"] == "skip"


def test_list_shows_every_property_and_what_a_target_would_skip(capsys):
    assert main(["check", "--list"]) == 0
    assert "score_variance" in capsys.readouterr().out
    assert main(["check", "flash", "--list"]) == 0
    assert "skipped: needs mask=" in capsys.readouterr().out


def test_list_prints_each_law_whole_and_wrapped(capsys):
    """Before: a long law was cut at its first sentence (large_logits' at "derived from finfo.")."""
    from spec.registry import PROPERTIES

    assert main(["check", "--list"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120
    column = out.splitlines()[0].index("law")
    laws = "".join("".join(line[column:].split()) for line in out.splitlines()[2:])  # wraps break at hyphens
    for prop in PROPERTIES.values():
        assert "".join(prop.law.replace("``", "").split()) in laws, prop.name


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["check", "nope"], "unknown target 'nope'"),
     (["check", "impl:nope"], "no attribute"),
     (["check", "reference", "--only", "rows"], "unknown property 'rows'"),
     (["check", "reference", "--profile", "fast"], "--profile"),
     (["check", "reference", "--max-examples", "0"], "--max-examples"),
     (["check", "reference", "--seed", "x"], "--seed"),
     (["check"], "needs a TARGET"),
     ([], "command")],
)
def test_usage_errors_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1 and not captured.out


def test_real_subprocess_exit_codes():
    ok = subprocess.run([sys.executable, "-m", "spec", "check", "flash", "--profile", "quick", "--only",
                         "causal_no_leak"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "spec", "check", "torch_or_what"], capture_output=True,
                         text=True, env=ENV, cwd=ROOT, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1


def _plugin_args() -> list[str]:
    """Load the plugin by hand unless the installed package's pytest11 entry point already does."""
    installed = any(ep.value == "spec.pytest_plugin" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "spec.pytest_plugin"]


def _pytest(tmp_path, *args, env=ENV):
    (tmp_path / "test_own.py").write_text("def test_own():\n    pass\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", *_plugin_args(), "-p", "no:cacheprovider", "-q",
         "--attention-profile=quick", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )


def test_pytest_plugin_adds_the_properties_next_to_the_projects_tests(tmp_path):
    run = _pytest(tmp_path, "--attention-target=reference", "-k", "own or rows_sum_to_one or bias_per_head")
    assert run.returncode == 0, run.stdout
    assert "3 passed" in run.stdout
    run = _pytest(tmp_path, "--attention-target=impl:flash_attention", "-k", "own or bias_per_head")
    assert run.returncode == 0, run.stdout
    assert "1 passed, 1 skipped" in run.stdout


def test_the_readmes_pytest_line_collects_the_laws_alone():
    """Before: run from a checkout it collected the project's ~2,000 tests beside the 53 laws."""
    from spec.registry import PROPERTIES

    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    (line,) = [s for s in readme if s.startswith("python -m pytest --attention-target=")]
    words = shlex.split(line.split("#")[0])[3:]  # what follows "python -m pytest"
    run = subprocess.run([sys.executable, "-m", "pytest", *_plugin_args(), *words, "--collect-only", "-q",
                          "-p", "no:cacheprovider"], capture_output=True, text=True, env=ENV, cwd=ROOT,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    collected = [s for s in run.stdout.splitlines() if "::" in s]
    assert collected == [f"attention-spec::{name}" for name in PROPERTIES], run.stdout[-2000:]


def test_attention_only_leaves_the_projects_own_tests_out(tmp_path):
    run = _pytest(tmp_path, "--attention-target=reference", "--attention-only", "-k",
                  "own or rows_sum_to_one")
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout
    (tmp_path / "test_broken_import.py").write_text("import no_such_module_anywhere\n")
    run = _pytest(tmp_path, "--attention-target=reference", "--attention-only", "-k", "rows_sum_to_one")
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout  # never imported
    env = {k: v for k, v in ENV.items() if k != "ATTENTION_TARGET"}
    run = _pytest(tmp_path, "--attention-only", env=env)
    assert run.returncode == 4 and "--attention-only needs a target" in run.stderr


def test_pytest_plugin_reports_a_broken_target_with_the_counterexample(tmp_path):
    env = {**ENV, "ATTENTION_TARGET": "gallery.core:softmax_wrong_axis"}
    run = _pytest(tmp_path, "-k", "rows_sum", env=env)
    assert run.returncode == 1
    assert "FAIL rows_sum_to_one" in run.stdout and run.stdout.count("reproduce:") == 1, run.stdout


def test_pytest_plugin_without_a_target_adds_nothing(tmp_path):
    env = {k: v for k, v in ENV.items() if k != "ATTENTION_TARGET"}
    run = _pytest(tmp_path, env=env)
    assert run.returncode == 0 and "1 passed" in run.stdout


def test_pytest_plugin_unloadable_target_is_a_usage_error(tmp_path):
    run = _pytest(tmp_path, "--attention-target=nope")
    assert run.returncode == 4 and "unknown target 'nope'" in run.stderr


def test_pytest_plugin_under_xdist(tmp_path):
    run = _pytest(tmp_path, "--attention-target=flash", "-n", "2", "-k", "own or shape or scale or mask")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed, 4 skipped" in run.stdout  # the two mask laws of spec.laws.masks skip too


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker process through /proc")
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctrl_c_stops_the_run_with_one_line_exit_130_and_no_worker_left(isolation):
    """Before: a KeyboardInterrupt traceback. Ctrl-C signals the whole foreground group, the
    run's worker process included. (SIGINT is set back to its default in the child: a test run
    started in the background of a shell inherits it ignored, and Python keeps it so.)"""
    run = subprocess.Popen(
        [sys.executable, "-m", "spec", "check", "reference", "--profile", "ci", "--isolation", isolation],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while "… pass" not in run.stderr.readline():  # a law has run: the run is under way
            assert run.poll() is None
        children = _children(run.pid)
        os.killpg(run.pid, signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130
    assert err.strip().splitlines()[-1] == "python -m spec: interrupted" and "Traceback" not in err
    assert bool(children) == (isolation == "process")  # the run's worker
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc: field 4 of each stat, after the name)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except OSError:  # gone meanwhile
            continue
    return found
