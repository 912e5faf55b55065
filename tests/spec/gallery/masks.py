"""The gallery for spec.laws.masks: padding masks, bottom-right causal masks and long rows in
every dtype — each broken one a bug that real kernels have shipped."""

from __future__ import annotations

import numpy as np

from gallery.base import broken
from impl import attention
from spec import Target

Array = np.ndarray


def pad_wrong_sequence(q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
                       scale: float | None = None) -> Array:
    """Flattens (batch, heads) and picks slice f's mask row as f % batch instead of f // heads."""
    if mask is None or q.ndim != 4:
        return attention(q, k, v, causal=causal, mask=mask, scale=scale)
    b, h = q.shape[:2]
    full = np.broadcast_to(mask, (b, h, q.shape[2], k.shape[2]))
    rows = [attention(q[f // h, f % h], k[f // h, f % h], v[f // h, f % h], causal=causal,
                      mask=full[f % b, f % h], scale=scale) for f in range(b * h)]
    return np.stack(rows).reshape(b, h, *rows[0].shape)


def ignores_mask_for_causal(q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
                            scale: float | None = None) -> Array:
    """Takes any partial mask for the kernel's own (top-left) causal mode."""
    if mask is not None and not mask.all():
        return attention(q, k, v, causal=True, scale=scale)
    return attention(q, k, v, causal=causal, scale=scale)


def sequential_sum(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    """Normalised weights in float32, then the weighted sum one key at a time in the input dtype:
    fine in float32, error growing with the row length in float16."""
    w = attention(q.astype(np.float32), k.astype(np.float32), np.eye(k.shape[-2], dtype=np.float32),
                  causal=causal).astype(q.dtype)
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    for j in range(k.shape[-2]):
        out += w[..., :, j : j + 1] * v[..., j : j + 1, :]
    return out


BROKEN = [
    broken(pad_wrong_sequence, "padding_mask_is_truncation",
           "padding mask row read per head, not per sequence",
           name="pad-wrong-sequence", supports_mask=True, ndims=(4,)),
    broken(ignores_mask_for_causal, "bottom_right_causal_mask",
           "a partial mask replaced by top-left is_causal",
           name="mask-as-is_causal", supports_mask=True),
    broken(sequential_sum, "long_rows_every_dtype", "weighted sum accumulated key by key in float16",
           name="sequential-fp16", dtypes=("float16",), ndims=(2,)),
]

CORRECT = [
    Target(sequential_sum, name="sequential-fp32", dtypes=("float32",), ndims=(2,)),
]
