"""Every ``reproduce:`` line replays: a target checked from the Python door is named by the
``module:attr`` or ``path/to/script.py:attr`` that loads it again, and where none can (a lambda,
a closure, a function typed interactively) the report says so and what to do."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

SCRIPT = '''
import sys

import spec
from impl import attention


def half_scaled(q, k, v, *, causal=False):
    return attention(q * 0.5, k, v, causal=causal)


declared = spec.Target(half_scaled, name="half scaled", supports_scale=False)


def closure():
    def inner(q, k, v, *, causal=False):
        return half_scaled(q, k, v, causal=causal)
    return inner


if __name__ == "__main__":
    print("the script's main block ran")
    chosen = {"function": half_scaled, "target": declared, "lambda": lambda q, k, v, *, causal=False:
              half_scaled(q, k, v, causal=causal), "closure": closure()}[sys.argv[1]]
    report = spec.check(chosen, profile="quick", only=["matches_golden"])
    print("reproduce:", report.failures[0].counterexample.reproduce)
'''


def _run(args, cwd, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=ENV, timeout=300, **kwargs)


def _reproduce(run) -> str:
    assert run.returncode == 0, run.stderr
    return run.stdout.split("reproduce: ", 1)[1].strip()


@pytest.mark.parametrize(("which", "named"), [("function", "half_scaled"), ("target", "declared")])
def test_a_script_run_as_main_gets_a_line_that_replays(tmp_path, which, named):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kernel.py").write_text(SCRIPT)
    line = _reproduce(_run([sys.executable, "mine/kernel.py", which], tmp_path))
    assert line.startswith("python -c ") and f"'mine/kernel.py:{named}'" in line
    replay = _run(line, tmp_path, shell=True)
    # The law is broken, so the replay raises it again; the script's main block does not run.
    assert replay.returncode == 1
    assert "AssertionError: output differs from the float64 golden" in replay.stderr
    assert "main block ran" not in replay.stdout


@pytest.mark.parametrize(("which", "why"), [("lambda", "it is a lambda"),
                                            ("closure", "it is defined inside a function")])
def test_no_line_for_a_lambda_or_a_closure_says_what_to_do(tmp_path, which, why):
    (tmp_path / "kernel.py").write_text(SCRIPT)
    line = _reproduce(_run([sys.executable, "kernel.py", which], tmp_path))
    assert "python -c" not in line and why in line and "define it at the top level of a file" in line


def test_no_line_for_a_function_typed_interactively(tmp_path):
    line = _reproduce(_run([sys.executable, "-", "function"], tmp_path, input=SCRIPT))
    assert "python -c" not in line and "defined interactively" in line


def test_an_imported_module_is_named_by_module_and_attribute(tmp_path):
    (tmp_path / "kernels.py").write_text(SCRIPT)
    code = ("import spec, kernels\n"
            "report = spec.check(kernels.declared, profile='quick', only=['matches_golden'])\n"
            "print('reproduce:', report.failures[0].counterexample.reproduce)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}, timeout=300)
    assert "spec.replay('kernels:declared', 'matches_golden'" in _reproduce(run)


def test_a_non_finite_field_is_written_as_a_literal_that_replays():
    """``repr(inf)`` is ``inf``, no Python literal: a line holding it raised NameError when run."""
    import ast

    from spec.cases import Case
    from spec.registry import PROPERTIES
    from spec.runner import counterexample

    case = Case(dtype="float64", ndim=2, batch=1, heads=1, n_q=1, n_k=2, d_k=1, d_v=1, seed=3,
                amplitude=float("inf"), keywords={"sinks": (float("-inf"),)})
    line = counterexample(PROPERTIES["matches_golden"], case, None, "reference").reproduce
    code = shlex.split(line)[2]
    (call,) = [n for n in ast.walk(ast.parse(code))
               if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "replay"]
    given = {kw.arg: eval(compile(ast.Expression(kw.value), "<line>", "eval")) for kw in call.keywords}
    assert given["amplitude"] == float("inf") and given["sinks"] == (float("-inf"),)
    assert Case.from_fields(**given) == case
