"""The per-dtype table of spec.peers: one run per dtype, failures named, worst ratio read back."""

from __future__ import annotations

import numpy as np
import pytest

from impl import attention
from spec.peers import dtype_rows, main
from spec.target import Target


def _half_inside(q, k, v, *, causal=False, mask=None, scale=None):
    # Computes in float16 whatever it is given: fine for float16, far too coarse for float32.
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
