"""bfloat16 in the conformance suite: the dtype, its cases and baseline, a correct target passing,
broken ones rejected, and the error ratio reported per dtype."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

import spec  # noqa: E402
from impl import attention  # noqa: E402
from spec import dtypes, tolerance  # noqa: E402
from spec.builtin import load_target  # noqa: E402
from spec.cases import Case  # noqa: E402
from spec.cli import main  # noqa: E402
from spec.peers import dtype_rows  # noqa: E402
from spec.target import Target, TargetError  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)


def _as_float32(q, k, v, *, causal=False):
    # Right values, wrong dtype: bfloat16 in, float32 out.
    return attention(q, k, v, causal=causal).astype(np.float32)


def _denominator_one_key_at_a_time(q, k, v, *, causal=False):
    # The softmax denominator summed key by key in bfloat16: past a running sum of 256, each
    # further weight ≤ 1 is at most half an ulp and is lost (256 + 1 rounds back to 256).
    s = (q.astype(np.float32) @ np.swapaxes(k.astype(np.float32), -1, -2)) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True)).astype(BF16)
    total = np.zeros(e.shape[:-1], dtype=BF16)
    for j in range(e.shape[-1]):
        total = (total + e[..., j]).astype(BF16)
    p = e.astype(np.float32) / total.astype(np.float32)[..., None]
    return (p @ v.astype(np.float32)).astype(BF16)


def test_eps_and_tiny_come_from_ml_dtypes():
    assert dtypes.eps("bfloat16") == 2.0**-7  # 8 significand bits
    assert dtypes.tiny("bfloat16") == 2.0**-126  # float32's exponent range
    assert dtypes.eps(BF16) == 2.0**-7
    assert dtypes.eps("float16") == 2.0**-10


def test_cases_draw_representable_bfloat16_values():
    for values in ("normal", "ints"):
        case = Case(dtype="bfloat16", ndim=4, batch=2, heads=2, n_q=5, n_k=7, d_k=9, d_v=3, seed=1,
                    values=values, amplitude=10.0)
        for x in case.arrays():
            assert x.dtype == BF16
            wide = x.astype(np.float64)
            assert np.array_equal(wide.astype(BF16).astype(np.float64), wide)
            assert np.all(np.isfinite(wide))


def test_baseline_is_bfloat16_and_keeps_every_key_of_a_long_row():
    # 1,024 equal scores: a key-by-key bfloat16 denominator would stop at 256 and give 4.
    n_k = 1024
    q = np.zeros((1, 8), dtype=BF16)
    k = np.ones((n_k, 8), dtype=BF16)
    v = np.ones((n_k, 2), dtype=BF16)
    out = tolerance.baseline(q, k, v, visible=np.ones((1, n_k), dtype=bool), scale=0.25)
    assert out.dtype == BF16
    assert np.array_equal(out.astype(np.float64), np.ones((1, 2)))


def test_baseline_rounds_to_bfloat16_so_its_error_is_bfloat16_sized():
    case = Case(dtype="bfloat16", ndim=2, batch=1, heads=1, n_q=16, n_k=64, d_k=32, d_v=16, seed=3)
    q, k, v = case.arrays()
    vis = np.ones((16, 64), dtype=bool)
    gold, _ = tolerance.golden(q, k, v, visible=vis, scale=32**-0.5)
    err = np.max(np.abs(tolerance.baseline(q, k, v, visible=vis, scale=32**-0.5).astype(np.float64) - gold))
    # Above float32's rounding, within a few bfloat16 ulps of outputs of size ≲ 3.
    assert 1e-5 < err < 8 * dtypes.eps("bfloat16")


def test_reference_declares_and_passes_bfloat16_with_the_ratio_per_dtype():
    target = load_target("reference")
    assert "bfloat16" in target.dtypes
    report = spec.check(target.replace(dtypes=("bfloat16",)), profile="quick", max_examples=5)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    golden = next(r for r in report.results if r.name == "matches_golden")
    assert "worst error ratio bfloat16" in golden.message


def test_a_float32_result_for_bfloat16_inputs_is_rejected():
    report = spec.check(Target(_as_float32, dtypes=("bfloat16",)), profile="quick", max_examples=5,
                        only=["output_shape_dtype"])
    (result,) = report.results
    assert result.status == "fail"
    assert "output dtype is float32, inputs are bfloat16" in result.message


def test_a_denominator_summed_key_by_key_in_bfloat16_is_rejected():
    report = spec.check(Target(_denominator_one_key_at_a_time, dtypes=("bfloat16",)), profile="quick",
                        max_examples=5, only=["long_rows_every_dtype"])
    (result,) = report.results
    assert result.status == "fail", result.message
    assert "in bfloat16" in result.message
    ratio = float(result.message.split("ratio ")[-1].split()[0])
    assert ratio > 1


def test_json_report_carries_the_ratio_per_dtype(tmp_path, capsys):
    path = tmp_path / "report.json"
    code = main(["check", "reference", "--profile", "quick", "--max-examples", "30",
                 "--only", "matches_golden", "--json", str(path)])
    capsys.readouterr()
    assert code == 0
    (result,) = json.loads(path.read_text(encoding="utf-8"))["results"]
    for dtype in ("float16", "float32", "float64", "bfloat16"):
        assert f"error ratio {dtype}" in result["message"]


def test_peer_table_has_a_bfloat16_row():
    broken = Target(_denominator_one_key_at_a_time, name="key-by-key", dtypes=("bfloat16",))
    (row,) = dtype_rows(broken, ("bfloat16",), profile="quick", max_examples=5)
    assert row["dtype"] == "bfloat16" and row["declared"]
    assert row["failed"] >= 1 and row["worst error ratio"] > 1
    assert "long_rows_every_dtype" in [name for name, _ in row["failures"]]


@pytest.fixture
def without_ml_dtypes(monkeypatch):
    """A machine without ml_dtypes: its import fails, and the (once-only) detection is redone."""
    from spec import dtypes

    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now fails
    dtypes.has_bfloat16.cache_clear()
    yield
    dtypes.has_bfloat16.cache_clear()


def test_declaring_bfloat16_without_ml_dtypes_is_a_clear_target_error(without_ml_dtypes):
    with pytest.raises(TargetError, match="bfloat16, which needs ml_dtypes"):
        Target(attention, dtypes=("float32", "bfloat16"))
    assert "bfloat16" not in load_target("reference").dtypes  # built-ins declare it only when it exists
    assert Target(attention, dtypes=("float32",)).dtypes == ("float32",)


def test_unknown_dtypes_are_still_refused():
    with pytest.raises(TargetError, match="bfloat16"):  # the message lists what is accepted
        Target(attention, dtypes=("float8",))


def test_torch_declares_and_passes_bfloat16():
    pytest.importorskip("torch")
    from spec.adapters.torch import sdpa_target as torch_target

    target = torch_target()
    assert "bfloat16" in target.dtypes
    report = spec.check(target.replace(dtypes=("bfloat16",)), profile="quick", max_examples=3,
                        only=["output_shape_dtype", "matches_golden", "long_rows_every_dtype"])
    assert report.ok, [(r.name, r.message) for r in report.failures]


def test_a_dtype_name_worked_out_before_ml_dtypes_went_is_still_refused(monkeypatch):
    """`spec.dtypes.as_dtype` works a name out once; the check that ml_dtypes is there is made
    on every call, so a cached bfloat16 does not outlive the detection."""
    dtypes.as_dtype("bfloat16")  # worked out while ml_dtypes is importable
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    dtypes.has_bfloat16.cache_clear()
    try:
        with pytest.raises(TypeError, match="bfloat16 needs ml_dtypes"):
            dtypes.as_dtype("bfloat16")
        assert dtypes.as_dtype("float32") == np.dtype(np.float32)
    finally:
        dtypes.has_bfloat16.cache_clear()
