"""The laws of spec.laws.masks: each rejects the bug it names and passes the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from impl import attention, causal_mask
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


def _pad_wrong_sequence(q, k, v, *, causal=False, mask=None, scale=None):
    # Flattens (batch, heads) and picks slice f's mask row as f % batch instead of f // heads.
    if mask is None or q.ndim != 4:
        return attention(q, k, v, causal=causal, mask=mask, scale=scale)
    b, h = q.shape[:2]
    full = np.broadcast_to(mask, (b, h, q.shape[2], k.shape[2]))
    rows = [attention(q[f // h, f % h], k[f // h, f % h], v[f // h, f % h], causal=causal,
                      mask=full[f % b, f % h], scale=scale) for f in range(b * h)]
    return np.stack(rows).reshape(b, h, *rows[0].shape)


def _ignores_mask_for_causal(q, k, v, *, causal=False, mask=None, scale=None):
    # Takes any partial mask for the kernel's own (top-left) causal mode.
    if mask is not None and not mask.all():
        return attention(q, k, v, causal=True, scale=scale)
    return attention(q, k, v, causal=causal, scale=scale)


def _sequential_float16(q, k, v, *, causal=False):
    # Normalised weights in float32, then the weighted sum one key at a time in the input dtype.
    w = attention(q.astype(np.float32), k.astype(np.float32), np.eye(k.shape[-2], dtype=np.float32),
                  causal=causal).astype(q.dtype)
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    for j in range(k.shape[-2]):
        out += w[..., :, j : j + 1] * v[..., j : j + 1, :]
    return out


def test_padding_read_per_head_is_caught():
    bad = Target(_pad_wrong_sequence, name="pad-wrong-sequence", supports_mask=True, ndims=(4,))
    assert "padding" in _failed(bad, "padding_mask_is_truncation", max_examples=40)


def test_mask_replaced_by_top_left_causal_is_caught():
    bad = Target(_ignores_mask_for_causal, name="mask-as-is_causal", supports_mask=True)
    assert "bottom-right" in _failed(bad, "bottom_right_causal_mask")


def test_sequential_float16_sum_is_caught():
    bad = Target(_sequential_float16, name="sequential-fp16", dtypes=("float16",), ndims=(2,))
    message = _failed(bad, "long_rows_every_dtype")
    assert "float16" in message
    good = Target(_sequential_float16, name="sequential-fp32", dtypes=("float32",), ndims=(2,))
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
