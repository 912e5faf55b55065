"""Gallery for the scale laws (`spec.laws.scale`): overflow bugs of public kernels, re-created at
sizes a CPU reaches, each judged at ``--profile scale`` alone.

Each is correct below the size where its bug starts (the textbook formula, `impl.attention` per
packed sequence, `impl.grad`), so no smaller profile's sizes can catch it (tested), and each
starts where the report it re-creates says: a packed row index kept in 17 bits (token 2^17 reads
token 0: FlashDeBERTa#11's 190,485 tokens), a launch grid capped at 65,535 slices (#2260's
132,800), a running denominator carried in float16 across key tiles (past 65,504 it is inf:
flash-attention#47's 350,000 keys), a key index kept in 18 bits (key 2^18 read as key 0 in a long
decode: the needles case's key 2^18 is lost). Their ``sizes`` keep the scale profile's shape that starts the
bug and shrink the others, so that the suite's own test of each runs in seconds (the scale
profile at its own sizes catches them too: docs/laws.md says by which law).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gallery.base import broken, plain
from impl import attention, flash_attention
from impl.grad import attention_backward
from spec.scale_plan import Sizes

Array = np.ndarray

GRID_LIMIT = 65_535
"""The largest grid dimension of a CUDA launch (gridDim.y and .z): slices past it are not launched."""
ROW_BITS = 17
"""The packed kernel's row index width: row 2^17 is read as row 0."""
KEY_TILE = 2**12
"""The float16 kernel's key tile: each tile's sum is float32, the running sum across tiles float16."""
KEY_BITS = 18
"""The long decode kernel's key index width: key 2^18 is read as key 0."""

SMALL = dict(decode_keys=2_000, square=129, slices=(3, 5), packed=(3, 20), elements=(1, 600, 8), width=8)
"""The scale profile's sizes, small: a gallery bug's ``sizes`` keep the one that starts its bug."""


# --- broken ------------------------------------------------------------------------------------


def packed_row_wraps(q: Array, k: Array, v: Array, *, causal: bool = False, cu_seqlens_q: Any = None,
                     cu_seqlens_k: Any = None) -> Array:
    """Packed sequences, each on its own (`impl.attention`), the key rows read at their index mod
    2^17 (a 17-bit row index: a sequence past token 2^17 reads the first sequences' keys); a call
    without them tiled (`impl.flash_attention`: it holds no n × n scores, as it declares)."""
    if cu_seqlens_q is None:
        return flash_attention(q, k, v, causal=causal)
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    cu_q, cu_k = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    for i in range(len(cu_q) - 1):
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        keys = np.arange(int(cu_k[i]), int(cu_k[i + 1])) % 2**ROW_BITS
        if rows.stop > rows.start and keys.size:
            out[..., rows, :] = attention(q[..., rows, :], k[..., keys, :], v[..., keys, :], causal=causal)
    return out


def _capped(out: Array, fill: float) -> Array:
    """Slices (batch × heads, flattened) past the grid's limit never written: ``fill`` there."""
    flat = out.reshape(-1, *out.shape[-2:])
    flat[GRID_LIMIT:] = fill
    return out


