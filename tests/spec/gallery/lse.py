"""Gallery for the logsumexp laws (`spec.laws.lse`). The broken variants return a wrong lse
next to a right output; the correct one computes both tile by tile, merging the tiles' partial
results by their logsumexps (as split-KV decoding does)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gallery.base import broken
from impl import attention
from impl.attention import compute_dtype
from spec import Target

Array = np.ndarray


def _with_lse(q: Array, k: Array, v: Array, fix: Any, **kw: Any) -> Any:
    """impl.attention's (out, lse), its lse passed through ``fix(lse, q, k, kw)`` when asked for."""
    if not kw.pop("return_lse", False):
        return attention(q, k, v, **kw)
    out, lse = attention(q, k, v, return_lse=True, **kw)
    return out, fix(lse, q, k, kw)


def lse_base2(q: Array, k: Array, v: Array, **kw: Any) -> Any:
    # log2 Σ exp, as a base-2 kernel keeps it
    return _with_lse(q, k, v, lambda lse, *_: lse / np.log(2), **kw)


def lse_without_max(q: Array, k: Array, v: Array, **kw: Any) -> Any:
    def shifted(lse: Array, q: Array, k: Array, kw: dict[str, Any]) -> Array:
        # log Σ exp(s − max) = lse − max = −log(max weight): the max not added back.
        _, w = attention(q, k, np.eye(k.shape[-2], dtype=q.dtype), return_weights=True, **kw)
        top = np.max(w, axis=-1, initial=0.0)
        with np.errstate(divide="ignore"):
            return np.where(top > 0, -np.log(np.where(top > 0, top, 1)), lse)

    return _with_lse(q, k, v, shifted, **kw)


def lse_plus_inf_for_empty_rows(q: Array, k: Array, v: Array, **kw: Any) -> Any:
    return _with_lse(q, k, v, lambda lse, *_: np.where(np.isneginf(lse), np.inf, lse), **kw)


_DECLARED = {"returns_lse": True, "ndims": (2, 3, 4), "supports_mask": True, "supports_scale": True}

BROKEN = [
    broken(lse_base2, "lse_matches_golden", "lse in base 2", **_DECLARED),
    broken(lse_without_max, "lse_merge_split_keys", "lse of the shifted scores, max not added back",
           **_DECLARED),
    broken(lse_plus_inf_for_empty_rows, "lse_empty_row_as_declared", "+inf lse for a row that sees nothing",
           **_DECLARED),
    broken(attention, "lse_matches_golden", "a natural-log lse declared base 2 (lse_base=2): a base-2 LSE "
           "merged as natural, or the reverse, is off by a factor ln 2 (sglang PR #35045)",
           name="lse_natural_declared_base2", lse_base=2, **_DECLARED),
]


def tiled(q: Array, k: Array, v: Array, *, causal: bool = False, mask: Any = None, scale: float | None = None,
          return_lse: bool = False, tile: int = 5) -> Any:
    """Keys in tiles of 5; each tile's (out, lse) merged into the running result by logsumexp."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    work = compute_dtype(q.dtype)
    keep = np.ones((*lead, n_q, n_k), dtype=bool)
    if causal:
        keep &= np.arange(n_k)[None, :] <= np.arange(n_q)[:, None]
    if mask is not None:
        keep &= mask
    out = np.zeros((*lead, n_q, v.shape[-1]), dtype=work)
    lse = np.full((*lead, n_q), -np.inf, dtype=work)
    for start in range(0, n_k, tile):
        cols = slice(start, start + tile)
        part, part_lse = attention(q, k[..., cols, :], v[..., cols, :], mask=keep[..., cols], scale=scale,
                                   return_lse=True)
        total = np.logaddexp(lse, part_lse)
        safe = np.where(np.isneginf(total), 0, total)
        old = np.where(np.isneginf(lse), 0, np.exp(lse - safe))[..., None]
        new = np.where(np.isneginf(part_lse), 0, np.exp(part_lse - safe))[..., None]
        out, lse = old * out + new * part.astype(work), total
    out = out.astype(q.dtype)
    return (out, lse) if return_lse else out


CORRECT = [Target(tiled, name="lse_tiled", dtypes=("float16", "float32", "float64"), **_DECLARED),
           # +inf for a row that sees nothing, declared (FlashAttention's CUDA kernels)
           Target(lse_plus_inf_for_empty_rows, name="lse_plus_inf_declared", empty_lse=float("inf"),
                  **_DECLARED),
           # log2 Σ exp, declared (FlashInfer, FlashMLA's sparse prefill)
           Target(lse_base2, name="lse_base2_declared", lse_base=2, **_DECLARED)]
