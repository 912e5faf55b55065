"""KV caches as inference kernels hold them: paged (read through a block table) and float8.

A **paged cache** (vLLM's PagedAttention, Kwon et al. 2023; FlashAttention's ``block_table``) keeps
keys in fixed-size blocks of one shared pool, ``k [num_blocks, block_size, g, d_k]`` and
``v [num_blocks, block_size, g, d_v]`` whatever the layout of q; batch row b owns the blocks listed in
``block_table [batch, max_blocks]``, and holds ``kv_lengths[b]`` keys:

    key j of sequence b = k[block_table[b, j // block_size], j % block_size]      j < kv_lengths[b]

Table entries past a sequence's last block, other rows' blocks, unused blocks and the tail of a
sequence's last block may hold anything (NaN, stale keys): they are never read.

A **float8 cache** (FlashAttention 3's ``k_descale``/``v_descale``) stores k and v as
``float8_e4m3fn`` (ml_dtypes) with one float scale per batch row and K/V head: the keys mean
``k.astype(float32) · k_descale[b, g]``, and the same for v.

Reading a cache here is the definition, in NumPy: gather each sequence's own keys in order,
dequantize them, and hand contiguous ``[batch, g, n_k, d]`` keys and values (n_k the longest
sequence, later positions zero and hidden by ``kv_lengths``) to ordinary attention.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from impl.masks import Align

Array = np.ndarray

FLOAT8 = "float8_e4m3fn"
"""The float8 format a cache may arrive in (4 exponent bits, 3 mantissa bits, no infinities)."""


def is_float8(x: Any) -> bool:
    """Whether ``x`` is an array of ``float8_e4m3fn`` (ml_dtypes names it so in NumPy)."""
    return isinstance(x, np.ndarray) and x.dtype.type.__name__ == FLOAT8


def _check_table(block_table: Any, batch: int) -> Array:  # -> [batch, max_blocks] int
    table = np.asarray(block_table)
    if table.dtype.kind not in "iu":
        raise TypeError(f"block_table must be an integer array (int32), got dtype {table.dtype}")
    if table.ndim != 2 or table.shape[0] != batch:
        raise ValueError(f"block_table must have shape (batch, max_blocks) with batch = {batch}, "
                         f"got {table.shape}")
    return table


def _check_pool(name: str, cache: Any) -> Array:  # -> [num_blocks, block_size, g, d]
    if not isinstance(cache, np.ndarray) or cache.ndim != 4:
        raise ValueError(f"{name} must be a paged cache (num_blocks, block_size, heads_kv, d), "
                         f"got shape {np.shape(cache)}")
    if cache.shape[1] == 0:
        raise ValueError(f"{name} must have block_size > 0, got shape {cache.shape}")
    return cache


def check_pages(
    q_shape: tuple[int, ...], k: Any, v: Any, block_table: Any, kv_lengths: Any
) -> tuple[Array, Array]:
    """Validate a paged call and return ``(block_table, kv_lengths)`` as integer arrays.

    q ``[batch, h, n_q, d_k]``; k ``[num_blocks, block_size, g, d_k]`` and v
    ``[num_blocks, block_size, g, d_v]`` share their pool shape; ``block_table`` int
    ``[batch, max_blocks]``; ``kv_lengths`` int ``[batch]`` in ``[0, max_blocks · block_size]``; the
    blocks a sequence uses (``ceil(kv_lengths[b] / block_size)`` of them) index the pool. Raises
    ``TypeError``/``ValueError`` naming the argument.
    """
    if len(q_shape) != 4:
        raise ValueError(f"a paged cache (block_table) needs q of shape (batch, heads, n_q, d_k), "
                         f"got {q_shape}")
    k, v = _check_pool("k", k), _check_pool("v", v)
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must share (num_blocks, block_size, heads_kv), got k {k.shape} "
                         f"and v {v.shape}")
    if k.shape[3] != q_shape[3]:
        raise ValueError(f"q and k must have the same width d_k, got q {q_shape} and k {k.shape}")
    batch, (num_blocks, block_size) = q_shape[0], k.shape[:2]
    table = _check_table(block_table, batch)
    if kv_lengths is None:
        raise ValueError("kv_lengths is required with block_table: it says how many keys each sequence holds")
    lengths = np.asarray(kv_lengths)
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"kv_lengths must be an integer array, got dtype {lengths.dtype}")
    if lengths.shape != (batch,):
        raise ValueError(f"kv_lengths must have shape (batch,) = ({batch},), got {lengths.shape}")
    capacity = table.shape[1] * block_size
    if np.any(lengths < 0) or np.any(lengths > capacity):
        raise ValueError(f"kv_lengths must lie in [0, max_blocks · block_size = {table.shape[1]} · "
                         f"{block_size} = {capacity}], got {lengths.tolist()}")
    for b, length in enumerate(lengths.tolist()):
        used = table[b, : -(-length // block_size)]  # ceil: the blocks that hold keys 0 … length − 1
        if np.any(used < 0) or np.any(used >= num_blocks):
            raise ValueError(f"block_table[{b}] lists blocks {used.tolist()} for its {length} keys; each "
                             f"must lie in [0, num_blocks = {num_blocks})")
    return table, lengths


def check_descale(name: str, descale: Any, shape: tuple[int, int]) -> Array:  # -> [batch, g]
    """A float8 cache's scales: real floats of ``shape`` = (batch, heads_kv), one per row and K/V head."""
    arr = np.asarray(descale)
    if arr.dtype.kind != "f":
        raise TypeError(f"{name} must be a float array (float32) of shape (batch, heads_kv), "
                        f"got dtype {arr.dtype}")
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape (batch, heads_kv) = {shape}, one per batch row and "
                         f"K/V head, got {arr.shape}")
    return arr


