"""Errors that teach (issue 11, item 4): a target that fails to load or build is exit 2 and one
line; a signature that differs from the call is reported once, naming the keyword and the fix;
options go before or after TARGET; pytest's short summary carries the law's message."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import spec
from impl import attention
from spec.cli import main
from spec.target import TargetError

ROOT = Path(__file__).resolve().parents[1]

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
    """Before: a factory that raised (a module __getattr__) printed a traceback and exited 1."""
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


def sdpa(q, k, v, is_causal=False):
    """PyTorch's spelling: ``is_causal`` where the suite passes ``causal``."""
    return attention(q, k, v, causal=is_causal)


def test_a_pytorch_style_signature_is_reported_once_with_the_fix():
    """Before: every law that passed causal=True failed with the same TypeError, with no hint."""
    report = spec.check(sdpa, profile="quick")
    (failed,) = report.failures
    assert "does not take the keyword causal=" in failed.message
    assert "sdpa(q, k, v, is_causal=False)" in failed.message  # its signature, as found
    assert "Target(fn, causal_alignment=None)" in failed.message
    wrapper = failed.message.split("wrap it: ", 1)[1]
    assert wrapper == "def f(q, k, v, *, causal=False): return sdpa(q, k, v, is_causal=causal)"
    after = report.results[report.results.index(failed) + 1:]
    assert after and all(r.status == "skip" and f"see {failed.name}" in r.message for r in after)
    assert "TypeError" not in str(report).replace(failed.message, "")  # said once
    # The fix it shows works: the wrapper conforms.
    scope = {"sdpa": sdpa}
    exec(wrapper, scope)
    assert spec.check(scope["f"], profile="quick", only=["causal_no_leak", "matches_golden"]).ok


def test_a_required_keyword_the_suite_never_passes_is_named():
    def needs_flag(q, k, v, *, is_causal):
        return attention(q, k, v, causal=is_causal)

    report = spec.check(needs_flag, profile="quick", only=["matches_golden", "rows_sum_to_one"])
    first, second = report.results
    assert first.status == "fail" and first.fatal
    assert "requires the argument is_causal, which the suite never passes" in first.message
    assert "give is_causal a default" in first.message
    assert second.status == "skip" and "not run: see matches_golden" in second.message


def forgets_v(q, k):
    """Takes two arrays where the suite passes three."""
    return q


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_target_that_takes_too_few_arguments_is_reported_once(isolation):
    """Before: each of 22 laws failed with the same "takes 2 positional arguments but 3 were given"."""
    report = spec.check(forgets_v, profile="quick", isolation=isolation)
    (failed,) = report.failures
    assert failed.fatal and failed.message.startswith(
        "the target cannot be called as the suite calls it, forgets_v(q, k, v): takes 2 positional "
        "arguments but 3 were given (its signature: forgets_v(q, k));")
    assert failed.message.endswith("wrap it: def f(q, k, v, *, causal=False): "
                                   "return forgets_v(<q, k, v as it takes them>)")
    after = report.results[report.results.index(failed) + 1:]
    assert after and all(r.status == "skip" and r.message.startswith("not run: see") for r in after)


def test_the_call_shown_carries_the_keywords_passed():
    def keyword_only(*, q, k, v, causal=False):
        return attention(q, k, v, causal=causal)

    (result,) = spec.check(keyword_only, profile="quick", only=["causal_no_leak"]).results
    assert result.fatal and result.message.startswith(
        "the target cannot be called as the suite calls it, keyword_only(q, k, v, causal=True): takes 0 "
        "positional arguments but 3 positional arguments (and 1 keyword-only argument) were given")


def test_a_grad_fn_that_takes_too_few_arguments_is_named():
    def grad(q, k, v, *, causal=False):  # no d_out
        raise AssertionError("never bound")

    (result,) = spec.check(spec.Target(attention, grad_fn=grad), profile="quick",
                           only=["grad_matches_golden"]).results
    assert result.fatal and result.message.startswith(
        "grad_fn cannot be called as the suite calls it, grad(q, k, v, d_out")


def test_a_type_error_inside_the_target_is_not_mistaken_for_its_signature():
    def buggy(q, k, v, *, causal=False):
        return sorted([1, "a"])  # TypeError from the target's own code

    (result,) = spec.check(buggy, profile="quick", only=["matches_golden"]).results
    assert result.status == "fail" and not result.fatal
    assert result.message.startswith("the target raised TypeError: '<' not supported")


def test_a_grad_fn_with_another_signature_is_named_too():
    def grad(q, k, v, d_out, *, is_causal=False):
        raise AssertionError("never bound")

    report = spec.check(spec.Target(attention, grad_fn=grad), profile="quick",
                        only=["grad_causal_no_leak"])
    (result,) = report.results
    assert "grad_fn does not take the keyword causal=" in result.message
    assert result.message.endswith("def f(q, k, v, d_out, *, causal=False): "
                                   "return grad(q, k, v, d_out, is_causal=causal)")


@pytest.mark.parametrize("argv", [
    ["check", "--only", "rows_sum_to_one", "reference", "--profile", "quick"],
    ["check", "--profile", "quick", "--only", "rows_sum_to_one", "causal_no_leak", "reference"],
    ["check", "reference", "--only", "rows_sum_to_one", "--profile", "quick"],
])
def test_options_go_before_or_after_the_target(argv, capsys):
    """Before: ``--only LAW TARGET`` took TARGET as a property name: "check needs a TARGET"."""
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "reference: conforms" in out and "rows_sum_to_one" in out


def test_only_with_no_target_still_asks_for_one(capsys):
    assert main(["check", "--only", "rows_sum_to_one"]) == 2
    assert "check needs a TARGET" in capsys.readouterr().err


def _pytest_with_the_plugin(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    """A real pytest run, in a project whose one test is ``test_own``, with the suite's plugin."""
    installed = any(ep.value == "spec.pytest_plugin" for ep in entry_points(group="pytest11"))
    (tmp_path / "test_own.py").write_text("def test_own():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", *([] if installed else ["-p", "spec.pytest_plugin"]),
         "-p", "no:cacheprovider", "-q", "-ra", "--attention-profile=quick", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


def test_pytest_short_summary_carries_the_laws_message(tmp_path):
    """Before: the -ra line said only ``FAIL rows_sum_to_one``."""
    run = _pytest_with_the_plugin(tmp_path, "--attention-target=gallery.core:softmax_wrong_axis",
                                  "-k", "rows_sum")
    assert run.returncode == 1
    (line,) = [s for s in run.stdout.splitlines() if s.startswith("FAILED")]
    assert "rows_sum_to_one" in line and " - FAIL rows_sum_to_one: " in line
    (result,) = spec.check("gallery.core:softmax_wrong_axis", "quick", only=["rows_sum_to_one"]).results
    assert line.split("FAIL rows_sum_to_one: ", 1)[1] == result.message, textwrap.shorten(run.stdout, 400)


def test_the_pytest_plugin_reports_a_signature_mismatch_once(tmp_path):
    run = _pytest_with_the_plugin(tmp_path, "--attention-target=test_spec_signature:sdpa")
    assert run.returncode == 1
    failed = [s for s in run.stdout.splitlines() if s.startswith("FAILED")]
    assert len(failed) == 1 and "does not take the keyword causal=" in failed[0], failed
    assert "not run: see " in run.stdout
