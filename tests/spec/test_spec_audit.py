"""spec.audit and ``python -m spec audit PROBLEM``: a problem file in KernelBench's shape read and
refused as it should be; its allclose check run as such a harness runs it (seeded trials, the
worst ratio of deviation to allowance); the mean of V passing that check on uniform inputs and
the suite rejecting it; the cheats right on the check's inputs; the command's exit codes."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from spec import audit
from spec.cli import main

SMALL = textwrap.dedent('''
    import numpy as np

    atol = rtol = 1e-2

    def get_inputs():
        return [np.random.random_sample((1, 2, 512, 64)).astype(np.float32) for _ in range(3)]

    def reference(q, k, v):
        s = q @ np.swapaxes(k, -1, -2) / np.float32(np.sqrt(q.shape[-1]))
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)) @ v
''')


@pytest.fixture
def problem_file(tmp_path):
    path = tmp_path / "small_attention.py"
    path.write_text(SMALL)
    return path


def _only(*names):
    return [k for k in audit.KERNELS if k.name in names]


def test_the_mean_of_v_passes_an_allclose_check_on_uniform_inputs_and_the_suite_rejects_it(problem_file):
    problem = audit.load_problem(str(problem_file))
    found = audit.audit(problem, trials=3, kernels=_only("mean_v", "zeros", "one_shape"))
    rows = {r.kernel: r for r in found}
    # uniform inputs: each row's scores spread about 1/6, so 512 keys weigh nearly alike
    assert rows["mean_v"].check_passes and 0 < rows["mean_v"].worst <= 1
    assert not rows["zeros"].check_passes and rows["zeros"].worst > 1
    assert rows["one_shape"].check_passes and rows["one_shape"].worst < 1e-3  # right at the check's shape
    assert not any(r.suite_ok for r in rows.values())
    assert "matches_golden" in rows["mean_v"].suite_failed


def test_the_trials_are_seeded_as_a_harness_seeds_them(problem_file):
    problem = audit.load_problem(str(problem_file))
    first, again, other = problem.inputs(0), problem.inputs(0), problem.inputs(1)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[0], other[0])


def test_the_check_fails_nan_a_raise_and_a_wrong_shape(problem_file):
    problem = audit.load_problem(str(problem_file))
    q, k, v = problem.inputs(0)
    refs = [((q, k, v), problem.reference(q, k, v).astype(np.float64))]

    def raises(q, k, v):
        raise RuntimeError("no")

    for bad in (lambda q, k, v: np.full_like(q, np.nan), raises, lambda q, k, v: q[..., :1, :]):
        assert audit.allclose_check(problem, bad, 1, refs) == (False, np.inf)
    assert audit.allclose_check(problem, problem.reference, 1, refs) == (True, 0.0)


@pytest.mark.parametrize(("text", "said"), [
    ("atol = rtol = 1e-2\ndef reference(q, k, v): return q\n", "has no get_inputs()"),
    ("atol = rtol = 1e-2\ndef get_inputs(): return []\n", "neither reference(q, k, v) nor a class Model"),
    ("atol = 'x'\nrtol = 1e-2\ndef get_inputs(): return []\ndef reference(q, k, v): return q\n",
     "must set atol to a number ≥ 0, got 'x'"),
    ("raise ImportError('no torch here')\n", "raised ImportError: no torch here"),
])
def test_a_problem_file_that_cannot_be_read_is_refused_naming_what(tmp_path, text, said):
    path = tmp_path / "bad.py"
    path.write_text(text)
    with pytest.raises(ValueError, match="PROBLEM") as info:
        audit.load_problem(str(path))
    assert said in str(info.value)


def test_a_model_class_and_torch_tensors_are_read_as_kernelbench_writes_them(tmp_path):
    pytest.importorskip("torch")
    path = tmp_path / "torch_attention.py"
    path.write_text(textwrap.dedent('''
        import torch

        atol = rtol = 1e-2

        class Model(torch.nn.Module):
            def forward(self, q, k, v):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)

        def get_inputs():
            return [torch.rand(1, 2, 32, 128) for _ in range(3)]

        def get_init_inputs():
            return []
    '''))
    problem = audit.load_problem(str(path))
    q, k, v = problem.inputs(3)
    assert isinstance(q, np.ndarray) and q.shape == (1, 2, 32, 128)
    out = audit.as_numpy(problem.reference(*(__import__("torch").from_numpy(x) for x in (q, k, v))), "out")
    assert out.shape == (1, 2, 32, 128)


def test_the_command_prints_the_table_writes_json_and_refuses_a_bad_file(problem_file, tmp_path, capsys):
    out_json = tmp_path / "audit.json"
    code = main(["audit", str(problem_file), "--trials", "2", "--json", str(out_json)])
    shown = capsys.readouterr().out
    assert code == 0  # the suite rejects every wrong kernel, the cheats that keep state among them
    assert "small_attention: its check (allclose, atol=0.01, rtol=0.01, 2 trials)" in shown
    data = json.loads(out_json.read_text())
    rows = {r["kernel"]: r for r in data["rows"]}
    assert set(rows) == {k.name for k in audit.KERNELS}
    assert rows["mean_v"]["check_passes"] and not rows["mean_v"]["suite_conforms"]
    assert isinstance(rows["zeros"]["check_worst_ratio"], float)  # strict JSON: a NaN output's is "Infinity"
    assert main(["audit", str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PROBLEM must be a Python file" in err