def check_float8(k: Any, v: Any, k_descale: Any, v_descale: Any) -> bool:
    """Whether k and v are a float8 cache: both ``float8_e4m3fn`` with both descales, or neither."""
    k8, v8 = is_float8(k), is_float8(v)
    if k8 != v8:
        raise TypeError(f"k and v must both be {FLOAT8} (a float8 cache) or neither, got k "
                        f"{np.asarray(k).dtype} and v {np.asarray(v).dtype}")
    for name, descale in (("k_descale", k_descale), ("v_descale", v_descale)):
        if k8 and descale is None:
            raise TypeError(f"k and v are {FLOAT8}: {name} is required "
                            "(they mean k.astype(float32) · k_descale)")
        if not k8 and descale is not None:
            raise TypeError(f"{name} is given, but k and v are {np.asarray(k).dtype} and "
                            f"{np.asarray(v).dtype}, not {FLOAT8}: a descale only applies to a float8 cache")
    return k8


def sequence(
    pool: Array, table_row: Array, length: int, descale: Array | None, dtype: np.dtype
) -> Array:  # [num_blocks, block_size, g, d], [max_blocks], [g] -> [g, length, d]
    """The keys (or values) of one sequence from a paged cache, in order and in ``dtype``.

    Position j is ``pool[table_row[j // block_size], j % block_size]``; nothing at or past
    ``length`` is read. A float8 pool is dequantized: ``x.astype(dtype) · descale[g]``.
    """
    j = np.arange(length)
    block_size = pool.shape[1]
    keys = pool[table_row[j // block_size], j % block_size].astype(dtype)  # [length, g, d]
    if descale is not None:
        keys *= descale.astype(dtype)[:, None]
    return np.swapaxes(keys, 0, 1)


def gather(
    pool: Array, table: Array, lengths: Array, descale: Array | None, dtype: np.dtype
) -> Array:  # [num_blocks, block_size, g, d], [batch, max_blocks], [batch], [batch, g] -> [batch, g, n_k, d]
    """Every sequence's keys as one contiguous array, n_k = the longest; the rest is zeros.

    The zeros past ``lengths[b]`` are placeholders that ``kv_lengths`` hides; they are written
    here, so nothing a sequence does not own is ever read.
    """
    n_k = int(lengths.max(initial=0))
    out = np.zeros((len(lengths), pool.shape[2], n_k, pool.shape[3]), dtype=dtype)
    for b, length in enumerate(lengths.tolist()):
        out[b, :, :length] = sequence(pool, table[b], length, None if descale is None else descale[b], dtype)
    return out


def read_cache(
    q: Array, k: Any, v: Any, *, block_table: Any, kv_lengths: Any, k_descale: Any, v_descale: Any,
    align: Align | None, work: np.dtype,
) -> tuple[Array, Any, Any, Any, Align | None]:
    """``(q, k, v, kv_lengths, align)`` for ordinary attention over what a cache means.

    Without a block table or a float8 cache this returns its inputs unchanged. A paged cache
    becomes contiguous ``[batch, g, n_k, d]`` keys and values with ``kv_lengths`` hiding each
    sequence's padding, and ``align`` None becomes ``"kv_lengths"`` (causal and window aligned per
    sequence; ``"bottom_right"`` is refused: padded to the longest sequence, ``n_k`` means nothing).
    A float8 cache is dequantized into ``work``, the compute dtype, and q joins it (so float16 q
    does not round the dequantized keys); the caller casts the output back to q's dtype.
    q must already be a validated float array (``impl.attention.check_qkv``'s first step).
    """
    float8 = check_float8(k, v, k_descale, v_descale)
    if block_table is None and not float8:
        return q, k, v, kv_lengths, align
    if q.ndim != 4:
        what = "a paged cache (block_table)" if block_table is not None else "a float8 cache (k_descale)"
        raise ValueError(f"{what} needs q of shape (batch, heads, n_q, d_k), got {q.shape}")
    dtype = work if float8 else np.asarray(k).dtype
    if block_table is None:  # contiguous float8 k [batch, g, n_k, d_k]: dequantize in place of the keys
        if k.ndim != 4 or v.ndim != 4:
            raise ValueError(f"a float8 cache needs k and v of shape (batch, heads_kv, n_k, d), "
                             f"got k {k.shape} and v {v.shape}")
        shape = (q.shape[0], k.shape[1])
        k_per_head = check_descale("k_descale", k_descale, shape).astype(work)[:, :, None, None]
        v_per_head = check_descale("v_descale", v_descale, shape).astype(work)[:, :, None, None]
        k, v = k.astype(work) * k_per_head, v.astype(work) * v_per_head
        return q.astype(work, copy=False), k, v, kv_lengths, align
    table, lengths = check_pages(q.shape, k, v, block_table, kv_lengths)
    if align == "bottom_right":
        raise ValueError("align='bottom_right' needs one n_k; a paged cache aligns per sequence: use "
                         "align='kv_lengths' (the default with block_table) or 'top_left'")
    shape = (q.shape[0], k.shape[2])
    k_scale = check_descale("k_descale", k_descale, shape) if float8 else None
    v_scale = check_descale("v_descale", v_descale, shape) if float8 else None
    k_pages, v_pages = gather(k, table, lengths, k_scale, dtype), gather(v, table, lengths, v_scale, dtype)
    return (q.astype(work, copy=False) if float8 else q), k_pages, v_pages, lengths, align or "kv_lengths"
