"""What real kernels declare (docs/targets.md, "Real kernels"): shape limits the draws keep inside,
expected failures (XFAIL, and XPASS for a stale one), the LSE of an empty row, compile-once shapes,
and devices; and the GPU script's dry run on this CPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

import spec
from impl import attention
from spec.adapters import Framework, wrap
from spec.cases import SHAPE_GRID, SHAPE_WIDTHS, boundary_cases, edges_for, outside_limits
from spec.target import TargetError

ROOT = Path(__file__).resolve().parents[1]


def fussy(q, k, v, *, causal=False, mask=None, scale=None):
    """A kernel that refuses what a FlashAttention-style kernel refuses: lengths that are not
    multiples of 16, head sizes other than 8 and 16, d_v ≠ d_k."""
    n_q, n_k, d_k, d_v = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    if n_q % 16 or n_k % 16:
        raise ValueError(f"sequence lengths must be multiples of 16, got {n_q}, {n_k}")
    if d_k not in (8, 16) or d_v != d_k:
        raise ValueError(f"head dims must be equal and 8 or 16, got {d_k}, {d_v}")
    return attention(q, k, v, causal=causal, mask=mask, scale=scale)


LIMITS = {"seq_multiple": 16, "head_dims": (8, 16), "equal_head_dims": True}
FUSSY = spec.Target(fussy, name="fussy", supports_mask=True, supports_scale=True, ndims=(2, 3, 4),
                    empty_keys="compute", **LIMITS)


def test_a_kernel_with_shape_limits_conforms_when_it_declares_them():
    report = spec.check(FUSSY, profile="quick", seed=1)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    passed = {r.name for r in report.results if r.status == "pass"}
    # the laws that read the pattern through V = I (d_v = n_k) read it in blocks of d_k columns
    assert {"matches_golden", "rows_sum_to_one", "scale_is_inv_sqrt_dk", "causal_no_leak"} <= passed
    skipped = {r.name: r.message for r in report.results if r.status == "skip"}
    assert "seq_multiple=16" in skipped["score_variance"]  # one query against two keys: not drawable


def test_the_same_kernel_undeclared_fails_on_what_it_refuses():
    undeclared = spec.Target(fussy, name="fussy undeclared", supports_mask=True, supports_scale=True)
    (result,) = spec.check(undeclared, profile="quick", only=["matches_golden"]).results
    assert result.status == "fail" and "must be" in result.message


@pytest.mark.parametrize("law", ["matches_golden", "causal_no_leak", "mask_semantics", "rows_sum_to_one"])
def test_every_call_of_a_law_stays_inside_the_limits(law):
    seen = []

    def recording(q, k, v, **kw):
        seen.append((q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]))
        return fussy(q, k, v, **kw)

    report = spec.check(FUSSY.replace(fn=recording), profile="quick", only=[law])
    assert report.ok and seen
    assert all(n_q % 16 == 0 and n_k % 16 == 0 and d_k in (8, 16) and d_v == d_k
               for n_q, n_k, d_k, d_v in seen)


def test_the_boundary_grid_and_the_tile_edges_are_multiples():
    grid = boundary_cases(FUSSY, tiles=True, long=True)
    assert grid and all(outside_limits(FUSSY, c) is None for c in grid)
    assert {(c.n_q, c.n_k) for c in grid} >= {(16, 16), (16, 32), (32, 32)}
    assert max(c.n_k for c in grid) == 2080  # the long causal square of 2,065, rounded up to a multiple of 16
    assert all(n % 16 == 0 for n in edges_for(FUSSY)) and 256 in edges_for(FUSSY)
    capped = FUSSY.replace(max_seq=64)
    assert all(c.n_q <= 64 and c.n_k <= 64 for c in boundary_cases(capped, tiles=True, long=True))


def test_the_report_header_lists_the_limits():
    report = spec.check(FUSSY, profile="quick", only=["output_shape_dtype"])
    assert str(report).startswith("declared limits: head_dims=(8, 16), equal_head_dims, seq_multiple=16\n")
    assert json.loads(report.to_json())["limits"] == "head_dims=(8, 16), equal_head_dims, seq_multiple=16"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("head_dims", (), "head_dims must be a non-empty tuple"), ("head_dims", 64, "head_dims must be"),
    ("seq_multiple", 0, "seq_multiple must be a positive integer"), ("max_seq", 1.5, "max_seq must be"),
    ("empty_lse", float("nan"), "empty_lse must be a float"),
    ("expected_failures", {"matches_golden[int8]": "x"}, "int8 is not among the declared dtypes"),
    ("expected_failures", {"matches_golden": ""}, "needs its reason"),
    ("expected_failures", {"bad key!": "x"}, "must be 'law' or 'law"),
])
def test_bad_declarations_are_refused_naming_the_field(field, value, message):
    with pytest.raises(TargetError, match=message):
        spec.Target(attention, **{field: value})


def test_max_seq_below_seq_multiple_is_refused():
    with pytest.raises(TargetError, match="max_seq=8 is below seq_multiple=16"):
        spec.Target(attention, seq_multiple=16, max_seq=8)


# --- expected failures --------------------------------------------------------------------------


def wrong_scale(q, k, v, *, causal=False):
    return attention(q * 1.01, k, v, causal=causal)


def test_an_expected_failure_is_xfail_and_the_run_conforms():
    target = spec.Target(wrong_scale, expected_failures={"matches_golden": "q scaled by 1.01"})
    report = spec.check(target, profile="quick", only=["matches_golden"])
    (result,) = report.results
    assert report.ok and result.status == "xfail" and result.expected == "q scaled by 1.01"
    assert json.loads(report.to_json())["results"][0]["status"] == "xfail"
    text = str(report)
    assert "XFAIL matches_golden: q scaled by 1.01" in text and "reproduce:" in text
    assert "1 xfail" in text.splitlines()[-1]


def test_a_stale_expected_failure_is_xpass_and_fails_the_run():
    target = spec.Target(attention, expected_failures={"matches_golden": "once wrong"})
    report = spec.check(target, profile="quick", only=["matches_golden"])
    (result,) = report.results
    assert not report.ok and result.status == "xpass"
    assert "XPASS matches_golden: declared an expected failure (once wrong), but the law holds" in str(report)


def test_an_expected_failure_in_one_dtype_runs_that_dtype_alone():
    def wrong_in_float32(q, k, v, *, causal=False):
        broken = wrong_scale if q.dtype == np.float32 else attention
        return broken(q, k, v, causal=causal)

    target = spec.Target(wrong_in_float32, expected_failures={"matches_golden[float32]": "float32 path"})
    report = spec.check(target, profile="quick", only=["matches_golden"])
    assert [(r.name, r.status) for r in report.results] == [("matches_golden[float32]", "xfail"),
                                                             ("matches_golden", "pass")]
    assert report.ok


def test_an_expected_failure_naming_no_law_is_refused():
    with pytest.raises(TargetError, match="'no_such_law' names no law"):
        spec.check(spec.Target(attention, expected_failures={"no_such_law": "x"}), profile="quick")


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


# --- the LSE of an empty row ------------------------------------------------------------------


def plus_inf_lse(q, k, v, *, causal=False, mask=None, return_lse=False):
    out = attention(q, k, v, causal=causal, mask=mask, return_lse=return_lse)
    if not return_lse:
        return out
    out, lse = out
    return out, np.where(np.isneginf(lse), np.inf, lse)


@pytest.mark.parametrize(("declared", "ok"), [(math.inf, True), (-math.inf, False)])
def test_the_lse_of_an_empty_row_is_what_the_target_declares(declared, ok):
    target = spec.Target(plus_inf_lse, supports_mask=True, returns_lse=True, empty_lse=declared)
    report = spec.check(target, profile="quick", only=["lse_empty_row_as_declared", "lse_merge_split_keys",
                                                      "lse_matches_golden"])
    assert report.ok is ok, [(r.name, r.message) for r in report.failures]


# --- compile-once shapes ------------------------------------------------------------------------


def _shapes_met(**declared):
    shapes: set = set()

    def recording(q, k, v, *, causal=False, mask=None, scale=None):
        shapes.add((q.shape, k.shape, v.shape))
        return attention(q, k, v, causal=causal, mask=mask, scale=scale)

    target = spec.Target(recording, ndims=(2, 3, 4), supports_mask=True, supports_scale=True, **declared)
    return target, shapes


def test_a_target_that_compiles_per_shape_is_drawn_from_the_grid():
    target, shapes = _shapes_met(compiles_per_shape=True)
    laws = ["matches_golden", "causal_no_leak", "rows_sum_to_one", "mask_semantics",
            "kv_permutation_invariance"]
    assert spec.check(target, profile="ci", only=laws).ok
    assert {n for q, k, v in shapes for n in (q[-2], k[-2])} <= set(SHAPE_GRID)
    assert {len(q) for q, _, _ in shapes} == {4}  # the target's highest rank alone
    assert {q[-1] for q, _, _ in shapes} <= set(SHAPE_WIDTHS)


def test_a_whole_run_that_compiles_per_shape_meets_fewer_than_half_the_shapes():
    """Laws that build their own cases (long rows, two keys, no keys) add their few shapes."""
    grid, few = _shapes_met(compiles_per_shape=True)
    free, many = _shapes_met()
    assert spec.check(grid, profile="ci").ok and spec.check(free, profile="ci").ok
    assert len(few) * 2 < len(many), (len(few), len(many))


# --- devices ------------------------------------------------------------------------------------


def test_a_framework_call_is_placed_on_its_device_and_synchronized_before_it_returns():
    events = []
    record = Framework(name="fake", to_native=lambda x, device: events.append(("to", device)) or x,
                       to_numpy=lambda x: events.append(("back",)) or np.asarray(x),
                       synchronize=lambda device: events.append(("sync", device)))

    def fn(q, k, v, *, causal=False):
        events.append(("call",))
        return attention(q, k, v, causal=causal)

    target = wrap(record, fn, device="gpu:7")
    q = np.ones((2, 3))
    target.fn(q, q, q)
    assert events == [("to", "gpu:7")] * 3 + [("call",), ("sync", "gpu:7"), ("back",)]
    with pytest.raises(TypeError, match="device must be a device name"):
        wrap(record, fn, device="")


def test_from_torch_on_the_cpu_device_is_bit_exact():
    torch = pytest.importorskip("torch")
    seen = []

    def sdpa(q, k, v, **kw):
        seen.append(q.device.type)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)

    target = spec.from_torch(sdpa, device="cpu", rename={"causal": "is_causal"})
    assert spec.check(target, profile="quick", only=["matches_golden"]).ok and set(seen) == {"cpu"}


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


def test_the_gpu_script_dry_run_on_the_cpu():
    pytest.importorskip("torch")
    run = subprocess.run([sys.executable, "tools/gpu_check.py", "--device", "cpu", "--only", "matches_golden",
                          "causal_no_leak", "--dtypes", "float32", "bfloat16"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].endswith("on cpu, profile quick")
    rows = [line for line in lines if line.startswith("| math") or line.startswith("| flash")]
    assert len(rows) == 4 and all("| True" in row for row in rows)
    assert "efficient -: not available: no efficient kernel on cpu" in run.stdout
