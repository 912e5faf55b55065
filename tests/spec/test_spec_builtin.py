"""spec.builtin: names and paths load targets (the built-in ones, ``module:attr``,
``path/to/script.py:attr``), with a did-you-mean for a typo; and back: every ``reproduce:`` line
replays, naming a target checked from the Python door by the ``module:attr`` or
``path/to/script.py:attr`` that loads it again, and where none can (a lambda, a closure, a function
typed interactively) saying so and what to do. What the built-in targets declare."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import spec
from impl import attention
from spec import TargetError, load_target

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


# --- names and paths load targets -----------------------------------------------------------------


def test_builtin_names_load():
    assert load_target("reference").fn is attention
    assert load_target("flash").name == "flash"


def test_module_attr_loads_a_callable_or_a_target():
    assert load_target("impl:flash_attention").name == "impl:flash_attention"


@pytest.mark.parametrize(
    ("text", "message"),
    [("nope", "unknown target 'nope'"), ("impl:nope", "has no attribute 'nope'"),
     ("no_such_module:f", "cannot import module 'no_such_module'"), (":f", "package.module:attr"),
     ("impl.attention:Array.nope", "has no attribute")],
)
def test_unloadable_target_names_what_is_wrong(text, message):
    with pytest.raises(TargetError, match=message):
        load_target(text)


def test_non_callable_attribute_is_refused():
    with pytest.raises(TargetError, match=r"DEFAULT_BLOCK' is tuple \(256, 2048\), not a callable"):
        load_target("impl.flash:DEFAULT_BLOCK")


@pytest.mark.parametrize(
    ("text", "message"),
    [("examples.my_attention:targte", "has no attribute 'targte'; did you mean 'target'?"),
     ("examples.my_atention:target",
      "No module named 'examples.my_atention'; did you mean 'examples.my_attention'?"),
     ("exmaples.my_attention:target", "did you mean 'examples'?"),
     ("examples/my_atention.py:target", "; did you mean 'examples/my_attention.py'"),
     ("examples/my_attention:target", "give examples.my_attention:NAME or examples/my_attention.py:NAME"),
     ("impl:flash_atention", "did you mean 'flash_attention' or"),
     ("refrence", "; did you mean 'reference' or 'onnx_reference'?"),
     ("examples/my_attention.py", "give the path/to/file.py:attr form, examples/my_attention.py:NAME")],
)
def test_a_typo_gets_did_you_mean(text, message, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    with pytest.raises(TargetError) as raised:
        load_target(text)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("source", "shown"),
    [("import spec\ndef attention(q, k, v):\n    return q\ntarget = spec.Target(attention)\n", "target"),
     ("import impl\ntarget = impl.attention\ndef attention(q, k, v):\n    return q\n", "attention"),
     ("import spec\ndef f(q, k, v):\n    return q\na = spec.Target(f)\nb = a.replace(name='b')\n", "NAME"),
     ("def f(q, k, v):\n    return q\ndef g(q, k, v):\n    return q\ndef _h():\n    pass\n", "NAME")],
    ids=["one-target", "one-function", "two-targets", "two-functions"])
def test_a_file_without_attr_is_shown_its_attr_form(source, shown, tmp_path, monkeypatch):
    """``my.py`` alone names no target: the message gives the ``path/to/file.py:attr`` form, with
    the file's one Target (or, without one, its one public function) when there is exactly one."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.py").write_text(source)
    with pytest.raises(TargetError, match="names a file but not what in it to check") as raised:
        load_target("my.py")
    assert str(raised.value).endswith(f"give the path/to/file.py:attr form, my.py:{shown}")


def test_a_missing_dependency_is_not_a_typo(tmp_path, monkeypatch):
    (tmp_path / "needs_it.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TargetError, match=r"No module named 'no_such_dependency_xyz'$"):
        load_target("needs_it:f")


def test_a_script_loads_by_its_path_without_running_its_main_block(tmp_path, monkeypatch):
    (tmp_path / "helper.py").write_text("from impl import attention as attn\n")
    (tmp_path / "script.py").write_text(
        "from helper import attn  # a sibling module, as when the script runs\n"
        "import spec\n"
        "target = spec.Target(attn, name='scripted', supports_scale=True)\n"
        "if __name__ == '__main__':\n"
        "    raise SystemExit('the main block ran')\n")
    monkeypatch.chdir(tmp_path)
    target = load_target("script.py:target")
    assert target.name == "scripted" and target.fn is attention and target.supports_scale
    assert load_target(f"{tmp_path}/script.py:target") is target  # one module per file
    assert load_target("script.py:attn").name == "script.py:attn"


def test_the_example_loads_by_module_or_by_path(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    by_path = load_target("examples/my_attention.py:target")
    by_module = load_target("examples.my_attention:target")
    assert by_path.name == by_module.name == "my_attention" and by_path.masked_rows == "nan"


def test_peer_targets_fail_with_one_clear_line_when_unavailable(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails, as where it is not installed
    with pytest.raises(TargetError, match="built-in target 'torch'"):
        load_target("torch")


# --- and back: every reproduce: line names what loads the target again ----------------------------


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


# --- what the built-in targets declare ---------------------------------------------------------------


def test_reference_declares_and_passes_bfloat16_with_the_ratio_per_dtype():
    pytest.importorskip("ml_dtypes")
    target = load_target("reference")
    assert "bfloat16" in target.dtypes
    report = spec.check(target.replace(dtypes=("bfloat16",)), profile="quick", max_examples=5)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    golden = next(r for r in report.results if r.name == "matches_golden")
    assert "error/allowed: bfloat16 " in golden.message and "error ratio bfloat16" in golden.observed


def test_the_builtin_reference_and_flash_declare_the_caches():
    pytest.importorskip("ml_dtypes")
    for name in ("reference", "flash"):
        target = spec.builtin.load_target(name)
        assert target.supports_paged_kv and target.supports_fp8_kv
    assert spec.builtin.load_target("flash").fp8_kv_paged_only
    assert not spec.builtin.load_target("flash").supports_kv_lengths  # block_table carries it