def grid_capped(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    """The textbook formula, launched on at most 65,535 slices: the rest of a zeroed output stays 0."""
    return _capped(plain(q, k, v, causal=causal), 0.0)


def grid_capped_uninitialised(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    """As `grid_capped`, the output allocated uninitialised (``torch.empty``): NaN past the limit."""
    return _capped(plain(q, k, v, causal=causal), np.nan)


def float16_denominator(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    """The textbook formula, the denominator Σ exp(s − max) summed in float32 within each tile of
    4,096 keys and carried across tiles in the inputs' dtype: for float16 inputs, past 65,504 it
    is inf and the output 0 (a diffuse row of 350,000 keys reaches it; 2,065 keys never do)."""
    if q.dtype != np.float16 or 0 in (q.shape[-2], k.shape[-2]):
        return plain(q, k, v, causal=causal)
    scale = np.float32(1 / math.sqrt(q.shape[-1]))
    s = (q.astype(np.float32) @ np.swapaxes(k.astype(np.float32), -1, -2)) * scale
    if causal:
        s = np.where(np.arange(k.shape[-2]) <= np.arange(q.shape[-2])[:, None], s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    total = np.zeros(e.shape[:-1], dtype=np.float16)
    with np.errstate(over="ignore"):
        for start in range(0, e.shape[-1], KEY_TILE):
            tile = e[..., start:start + KEY_TILE].sum(axis=-1)  # float32 within the tile
            total = (total.astype(np.float32) + tile).astype(np.float16)
    return ((e @ v.astype(np.float32)) / total[..., None].astype(np.float32)).astype(q.dtype)


def key_index_wraps(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    """Tiled attention (`impl.flash_attention`), key j read at its index mod 2^18 (an 18-bit key
    index: past 262,144 keys a row reads the first keys again in place of the last ones)."""
    keys = np.arange(k.shape[-2]) % 2**KEY_BITS
    return flash_attention(q, k[..., keys, :], v[..., keys, :], causal=causal)


def backward_grid_capped(q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False) -> Any:
    """`impl.grad`'s backward, launched on at most 65,535 slices: dq, dk, dv past them stay 0."""
    return tuple(_capped(np.array(g), 0.0) for g in attention_backward(q, k, v, d_out, causal=causal))


BROKEN = [
    broken(packed_row_wraps, "scale_hidden_keys_unmoved",
           "a packed kernel's row index kept in 17 bits: a sequence past token 2^17 reads the first "
           "sequence's keys (Knowledgator/FlashDeBERTa#11: 190,485 tokens)",
           name="packed_row_wraps_at_2^17", ndims=(3,), supports_varlen=True, holds_scores=False,
           dtypes=("float32", "float64"), profile="scale", sizes=Sizes(**{**SMALL, "packed": (512, 257)})),
    broken(grid_capped, "scale_matches_golden",
           "a launch grid capped at 65,535 slices of batch × heads: the rest left as zeros "
           "(Dao-AILab/flash-attention#2260: batch 8,300 × 16 heads)",
           name="grid_capped_at_65535", ndims=(4,), profile="scale",
           sizes=Sizes(**{**SMALL, "slices": (8_300, 16)})),
    broken(grid_capped_uninitialised, "scale_finite_everywhere",
           "a launch grid capped at 65,535 slices, the output uninitialised (NaN) past them",
           name="grid_capped_uninitialised", ndims=(4,), profile="scale",
           sizes=Sizes(**{**SMALL, "slices": (8_300, 16)})),
    broken(float16_denominator, "scale_matches_golden",
           "float16: the running denominator carried across key tiles in float16 overflows to inf "
           "past 65,504 (a diffuse row of 350,000 keys: Dao-AILab/flash-attention#47)",
           name="float16_denominator_overflows", ndims=(4,), dtypes=("float16", "float32"), profile="scale",
           sizes=Sizes(**{**SMALL, "decode_keys": 350_000})),
    broken(key_index_wraps, "scale_needles_found",
           "a long decode's key index kept in 18 bits: key 2^18 is read as key 0 (over 350,000 diffuse "
           "keys the wrong ones average like the right ones, Dao-AILab/flash-attention#47; a dominant key "
           "is lost)", name="key_index_wraps_at_2^18", ndims=(3, 4), holds_scores=False, profile="scale",
           sizes=Sizes(**SMALL)),
    broken(plain, "scale_gradients_match_golden",
           "a backward launched on at most 65,535 slices of batch × heads: their dq, dk, dv left as zeros "
           "(Dao-AILab/flash-attention#1500: the backward past batch 10,000)",
           name="backward_grid_capped", ndims=(4,), grad_fn=backward_grid_capped, profile="scale",
           sizes=Sizes(**{**SMALL, "slices": (8_300, 16)})),
]

CORRECT: list[Any] = []
