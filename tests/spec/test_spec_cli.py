"""python -m spec check (spec.cli), in-process through main plus real subprocesses: the table, the
JSON report, --list, options before or after TARGET, one line and exit 2 for a usage error or a
target that cannot be loaded, Ctrl-C, and the same check as the Python door."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import spec
from spec.cli import main
from spec.target import TargetError

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "spec")])}


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
    """--list prints each law whole, wrapped to fit, not cut at its first sentence (large_logits'
    goes on past "derived from finfo.")."""
    from spec.registry import LAWS

    assert main(["check", "--list"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120
    column = out.splitlines()[0].index("law")
    laws = "".join("".join(line[column:].split()) for line in out.splitlines()[2:])  # wraps break at hyphens
    for prop in LAWS.values():
        assert "".join(prop.statement.replace("``", "").split()) in laws, prop.name


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["check", "nope"], "unknown target 'nope'"),
     (["check", "impl:nope"], "no attribute"),
     (["check", "reference", "--only", "rows"], "unknown law 'rows'"),
     (["check", "refrence"], "did you mean 'reference'"),
     (["check", "reference", "--only", "causal_no_leek"], "(did you mean 'causal_no_leak'"),
     (["check", "my_kernel.py"], "give the path/to/file.py:attr form, my_kernel.py:NAME"),
     (["check", "reference", "--profile", "fast"], "--profile"),
     (["check", "reference", "--max-examples", "0"], "--max-examples"),
     (["check", "reference", "--seed", "x"], "--seed"),
     (["check"], "needs a TARGET"),
     (["check", "reference", "--profile", "scale", "--memory", "-1"], "--memory"),
     (["check", "reference", "--profile", "scale", "--memory", "lots"], "--memory"),
     (["check", "reference", "--memory", "4"], "give --profile scale"),
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


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker process through /proc")
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctrl_c_stops_the_run_with_one_line_exit_130_and_no_worker_left(isolation):
    """Ctrl-C stops a run with one line and exit status 130, no traceback, and no worker process
    left: Ctrl-C signals the whole foreground group, the run's worker process included. (SIGINT is
    set back to its default in the child: a test run started in the background of a shell inherits
    it ignored, and Python keeps it so.)"""
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


def test_the_cli_runs_the_same_check_as_python(monkeypatch, capsys):
    import spec.cli

    seen = {}
    real = spec.runner.check

    def spy(target, *args, **kwargs):
        seen["target"] = target
        return real(target, *args, **kwargs)

    monkeypatch.setattr(spec.cli, "check", spy)
    assert spec.cli.main(["check", "reference", "--profile", "quick", "--only", "rows_sum_to_one"]) == 0
    assert seen["target"].name == "reference"
    capsys.readouterr()


# --- a target that cannot be loaded, and options around TARGET ------------------------------------


MODULES = {
    "wrong_field": "from impl import attention\nfrom spec import Target\n"
                   "target = Target(attention, wrong_field=1)\n",
    "factory_raises": "def __getattr__(name):\n    raise RuntimeError(f'no GPU to build {name} on')\n",
    "import_raises": "raise ZeroDivisionError('division by zero at import')\n",
}


SAID = {
    "wrong_field": "raised TypeError: Target.__init__() got an unexpected keyword argument 'wrong_field'",
    "factory_raises": "raised RuntimeError: no GPU to build target on",
    "import_raises": "raised ZeroDivisionError: division by zero at import",
}


@pytest.fixture
def modules(tmp_path, monkeypatch):
    for name, text in MODULES.items():
        (tmp_path / f"teach_{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("name", list(MODULES))
def test_a_target_that_raises_while_loading_or_building_exits_2_with_one_line(name, modules, capsys):
    """A target that cannot be loaded or built (an unknown field, a module __getattr__ that raises,
    an import that raises) is a usage error: one line naming what was raised and exit status 2, no
    traceback; from Python, a TargetError saying the same."""
    assert main(["check", f"teach_{name}:target", "--profile", "quick"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m spec: error: ") and SAID[name] in err
    with pytest.raises(TargetError, match=SAID[name].replace("(", r"\(").replace(")", r"\)")):
        spec.check(f"teach_{name}:target")


def test_a_factory_that_raises_in_a_real_subprocess(modules):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(modules)])}
    run = subprocess.run([sys.executable, "-m", "spec", "check", "teach_factory_raises:target"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr and run.stderr.count("\n") == 1
    assert SAID["factory_raises"] in run.stderr


@pytest.mark.parametrize("argv", [
    ["check", "--only", "rows_sum_to_one", "reference", "--profile", "quick"],
    ["check", "--profile", "quick", "--only", "rows_sum_to_one", "causal_no_leak", "reference"],
    ["check", "reference", "--only", "rows_sum_to_one", "--profile", "quick"],
])
def test_options_go_before_or_after_the_target(argv, capsys):
    """Options go before or after TARGET: in ``--only LAW TARGET`` the last word is the target, not
    one more law's name."""
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "reference: conforms" in out and "rows_sum_to_one" in out


def test_only_with_no_target_still_asks_for_one(capsys):
    assert main(["check", "--only", "rows_sum_to_one"]) == 2
    assert "check needs a TARGET" in capsys.readouterr().err


def test_the_cli_reads_expected_failures_from_a_file(tmp_path, capsys):
    from spec.cli import main

    listed = tmp_path / "xfails.txt"
    listed.write_text("# known\nmatches_golden[float32]  # held, so stale\n", encoding="utf-8")
    assert main(["check", "reference", "--only", "matches_golden", "--profile", "quick",
                 "--expected-failures", str(listed)]) == 1
    assert "XPASS matches_golden[float32]" in capsys.readouterr().out
    listed.write_text("matches_golden[float32]\n", encoding="utf-8")
    assert main(["check", "reference", "--expected-failures", str(listed)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 1: expected 'law[dtype]  # reason'" in err


def test_device_is_for_framework_targets_and_a_missing_device_is_one_line(capsys):
    from spec.cli import main

    assert main(["check", "reference", "--device", "cuda"]) == 2
    assert "--device applies to the framework targets" in capsys.readouterr().err
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["check", "torch", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot run on 'cuda'" in err


def test_the_scale_profile_says_its_budget_and_the_cases_over_it(capsys):
    from spec import scale_plan

    small = scale_plan.Sizes(decode_keys=2_000, square=200, slices=(30, 2), packed=(4, 20),
                             elements=(2, 500, 8), width=8, needles=(2**8, 2**9), needle_keys=600)
    with scale_plan.sized(small):
        assert main(["check", "flash", "--profile", "scale", "--memory", "2"]) == 0
        out = capsys.readouterr().out
        assert "scale: memory budget 2 GiB; not run: packed: needs cu_seqlens_q=" in out
        assert "scale_matches_golden" in out and "causal_no_leak" not in out  # the scale laws alone
        assert main(["check", "flash", "--profile", "scale", "--memory", "0.001"]) == 0  # nothing fits
        out = " ".join(capsys.readouterr().out.split())  # the header wrapped to fit
        assert "over the memory budget of 0.001 GiB (--memory)" in out and "5 skipped" in out
