"""The laws of spec.laws.masks: each rejects the bug it names (implementations in
gallery.masks) and passes the reference."""

from __future__ import annotations

import math

import pytest
from gallery.masks import ignores_mask_for_causal, pad_wrong_sequence, sequential_sum

from impl import causal_mask
from spec.runner import check
from spec.target import Target

LAWS = ["padding_mask_is_truncation", "bottom_right_causal_mask", "long_rows_every_dtype"]


def _failed(target: Target, law: str, **kw) -> str:
    (result,) = check(target, "quick", only=[law], **kw).results
    assert result.status == "fail", f"{law} did not reject {target.name}: {result.message}"
    return result.message


@pytest.mark.parametrize("law", LAWS)
def test_reference_passes(law):
    (result,) = check("reference", "quick", only=[law]).results
    assert result.status == "pass", result.message
    assert "error ratio float32" in result.message or "error ratio float64" in result.message


def test_padding_read_per_head_is_caught():
    bad = Target(pad_wrong_sequence, name="pad-wrong-sequence", supports_mask=True, ndims=(4,))
    assert "padding" in _failed(bad, "padding_mask_is_truncation", max_examples=40)


def test_mask_replaced_by_top_left_causal_is_caught():
    bad = Target(ignores_mask_for_causal, name="mask-as-is_causal", supports_mask=True)
    assert "bottom-right" in _failed(bad, "bottom_right_causal_mask")


def testsequential_sum_sum_is_caught():
    bad = Target(sequential_sum, name="sequential-fp16", dtypes=("float16",), ndims=(2,))
    message = _failed(bad, "long_rows_every_dtype")
    assert "float16" in message
    good = Target(sequential_sum, name="sequential-fp32", dtypes=("float32",), ndims=(2,))
    (result,) = check(good, "quick", only=["long_rows_every_dtype"]).results
    assert result.status == "pass", result.message
    assert math.isfinite(float(result.message.rsplit(" ", 1)[-1]))


def test_padding_mask_shapes():
    from spec.cases import Case
    from spec.laws.masks import key_lengths, padding

    case = Case(dtype="float32", ndim=4, batch=3, heads=2, n_q=4, n_k=6, d_k=2, d_v=2, seed=1)
    lengths = key_lengths(case)
    mask = padding(case)
    assert mask.shape == (3, 1, 1, 6)
    assert (mask.sum(axis=-1).ravel() == lengths).all() and lengths.min() >= 1
    assert causal_mask(2, 2).shape == (2, 2)
