"""The laws of spec.laws.masks (padding as truncation, the bottom-right causal mask, long rows in
every dtype): each rejects the bug it names and passes the reference, on every rank a target
declares."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gallery.masks import ignores_mask_for_causal, pad_wrong_sequence, sequential_sum

import spec
from impl import attention, causal_mask
from spec import Target, dtypes
from spec.cases import Case
from spec.runner import check

LAWS = ["padding_mask_is_truncation", "bottom_right_causal_mask", "long_rows_every_dtype"]


def _failed(target: Target, law: str, **kw) -> str:
    (result,) = check(target, "quick", only=[law], **kw).results
    assert result.status == "fail", f"{law} did not reject {target.name}: {result.message}"
    return result.message


@pytest.mark.parametrize("law", LAWS)
def test_reference_passes(law):
    (result,) = check("reference", "quick", only=[law]).results
    assert result.status == "pass", result.message
    assert result.message.startswith("error/allowed: float")
    assert any(key.startswith("error ratio float") for key in result.observed)


def test_padding_read_per_head_is_caught():
    bad = Target(pad_wrong_sequence, name="pad-wrong-sequence", supports_mask=True, ndims=(4,))
    assert "padding" in _failed(bad, "padding_mask_is_truncation", max_examples=40)


def test_mask_replaced_by_top_left_causal_is_caught():
    bad = Target(ignores_mask_for_causal, name="mask-as-is_causal", supports_mask=True)
    assert "bottom-right" in _failed(bad, "bottom_right_causal_mask")


def test_a_sequential_sum_is_caught_in_float16_and_passes_in_float32():
    bad = Target(sequential_sum, name="sequential-fp16", dtypes=("float16",), ndims=(2,))
    message = _failed(bad, "long_rows_every_dtype")
    assert "float16" in message
    good = Target(sequential_sum, name="sequential-fp32", dtypes=("float32",), ndims=(2,))
    (result,) = check(good, "quick", only=["long_rows_every_dtype"]).results
    assert result.status == "pass", result.message
    assert math.isfinite(float(result.message.rsplit(" ", 1)[-1]))


def test_padding_mask_shapes():
    from spec.laws.masks import key_lengths, padding

    case = Case(dtype="float32", ndim=4, batch=3, heads=2, n_q=4, n_k=6, d_k=2, d_v=2, seed=1)
    lengths = key_lengths(case)
    mask = padding(case)
    assert mask.shape == (3, 1, 1, 6)
    assert (mask.sum(axis=-1).ravel() == lengths).all() and lengths.min() >= 1
    assert causal_mask(2, 2).shape == (2, 2)


def test_long_rows_run_on_a_four_d_only_target():
    (good,) = check(Target(attention, ndims=(4,)), "quick", only=["long_rows_every_dtype"]).results
    assert good.status == "pass" and good.examples > 0
    bad = Target(sequential_sum, name="seq-fp16-4d", dtypes=("float16",), ndims=(4,))
    (result,) = check(bad, "quick", only=["long_rows_every_dtype"]).results
    assert result.status == "fail" and "float16" in result.message


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


def test_a_denominator_summed_key_by_key_in_bfloat16_is_rejected():
    pytest.importorskip("ml_dtypes")
    report = spec.check(Target(_denominator_one_key_at_a_time, dtypes=("bfloat16",)), profile="quick",
                        max_examples=5, only=["long_rows_every_dtype"])
    (result,) = report.results
    assert result.status == "fail", result.message
    assert "in bfloat16" in result.message
    ratio = float(result.message.split("ratio ")[-1].split()[0])
    assert ratio > 1
