"""Gallery of the mask- and score-function laws (``mask_mod=``, ``score_mod=``): a block-sparse
kernel in the manner of FlexAttention — keys in blocks of `BLOCK`, padded to a whole block, the
mask function evaluated on index arrays and a block table of full blocks — each broken in one
place the public reports name, and the correct one."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gallery.base import broken, stable_softmax
from impl.attention import compute_dtype
from spec import Target

Array = np.ndarray

BLOCK = 4
"""The kernel's key block: small, so that the suite's small calls hold partial blocks."""

CACHE: dict[Any, Array] = {}
"""The block tables a broken kernel keeps from call to call, by mask function (`cached_longer`)."""


def as_4d(x: Array) -> Array:  # [..., n, d] -> [b, h, n, d]
    return np.asarray(x).reshape((1,) * (4 - np.ndim(x)) + np.shape(x))


def indices(batch: int, heads: int, n_q: int, n_k: int) -> tuple[Array, Array, Array, Array]:
    return (np.arange(batch).reshape(-1, 1, 1, 1), np.arange(heads).reshape(1, -1, 1, 1),
            np.arange(n_q).reshape(1, 1, -1, 1), np.arange(n_k).reshape(1, 1, 1, -1))


def full_blocks(keep: Array, n_q: int, n_k: int) -> Array:  # [b, h, Qp, Kp] -> [b, h, Qp/B, Kp/B] bool
    """Blocks whose every position exists (q < n_q, kv < n_k) and is kept."""
    exists = (np.arange(keep.shape[-2])[:, None] < n_q) & (np.arange(keep.shape[-1]) < n_k)
    whole = keep & exists
    b, h, qp, kp = whole.shape
    return whole.reshape(b, h, qp // BLOCK, BLOCK, kp // BLOCK, BLOCK).all(axis=(3, 5))


def mods_attention(q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
                   scale: float | None = None, mask_mod: Any = None, score_mod: Any = None,
                   partial_dropped: bool = False, cached_longer: bool = False, head_zero: bool = False,
                   unsigned: bool = False, last_row_off: bool = False, score_after_mask: bool = False,
                   multiplied: bool = False) -> Array:
    # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v]
    """Keys padded with zeros to whole blocks of `BLOCK`; the score function on every score, the
    mask function (ANDed with top-left causal and mask=) on every position, positions past n_k
    hidden, except in the blocks the block table says are full; the flags are the bugs of
    `BROKEN`."""
    work = compute_dtype(np.asarray(q).dtype)
    q4, k4, v4 = (as_4d(x).astype(work) for x in (q, k, v))
    batch, heads, n_q, _ = q4.shape
    n_k = k4.shape[2]
    k4, v4 = (np.repeat(x, heads // x.shape[1], axis=1) for x in (k4, v4))  # grouped K/V heads
    padded = -(-n_k // BLOCK) * BLOCK
    k4, v4 = (np.concatenate([x, np.zeros((*x.shape[:2], padded - n_k, x.shape[3]), work)], axis=2)
              for x in (k4, v4))
    padded_q = -(-n_q // BLOCK) * BLOCK
    b, h, q_idx, kv_idx = indices(batch, heads, padded_q, padded)
    s = (q4 @ np.swapaxes(k4, -1, -2)) * work.type(1 / math.sqrt(q4.shape[-1]) if scale is None else scale)
    if score_mod is not None and not score_after_mask:  # on the keys there are, not the padding
        s[..., :n_k] = np.asarray(score_mod(s[..., :n_k], *indices(batch, heads, n_q, n_k))).astype(work)
    keep = np.ones((batch, heads, padded_q, padded), dtype=bool)
    if causal:
        keep = keep & (q_idx >= kv_idx)
    if mask_mod is not None:
        at = (b * 0, h * 0) if head_zero else (b, h)  # a block mask built for batch row 0, head 0
        last = (b == batch - 1) & (h == heads - 1) & (q_idx == n_q - 1)  # the launch's last row: an epilogue
        rows = np.where(last, 0, q_idx) if last_row_off else q_idx
        found = (mask_mod(*(x.astype(np.uint32) for x in (*at, rows, kv_idx))) if unsigned
                 else mask_mod(*at, rows, kv_idx))
        keep = keep & found
    if mask is not None:
        given = np.broadcast_to(as_4d(mask), (batch, heads, n_q, n_k))
        keep[:, :, :n_q, :n_k] &= given
    full = full_blocks(keep, n_q, n_k)
    if cached_longer and mask_mod is not None:  # the table of the longest call met, cut to this one
        key = (mask_mod, causal, batch, heads)
        if key not in CACHE or CACHE[key].shape[-1] < full.shape[-1] or CACHE[key].shape[-2] < full.shape[-2]:
            CACHE[key] = full
        full = CACHE[key][..., :full.shape[-2], :full.shape[-1]]
    keep = keep & (kv_idx < (n_k // BLOCK * BLOCK if partial_dropped else n_k))
    keep = keep | np.repeat(np.repeat(full, BLOCK, axis=-2), BLOCK, axis=-1)  # full blocks: every position
    keep = keep[:, :, :n_q]
    if multiplied:  # hidden scores kept, their exponentials multiplied by 0
        top = np.max(np.where(keep, s, -np.inf), axis=-1, keepdims=True, initial=-np.inf)
        with np.errstate(invalid="ignore"):
            e = np.exp(s - np.where(np.isfinite(top), top, 0)) * keep
        total = e.sum(axis=-1, keepdims=True)
        w = e / np.where(total > 0, total, 1)
    else:
        s = np.where(keep, s, -np.inf)
        if score_mod is not None and score_after_mask:
            s[..., :n_k] = np.asarray(score_mod(s[..., :n_k], *indices(batch, heads, n_q, n_k))).astype(work)
        w = stable_softmax(s)
    out = (w @ v4).astype(np.asarray(q).dtype)
    return out.reshape(*np.shape(q)[:-1], v4.shape[-1])


def _bug(name: str, **flags: Any) -> Any:
    def fn(q: Array, k: Array, v: Array, **kw: Any) -> Array:
        return mods_attention(q, k, v, **kw, **flags)
    fn.__name__ = name
    return fn


MODS = {"supports_mask_mod": True, "supports_score_mod": True, "supports_mask": True, "supports_scale": True,
        "supports_gqa": True, "ndims": (2, 3, 4)}

BROKEN = [
    broken(_bug("mods_partial_block_ignored", partial_dropped=True), "mask_mod_keys_off_block",
           "a block mask that ignores a partial last block: the number of key blocks taken as n_k // block, "
           "so the keys of the last, partial block are never visited (#159247)", **MODS),
    broken(_bug("mods_block_mask_from_longer_call", cached_longer=True), "mask_mod_after_longer_call",
           "the block table of a longer call with the same mask function, cut to this call in whole blocks: "
           "its partial last block counts as full and the zero padding past n_k is attended (#136232, "
           "#163314)", **MODS),
    broken(_bug("mods_head_zero_broadcast", head_zero=True), "mask_mod_reads_batch_and_head",
           "the mask function evaluated for batch row 0 and head 0 and broadcast to every slice (#163314)",
           **MODS),
    broken(_bug("mods_unsigned_indices", unsigned=True), "mask_mod_forms_agree",
           "the indices handed to the mask function as uint32: a difference of indices wraps, so "
           "(q − kv) % 3 and (kv − q) % 3, or kv ≥ q − w and q − kv ≤ w, disagree (#165838)", **MODS),
    broken(_bug("mods_last_row_off", last_row_off=True), "mask_mod_matches_golden",
           "the last query row of the call (of its last batch row and head), handled by an epilogue, "
           "evaluates the mask for row 0: one wrong row, which a mean-error tolerance (PyTorch's own tests) "
           "dilutes by 1/(batch · heads · n_q) and passes", **MODS),
    broken(_bug("mods_score_after_mask", score_after_mask=True), "score_mod_matches_golden",
           "the score function applied after the mask: a softcap turns a hidden key's −inf into −c, and "
           "the key is seen", **MODS),
    broken(_bug("mods_masked_by_multiplying", multiplied=True), "score_mod_unused_where_hidden",
           "the mask applied by multiplying the exponentials by 0: a NaN the score function reads where a "
           "key is hidden gives NaN · 0 = NaN (#150321)", **MODS),
]

_correct = _bug("mods_blocked")
CORRECT = [Target(_correct, name="mods_blocked", **MODS)]
