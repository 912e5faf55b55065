"""The per-dtype table of spec.peers: one run per dtype (bfloat16 included), failures named, worst
ratio read back."""

from __future__ import annotations

import numpy as np
import pytest

from impl import attention
from spec import dtypes
from spec.peers import dtype_rows, main
from spec.target import Target


def _half_inside(q, k, v, *, causal=False, mask=None, scale=None):
    # Computes in float16 whatever it is given: fine for float16, far too coarse for float32 (whose
    # large values overflow float16 on the cast, on purpose: NumPy's warning is the bug at work).
    with np.errstate(over="ignore", invalid="ignore"):
        out = attention(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16),
                        causal=causal, mask=mask, scale=scale)
    return out.astype(q.dtype)


def test_rows_per_dtype_name_the_failures():
    target = Target(_half_inside, name="half-inside", dtypes=("float16", "float32"),
                    supports_mask=True, supports_scale=True)
    fp16, fp32 = dtype_rows(target, ("float16", "float32"), profile="quick", max_examples=3)
    assert fp16["dtype"] == "float16" and fp16["failed"] == 0 and fp16["worst error ratio"] <= 1
    assert "matches_golden" in [name for name, _ in fp32["failures"]]
    assert fp32["failed"] == len(fp32["failures"]) > 0
    assert fp32["worst error ratio"] > 1  # the failures' ratios count, not only the passes'

    assert fp32["passed"] < fp16["passed"]


def test_main_refuses_an_unknown_peer(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["mxnet"])
    assert exit_.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


BF16 = dtypes.as_dtype("bfloat16") if dtypes.has_bfloat16() else None


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


def test_peer_table_has_a_bfloat16_row():
    pytest.importorskip("ml_dtypes")
    broken = Target(_denominator_one_key_at_a_time, name="key-by-key", dtypes=("bfloat16",))
    (row,) = dtype_rows(broken, ("bfloat16",), profile="quick", max_examples=5)
    assert row["dtype"] == "bfloat16" and row["declared"]
    assert row["failed"] >= 1 and row["worst error ratio"] > 1
    assert "long_rows_every_dtype" in [name for name, _ in row["failures"]]


def test_failure_lines_are_wrapped_to_fit_and_say_every_word():
    """A failure line is wrapped to 100 columns (the page's code block and a terminal show it
    whole), the continuation indented, no word lost or broken."""
    from spec.peers import failure_lines

    message = "output differs from the float64 golden: max|out − golden| = 4.91e-08 at index [0, 0], " * 3
    rows = [{"dtype": "float64", "failures": [("matches_golden", message.strip()), ("short", "x")]}]
    lines = failure_lines(rows)
    assert max(map(len, lines)) <= 100 and len(lines) > 3
    assert lines[0].startswith("float64 matches_golden: ") and lines[-1] == "float64 short: x"
    assert all(line.startswith("    ") and not line.startswith("     ") for line in lines[1:-1])
    assert " ".join(line.strip() for line in lines[:-1]) == f"float64 matches_golden: {message.strip()}"
