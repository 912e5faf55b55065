"""The pytest plugin (spec.pytest_plugin), in real pytest runs: the laws collected next to a
project's tests or alone, under xdist, and a failure's message in the short summary."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import spec

ROOT = Path(__file__).resolve().parents[2]
# a pytest run as in a terminal: where CI or BUILD_NUMBER is set (.ci/run sets CI), pytest writes
# each short-summary line in full, and what these tests count would be counted twice
ENV = {**{k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")},
       "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "spec")])}
WIDE = {**ENV, "COLUMNS": "250"}  # the short summary's lines whole


def _plugin_args() -> list[str]:
    """Load the plugin by hand unless the installed package's pytest11 entry point already does."""
    installed = any(ep.value == "spec.pytest_plugin" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "spec.pytest_plugin"]


def _pytest(tmp_path, *args, env=ENV):
    """A real pytest run with the suite's plugin, in a project whose one test is ``test_own``."""
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
    """The README's pytest line, run from a checkout, collects the laws alone (those of its profile,
    ci: every law but the scale, merge and rank ones), not the project's own tests beside them."""
    from spec.profiles import runs_at
    from spec.registry import LAWS

    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    (line,) = [s for s in readme if s.startswith("python -m pytest --attention-target=")]
    words = shlex.split(line.split("#")[0])[3:]  # what follows "python -m pytest"
    run = subprocess.run([sys.executable, "-m", "pytest", *_plugin_args(), *words, "--collect-only", "-q",
                          "-p", "no:cacheprovider"], capture_output=True, text=True, env=ENV, cwd=ROOT,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    collected = [s for s in run.stdout.splitlines() if "::" in s]
    laws = [name for name, prop in LAWS.items() if runs_at(prop.family, "ci") is None
            and prop.family not in ("merge", "ranks")]  # merge operators' and context-parallel targets' own
    assert collected == [f"attention-spec::{name}" for name in laws], run.stdout[-2000:]
    assert len(laws) < len(LAWS)


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
    """Under two xdist workers, each law selected runs once with the verdict spec.check gives it (the
    laws of the profile whose names hold the words, counted from the registry, so a new law changes
    no figure)."""
    from spec.profiles import runs_at

    words = ("shape", "scale", "mask")
    chosen = [name for name, law in spec.LAWS.items()
              if any(w in name for w in words) and runs_at(law.family, "quick") is None]  # those collected
    report = spec.check("flash", "quick", only=chosen)
    passed = 1 + sum(r.status == "pass" for r in report.results)  # test_own too
    skipped = sum(r.status == "skip" for r in report.results)
    assert passed > 1 and skipped > 0  # both kinds among them
    run = _pytest(tmp_path, "--attention-target=flash", "-n", "2", "-k", " or ".join(("own", *words)))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{passed} passed, {skipped} skipped" in run.stdout


def test_pytest_short_summary_carries_the_laws_message(tmp_path):
    """pytest's short summary (-ra) carries the law's message, the one spec.check reports, after
    ``FAIL rows_sum_to_one:``."""
    run = _pytest(tmp_path, "-ra", "--attention-target=gallery.core:softmax_wrong_axis", "-k", "rows_sum",
                  env=WIDE)
    assert run.returncode == 1
    (line,) = [s for s in run.stdout.splitlines() if s.startswith("FAILED")]
    assert "rows_sum_to_one" in line and " - FAIL rows_sum_to_one: " in line
    (result,) = spec.check("gallery.core:softmax_wrong_axis", "quick", only=["rows_sum_to_one"]).results
    assert line.split("FAIL rows_sum_to_one: ", 1)[1] == result.message, textwrap.shorten(run.stdout, 400)


def test_the_pytest_plugin_reports_a_signature_mismatch_once(tmp_path):
    run = _pytest(tmp_path, "-ra", "--attention-target=test_spec_signature:sdpa", env=WIDE)
    assert run.returncode == 1
    failed = [s for s in run.stdout.splitlines() if s.startswith("FAILED")]
    assert len(failed) == 1 and "does not take the keyword causal=" in failed[0], failed
    assert "not run: see " in run.stdout


def test_the_pytest_door_marks_expected_failures_strict(tmp_path):
    listed = tmp_path / "xfails.txt"
    listed.write_text("rows_sum_to_one  # stale\n", encoding="utf-8")
    (tmp_path / "target.py").write_text(
        "import spec\nfrom impl import attention\n\n"
        "def wrong(q, k, v, *, causal=False):\n    return attention(q * 1.01, k, v, causal=causal)\n\n"
        "target = spec.Target(wrong, expected_failures={'matches_golden': 'q scaled'})\n")
    installed = any(ep.value == "spec.pytest_plugin" for ep in entry_points(group="pytest11"))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *([] if installed else ["-p", "spec.pytest_plugin"]),
         "-p", "no:cacheprovider", "-q", "-ra",
         "--attention-target=target.py:target", "--attention-only", "--attention-profile=quick",
         f"--attention-expected-failures={listed}", "-k", "matches_golden or rows_sum_to_one"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert "XFAIL attention-spec::matches_golden" in run.stdout, run.stdout[-2000:]
    assert "FAILED attention-spec::rows_sum_to_one" in run.stdout and "XPASS(strict)" in run.stdout
    assert run.returncode == 1


def test_the_pytest_door_at_profile_scale_applies_the_memory_budget(tmp_path):
    """``--attention-memory`` is the scale profile's budget, as the CLI's ``--memory`` (the one
    set-up of both, `spec.profiles.checking`): with a tiny one every case is over it, named in the
    header line the CLI prints and in each law's skip; at another profile it is a usage error."""
    run = _pytest(tmp_path, "--attention-target=reference", "--attention-only", "--attention-profile=scale",
                  "--attention-memory=0.001", "-rs", env=WIDE)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "scale: memory budget 0.001 GiB; not run: decode: needs about" in run.stdout, run.stdout
    assert "5 skipped" in run.stdout
    skips = [s for s in run.stdout.splitlines() if s.startswith("SKIPPED")]
    assert len(skips) == 5 and all("over the memory budget of 0.001 GiB" in s for s in skips), skips
    report = spec.check("reference", profile="scale", memory=0.001)
    assert f"scale: {report.scale}" in run.stdout  # the CLI's header, word for word
    run = _pytest(tmp_path, "--attention-target=reference", "--attention-memory=1")
    assert run.returncode == 4 and "give --attention-profile scale" in run.stderr


def test_the_pytest_door_shows_one_cause_once(tmp_path):
    """A target that raises in every law: each law's item fails, the first with the whole block,
    the others pointing to it (and each with its own line that replays it)."""
    (tmp_path / "always_raises.py").write_text(
        "def attention(q, k, v, *, causal=False):\n    raise RuntimeError('kernel not built')\n")
    run = _pytest(tmp_path, "--attention-target=always_raises:attention", "--attention-only", "-k",
                  "shape or golden or rows_sum")
    assert run.returncode == 1
    failed = len([s for s in run.stdout.splitlines() if s.startswith("FAIL ") and "kernel not built" in s])
    assert failed >= 3 and run.stdout.count("\n  law: ") == 1, run.stdout
    assert run.stdout.count("the same failure as output_shape_dtype") == failed - 1
    assert run.stdout.count("reproduce:") == failed


def test_attention_html_writes_the_page_of_the_laws_run_under_xdist_too(tmp_path):
    """``--attention-html FILE``: the CLI's page of the laws run, each failure with its heat map,
    whether the laws ran in this process or in xdist workers (each result carried back with its
    test's report)."""
    for extra in ([], ["-n", "2"]):
        page = tmp_path / f"page{len(extra)}.html"
        run = _pytest(tmp_path, "--attention-target=gallery.core:mask_off_by_one", "--attention-only",
                      "-k", "causal_no_leak or rows_sum_to_one or bias_per_head", f"--attention-html={page}",
                      *extra)
        assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
        text = page.read_text(encoding="utf-8")
        assert "gallery.core:mask_off_by_one: DOES NOT CONFORM" in text
        assert "FAIL causal_no_leak" in text and text.count('class="heatmap ratio"') == 1
        assert text.index(">rows_sum_to_one<") < text.index(">causal_no_leak<")  # the registry's order
        assert "skipped laws (2)" in text  # bias_per_head and grad_bias_per_head, folded


def test_the_pytest_door_runs_a_merge_operators_own_laws(tmp_path):
    """A merge operator (a spec.MergeTarget, built-in or in a file) gets its family's laws, as
    spec.check runs them: the right one passes them, the unguarded merge fails empty ⊕ empty."""
    merge_laws = [p.name for p in spec.LAWS.values() if p.family == "merge"]
    run = _pytest(tmp_path, "--attention-only", "--attention-target=merge", "--collect-only")
    assert [line.split("::")[-1] for line in run.stdout.splitlines() if "::" in line] == merge_laws
    run = _pytest(tmp_path, "--attention-only", "--attention-target=merge")
    report = spec.check("merge", profile="quick")
    passed, skipped = (sum(r.status == s for r in report.results) for s in ("pass", "skip"))
    assert run.returncode == 0 and f"{passed} passed, {skipped} skipped" in run.stdout, run.stdout
    (tmp_path / "ops.py").write_text("import spec\nfrom gallery.merge import empty_empty_nan\n"
                                     "unguarded = spec.MergeTarget(empty_empty_nan)\n")
    run = _pytest(tmp_path, "--attention-only", "--attention-target=ops.py:unguarded", "-k", "empty")
    assert run.returncode == 1 and "FAIL merge_empty_empty_is_empty" in run.stdout, run.stdout
    run = _pytest(tmp_path, "--attention-only", "--attention-target=merge", "--attention-isolation=process")
    assert run.returncode == 4 and "--attention-isolation applies to attention targets" in run.stderr


@pytest.mark.skipif(spec.LAWS["ranks_match_golden"].needs(spec.RankTarget(print)) is not None,
                    reason="needs torch.distributed with gloo")
def test_the_pytest_door_runs_a_context_parallel_targets_laws_on_ranks_kept_for_the_session(tmp_path):
    run = _pytest(tmp_path, "--attention-only", "--attention-target=ring", "-k", "match_golden or invariant")
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout
