"""Gallery of the top-k laws (``topk_indices=``, ``topk_length=``): sparse kernels that gather the
listed keys row by row, as DeepSeek's and FlashMLA's do, each broken in one place the public
reports name, and correct ones (a gather that counts a key listed twice each time, declared so,
and a mask built from the lists)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gallery._keywords import textbook
from gallery.base import broken
from impl.attention import compute_dtype
from spec import Target

Array = np.ndarray


def every_key(q: Array, k: Array) -> Array:  # -> [*kv_lead, n_q, n_k]: every row lists every key
    return np.broadcast_to(np.arange(k.shape[-2]), (*k.shape[:-2], q.shape[-2], k.shape[-2]))


def _slices(q: Array, k: Array) -> tuple[Array, Array, int]:
    """q and k as ``[slices, n, d]``, and how many query heads share a K/V head."""
    group = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    return q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:]), group


def _lengths(topk_length: Any, idx: Array, batch: int) -> Array:  # -> [batch, n_q] int
    if topk_length is None:
        return np.full((batch, idx.shape[-2]), idx.shape[-1])
    return np.asarray(topk_length).reshape(batch, idx.shape[-2])


def _rows(idx: Array, n_k: int, length: Array, i_slice: int, heads_kv: int, *, clamp: bool,
          length_ignored: bool, past_n_k_zero: bool, stop_at_invalid: bool) -> tuple[Array, Array, Array]:
    # -> entries [n_q, t] int (clipped into range), read [n_q, t] bool, zero [n_q, t] bool (a zero key read)
    """One K/V slice's lists: which entries are read and which key each reads."""
    row_idx = idx.reshape(-1, *idx.shape[-2:])[i_slice]
    count = length[i_slice // heads_kv] if not length_ignored else np.full(row_idx.shape[0], row_idx.shape[1])
    read = np.arange(row_idx.shape[1]) < count[:, None]
    valid = (row_idx >= 0) & (row_idx < n_k)
    zero = np.zeros(row_idx.shape, dtype=bool)
    if clamp:  # −1 read as key 0
        row_idx = np.where(row_idx < 0, 0, row_idx)
        valid = valid | (row_idx == 0)
    if past_n_k_zero:  # an index past n_k reads the zero-filled keys there
        zero = read & (row_idx >= n_k)
    if stop_at_invalid:  # −1 taken as the end of the list
        valid = valid & (np.cumsum(~valid, axis=-1) == 0)
    return np.clip(row_idx, 0, max(n_k - 1, 0)), read & (valid | zero), zero


def gather_attention(q: Array, k: Array, v: Array, *, topk_indices: Any = None, topk_length: Any = None,
                     causal: bool = False, mask: Any = None, scale: float | None = None,
                     return_lse: bool = False, clamp: bool = False, length_ignored: bool = False,
                     past_n_k_zero: bool = False, stop_at_invalid: bool = False, wrap: bool = False,
                     pairs: bool = False, nan_rows: bool = False) -> Any:
    """Top-k attention by gathering each row's listed keys (a key listed twice counts twice), top-left
    causal; the flags are the bugs of `BROKEN`."""
    topk_indices = every_key(q, k) if topk_indices is None else topk_indices
    work = compute_dtype(q.dtype)
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    qs, ks, group = _slices(q.astype(work), k.astype(work))
    vs = v.astype(work).reshape(-1, *v.shape[-2:])
    idx = np.asarray(topk_indices).astype(np.int64)
    if wrap:  # an index past n_k taken modulo n_k
        idx = np.where(idx >= n_k, idx % max(n_k, 1), idx)
    if pairs:  # each entry read as the block of two keys holding it (a block-sparse kernel given keys)
        first = np.where((idx >= 0) & (idx < n_k), idx // 2 * 2, -1)
        idx = np.concatenate([first, np.where(first >= 0, first + 1, -1)], axis=-1)
        topk_length = None if topk_length is None else np.asarray(topk_length) * 2
    heads_kv = idx.shape[-3] if idx.ndim >= 3 else 1
    length = _lengths(topk_length, idx, max(qs.shape[0] // group // heads_kv, 1))
    masks = None if mask is None else np.broadcast_to(mask, (*q.shape[:-1], n_k)).reshape(-1, n_q, n_k)
    out = np.zeros((qs.shape[0], n_q, v.shape[-1]), dtype=work)
    lse = np.full((qs.shape[0], n_q), -np.inf)
    for s in range(qs.shape[0]):
        kv = s // group
        entries, read, zero = _rows(idx, n_k, length, kv, heads_kv, clamp=clamp,
                                    length_ignored=length_ignored,
                                    past_n_k_zero=past_n_k_zero, stop_at_invalid=stop_at_invalid)
        keys, values = ks[kv][entries], vs[kv][entries]  # [n_q, t, d]
        keys, values = np.where(zero[..., None], 0, keys), np.where(zero[..., None], 0, values)
        scores = np.einsum("qd,qtd->qt", qs[s], keys) * work.type(scale)
        seen = read & ~(causal & (entries > np.arange(n_q)[:, None]) & ~zero)
        if masks is not None:
            seen = seen & (np.take_along_axis(masks[s], entries, axis=-1) | zero)
        scores = np.where(seen, scores, -np.inf)
        top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
        e = np.exp(scores - np.where(np.isfinite(top), top, 0))
        total = e.sum(axis=-1, keepdims=True)
        with np.errstate(invalid="ignore"):
            divisor = total if nan_rows else np.where(total > 0, total, 1)
            out[s] = np.einsum("qt,qtd->qd", e / divisor, values)
        with np.errstate(divide="ignore"):
            lse[s] = (np.log(total) + np.where(np.isfinite(top), top, 0))[:, 0]
    shaped = out.reshape(*q.shape[:-1], v.shape[-1]).astype(q.dtype)
    if return_lse:
        return shaped, lse.reshape(q.shape[:-1]).astype(np.float64 if q.dtype == np.float64 else np.float32)
    return shaped


def gather_backward(q: Array, k: Array, v: Array, d_out: Array, *, topk_indices: Any = None,
                    topk_length: Any = None, causal: bool = False, mask: Any = None,
                    scale: float | None = None,
                    assign: bool = False, per_query_count: bool = False, width_cut: bool = False) -> Any:
    """The gather's backward, dK and dV scattered into each listed key with ``np.add.at``; the
    flags are the bugs of `BROKEN`."""
    topk_indices = every_key(q, k) if topk_indices is None else topk_indices
    work = np.float64
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    qs, ks, group = _slices(q.astype(work), k.astype(work))
    vs = v.astype(work).reshape(-1, *v.shape[-2:])
    do = d_out.astype(work).reshape(-1, n_q, v.shape[-1])
    idx = np.asarray(topk_indices).astype(np.int64)
    heads_kv = idx.shape[-3] if idx.ndim >= 3 else 1
    length = _lengths(topk_length, idx, max(qs.shape[0] // group // heads_kv, 1))
    masks = None if mask is None else np.broadcast_to(mask, (*q.shape[:-1], n_k)).reshape(-1, n_q, n_k)
    dq, dk, dv = np.zeros_like(qs), np.zeros_like(ks), np.zeros_like(vs)
    for s in range(qs.shape[0]):
        kv = s // group
        entries, read, _ = _rows(idx, n_k, length, kv, heads_kv, clamp=False, length_ignored=False,
                                 past_n_k_zero=False, stop_at_invalid=False)
        if width_cut:  # entries past column n_k never reach dK and dV
            read = read & (np.arange(read.shape[-1]) < n_k)
        keys, values = ks[kv][entries], vs[kv][entries]
        seen = read & ~(causal & (entries > np.arange(n_q)[:, None]))
        if masks is not None:
            seen = seen & np.take_along_axis(masks[s], entries, axis=-1)
        scores = np.where(seen, np.einsum("qd,qtd->qt", qs[s], keys) * scale, -np.inf)
        top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
        e = np.exp(scores - np.where(np.isfinite(top), top, 0))
        p = e / np.where(e.sum(axis=-1, keepdims=True) > 0, e.sum(axis=-1, keepdims=True), 1)
        dp = np.einsum("qd,qtd->qt", do[s], values)
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
        dq[s] = scale * np.einsum("qt,qtd->qd", ds, keys)
        key_grad = scale * ds[..., None] * qs[s][:, None, :]  # [n_q, t, d_k]
        value_grad = p[..., None] * do[s][:, None, :]  # [n_q, t, d_v]
        if per_query_count:  # each key's summed contribution added once per query that listed it
            listed = np.zeros(n_k)
            np.add.at(listed, entries[seen], 1)
            key_grad = key_grad * listed[entries][..., None]
            value_grad = value_grad * listed[entries][..., None]
        if assign:  # plain assignment: the last query to list a key wins
            dk[kv][entries] = dk[kv][entries] + key_grad
            dv[kv][entries] = dv[kv][entries] + value_grad
        else:
            np.add.at(dk[kv], entries, key_grad)
            np.add.at(dv[kv], entries, value_grad)
    return (dq.reshape(q.shape).astype(q.dtype), dk.reshape(k.shape).astype(k.dtype),
            dv.reshape(v.shape).astype(v.dtype))


def _gather_with(**bug: Any) -> Any:
    def fn(q: Array, k: Array, v: Array, **kw: Any) -> Any:
        return gather_attention(q, k, v, **kw, **bug)
    return fn


def _backward_with(**bug: Any) -> Any:
    def fn(q: Array, k: Array, v: Array, d_out: Array, **kw: Any) -> Any:
        return gather_backward(q, k, v, d_out, **kw, **bug)
    return fn


def as_mask(q: Array, k: Array, v: Array, *, topk_indices: Any = None, topk_length: Any = None,
            mask: Any = None, **kw: Any) -> Array:
    """Correct: the lists turned into a boolean mask, one key at a time from the definition, and
    passed to the textbook formula (a key listed twice counts once)."""
    idx = np.asarray(every_key(q, k) if topk_indices is None else topk_indices)
    n_q, n_k = q.shape[-2], k.shape[-2]
    heads_kv = idx.shape[-3] if idx.ndim >= 3 else 1
    group = q.shape[-3] // heads_kv if q.ndim >= 3 else 1
    lead = q.shape[:-2]
    listed = np.zeros((*lead, n_q, n_k), dtype=bool)
    for at in np.ndindex(*lead):
        kv = (*at[:-1], at[-1] // group) if at else ()
        batch = at[0] if len(at) == 2 else None
        for i in range(n_q):
            count = idx.shape[-1] if topk_length is None else \
                int(np.asarray(topk_length)[(batch, i) if batch is not None else i])
            for j in idx[(*kv, i)][:count]:
                if 0 <= j < n_k:
                    listed[(*at, i, int(j))] = True
    if q.ndim >= 3 and group > 1:  # grouped K/V heads, repeated to the query heads
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    return textbook(q, k, v, mask=listed if mask is None else listed & mask, **kw)


GATHER = {"supports_topk": True, "supports_mask": True, "supports_scale": True, "supports_gqa": True,
          "ndims": (2, 3, 4), "topk_duplicates": "each"}
"""What the gather variants declare: a key listed twice counts twice; top-left causal."""

def _broken() -> list[Any]:
    def fwd(name: str, catches: str, bug: str, **flags: Any) -> Any:
        fn = _gather_with(**flags)
        fn.__name__ = name
        return broken(fn, catches, bug, **GATHER)

    def bwd(name: str, catches: str, bug: str, **flags: Any) -> Any:
        fn = _gather_with()
        fn.__name__ = name
        return broken(fn, catches, bug, grad_fn=_backward_with(**flags), **GATHER)

    plain = _gather_with()
    plain.__name__ = "topk_gather_declared_once"
    return [
        fwd("topk_minus_one_as_key_0", "topk_matches_golden",
            "−1 padding clamped to index 0: key 0 attended by every padded row (cudnn-frontend PR #298)",
            clamp=True),
        fwd("topk_length_ignored", "topk_matches_golden",
            "topk_length ignored: the entries past it are read (PaddleFleet PR #1836)", length_ignored=True),
        fwd("topk_zero_keys_past_n_k", "topk_matches_golden",
            "an index past n_k reads a zero-filled key: a score of 0, a weight of exp(0) "
            "(flashinfer PR #5090)",
            past_n_k_zero=True),
        fwd("topk_reads_key_pairs", "topk_no_leak",
            "each listed key read with its neighbour in a block of two (a block-sparse kernel given key "
            "indices)", pairs=True),
        fwd("topk_wraps_past_n_k", "topk_ignored_entries_change_nothing",
            "an index past n_k taken modulo n_k instead of ignored", wrap=True),
        fwd("topk_empty_rows_nan", "topk_empty_rows_as_declared",
            "a row whose list holds no valid key divides 0 by 0: NaN (cudnn-frontend #676)", nan_rows=True),
        fwd("topk_stops_at_minus_one", "topk_order_invariant",
            "−1 taken as the end of the list: the valid keys after it are dropped", stop_at_invalid=True),
        broken(plain, "topk_duplicates_as_declared",
               "a gather (a key listed twice counts twice) declared as a mask (topk_duplicates='once')",
               **{**GATHER, "topk_duplicates": "once"}),
        bwd("topk_grad_assigned", "topk_grad_shared_keys",
            "dK and dV scattered by assignment: of the queries that picked a key, the last wins "
            "(cudnn-frontend #384/#385)", assign=True),
        bwd("topk_grad_counted_per_query", "topk_grad_shared_keys",
            "a key's dK and dV added once per query that listed it: cross-query duplicates double-counted",
            per_query_count=True),
        bwd("topk_grad_width_cut", "grad_keywords_match_golden",
            "dK and dV dropped for entries past column n_k of a list wider than the keys "
            "(cudnn-frontend PR #298)",
            width_cut=True),
    ]


BROKEN = _broken()

_correct_gather = _gather_with()
_correct_gather.__name__ = "topk_gather"

CORRECT = [
    Target(_correct_gather, name="topk_gather", grad_fn=_backward_with(), empty_keys="raise", **GATHER),
    Target(as_mask, name="topk_as_mask", supports_topk=True, supports_mask=True, supports_scale=True,
           supports_gqa=True, ndims=(2, 3, 4), empty_keys="raise"),
]


# --- block-sparse selection (topk_blocks=, topk_block_size=) -------------------------------------


def block_lists(topk_blocks: Any, topk_block_size: int, n_k: int, *, partial_dropped: bool = False,
                wide: bool = False, wrap: bool = False, each: bool = False) -> Array:
    # -> [*kv_lead, n_q, width · size] key indices (−1 where none): each listed block's keys
    """The key lists the blocks stand for, a block's keys b·size .. b·size + size − 1 (those < n_k);
    the flags are the bugs of `BROKEN`. A block listed twice is read once unless ``each``."""
    blocks = np.asarray(topk_blocks).astype(np.int64)
    count = n_k // topk_block_size if partial_dropped else -(-n_k // topk_block_size)
    if wrap:  # an invalid block taken modulo the number of blocks
        blocks = np.where((blocks < 0) | (blocks >= count), blocks % max(count, 1), blocks)
    valid = (blocks >= 0) & (blocks < count)
    if not each:  # a block already listed earlier in the row is not read again
        before = np.tri(blocks.shape[-1], k=-1, dtype=bool).T  # [a, b]: entry a comes before entry b
        earlier = (blocks[..., :, None] == blocks[..., None, :]) & before
        valid = valid & ~earlier.any(axis=-2)
    span = topk_block_size + (1 if wide else 0)
    keys = blocks[..., None] * topk_block_size + np.arange(span)  # [..., width, span]
    keys = np.where(valid[..., None] & (keys < n_k), keys, -1)
    return keys.reshape(*blocks.shape[:-1], -1)


def block_gather(q: Array, k: Array, v: Array, *, topk_blocks: Any = None, topk_block_size: Any = None,
                 **kw: Any) -> Any:
    """Correct: each row's listed blocks turned into their keys and gathered (a block listed twice
    read once)."""
    if topk_blocks is not None:
        kw["topk_indices"] = block_lists(topk_blocks, topk_block_size, k.shape[-2])
    return gather_attention(q, k, v, **kw)


def _block_bug(name: str, **flags: Any) -> Any:
    def fn(q: Array, k: Array, v: Array, *, topk_blocks: Any = None, topk_block_size: Any = None,
           **kw: Any) -> Any:
        if topk_blocks is not None:
            kw["topk_indices"] = block_lists(topk_blocks, topk_block_size, k.shape[-2], **flags)
        return gather_attention(q, k, v, **kw)
    fn.__name__ = name
    return fn


BLOCKS = {"supports_topk_blocks": True, "supports_mask": True, "supports_scale": True, "supports_gqa": True,
          "ndims": (2, 3, 4)}

BROKEN += [
    broken(_block_bug("topk_blocks_partial_dropped", partial_dropped=True), "topk_blocks_matches_golden",
           "the partial last block dropped: the number of blocks taken as n_k // size (flashinfer PR #5090's "
           "n_k not a multiple of the tile)", **BLOCKS),
    broken(_block_bug("topk_blocks_one_key_wide", wide=True), "topk_blocks_no_leak",
           "a block's keys taken as b·size .. (b + 1)·size: the next block's first key read with it",
           **BLOCKS),
    broken(_block_bug("topk_blocks_wrapped", wrap=True), "topk_blocks_invalid_ignored",
           "an invalid block taken modulo the number of blocks", **BLOCKS),
    broken(_block_bug("topk_blocks_read_each_time", each=True), "topk_blocks_listed_twice_count_once",
           "a block listed twice read twice (its keys' weights doubled)", **BLOCKS),
]

CORRECT += [Target(block_gather, name="topk_blocks_gather", empty_keys="raise", **BLOCKS)]
