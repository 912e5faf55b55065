"""Gallery of the cache laws (`spec.laws.cache`): paged caches read wrong, float8 caches scaled
wrong, causal attention aligned to the wrong end of a cache.

Each broken kernel reads its cache with one bug (`read_pages`, `dequantize`) and hands the
contiguous keys to `impl.attention`; the correct ones read it other ways: whole blocks joined and
cut, and one block at a time with an online softmax (as vLLM's and FlashInfer's kernels do).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gallery.base import broken
from gallery.window import SERVING
from impl import attention
from spec import Target
from spec.dtypes import has_ml_dtypes

Array = np.ndarray

FLOAT8 = has_ml_dtypes()  # float8 caches need ml_dtypes: without it, their entries are left out
PAGED = {"supports_paged_kv": True, "ndims": (2, 3, 4)}
FP8 = {"supports_fp8_kv": True, "ndims": (2, 3, 4)}


def read_pages(pool: Array, table: Array, lengths: Array, bug: str = "") -> tuple[Array, Array]:
    # [num_blocks, block_size, g, d], [batch, max_blocks], [batch] -> [batch, g, n_k, d], lengths read
    """Each sequence's keys, contiguous, with one named bug (or none): ``off_by_one`` (block
    j // size + 1), ``swapped`` (offset and block index exchanged), ``row0`` (every sequence reads
    table row 0), ``stale_tail`` (the whole last block is read and attended to), ``floor``
    (⌊L / size⌋ blocks: a partial last block dropped). Indices are clipped, as a GPU reads
    whatever memory they land on."""
    size, max_blocks = pool.shape[1], table.shape[1]
    out = np.zeros((len(lengths), pool.shape[2], max_blocks * size, pool.shape[3]), dtype=pool.dtype)
    read = np.asarray(lengths).copy()
    for b, n in enumerate(np.asarray(lengths).tolist()):
        if bug == "stale_tail":
            n = -(-n // size) * size
        elif bug == "floor":
            n = n // size * size
        read[b] = n
        j = np.arange(n)
        block, offset = j // size, j % size
        if bug == "off_by_one":
            block = block + 1
        elif bug == "swapped":
            block, offset = offset, block
        row = table[0] if bug == "row0" else table[b]
        physical = row[np.clip(block, 0, max_blocks - 1)]
        out[b, :, :n] = np.swapaxes(pool[physical, np.clip(offset, 0, size - 1)], 0, 1)
    return out, read


def dequantize(k: Array, v: Array, k_descale: Array, v_descale: Array, work: np.dtype, heads: int,
               bug: str = "") -> tuple[Array, Array]:
    # [batch, g, n, d] float8, [batch, g] -> [batch, heads, n, d] in work (K/V heads repeated)
    """What float8 codes mean, ``codes · descale[b, g]``, with one named bug (or none): ``k_only``
    (the values' descale forgotten), ``query_head`` (descales read as [batch, heads], by query
    head), ``tensor`` (only ``k_descale[0, 0]`` and ``v_descale[0, 0]`` read: a per-tensor scale),
    ``swapped`` (K's descale on V and V's on K), ``float16`` (dequantized in float16,
    saturating at ±65,504, then computed in ``work``)."""
    batch, g = k.shape[:2]
    group = heads // g
    kv_head = np.arange(heads) // group
    ks, vs = np.asarray(k_descale, work), np.asarray(v_descale, work)
    if bug == "tensor":  # one scale per tensor read: the first entry of each, for every row and head
        ks, vs = np.full_like(ks, ks.flat[0]), np.full_like(vs, vs.flat[0])
    if bug == "swapped":
        ks, vs = vs, ks
    if bug == "query_head":  # the flat [batch, g] buffer indexed with the query heads' stride
        index = (np.arange(batch)[:, None] * heads + np.arange(heads)[None, :]) % ks.size
        k_scale, v_scale = ks.reshape(-1)[index], vs.reshape(-1)[index]
    else:
        k_scale, v_scale = ks[:, kv_head], vs[:, kv_head]
    if bug == "k_only":
        v_scale = np.ones_like(v_scale)
    k_all, v_all = k.astype(work)[:, kv_head], v.astype(work)[:, kv_head]
    keys, values = k_all * k_scale[:, :, None, None], v_all * v_scale[:, :, None, None]
    if bug == "float16":  # a saturating conversion to float16 (65,504 the largest finite)
        edge = float(np.finfo(np.float16).max)
        keys, values = (np.clip(x, -edge, edge).astype(np.float16).astype(work) for x in (keys, values))
    return keys, values


def with_cache(*, pages_bug: str = "", fp8_bug: str = "", align: str = "kv_lengths",
               contiguous_align: str | None = None, name: str = "") -> Any:
    """A kernel that reads its cache (`read_pages`, `dequantize`, each with its bug) and attends
    with `impl.attention`, causal and windows aligned by ``align`` over a paged cache and
    ``contiguous_align`` over contiguous keys with kv_lengths."""

    def fn(q: Array, k: Array, v: Array, *, block_table: Any = None, kv_lengths: Any = None,
           k_descale: Any = None, v_descale: Any = None, **kw: Any) -> Array:
        lengths = None if kv_lengths is None else np.asarray(kv_lengths)
        if block_table is not None:
            table = np.asarray(block_table)
            k, lengths = read_pages(k, table, lengths, pages_bug)
            v, _ = read_pages(v, table, np.asarray(kv_lengths), pages_bug)
        dtype = q.dtype
        if k_descale is not None:
            work = np.dtype(np.float64 if dtype == np.float64 else np.float32)
            k, v = dequantize(k, v, k_descale, v_descale, work, q.shape[1], fp8_bug)
            q = q.astype(work)
        if block_table is not None:
            kw["align"] = align
        elif contiguous_align is not None:  # without key lengths, bottom-right on the call's n_k
            kw["align"] = contiguous_align if lengths is not None else "bottom_right"
        return attention(q, k, v, kv_lengths=lengths, **kw).astype(dtype)

    fn.__name__ = fn.__qualname__ = name or "_".join(b for b in (pages_bug, fp8_bug) if b) or "cache"
    return fn


def physical_order(q: Array, k: Array, v: Array, *, causal: bool = False, block_table: Any = None,
                   kv_lengths: Any = None, **kw: Any) -> Array:
    """Right up to rounding, wrong in its bits: each sequence's blocks visited in the order of
    their physical numbers (a sorted table), each key's logical position carried along for the
    masks, so the sums run in an order the allocator chose."""
    if block_table is None:
        return attention(q, k, v, causal=causal, kv_lengths=kv_lengths, **kw)
    table, lengths = np.asarray(block_table), np.asarray(kv_lengths)
    size = k.shape[1]
    n_q, n_k = q.shape[2], table.shape[1] * size
    keys = np.zeros((len(lengths), k.shape[2], n_k, k.shape[3]), k.dtype)
    values = np.zeros((len(lengths), v.shape[2], n_k, v.shape[3]), v.dtype)
    position = np.full((len(lengths), n_k), n_k)  # past every length: hidden
    for b, n in enumerate(lengths.tolist()):
        used = -(-n // size)
        for slot, logical in enumerate(np.argsort(table[b, :used], kind="stable").tolist()):
            j = logical * size + np.arange(min(size, n - logical * size))
            at = slot * size + np.arange(len(j))
            keys[b][:, at] = np.swapaxes(k[table[b, logical], j % size], 0, 1)
            values[b][:, at] = np.swapaxes(v[table[b, logical], j % size], 0, 1)
            position[b, at] = j
    seen = position[:, None, None, :] < lengths[:, None, None, None]
    if causal:
        diagonal = np.arange(n_q)[:, None] + (lengths - n_q)[:, None, None, None]  # [batch, 1, n_q, 1]
        seen = seen & (position[:, None, None, :] <= diagonal)
    return attention(q, keys, values, mask=seen, **kw)


BROKEN = [
    broken(with_cache(pages_bug="off_by_one"), "paged_matches_golden",
           "block index off by one: block_table[b, j // block_size + 1]", **PAGED),
    broken(with_cache(pages_bug="swapped"), "paged_matches_golden",
           "offset inside a block swapped with the block index", **PAGED),
    broken(with_cache(pages_bug="row0"), "paged_matches_golden",
           "every sequence reads row 0 of the block table", **PAGED),
    broken(with_cache(pages_bug="stale_tail"), "paged_reads_only_its_keys",
           "stale tail read: the whole last block attended to, keys past kv_lengths[b] included", **PAGED),
    broken(physical_order, "paged_block_order_invariant",
           "a sequence's blocks summed in physical order: right up to rounding, bits set by the allocator",
           **PAGED),
    broken(with_cache(pages_bug="floor"), "paged_block_size_invariant",
           "⌊L / block_size⌋ blocks read: a partial last block dropped", **PAGED),
    broken(with_cache(align="top_left", name="top_left_prefill"), "causal_aligned_per_sequence",
           "chunked prefill aligned top-left over a paged cache (query i sees keys j ≤ i)", **PAGED),
    broken(with_cache(contiguous_align="bottom_right", name="lengths_call_aligned"),
           "causal_aligned_per_sequence",
           "declares per-sequence alignment, aligns to the call's n_k: i + n_k − n_q instead of "
           "i + kv_lengths[b] − n_q", causal_alignment="kv_lengths", supports_kv_lengths=True,
           ndims=(2, 3, 4)),
]
BROKEN += [] if not FLOAT8 else [
    broken(with_cache(fp8_bug="k_only"), "fp8_matches_golden",
           "float8 descale applied to K only: the values read as raw codes", **FP8),
    broken(with_cache(fp8_bug="query_head"), "fp8_per_row_and_kv_head",
           "float8 descales indexed by the query head ([batch, heads] strides over a [batch, heads_kv] "
           "buffer)",
           supports_gqa=True, **FP8),
    broken(with_cache(fp8_bug="tensor", name="per_tensor_scale"), "fp8_per_row_and_kv_head",
           "declares per-row float8 descales (the default fp8_scale), reads one per tensor: only "
           "k_descale[0, 0] and v_descale[0, 0]", **FP8),
    broken(with_cache(fp8_bug="swapped"), "fp8_k_and_v_not_interchangeable",
           "k_descale and v_descale swapped", **FP8),
    broken(with_cache(fp8_bug="float16"), "fp8_matches_golden",
           "float8 cache dequantized in float16 (saturating at 65,504) by a kernel that computes in float32",
           **FP8),
]


# --- correct -----------------------------------------------------------------------------------


def joined_blocks(q: Array, k: Array, v: Array, *, block_table: Any = None, kv_lengths: Any = None,
                  k_descale: Any = None, v_descale: Any = None, **kw: Any) -> Array:
    """A gather written another way: a sequence's whole blocks joined, then cut to its length
    (nothing past it is used); float8 dequantized per K/V head; per-sequence alignment."""
    lengths = None if kv_lengths is None else np.asarray(kv_lengths)
    if block_table is not None:
        table, size = np.asarray(block_table), k.shape[1]
        n_k = table.shape[1] * size

        def join(pool: Array) -> Array:  # -> [batch, g, n_k, d]
            out = np.zeros((len(lengths), pool.shape[2], n_k, pool.shape[3]), pool.dtype)
            for b, n in enumerate(lengths.tolist()):
                blocks = np.concatenate([pool[i] for i in table[b, :-(-n // size)]] or [pool[:0, 0]])
                out[b, :, :n] = np.swapaxes(blocks[:n], 0, 1)
            return out

        k, v = join(k), join(v)
    dtype = q.dtype
    if k_descale is not None:
        work = np.float64 if dtype == np.float64 else np.float32
        k = k.astype(work) * np.asarray(k_descale, work)[:, :, None, None]
        v = v.astype(work) * np.asarray(v_descale, work)[:, :, None, None]
        q = q.astype(work)
    align = "kv_lengths" if lengths is not None else "bottom_right"
    return attention(q, k, v, kv_lengths=lengths, align=align, **kw).astype(dtype)


def one_block_at_a_time(q: Array, k: Array, v: Array, *, causal: bool = False, scale: Any = None,
                        block_table: Any = None, kv_lengths: Any = None, k_descale: Any = None,
                        v_descale: Any = None) -> Array:
    """A paged kernel as vLLM's and FlashInfer's are: one block at a time, an online softmax
    (running max, rescaled sum and accumulator), the descales applied to each block as it is
    read; contiguous keys go to `impl.attention` (top-left, and no float8 there)."""
    if block_table is None:
        return attention(q, k, v, causal=causal, scale=scale, kv_lengths=kv_lengths)
    work = np.dtype(np.float64 if q.dtype == np.float64 else np.float32)
    batch, heads, n_q, d_k = q.shape
    size, g, d_v = k.shape[1], k.shape[2], v.shape[3]
    kv_head = np.arange(heads) // (heads // g)
    factor = work.type(1 / math.sqrt(d_k) if scale is None else scale)
    table, lengths = np.asarray(block_table), np.asarray(kv_lengths)
    out = np.zeros((batch, heads, n_q, d_v), work)
    for b, n in enumerate(lengths.tolist()):
        top = np.full((heads, n_q, 1), -np.inf, work)
        total = np.zeros((heads, n_q, 1), work)
        acc = np.zeros((heads, n_q, d_v), work)
        qb = q[b].astype(work)
        for i in range(-(-n // size)):
            count = min(size, n - i * size)
            kb = k[table[b, i], :count].astype(work)  # [count, g, d_k]
            vb = v[table[b, i], :count].astype(work)
            if k_descale is not None:
                kb = kb * np.asarray(k_descale, work)[b][None, :, None]
                vb = vb * np.asarray(v_descale, work)[b][None, :, None]
            kb, vb = np.swapaxes(kb, 0, 1)[kv_head], np.swapaxes(vb, 0, 1)[kv_head]  # [heads, count, d]
            s = (qb @ np.swapaxes(kb, -1, -2)) * factor  # [heads, n_q, count]
            if causal:
                j = i * size + np.arange(count)
                s = np.where(j[None, :] <= np.arange(n_q)[:, None] + n - n_q, s, -np.inf)
            new_top = np.maximum(top, s.max(axis=-1, keepdims=True))
            shift = np.where(np.isfinite(new_top), new_top, 0)
            rescale = np.where(np.isfinite(top), np.exp(top - shift), 0)
            e = np.exp(s - shift)
            total = total * rescale + e.sum(axis=-1, keepdims=True)
            acc = acc * rescale + e @ vb
            top = new_top
        out[b] = np.where(total > 0, acc / np.where(total > 0, total, 1), 0)
    return out.astype(q.dtype)


def weights_in_float8(q: Array, k: Array, v: Array, *, causal: bool = False, scale: Any = None,
                      k_descale: Any = None, v_descale: Any = None) -> Array:
    """FlashAttention 3's float8 path: the unnormalised weights exp(s − max) rounded to e4m3 for
    the P·V product (the row sums from the unrounded ones); the tolerance allows exactly this."""
    if k_descale is None:
        return attention(q, k, v, causal=causal, scale=scale)
    work = np.dtype(np.float64 if q.dtype == np.float64 else np.float32)
    keys, values = dequantize(k, v, k_descale, v_descale, work, q.shape[1])
    s = (q.astype(work) @ np.swapaxes(keys, -1, -2)) * work.type(1 / math.sqrt(q.shape[-1]) if scale is None
                                                                 else scale)
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    rounded = p.astype(k.dtype).astype(work)  # to float8_e4m3fn and back
    return (rounded @ values / p.sum(axis=-1, keepdims=True)).astype(q.dtype)


def float64_over_dequantized(*, per_sequence: bool) -> Any:
    """A float8 kernel as the plainest correct one is written: the cache gathered (when paged) and
    dequantized, everything computed in float64, the output returned in q's dtype — float16
    included, so the suite may draw only float8 caches whose output float16 can hold (a cache past
    float16's range once gave this kernel a correctly rounded inf, which a law called a failure).
    ``per_sequence``: causal aligned on each sequence's key length (bottom-right without them), as
    a paged kernel aligns; else top-left."""

    def fn(q: Array, k: Array, v: Array, *, causal: bool = False, scale: Any = None, kv_lengths: Any = None,
           block_table: Any = None, k_descale: Any = None, v_descale: Any = None) -> Array:
        lengths = None if kv_lengths is None else np.asarray(kv_lengths)
        if block_table is not None:
            k, _ = read_pages(k, np.asarray(block_table), lengths)
            v, _ = read_pages(v, np.asarray(block_table), lengths)
        k, v = k.astype(np.float64), v.astype(np.float64)
        if k_descale is not None:
            k = k * np.asarray(k_descale, np.float64)[:, :, None, None]
            v = v * np.asarray(v_descale, np.float64)[:, :, None, None]
        align = None if not per_sequence else "kv_lengths" if lengths is not None else "bottom_right"
        out = attention(q.astype(np.float64), k, v, causal=causal, scale=scale, kv_lengths=lengths,
                        align=align)
        return out.astype(q.dtype)

    return fn


FLOAT64_FP8 = {"supports_fp8_kv": FLOAT8, "supports_kv_lengths": True, "supports_scale": True,
               "supports_gqa": True, "dtypes": ("float16", "float32", "float64")}
"""What a float8 kernel computing in float64 declares: its output in q's dtype, float16 included."""

CORRECT = [
    Target(joined_blocks, name="cache_joined_blocks", causal_alignment="kv_lengths", supports_kv_lengths=True,
           supports_window=True, supports_mask=True, supports_scale=True, supports_gqa=True, ndims=(2, 3, 4),
           dtypes=("float16", "float32", "float64"), supports_paged_kv=True, supports_fp8_kv=FLOAT8),
    Target(one_block_at_a_time, name="cache_one_block_at_a_time", supports_scale=True, supports_gqa=True,
           ndims=(2, 3, 4), supports_paged_kv=True, supports_fp8_kv=FLOAT8, fp8_kv_paged_only=FLOAT8),
    Target(float64_over_dequantized(per_sequence=False), name="fp8_float64_contiguous", **FLOAT64_FP8),
    Target(float64_over_dequantized(per_sequence=True), name="fp8_float64_paged", supports_paged_kv=True,
           causal_alignment="kv_lengths", **FLOAT64_FP8),
    *([Target(weights_in_float8, name="weights_in_float8", supports_scale=True, supports_gqa=True,
              ndims=(2, 3, 4), supports_fp8_kv=True)] if FLOAT8 else []),
]


# --- serving kernels that take a cache in one form only, each with its declaration -------------


def tensor_fp8_kernel(q: Array, k: Array, v: Array, *, k_descale: Any = None, v_descale: Any = None,
                      **kw: Any) -> Array:
    """One float8 scale per tensor: reads the first entry of each descale, as a kernel taking a
    scalar does behind a wrapper that passes it ``k_descale[0, 0]``."""
    if k_descale is None:
        return attention(q, k, v, **kw)
    k_one, v_one = (np.full_like(np.asarray(x), np.asarray(x).flat[0]) for x in (k_descale, v_descale))
    return attention(q, k, v, k_descale=k_one, v_descale=v_one, **kw)


def block16_kernel(q: Array, k: Array, v: Array, *, block_table: Any = None, **kw: Any) -> Array:
    """A paged cache in blocks of a multiple of 16 keys (its tile)."""
    if block_table is not None and k.shape[1] % 16:
        raise ValueError(f"block size must be a multiple of 16, got {k.shape[1]}")
    return attention(q, k, v, block_table=block_table, **kw)


CORRECT += [Target(block16_kernel, name="blocks_of_16",
                   supports_paged_kv=True, block_multiple=16, **SERVING)]
CORRECT += [] if not FLOAT8 else [
    Target(tensor_fp8_kernel, name="per_tensor_fp8",
           supports_fp8_kv=True, supports_gqa=True, fp8_scale="tensor", **SERVING)]
