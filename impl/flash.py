"""Tiled attention with an online softmax (FlashAttention's algorithm, in NumPy), and its backward.

Keys and values are visited a tile at a time. Each query row i keeps three running values: a
reference shift ``m`` (the largest score seen so far, in the textbook form), the softmax
denominator ``l`` and the unnormalised output ``acc``, both relative to ``m``. A new tile of
scores ``s`` (and its values ``V_t``), exponentiated relative to its own shift ``c``, updates them
by the online-softmax law

    m'   = max(m, c)
    l'   = e^(m − m') · l   + e^(c − m') · Σ_j e^(s_j − c)
    acc' = e^(m − m') · acc + e^(c − m') · Σ_j e^(s_j − c) · V_t[j]

and after the last tile ``out = acc / l`` and ``lse = m + log l``. Softmax is invariant to any
per-row shift, so ``c`` need not be the tile's max: it only has to keep ``e^(s − c)`` from
overflowing or underflowing. The result is softmax(s)·V, yet the n_q × n_k pattern never exists:
memory is O(n · block) instead of O(n²) (Dao et al., 2022, "FlashAttention", Algorithm 1).

Speed in NumPy comes from doing as little per score as possible outside BLAS:

* tiles are large (hundreds of query rows by thousands of keys), so each matmul is a big sgemm
  and Python's per-tile overhead is negligible;
* tiles that a causal mask, a sliding window or a chunk hides entirely are never computed, and
  only the tiles that a bound crosses are masked, through a cached mask of the rectangle it reaches;
* per score outside BLAS there is one max and one exp, in place in a preallocated buffer: the
  shift is 0 (no pass) whenever every row max of the tile is small, and the row sums come from a
  matrix-vector product;
* row blocks are independent, so each core takes its own, in a thread running a single-threaded
  BLAS (through threadpoolctl): NumPy's ufuncs and BLAS release the GIL, so one thread's exp
  overlaps another's matmul, and no core is shared by two busy threads (``threads=`` caps the
  count, and ``threads=1`` keeps the whole call in the caller's thread).

What remains is BLAS time plus about one exp per visible score: ``python -m impl.bench``
measures it against PyTorch, JAX and the sgemm floor, and ``--profile`` shows it line by line
(docs/performance.md).

The backward (`flash_attention_backward`) is FlashAttention-2's: key blocks are shared
between cores, and each tile's weights are recomputed from the forward's ``lse``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict, Unpack, overload

import numpy as np

from cmdline.blas import one_thread_blas
from impl import cache
from impl.attention import (
    Array,
    _as_float_array,
    check_alibi_slopes,
    check_qkv,
    check_qv,
    check_scale,
    check_softcap,
    compute_dtype,
    kv_groups,
    latent_values,
    selection_shape,
)
from impl.grad import _check_d_out, _unbroadcast
from impl.keywords import CacheKeywords, CommonKeywords, LatentKeywords, WithLse, WithoutLse, given, takes
from impl.masks import _diagonal, check_chunk, check_selection_keywords, check_window
from impl.merge import merge_states_n

# Query rows × keys per tile. A 256 × 2048 float32 score tile is 2 MiB: big enough that each matmul
# runs near full sgemm speed and Python's per-tile cost vanishes, small enough to stay in cache.
DEFAULT_BLOCK = (256, 2048)

# Below this many scores (512², a few ms of work) a thread pool costs more than it saves.
_THREADED_MIN_SCORES = 1 << 18

# BLAS's thread count is process-wide: calls that lower and restore it take turns, or two of them
# interleaving would restore each other's lowered value and leave BLAS single-threaded.
_blas_turn = threading.Lock()


def _tile_shape(block: Any) -> tuple[int, int]:
    """``block`` as (query rows, keys): an int gives square tiles."""
    pair = (block, block) if not isinstance(block, (tuple, list)) else tuple(block)
    ok = len(pair) == 2 and all(
        isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b > 0 for b in pair
    )
    if not ok:
        raise ValueError(
            f"block must be a positive integer or a pair of them (query rows, keys), got {block!r}"
        )
    return int(pair[0]), int(pair[1])


@functools.lru_cache(maxsize=16)
def _diagonal_mask(rows: int, cols: int, offset: int, *, above: bool) -> Array:  # -> [rows, cols]
    """``j − i > offset`` (above) or ``j − i < offset`` (below), read-only: a regular tiling
    meets the same few diagonal rectangles again and again, so each is built once."""
    diagonal = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    mask = diagonal > offset if above else diagonal < offset
    mask.flags.writeable = False
    return mask


class Visibility:
    """Which keys each query sees: key j is visible to query i when ``i − left ≤ j ≤ i + right``.

    ``left``/``right`` are None for no limit. A sliding window ``(left, right)`` gives both; the
    causal mask caps ``right`` at 0 (keys j ≤ i); both bounds are top-left aligned and ANDed. Each
    bound moves by one key per query, so a block of rows sees one contiguous key range, and a tile
    crosses a bound only near the diagonals ``j − i = right`` and ``i − j = left``.

    ``offset`` moves the diagonal to key ``i + offset`` (a KV cache's ``kv_lengths[b] − n_q``): the
    bounds become ``right + offset`` and ``left − offset``, which may be negative.

    ``chunk`` = C (Llama 4's chunked attention) also hides key j from query i unless
    ``(i + offset) // C == j // C``: a block of rows sees the keys of the chunks its rows lie in, so
    the tiles of other chunks are skipped, and a tile inside one chunk needs no mask.
    """

    def __init__(self, *, causal: bool, window: tuple[int, int] | None, offset: int = 0,
                 chunk: int | None = None) -> None:
        left, right = window if window is not None else (None, None)
        if causal:
            right = 0 if right is None else min(right, 0)
        self.left = None if left is None else left - offset
        self.right = None if right is None else right + offset
        self.chunk, self.offset = chunk, offset

    def keys(self, q0: int, q1: int, n_k: int) -> tuple[int, int]:
        """The key range ``[k0, k1)`` that rows ``q0:q1`` see, clipped to ``[0, n_k]`` (may be empty)."""
        k0 = 0 if self.left is None else max(0, q0 - self.left)
        k1 = n_k if self.right is None else min(n_k, q1 + self.right)
        if self.chunk is not None:  # from the first row's chunk to the end of the last row's
            c = self.chunk
            k0 = max(k0, (q0 + self.offset) // c * c)
            k1 = min(k1, ((q1 - 1 + self.offset) // c + 1) * c)
        return k0, max(k0, k1)

    def queries(self, k0: int, k1: int, n_q: int) -> tuple[int, int]:
        """The query range ``[q0, q1)`` that sees any of keys ``k0:k1`` (the transpose of `keys`)."""
        q0 = 0 if self.right is None else max(0, k0 - self.right)
        q1 = n_q if self.left is None else min(n_q, k1 + self.left)
        if self.chunk is not None:  # the rows whose positions lie in the keys' chunks
            c = self.chunk
            q0 = max(q0, k0 // c * c - self.offset)
            q1 = min(q1, ((k1 - 1) // c + 1) * c - self.offset)
        return q0, max(q0, q1)

    def hide(self, s: Array, q0: int, k0: int) -> None:  # [rows, cols] score tile at (q0, k0), in place
        """Set the scores of the hidden (query, key) pairs of a tile to −∞.

        Each bound is applied to the one rectangle of the tile it reaches — the rows with a hidden
        key and the columns hidden from some row — through a cached mask of that rectangle.
        """
        rows, cols = s.shape
        q1, k1 = q0 + rows, k0 + cols
        if self.right is not None:  # hidden: j > i + right
            r1 = min(q1, k1 - 1 - self.right)  # rows from here on see the tile's every key
            c0 = max(k0, q0 + self.right + 1)  # columns before this are seen by every row
            if q0 < r1 and c0 < k1:
                past = _diagonal_mask(r1 - q0, k1 - c0, self.right + q0 - c0, above=True)
                np.copyto(s[: r1 - q0, c0 - k0 :], -np.inf, where=past)
        if self.left is not None:  # hidden: j < i − left
            r0 = max(q0, k0 + self.left + 1)  # rows before this see the tile's every key
            c1 = min(k1, q1 - 1 - self.left)  # columns from here on are seen by every row
            if r0 < q1 and k0 < c1:
                before = _diagonal_mask(q1 - r0, c1 - k0, r0 - k0 - self.left, above=False)
                np.copyto(s[r0 - q0 :, : c1 - k0], -np.inf, where=before)
        if self.chunk is not None and self._crosses_chunks(q0, q1, k0, k1):
            rows_in = (np.arange(q0, q1) + self.offset)[:, None] // self.chunk
            np.copyto(s, -np.inf, where=rows_in != np.arange(k0, k1)[None, :] // self.chunk)

    def _crosses_chunks(self, q0: int, q1: int, k0: int, k1: int) -> bool:
        """Whether the tile's rows and keys do not all lie in one chunk."""
        assert self.chunk is not None
        c = self.chunk
        first, last = (q0 + self.offset) // c, (q1 - 1 + self.offset) // c
        return not (first == last == k0 // c == (k1 - 1) // c)

    def sees(self, i: Array, j: Array) -> Array:  # query positions i, key positions j (broadcast) -> bool
        """Whether query i sees key j, pair by pair: the bounds and the chunk at any positions (the
        sparse path's gathered keys, which no tile's rectangle holds)."""
        seen = np.ones(np.broadcast_shapes(np.shape(i), np.shape(j)), dtype=bool)
        if self.right is not None:
            seen &= j <= i + self.right
        if self.left is not None:
            seen &= j >= i - self.left
        if self.chunk is not None:
            seen &= (i + self.offset) // self.chunk == j // self.chunk
        return seen

    def crosses(self, q0: int, q1: int, k0: int, k1: int) -> bool:
        """Whether the tile rows ``q0:q1`` × keys ``k0:k1`` holds any hidden pair."""
        over = self.right is not None and k1 - 1 > q0 + self.right
        under = self.left is not None and k0 < q1 - 1 - self.left
        chunks = self.chunk is not None and self._crosses_chunks(q0, q1, k0, k1)
        return over or under or chunks


class Alibi:
    """ALiBi for one call: ``−slope·|diag − j|`` added to each score, with ``diag = i + n_k − n_q``
    (FlashAttention's definition), one slope per head (``slopes`` broadcast to the leading dims)."""

    def __init__(self, slopes: Array, batch: tuple[int, ...], n_q: int, n_k: int) -> None:
        self.slopes = np.broadcast_to(slopes, batch)
        self.diagonal = _diagonal(n_q, n_k, "bottom_right")[0]  # [n_q, 1]: each query's diagonal key

    def add_at(self, s: Array, head: tuple[int, ...], q0: int, j: Array) -> None:  # s, j [rows, entries]
        """Add ALiBi's term to the scores of rows ``q0…`` against the keys at positions ``j``, in place."""
        distance = np.abs(self.diagonal[q0 : q0 + s.shape[0]] - j).astype(s.dtype)
        distance *= self.slopes[head]
        s -= distance

    def add(self, s: Array, head: tuple[int, ...], q0: int, k0: int) -> None:  # [rows, cols] at (q0, k0)
        """Add ALiBi's term to a score tile, in place."""
        rows, cols = s.shape
        distance = np.abs(self.diagonal[q0 : q0 + rows] - np.arange(k0, k0 + cols)).astype(s.dtype)
        distance *= self.slopes[head]
        s -= distance


def _tile_scores(
    s: Array, q_t: Array, k: Array, q0: int, k0: int, *, head: tuple[int, ...], softcap: float | None,
    alibi: Alibi | None, seen: Visibility, tanh: Array | None = None,
) -> None:  # s [rows, cols] <- the scores of queries q0.. × keys k0..; q_t [rows, d_k]; k [n_k, d_k]
    """One tile's final scores, in place: ``q_t·kᵀ`` (``q_t`` = q·scale, and /c under a softcap),
    ``c·tanh(·)``, ALiBi's term, −∞ where hidden. The forward and the backward both form their scores
    here, by the same steps in the same order, so the backward's are the forward's up to the order
    in which BLAS sums each dot product (it follows the tile's shape); `flash_attention_backward`
    gives no gradient to a row whose forward saw nothing, whatever its scores are here.
    ``tanh``, when given, keeps ``tanh(s/c)`` for the softcap's derivative."""
    rows, cols = s.shape
    np.matmul(q_t, k[k0 : k0 + cols].T, out=s)  # [rows, d_k] @ [d_k, cols]
    if softcap is not None:
        t = s if tanh is None else tanh
        np.tanh(s, out=t)
        np.multiply(t, s.dtype.type(softcap), out=s)
    if alibi is not None:
        alibi.add(s, head, q0, k0)
    if seen.crosses(q0, q0 + rows, k0, k0 + cols):
        seen.hide(s, q0, k0)


def _query_factor(scale: float, softcap: float | None, work: np.dtype) -> Any:
    """What q is multiplied by before ``q·kᵀ``: the scale, and 1/c under a softcap (c·tanh(s/c))."""
    return work.type(scale if softcap is None else scale / softcap)


# A row whose max lies within ±_SHIFT_FREE needs no shift before exp: its weights stay within
# [e^-20, e^20] of 1 at their maximum, far from float32's overflow (e^88) and underflow.
_SHIFT_FREE = 20.0


def _tile_shift(tile_max: Array, shift_free: bool) -> Array | None:  # [rows] -> [rows] or None
    """What to subtract from each row of a score tile before exp; None when nothing needs to be.

    Softmax is invariant to any per-row shift, so the max is only a guard against overflow (and
    against a row of very negative scores underflowing to 0). A row whose max is within
    ±_SHIFT_FREE, or −∞ (a row that sees nothing here, whose weights are 0 whatever the shift), is
    shifted by 0; the others by their max. When every row's shift is 0 the subtraction pass is
    skipped — subtracting 0 changes no bit, so each row's result depends on that row alone, as the
    causal law demands bit for bit. ``shift_free=False`` shifts every row by its max (0 for a row
    that sees nothing: −∞ − −∞ would be NaN).
    """
    unshifted = np.isneginf(tile_max)
    if shift_free:
        unshifted |= np.abs(tile_max) <= _SHIFT_FREE
        if unshifted.all():
            return None
    return np.where(unshifted, tile_max.dtype.type(0), tile_max)


def _row_block(
    q: Array, k: Array, v: Array, out: Array, lse: Array | None, q0: int, q1: int, *,
    head: tuple[int, ...], seen: Visibility, scale: float, softcap: float | None, alibi: Alibi | None,
    block_k: int, skip_hidden: bool, shift_free: bool, keys: tuple[int, int] | None = None,
) -> None:  # [n_q, d_k], [n_k, d_k], [n_k, d_v] -> writes out[q0:q1]: [q1 - q0, d_v], lse[q0:q1]
    """Attention for query rows ``q0:q1`` of one head, one key tile at a time (the law above);
    ``keys = (lo, hi)``: over keys lo..hi − 1 only (one split of `_split_rows`).

    Per tile, outside the two matmuls: one max and one exp over the scores (and a subtraction
    only when `_tile_shift` asks for one), in place; the row sums come from a matrix-vector
    product (BLAS, quicker than NumPy's sum along rows). ``m`` is each row's reference shift: the
    sums hold ``e^(s − m)``, and ``m`` is the row max whenever a shift was needed.
    """
    work = out.dtype
    n_k, d_v = v.shape
    rows = q1 - q0
    # Keys no row of the block sees are skipped (exact for finite values; see flash_attention).
    k_lo, k_hi = seen.keys(q0, q1, n_k) if skip_hidden else (0, n_k)
    if keys is not None:
        k_lo, k_hi = max(k_lo, keys[0]), min(k_hi, keys[1])
        if k_lo >= k_hi:  # no key of this split: the empty state, the merge's identity
            out[q0:q1] = 0
            if lse is not None:
                lse[q0:q1] = -np.inf
            return
    q_t = q[q0:q1] * _query_factor(scale, softcap, work)  # [rows, d_k]: the scale folded into q once
    m = np.full(rows, -np.inf, dtype=work)  # running reference shift
    l = np.zeros(rows, dtype=work)  # running softmax denominator
    acc = np.zeros((rows, d_v), dtype=work)  # running unnormalised output
    pv = np.empty((rows, d_v), dtype=work)
    scores = np.empty((rows, min(block_k, k_hi - k_lo)), dtype=work)
    ones = np.ones(scores.shape[1], dtype=work)
    # Overflow in an unshifted tile is caught below and that row redone: no warning for it here.
    with np.errstate(over="ignore", invalid="ignore") if shift_free else contextlib.nullcontext():
        for k0 in range(k_lo, k_hi, block_k):
            k1 = min(k0 + block_k, k_hi)
            s = scores[:, : k1 - k0]
            _tile_scores(s, q_t, k, q0, k0, head=head, softcap=softcap, alibi=alibi, seen=seen)
            shift = _tile_shift(np.maximum.reduce(s, axis=1), shift_free)
            if shift is not None:
                np.subtract(s, shift[:, None], out=s)
            np.exp(s, out=s)  # s is now e^(s − shift), the tile's unnormalised weights
            shift = np.zeros(rows, dtype=work) if shift is None else shift
            # Both the running sums and the tile's are re-expressed relative to m' = max(m, shift).
            m_new = np.maximum(m, shift)
            before, tile = np.exp(m - m_new), np.exp(shift - m_new)
            l *= before
            l += np.matmul(s, ones[: k1 - k0]) * tile
            acc *= before[:, None]
            np.matmul(s, v[k0:k1], out=pv)  # [rows, k1-k0] @ [k1-k0, d_v]
            pv *= tile[:, None]
            acc += pv
            m = m_new
    # l is exactly 0 only for rows that saw no key (or only −Inf scores); they get zeros, as in
    # impl.attention, and a logsumexp of −∞.
    empty = l == 0
    np.divide(acc, np.where(empty, work.type(1), l)[:, None], out=out[q0:q1])
    if lse is not None:
        with np.errstate(divide="ignore"):  # log(0) = −∞ is the logsumexp of nothing
            lse[q0:q1] = np.where(empty, -np.inf, m + np.log(l))
    if shift_free:
        # Unshifted weights reach e^20: with values near float32's max / n_k a row's sums can
        # overflow where shifted ones would not. Such a row (finite values, so nothing else made
        # it non-finite, or a NaN of its own) is computed again alone, shifted by its max.
        for i in np.flatnonzero(~(np.isfinite(l) & np.isfinite(acc).all(axis=1))).tolist():
            _row_block(q, k, v, out, lse, q0 + i, q0 + i + 1, head=head, seen=seen, scale=scale,
                       softcap=softcap, alibi=alibi, block_k=block_k, skip_hidden=skip_hidden,
                       shift_free=False, keys=keys)


def check_num_splits(num_splits: Any) -> int:
    """``num_splits``: an int ≥ 1 (a bool is refused), else ValueError naming it."""
    if isinstance(num_splits, (bool, np.bool_)) or not isinstance(num_splits, (int, np.integer)) \
            or num_splits < 1:
        raise ValueError(f"num_splits must be an integer >= 1, got {num_splits!r}")
    return int(num_splits)


def split_edges(n: int, num_splits: int) -> list[tuple[int, int]]:
    """The ranges of ``num_splits`` splits of n keys (of a sparse call, n list entries): contiguous,
    of near-equal sizes ⌊g·n / num_splits⌋ .. ⌊(g + 1)·n / num_splits⌋, covering every key once (a
    split is empty where there are more splits than keys), as a split-KV kernel cuts a row's keys.
    Each split is then tiled on its own, from its first key."""
    cuts = [g * n // num_splits for g in range(num_splits + 1)]
    return [(cuts[g], cuts[g + 1]) for g in range(num_splits)]


def _split_rows(
    q: Array, k: Array, v: Array, out: Array, lse: Array | None, q0: int, q1: int, *, num_splits: int,
    block_k: int, **rest: Any,
) -> None:  # as _row_block
    """`_row_block` for rows ``q0:q1``, its keys cut into ``num_splits`` splits (`split_edges`),
    each its own state (out, lse), merged by their logsumexps (`impl.merge.merge_states_n`: the
    split-KV combine); ``num_splits=1`` is `_row_block` itself."""
    if num_splits == 1:
        _row_block(q, k, v, out, lse, q0, q1, block_k=block_k, **rest)
        return
    rows, d_v = q1 - q0, v.shape[-1]
    outs = np.empty((num_splits, q1, d_v), dtype=out.dtype)  # rows q0:q1 of each are written
    lses = np.empty((num_splits, q1), dtype=out.dtype)
    for g, keys in enumerate(split_edges(k.shape[0], num_splits)):
        _row_block(q, k, v, outs[g], lses[g], q0, q1, block_k=block_k, keys=keys, **rest)
    merged, merged_lse = merge_states_n(outs[:, q0:q1], lses[:, q0:q1])
    out[q0:q1] = merged.reshape(rows, d_v)
    if lse is not None:
        lse[q0:q1] = merged_lse


def _cores() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _check_threads(threads: Any) -> int | None:
    """``threads`` as the flash functions take it: None (one per core) or an integer ≥ 1."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    return int(threads)


def _threads(n_jobs: int, n_scores: int, most: int | None) -> int:
    """Threads to run ``n_jobs`` on: for big calls, one per core (``most`` None) or at most ``most``."""
    threads = min(_cores() if most is None else most, n_jobs)
    if threads > 1 and n_scores >= _THREADED_MIN_SCORES:
        return threads
    return 1


def _in_parallel(run: Callable[[Any], None], items: Sequence[Any], threads: int) -> None:
    """``run(item)`` for every item, on ``threads`` threads, each with a one-thread BLAS.

    One thread per core, each with a one-thread BLAS: no core is oversubscribed (BLAS's own
    threads would be, and they wait on each other at every call), and one thread's exp overlaps
    another's matmul, since NumPy releases the GIL in both.
    """
    # BLAS on one thread on either path: a row's bits then never depend on how BLAS splits a product
    # among its own threads, which OpenBLAS picks by the product's size (Haswell's kernels round a
    # 300 x 300 x 128 product alone and in a batch of four differently): flash's batch invariance
    with _blas_turn, one_thread_blas():
        if threads == 1:
            for item in items:
                run(item)
            return
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, items))  # list() re-raises a worker's exception here


def _jobs(n_heads: int, n_q: int, block_q: int, causal: bool) -> Iterator[tuple[int, int, int]]:
    """(head, q0, q1) for every row block, costliest first so threads finish together."""
    starts = range(0, n_q, block_q)
    for q0 in reversed(starts) if causal else starts:
        for h in range(n_heads):
            yield h, q0, min(q0 + block_q, n_q)


def _prepare(q: Any, k: Any, v: Any, scale: Any) -> tuple[Array, Array, Array, tuple[int, ...], float]:
    """Validated q, k, v as broadcast views in the compute dtype (one 2-D slice per head), their
    leading shape and the scale. Copied only to widen float16/bfloat16."""
    q, k, v, batch = check_qkv(q, k, v)
    scale = check_scale(scale, q.shape[-1])
    work = compute_dtype(q.dtype)
    qs, ks, vs = (np.broadcast_to(x.astype(work, copy=False), (*batch, *x.shape[-2:])) for x in (q, k, v))
    return qs, ks, vs, batch, scale


def _chunk(attention_chunk: Any) -> int | None:
    return None if attention_chunk is None else check_chunk(attention_chunk)


def _alibi(alibi_slopes: Any, batch: tuple[int, ...], n_q: int, n_k: int, work: np.dtype) -> Alibi | None:
    slopes = check_alibi_slopes(alibi_slopes, batch, work)
    return None if slopes is None else Alibi(slopes, batch, n_q, n_k)


class Tiling(TypedDict, total=False):
    """How `flash_attention` tiles its work: ``block`` (query rows, keys), ``threads`` and
    ``num_splits`` (each row's keys cut into that many splits, merged by their LSEs)."""

    block: int | tuple[int, int]
    threads: int | None
    num_splits: int


class FlashKeywords(CommonKeywords, LatentKeywords, CacheKeywords, Tiling, total=False):
    """Every keyword of `flash_attention` but ``return_lse``."""


class _Out(FlashKeywords, WithoutLse): ...  # -> out


class _OutLse(FlashKeywords, WithLse): ...  # -> (out, lse)


@overload
def flash_attention(q: Any, k: Any, v: Any, **keywords: Unpack[_Out]) -> Array: ...
@overload
def flash_attention(q: Any, k: Any, v: Any, **keywords: Unpack[_OutLse]) -> tuple[Array, Array]: ...
@takes(FlashKeywords, block=DEFAULT_BLOCK, num_splits=1)
def flash_attention(
    q: Any, k: Any, v: Any, *, return_lse: bool = False, **keywords: Unpack[FlashKeywords],
) -> Array | tuple[Array, Array]:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v]
    """Attention computed tile by tile; equal to `impl.attention` up to float rounding.

    Args:
      q, k, v: as in `impl.attention`; leading dims broadcast.
      causal: query i sees keys j ≤ i (top-left aligned); tiles entirely above the diagonal are
        skipped. A query with no visible key gets zeros.
      scale: multiplies the scores; default ``1/√d_k``.
      block: tile shape (query rows, keys); an int gives square tiles. Memory beyond the inputs
        and output is about ``threads × block_q × block_k`` scores.
      window: ``(left, right)``, ints ≥ 0: query i sees keys ``i − left ≤ j ≤ i + right``
        (top-left aligned, ANDed with ``causal``); tiles entirely outside it are skipped.
      attention_chunk: C, an int > 0: query i sees key j only when ``i // C == j // C`` (top-left
        aligned, ANDed with ``causal`` and ``window``: Llama 4's chunked attention); the tiles of
        other chunks are skipped.
      softcap: ``c > 0``: the scaled scores ``s`` become ``c·tanh(s/c)`` before the masks.
      return_lse: return ``(out, lse)``, ``lse [..., n_q]`` the natural-log logsumexp of each
        row's final scores (−∞ for a row that sees nothing), in the compute dtype: float32 for
        float16, bfloat16 and float32 inputs, float64 for float64.
      alibi_slopes: float ``[h]`` (``[1]`` for 2-D inputs) or, for 4-D inputs, ``[batch, h]``:
        ``−slope·|i + n_k − n_q − j|`` added to each score after the softcap, before the masks, as
        in ``impl.attention``.
      block_table, kv_lengths: a paged KV cache, as in `impl.attention`: q
        ``[batch, h, n_q, d_k]``, k and v ``[num_blocks, block_size, g, d]``, key j of sequence b at
        ``k[block_table[b, j // block_size], j % block_size]`` for ``j < kv_lengths[b]``. ``causal``,
        ``window`` and ``attention_chunk`` are then aligned per sequence (diag = i + kv_lengths[b] − n_q, as
        FlashAttention's ``flash_attn_with_kvcache``); query head i reads K/V head ``i // (h // g)``.
        ``kv_lengths`` is taken only with a block table: contiguous keys have top-left masks here.
      k_descale, v_descale: float ``[batch, g]``: a paged cache in ``float8_e4m3fn`` meaning
        ``k.astype(float32) · k_descale[b, g]`` (only with ``block_table``). With a paged cache,
        ALiBi's distances are measured from each sequence's diagonal, i + kv_lengths[b] − n_q.
      topk_indices, topk_length: top-k sparse attention, the shapes and meaning of `impl.attention`'s,
        computed by gathering: each block of query rows gathers the keys and values its list names,
        ``min(block[1], SPARSE_ENTRIES)`` list entries at a time, with the online softmax, so memory is
        O(n_q · topk) (never n_q × n_k, nor a dense mask), and a key listed twice in a row counts
        TWICE (a gather, where `impl.attention`'s mask counts it once). ``causal``, ``window``,
        ``attention_chunk`` (top-left aligned), ``softcap``, ``alibi_slopes`` and ``scale`` apply at
        the gathered keys' positions; K/V may have g heads where q has h (query head i reads K/V
        head and list ``i // (h // g)``). Only keys some list names are read, so a NaN in a value no
        row lists reaches no row. Not with a paged cache (``block_table`` is refused).
      topk_blocks, topk_block_size: block-sparse selection, as in `impl.attention`, by the same
        gather over each listed block's keys; a block listed twice is gathered once. Not with
        ``topk_indices`` in the same call.
      qv: float ``[..., h, n_q, d_v]``, q's dtype: as in `impl.attention`, the score gains
        ``scale·qv·vᵀ``, computed as q' = [q, qv] against k' = [k, v] (a copy of the keys joined to
        the values); contiguous keys only. `flash_attention_backward` does not take it.
      d_v: with ``v=None``, MLA's shared latent: the values are ``k[..., :d_v]``.
      num_splits: an int ≥ 1: each row's keys are cut into this many contiguous near-equal splits (split-KV
        decoding's splits: FlashAttention's ``flash_attn_with_kvcache(num_splits=)``), each its own
        online softmax, the groups' states then merged by their logsumexps (`impl.merge`). Equal
        to one split up to rounding, not bit for bit. With top-k or block-sparse selection the
        splits cut each row's list entries (FlashMLA's sparse split-KV).
      threads: the most threads the row blocks run on; default (None) one per CPU this process may
        run on. ``1`` runs every block in the calling thread and leaves BLAS's own thread count
        as it is (``python -m impl.bench --profile`` runs so, under a one-thread BLAS, since a line
        profiler traces only the thread it runs in).

    Numerics follow `impl.attention`: float64 stays float64, narrower floats compute in
    float32 and are cast back; NaN and Inf propagate. No keys (n_k = 0) gives zeros.
    """
    keywords = given(flash_attention, keywords)
    splits = check_num_splits(keywords["num_splits"])
    v = latent_values(k, v, keywords["d_v"])
    if keywords["qv"] is not None:
        q, k, keywords["scale"] = _absorbed(q, k, v, keywords)
    if _sparse_given(keywords):
        return _sparse(q, k, v, keywords, return_lse=return_lse)
    if keywords["block_table"] is not None:
        return _paged(q, k, v, keywords, return_lse=return_lse)
    for name in ("kv_lengths", "k_descale", "v_descale"):
        if keywords.get(name) is not None:
            raise ValueError(f"flash_attention takes {name} only with a paged cache (block_table); "
                             "impl.attention takes it for contiguous keys")
    causal, window, softcap = bool(keywords["causal"]), keywords["window"], keywords["softcap"]
    qs, ks, vs, batch, scale = _prepare(q, k, v, keywords["scale"])
    block_q, block_k = _tile_shape(keywords["block"])
    seen = Visibility(causal=causal, window=None if window is None else check_window(window),
                      chunk=_chunk(keywords["attention_chunk"]))
    softcap = check_softcap(softcap)
    most = _check_threads(keywords["threads"])
    n_q, n_k, d_v = qs.shape[-2], ks.shape[-2], vs.shape[-1]
    work = qs.dtype
    alibi = _alibi(keywords["alibi_slopes"], batch, n_q, n_k, work)
    out = np.empty((*batch, n_q, d_v), dtype=work)
    lse = np.empty((*batch, n_q), dtype=work) if return_lse else None
    heads = list(np.ndindex(*batch))

    # Skipping the tiles outside the mask is exact for finite values. A NaN or Inf value behind
    # the mask still reaches every row in impl.attention (weight 0 · Inf = NaN); then compute those
    # tiles too, so the result never depends on the tiling.
    skip_hidden = _all_finite(vs)

    def run(job: tuple[int, int, int]) -> None:
        h, q0, q1 = job
        idx = heads[h]
        _split_rows(qs[idx], ks[idx], vs[idx], out[idx], None if lse is None else lse[idx], q0, q1,
                    head=idx, seen=seen, scale=scale, softcap=softcap, alibi=alibi, block_k=block_k,
                    skip_hidden=skip_hidden, shift_free=skip_hidden, num_splits=splits)

    jobs = list(_jobs(len(heads), n_q, block_q, causal))
    _in_parallel(run, jobs, _threads(len(jobs), len(heads) * n_q * n_k, most))
    result = out.astype(np.asarray(q).dtype, copy=False)
    return (result, lse) if lse is not None else result


def _absorbed(q: Any, k: Any, v: Any, keywords: FlashKeywords) -> tuple[Array, Array, float]:
    # q [..., n_q, d_k], k [..., n_k, d_k], v [..., n_k, d_v] -> q' [..., d_k + d_v], k' [..., d_k + d_v]
    """``qv`` (absorbed MLA): ``scale·(q·kᵀ + qv·vᵀ)`` is the score of q' = [q, qv] against
    k' = [k, v] at the same scale (the default still 1/√d_k of q's own width), so every path,
    dense or sparse, takes it as it is. Contiguous keys only."""
    for name in ("block_table", "k_descale", "v_descale"):
        if keywords[name] is not None:
            raise ValueError(f"qv: flash_attention takes it with contiguous keys only, not with {name}")
    q, k, v, _ = check_qkv(q, k, v, grouped=True)
    qv = check_qv(keywords["qv"], q, v.shape[-1])
    assert qv is not None
    return (np.concatenate([q, qv], axis=-1), np.concatenate([k, v], axis=-1),
            check_scale(keywords["scale"], q.shape[-1]))


def _paged(
    q: Any, k: Any, v: Any, keywords: FlashKeywords, *, return_lse: bool
) -> Array | tuple[Array, Array]:  # [b, h, n_q, d_k], pools [blocks, size, g, d] -> [b, h, n_q, d_v]
    """`flash_attention` over a paged (and perhaps float8) cache.

    Each sequence's keys and values are gathered once into contiguous ``[g, kv_lengths[b], d]``
    (dequantized for float8) by the same reader as `impl.attention`'s — a copy of the keys
    in use, O(n_k · d) per sequence, never the pattern — and then tiled as any other head, with
    the diagonal moved to ``i + kv_lengths[b] − n_q`` (ALiBi's distances too). Only the blocks a
    sequence owns are read.
    """
    q = _as_float_array("q", q)
    work = compute_dtype(q.dtype)
    k_descale, v_descale = keywords["k_descale"], keywords["v_descale"]
    table, lengths = cache.check_pages(q.shape, k, v, keywords["block_table"], keywords["kv_lengths"])
    float8 = cache.check_float8(k, v, k_descale, v_descale)
    if not float8 and not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    batch, heads, n_q, d_k = q.shape
    g, d_v = k.shape[2], v.shape[3]
    if g == 0 or heads % g:
        raise ValueError(f"q's heads (h = {heads}) must be a multiple of the cache's K/V heads (g = {g})")
    shape = (batch, g)
    k_scale = cache.check_descale("k_descale", k_descale, shape) if float8 else None
    v_scale = cache.check_descale("v_descale", v_descale, shape) if float8 else None
    scale = check_scale(keywords["scale"], d_k)
    block_q, block_k = _tile_shape(keywords["block"])
    causal, window = bool(keywords["causal"]), keywords["window"]
    window = None if window is None else check_window(window)
    chunk = _chunk(keywords["attention_chunk"])
    softcap = check_softcap(keywords["softcap"])
    most = _check_threads(keywords["threads"])
    qs = q.astype(work, copy=False)
    out = np.empty((batch, heads, n_q, d_v), dtype=work)
    lse = np.empty((batch, heads, n_q), dtype=work) if return_lse else None
    slopes = keywords["alibi_slopes"]
    keys, values, seen, alibi = [], [], [], []
    for b, length in enumerate(lengths.tolist()):  # [g, length, d_k], [g, length, d_v] in work
        keys.append(cache.sequence(k, table[b], length, None if k_scale is None else k_scale[b], work))
        values.append(cache.sequence(v, table[b], length, None if v_scale is None else v_scale[b], work))
        seen.append(Visibility(causal=causal, window=window, offset=length - n_q, chunk=chunk))
        alibi.append(_alibi(slopes, (batch, heads), n_q, length, work))  # its diagonal: length − n_q
    finite = [_all_finite(x) for x in values]  # as in flash_attention: skip only when exact

    def run(job: tuple[int, int, int, int]) -> None:
        b, h, q0, q1 = job
        kv = h // (heads // g)  # grouped-query attention: query head h reads K/V head h // (h/g)
        _split_rows(qs[b, h], keys[b][kv], values[b][kv], out[b, h], None if lse is None else lse[b, h],
                    q0, q1, head=(b, h), seen=seen[b], scale=scale, softcap=softcap, alibi=alibi[b],
                    block_k=block_k, skip_hidden=finite[b], shift_free=finite[b],
                    num_splits=keywords["num_splits"])

    jobs = [(b, h, q0, q1) for b in range(batch) for h, q0, q1 in _jobs(heads, n_q, block_q, causal)]
    _in_parallel(run, jobs, _threads(len(jobs), heads * n_q * int(lengths.sum()), most))
    result = out.astype(q.dtype, copy=False)
    return (result, lse) if lse is not None else result


# Backward tiles: key blocks are the jobs (each owns its rows of dk and dv), query tiles the inner
# loop. Key blocks of 256 give a causal call enough jobs to share between cores evenly; tall
# query tiles keep each matmul large.
DEFAULT_BACKWARD_BLOCK = (1024, 256)


def _carve(memory: Array, *shapes: tuple[int, ...]) -> list[Array]:
    """C-contiguous arrays of ``shapes``, one after another in the flat buffer ``memory``."""
    arrays, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        arrays.append(memory[start : start + size].reshape(shape))
        start += size
    return arrays


def _carved_size(*shapes: tuple[int, ...]) -> int:
    return sum(int(np.prod(shape)) for shape in shapes)


def _zeroed(shape: tuple[int, ...], dtype: np.dtype) -> Array:
    """Zeros whose pages are touched now (np.zeros may leave fresh pages for the first write)."""
    x = np.empty(shape, dtype=dtype)
    x.fill(0)
    return x


class _Workspace:
    """One worker's tiles for `_key_block` (flat buffers, in the order of `shapes`).

    ``take`` hands out a C-contiguous view of the first ``rows × cols`` entries of a tile, so
    every matmul writes into a BLAS-ready array whatever the tile's shape.
    """

    def __init__(self, buffers: Sequence[Array]) -> None:
        # p: P; dp: dP, then dS; tanh: tanh(s/c), then 1 − tanh² (empty without a softcap);
        # k_grad: k·scale; k_one, v_one: [k, 1], [v, 1]; dk, dv, dq: one tile's products
        (self.p, self.dp, self.tanh, self.k_grad, self.k_one, self.v_one, self.dk, self.dv,
         self.dq) = buffers

    @staticmethod
    def shapes(rows: int, cols: int, d_k: int, d_v: int, *, softcap: bool) -> list[tuple[int, ...]]:
        return [(rows * cols,), (rows * cols,), (rows * cols if softcap else 0,), (cols * d_k,),
                (cols * (d_k + 1),), (cols * (d_v + 1),), (cols * d_k,), (cols * d_v,), (rows * d_k,)]

    @staticmethod
    def take(buffer: Array, rows: int, cols: int) -> Array:  # -> [rows, cols], C-contiguous
        return buffer[: rows * cols].reshape(rows, cols)


def _all_finite(x: Array) -> bool:
    """Whether every entry of ``x`` is finite, without an array of flags: a sum is finite only if
    every term is (an Inf or a NaN makes it Inf or NaN); a sum that overflowed falls back on the
    entries themselves."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.sum(x)
    return bool(np.isfinite(total)) or bool(np.isfinite(x).all())


def _key_block(
    q_s: Array, q: Array, lse: Array, k: Array, v: Array, do_d: Array, dq: Array, dk: Array, dv: Array,
    k0: int, k1: int, *, head: tuple[int, ...], seen: Visibility, scale: float, softcap: float | None,
    alibi: Alibi | None, block_q: int, skip_hidden: bool, dead: Array, space: _Workspace,
) -> None:  # one head: q_s, q, dq [n_q, d_k]; lse [n_q, 1]; k, dk [n_k, d_k]; v, dv [n_k, d_v];
    # do_d [n_q, d_v + 1]; dead [n_q]: the rows that saw nothing in the forward
    """Gradients from keys ``k0:k1`` of one head: writes ``dk[k0:k1]``, ``dv[k0:k1]``, adds into ``dq``.

    For each query tile the scores are formed again as the forward formed them (``_tile_scores``,
    from ``q_s`` = q·scale, or q·scale/c under a softcap) and the weights recomputed from the
    forward's logsumexp, ``P = e^(S − lse)``, so the pattern is never stored (FlashAttention-2,
    Algorithm 2). Without a softcap or ALiBi, ``q_s`` arrives as ``[q·scale, −lse]`` and ``S − lse``
    is one matmul against ``[k, 1]``: the forward's products, and ``−lse`` as one more term.

        dV += Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − D),   dQ += dS K·scale,   dK += dSᵀ Q·scale

    with ``D = rowsum(dO ∘ O)``; under a softcap ``dS`` also takes the factor ``1 − tanh²``.
    ``do_d = [dO, −D]`` carries the subtraction of D into the matmul against ``[v, 1]``. Every
    tile lives in ``space`` (`_Workspace`), the worker's buffers.
    """
    work = dq.dtype
    n_q, d_k = dq.shape
    d_v = dv.shape[-1]
    do = do_d[:, :-1]  # view: [n_q, d_v]
    q_lo, q_hi = seen.queries(k0, k1, n_q) if skip_hidden else (0, n_q)
    cols = k1 - k0
    take = space.take
    k_grad = np.multiply(k[k0:k1], work.type(scale), out=take(space.k_grad, cols, d_k))  # ∂S/∂q = scale·k
    k_one = None
    if q_s.shape[-1] == d_k + 1:  # [k, 1]: [cols, d_k + 1]
        k_one = take(space.k_one, cols, d_k + 1)
        k_one[:, :-1], k_one[:, -1] = k[k0:k1], 1
    v_one = take(space.v_one, cols, d_v + 1)  # [v, 1]: [cols, d_v + 1]
    v_one[:, :-1], v_one[:, -1] = v[k0:k1], 1
    dk_b, dv_b = dk[k0:k1], dv[k0:k1]  # [cols, d_k], [cols, d_v]: this job's rows, zero on entry
    dk_t, dv_t = take(space.dk, cols, d_k), take(space.dv, cols, d_v)
    for q0 in range(q_lo, q_hi, block_q):
        q1 = min(q0 + block_q, q_hi)
        rows = q1 - q0
        p, dp = take(space.p, rows, cols), take(space.dp, rows, cols)
        t = take(space.tanh, rows, cols) if softcap is not None else None
        if k_one is not None:  # S − lse: [rows, d_k + 1] @ [d_k + 1, cols], then the masks
            np.matmul(q_s[q0:q1], k_one.T, out=p)
            if seen.crosses(q0, q1, k0, k1):
                seen.hide(p, q0, k0)
        else:
            _tile_scores(p, q_s[q0:q1], k, q0, k0, head=head, softcap=softcap, alibi=alibi, seen=seen,
                         tanh=t)
            np.subtract(p, lse[q0:q1], out=p)  # S − lse
        np.exp(p, out=p)  # P = e^(S − lse)
        gone = dead[q0:q1]
        if gone.any():  # rows that saw nothing in the forward: no gradient (flash_attention_backward)
            p[gone] = 0
        dv_b += np.matmul(p.T, do[q0:q1], out=dv_t)  # [cols, rows] @ [rows, d_v]
        np.matmul(do_d[q0:q1], v_one.T, out=dp)  # dP − D: [rows, d_v + 1] @ [d_v + 1, cols]
        np.multiply(dp, p, out=dp)  # dS = P ∘ (dP − D)
        if t is not None:
            np.multiply(t, t, out=t)
            np.subtract(work.type(1), t, out=t)
            np.multiply(dp, t, out=dp)  # through c·tanh(u/c): the factor 1 − tanh²
        dq[q0:q1] += np.matmul(dp, k_grad, out=take(space.dq, rows, d_k))  # [rows, cols] @ [cols, d_k]
        dk_b += np.matmul(dp.T, q[q0:q1], out=dk_t)  # [cols, rows] @ [rows, d_k]
    dk_b *= work.type(scale)


def _shares(costs: Sequence[int], n: int) -> list[list[int]]:
    """Indices of ``costs`` dealt to ``n`` workers, costliest first to the least loaded (LPT).

    Deterministic, so each worker's sum of dq, and the final sum over workers, always adds in the
    same order: two identical calls give identical bits.
    """
    shares: list[list[int]] = [[] for _ in range(n)]
    loads = [0] * n
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        w = loads.index(min(loads))
        shares[w].append(i)
        loads[w] += costs[i]
    return shares


def _check_lse(lse: Any, dtype: np.dtype, shape: tuple[int, ...]) -> Array:
    """``lse`` as ``flash_attention(..., return_lse=True)`` returns it: ``[..., n_q]``, compute dtype."""
    if isinstance(lse, (bool, int, float, complex)) or lse is None:
        raise TypeError(f"lse must be an array of shape {shape}, got {type(lse).__name__}")
    lse = np.asarray(lse)
    if lse.dtype != dtype:
        raise TypeError(
            f"lse must have the dtype flash_attention returns it in ({dtype}), got {lse.dtype}"
        )
    if lse.shape != shape:
        raise ValueError(f"lse must have shape (..., n_q) = {shape}, got {lse.shape}")
    return lse


def flash_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    d_out: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int, int] | None = None,
    attention_chunk: int | None = None,
    softcap: float | None = None,
    block: int | tuple[int, int] = DEFAULT_BACKWARD_BLOCK,
    alibi_slopes: Any = None,
    threads: int | None = None,
    topk_indices: Any = None,
    topk_length: Any = None,
    topk_blocks: Any = None,
    topk_block_size: int | None = None,
    d_v: int | None = None,
) -> tuple[Array, Array, Array | None]:  # q, k, v, out [..., n_q, d_v], lse [..., n_q], d_out [..., n_q, d_v]
    """Gradients ``(dq, dk, dv)`` of `flash_attention`, tile by tile (FlashAttention-2).

    Args:
      q, k, v, causal, scale, window, attention_chunk, softcap, alibi_slopes: as given to the
        forward call.
      d_v: with ``v=None`` (MLA's shared latent, ``v = k[..., :d_v]``): returns ``(dq, dk, None)``,
        dk the latent's gradient with the values' gradient added into its first d_v columns.
      topk_indices, topk_length, topk_blocks, topk_block_size: as given to the forward: the sparse
        path's backward, tile by tile over rows and list entries, its dk and dv ACCUMULATED
        (scatter-added) over every query and every entry that gathered a key, grouped heads
        summed into their K/V head (``threads`` is not read: it runs in the calling thread).
      out, lse: what ``flash_attention(q, k, v, ..., return_lse=True)`` returned.
      d_out: ``∂loss/∂out``, the shape of ``out`` and the dtype of q.
      block: tile shape (query rows, keys). Key blocks are shared between cores; each tile's
        weights are recomputed from ``lse``, so memory is the gradients plus a few tiles per core
        (and one more dq per extra core), never the n_q × n_k pattern.
      threads: the most threads the key blocks are shared between; default (None) one per CPU
        this process may run on; ``1`` runs them all in the calling thread, as in `flash_attention`.
        Each thread adds into its own dq, so a different count sums dq in another order (within
        rounding, not bit for bit).

    Returns:
      ``dq``, ``dk``, ``dv``, each in the shape and dtype of its input (summed over the leading
      dims it was broadcast along), equal to `impl.attention_backward` up to float rounding.

    The scores are formed again as the forward formed them, ``(q·scale)·kᵀ`` then the cap, ALiBi
    and the masks, and only then is ``lse`` subtracted. A row whose lse is −∞ (it saw nothing, or
    every score of it overflowed to −∞) gets no gradient, even where a tiling other than the
    forward's sums a score in another order and so to a finite value, or +∞.
    """
    if v is None:  # MLA's shared latent: v = k[..., :d_v], whose gradient folds into the latent's
        dq, dk, dv = flash_attention_backward(
            q, k, latent_values(k, v, d_v), out, lse, d_out, causal=causal, scale=scale, window=window,
            attention_chunk=attention_chunk, softcap=softcap, block=block, alibi_slopes=alibi_slopes,
            threads=threads, topk_indices=topk_indices, topk_length=topk_length, topk_blocks=topk_blocks,
            topk_block_size=topk_block_size)
        assert dv is not None
        dk = dk.copy()
        dk[..., : dv.shape[-1]] += dv
        return dq, dk, None
    latent_values(k, v, d_v)  # refuses d_v beside v
    sparse = {"topk_indices": topk_indices, "topk_length": topk_length, "topk_blocks": topk_blocks,
              "topk_block_size": topk_block_size}
    if _sparse_given(sparse):
        return _sparse_backward(q, k, v, out, lse, d_out, {
            **sparse, "causal": causal, "scale": scale, "window": window, "attention_chunk": attention_chunk,
            "softcap": softcap, "block": block, "alibi_slopes": alibi_slopes})
    qs, ks, vs, batch, scale = _prepare(q, k, v, scale)
    block_q, block_k = _tile_shape(block)
    seen = Visibility(causal=bool(causal), window=None if window is None else check_window(window),
                      chunk=_chunk(attention_chunk))
    softcap = check_softcap(softcap)
    most = _check_threads(threads)
    n_q, n_k = qs.shape[-2], ks.shape[-2]
    d_k, d_v = qs.shape[-1], vs.shape[-1]
    dtype, work = np.asarray(q).dtype, qs.dtype
    out_ = _check_d_out(out, dtype, (*batch, n_q, d_v), name="out").astype(work, copy=False)
    do = _check_d_out(d_out, dtype, (*batch, n_q, d_v)).astype(work, copy=False)
    lse_ = _check_lse(lse, work, (*batch, n_q))
    alibi = _alibi(alibi_slopes, batch, n_q, n_k, work)
    d_row = np.einsum("...ij,...ij->...i", do, out_)  # D = rowsum(dO ∘ O): [..., n_q]
    # A row with lse = −∞ saw nothing in the forward and gets no gradient, whatever its scores are
    # here: they equal the forward's in value, not always in bits (BLAS sums a dot product in an
    # order that depends on the tile's shape, so a score that overflowed to −∞ there may be finite,
    # or +∞, here). _key_block zeroes those rows of P; +∞ for their lse keeps e^(S − lse) from
    # overflowing first (−∞ itself would give −∞ − −∞ = NaN).
    dead = np.isneginf(lse_)  # [..., n_q]
    lse_ = np.where(dead, work.type(np.inf), lse_)[..., None]  # [..., n_q, 1]
    factor = _query_factor(scale, softcap, work)  # as the forward scales q
    fold = softcap is None and alibi is None  # [q·scale, −lse]: S − lse in one matmul (_key_block)
    # As in the forward: tiles outside the mask are skipped only when that is exact; with a NaN
    # or Inf among the inputs, the hidden pairs' 0 · Inf terms must reach the gradients too.
    skip_hidden = all(_all_finite(x) for x in (qs, ks, vs, do))

    heads = list(np.ndindex(*batch))
    jobs = [(h, k0, min(k0 + block_k, n_k)) for h in range(len(heads)) for k0 in range(0, n_k, block_k)]

    def cost(k0: int, k1: int) -> int:  # the scores a key block's job computes
        q0, q1 = seen.queries(k0, k1, n_q)
        return (q1 - q0) * (k1 - k0)

    costs = [cost(k0, k1) for _, k0, k1 in jobs]
    threads = _threads(len(jobs), len(heads) * n_q * n_k, most)
    shares = _shares(costs, threads)
    # Every buffer the workers write is made and first touched (zeroed) here, before they start:
    # a page that first faults in while another thread of the process runs costs far more than
    # one faulted here (the measurement, with its command: docs/performance.md, "Measurements
    # behind the code"). After the gradients: q·scale and dO with their extra columns, a dq per
    # extra worker (key blocks never share rows of dk and dv, so those need no copies), each
    # worker's tiles.
    tiles = _Workspace.shapes(min(block_q, n_q), min(block_k, n_k), d_k, d_v, softcap=softcap is not None)
    shapes = [(*batch, n_q, d_k), (*batch, n_k, d_k), (*batch, n_k, d_v),
              (*batch, n_q, d_k + 1 if fold else d_k), (*batch, n_q, d_v + 1),
              *[(*batch, n_q, d_k)] * (len(shares) - 1), *tiles * len(shares)]
    dq, dk, dv = (_zeroed(shape, work) for shape in shapes[:3])
    q_s, do_d, *rest = _carve(np.empty(_carved_size(*shapes[3:]), dtype=work), *shapes[3:])
    for x in rest:  # q_s and do_d are written whole below
        x.fill(0)
    dqs = [dq, *rest[: len(shares) - 1]]  # each worker adds into its own dq, the first into the result
    tile_memory = rest[len(shares) - 1 :]
    spaces = [_Workspace(tile_memory[w * len(tiles) : (w + 1) * len(tiles)]) for w in range(len(shares))]
    np.multiply(qs, factor, out=q_s[..., :d_k])  # [..., n_q, d_k (+ 1)]
    if fold:
        q_s[..., -1] = -lse_[..., 0]
    do_d[..., :-1], do_d[..., -1] = do, -d_row  # [dO, −D]: [..., n_q, d_v + 1]

    def run(worker: int) -> None:
        for i in shares[worker]:
            h, k0, k1 = jobs[i]
            idx = heads[h]
            _key_block(q_s[idx], qs[idx], lse_[idx], ks[idx], vs[idx], do_d[idx], dqs[worker][idx], dk[idx],
                       dv[idx], k0, k1, head=idx, seen=seen, scale=scale, softcap=softcap, alibi=alibi,
                       block_q=block_q, skip_hidden=skip_hidden, dead=dead[idx], space=spaces[worker])

    _in_parallel(run, range(len(shares)), threads)
    for extra in dqs[1:]:
        dq += extra
    return tuple(  # type: ignore[return-value]
        _unbroadcast(g, np.shape(x)).astype(dtype, copy=False) for g, x in ((dq, q), (dk, k), (dv, v))
    )


# --- the sparse path: a top-k list's keys gathered a block of entries at a time ---------------------

# List entries per gathered tile: a tile holds rows × entries × d of keys (and as many of values),
# so it is kept far narrower than a dense tile of keys: 256 rows × 16 entries × 128 floats is 2 MiB.
SPARSE_ENTRIES = 16


def _sparse_given(keywords: Any) -> bool:
    return any(keywords.get(name) is not None
               for name in ("topk_indices", "topk_length", "topk_blocks", "topk_block_size"))


def _distinct(blocks: Array, n_blocks: int) -> Array:  # [..., entries] int -> same, sorted, a repeat as −1
    """A row's listed blocks, each once: the valid ones (in [0, n_blocks)) sorted first, every
    invalid one after them as −1 whatever its value (so the order the valid blocks are read in, and
    with it every rounding, never depends on an invalid entry), every repeat made −1."""
    ordered = np.sort(np.where((blocks >= 0) & (blocks < n_blocks), blocks, n_blocks), axis=-1)
    ordered = np.where(ordered == n_blocks, -1, ordered)
    repeat = np.zeros(ordered.shape, dtype=bool)
    repeat[..., 1:] = ordered[..., 1:] == ordered[..., :-1]
    return np.where(repeat, -1, ordered)


def listed_keys(keywords: Any, shape: tuple[int, ...], n_k: int) -> Array:
    # -> [*shape, entries] int64: a key position, or n_k where the entry lists no key
    """The keys each list entry gathers, ``n_k`` (a zero row past the last key) for an entry that
    lists none: ``topk_indices`` read up to ``topk_length``, each entry out of ``[0, n_k)`` made
    n_k; or the keys of each listed block of ``topk_blocks``, a block listed twice read once (so
    the gather counts it once, as the mask does). Memory O(n_q · entries), never n_q × n_k."""
    indices, length, blocks, size = check_selection_keywords(keywords, shape)
    if indices is not None and blocks is not None:
        raise ValueError("flash_attention takes topk_indices or topk_blocks, not both "
                         "(impl.attention takes both, ANDed)")
    if blocks is not None and size is not None:
        n_blocks = -(-n_k // size)
        first = _distinct(blocks.astype(np.int64), n_blocks)
        first = np.where((first >= 0) & (first < n_blocks), first * size, -n_k - size)
        indices = (first[..., :, None] + np.arange(size)).reshape(*shape, -1)  # each block's keys
    assert indices is not None
    keys = indices.astype(np.int64)
    listed = (keys >= 0) & (keys < n_k)
    if length is not None:
        per_head = np.expand_dims(length, -2) if len(shape) > 2 else length
        listed &= np.arange(keys.shape[-1]) < per_head[..., None]
    return np.where(listed, keys, n_k)


def _gathered_scores(
    q_t: Array, k: Array, j: Array, q0: int, *, head: tuple[int, ...], softcap: float | None,
    alibi: Alibi | None, seen: Visibility, n_k: int, tanh: bool = False,
) -> tuple[Array, Array, Array | None]:
    # q_t [rows, d_k] (q·scale, /c under a softcap), k [n_k + 1, d_k], j [rows, entries]
    # -> scores [rows, entries], the keys gathered [rows, entries, d_k], tanh(s/c) or None
    """The final scores of rows ``q0…`` against their listed keys ``j``: ``q_t·k_j``, the softcap,
    ALiBi's term at the keys' positions, −∞ for an entry that lists no key or a key a restriction
    hides (causal, window, chunk, evaluated at the gathered positions). The forward and the
    backward both form their scores here."""
    keys = np.take(k, j, axis=0)  # [rows, entries, d_k]: the gather
    s = np.matmul(keys, q_t[:, :, None])[..., 0]  # [rows, entries, d_k] @ [rows, d_k, 1]
    t = None
    if softcap is not None:
        np.tanh(s, out=s)
        t = s.copy() if tanh else None
        s *= s.dtype.type(softcap)
    if alibi is not None:
        alibi.add_at(s, head, q0, j)
    i = np.arange(q0, q0 + j.shape[0])[:, None]
    s[(j == n_k) | ~seen.sees(i, j)] = -np.inf
    return s, keys, t


def _sparse_rows(
    q: Array, k: Array, v: Array, j_all: Array, out: Array, lse: Array | None, q0: int, q1: int, *,
    head: tuple[int, ...], seen: Visibility, scale: float, softcap: float | None, alibi: Alibi | None,
    entries: int,
) -> None:  # q [n_q, d_k], k [n_k + 1, d_k], v [n_k + 1, d_v], j_all [n_q, topk] -> out[q0:q1], lse[q0:q1]
    """Sparse attention for rows ``q0:q1`` of one head: the online softmax of the module's law over
    the listed keys, ``entries`` list entries at a time. An entry counts each time it is listed."""
    work = out.dtype
    rows, n_k = q1 - q0, k.shape[0] - 1
    q_t = q[q0:q1] * _query_factor(scale, softcap, work)
    m = np.full(rows, -np.inf, dtype=work)
    l = np.zeros(rows, dtype=work)
    acc = np.zeros((rows, v.shape[-1]), dtype=work)
    for t0 in range(0, j_all.shape[-1], entries):
        j = j_all[q0:q1, t0 : t0 + entries]
        s, _, _ = _gathered_scores(q_t, k, j, q0, head=head, softcap=softcap, alibi=alibi, seen=seen, n_k=n_k)
        shift = _tile_shift(np.maximum.reduce(s, axis=1), shift_free=False)
        assert shift is not None
        np.exp(s - shift[:, None], out=s)
        m_new = np.maximum(m, shift)
        before, tile = np.exp(m - m_new), np.exp(shift - m_new)
        l = l * before + s.sum(axis=1) * tile
        values = np.take(v, j, axis=0)  # [rows, entries, d_v]
        pv = np.matmul(s[:, None, :], values)[:, 0]  # [rows, 1, entries] @ [rows, entries, d_v]
        acc = acc * before[:, None] + pv * tile[:, None]
        m = m_new
    empty = l == 0  # no listed key seen: zeros and a logsumexp of −∞, as impl.attention
    np.divide(acc, np.where(empty, work.type(1), l)[:, None], out=out[q0:q1])
    if lse is not None:
        with np.errstate(divide="ignore"):
            lse[q0:q1] = np.where(empty, -np.inf, m + np.log(l))


class _Sparse:
    """One sparse call's inputs, validated: per head (an index of the leading dims) its queries, its
    K/V head's keys and values with a zero row appended (where an unlisted entry points), and its
    list of keys."""

    def __init__(self, q: Any, k: Any, v: Any, keywords: Any) -> None:
        for name in ("block_table", "kv_lengths", "k_descale", "v_descale"):
            if keywords.get(name) is not None:
                raise ValueError(f"{name}: flash_attention's top-k path takes contiguous keys, "
                                 "not a paged (or float8) cache")
        q, k, v, batch = check_qkv(q, k, v, grouped=True)
        self.batch, self.dtype = batch, q.dtype
        work = compute_dtype(q.dtype)
        self.n_q, self.n_k = q.shape[-2], k.shape[-2]
        self.scale = check_scale(keywords["scale"], q.shape[-1])
        shape = selection_shape(q.shape, k.shape, v.shape, batch)
        self.listed = listed_keys(keywords, shape, self.n_k)  # [*shape, entries]
        g = kv_groups(q.shape, k.shape, v.shape)
        kv_batch = batch if g is None else (*batch[:-1], g)
        self.q = np.broadcast_to(q.astype(work, copy=False), (*batch, *q.shape[-2:]))

        def padded(x: Array) -> Array:  # [..., n_k, d] -> [*kv_batch, n_k + 1, d], the last row zeros
            full = np.broadcast_to(x, (*kv_batch, *x.shape[-2:]))
            return np.concatenate([full, np.zeros((*kv_batch, 1, x.shape[-1]), dtype=x.dtype)], axis=-2
                                  ).astype(work, copy=False)

        self.k, self.v = padded(k), padded(v)
        self.heads = list(np.ndindex(*batch))
        self.grouped = g is not None

    def of(self, idx: tuple[int, ...]) -> tuple[Array, Array, Array, Array]:
        """Head ``idx``'s queries, K/V head (query head i reads ``i // (h // g)``) and list."""
        if not idx:
            return self.q, self.k, self.v, self.listed
        h = self.batch[-1]
        per_list = h // self.listed.shape[-3] if self.listed.shape[-3] else 1
        listed = self.listed[(*idx[:-1], idx[-1] // per_list)]
        kv = (*idx[:-1], idx[-1] // (h // self.k.shape[-3])) if self.grouped else idx
        return self.q[idx], self.k[kv], self.v[kv], listed


def _sparse(q: Any, k: Any, v: Any, keywords: Any, *, return_lse: bool) -> Array | tuple[Array, Array]:
    """`flash_attention` with a top-k list: each row gathers its listed keys, a block of list entries
    at a time, with the online softmax; memory O(n_q · topk), never n_q × n_k nor a dense mask."""
    call = _Sparse(q, k, v, keywords)
    splits = check_num_splits(keywords["num_splits"])
    seen = Visibility(causal=bool(keywords["causal"]), window=None if keywords["window"] is None
                      else check_window(keywords["window"]), chunk=_chunk(keywords["attention_chunk"]))
    softcap = check_softcap(keywords["softcap"])
    block_q, block_k = _tile_shape(keywords["block"])
    most = _check_threads(keywords["threads"])
    work = call.q.dtype
    alibi = _alibi(keywords["alibi_slopes"], call.batch, call.n_q, call.n_k, work)
    out = np.empty((*call.batch, call.n_q, call.v.shape[-1]), dtype=work)
    lse = np.empty((*call.batch, call.n_q), dtype=work) if return_lse else None

    def run(job: tuple[int, int, int]) -> None:
        h, q0, q1 = job
        idx = call.heads[h]
        qh, kh, vh, listed = call.of(idx)
        entries = min(block_k, SPARSE_ENTRIES)
        rest: dict[str, Any] = dict(head=idx, seen=seen, scale=call.scale, softcap=softcap, alibi=alibi,
                                    entries=entries)
        if splits == 1:
            _sparse_rows(qh, kh, vh, listed, out[idx], None if lse is None else lse[idx], q0, q1, **rest)
            return
        outs = np.empty((splits, q1, out.shape[-1]), dtype=work)  # rows q0:q1 of each are written
        lses = np.empty((splits, q1), dtype=work)
        for g, (a, b) in enumerate(split_edges(listed.shape[-1], splits)):  # a split of entries
            _sparse_rows(qh, kh, vh, listed[:, a:b], outs[g], lses[g], q0, q1, **rest)
        merged, merged_lse = merge_states_n(outs[:, q0:q1], lses[:, q0:q1])
        out[idx][q0:q1] = merged
        if lse is not None:
            lse[idx][q0:q1] = merged_lse

    jobs = list(_jobs(len(call.heads), call.n_q, block_q, False))
    # Each gathered score also gathers a key of d_k: as much work as d_k dense scores.
    work_size = len(call.heads) * call.n_q * call.listed.shape[-1] * call.q.shape[-1]
    _in_parallel(run, jobs, _threads(len(jobs), work_size, most))
    result = out.astype(call.dtype, copy=False)
    return (result, lse) if lse is not None else result


def _sparse_backward(
    q: Any, k: Any, v: Any, out: Any, lse: Any, d_out: Any, keywords: Any,
) -> tuple[Array, Array, Array]:
    """`flash_attention_backward` of the sparse path: per tile of rows and list entries, the scores
    formed again as the forward formed them and ``P = e^(S − lse)``; then

        dV[j] += P dO,   dP = dO·V[j],   dS = P ∘ (dP − D),   dQ += dS K[j]·scale,   dK[j] += dS Q·scale

    where the two scatters ACCUMULATE (``np.add.at``): a key listed by many queries, or twice in one
    row, gathers a term from each entry that picked it (a fancy-index assignment would keep one)."""
    call = _Sparse(q, k, v, keywords)
    seen = Visibility(causal=bool(keywords["causal"]), window=None if keywords["window"] is None
                      else check_window(keywords["window"]), chunk=_chunk(keywords["attention_chunk"]))
    softcap = check_softcap(keywords["softcap"])
    block_q, block_k = _tile_shape(keywords["block"])
    entries = min(block_k, SPARSE_ENTRIES)
    batch, n_q, n_k, work = call.batch, call.n_q, call.n_k, call.q.dtype
    d_v = call.v.shape[-1]
    out_ = _check_d_out(out, call.dtype, (*batch, n_q, d_v), name="out").astype(work, copy=False)
    do = _check_d_out(d_out, call.dtype, (*batch, n_q, d_v)).astype(work, copy=False)
    lse_ = _check_lse(lse, work, (*batch, n_q))
    alibi = _alibi(keywords["alibi_slopes"], batch, n_q, n_k, work)
    d_row = np.einsum("...ij,...ij->...i", do, out_)  # D = rowsum(dO ∘ O)
    dq = np.zeros(call.q.shape, dtype=work)
    dk, dv = np.zeros(call.k.shape, dtype=work), np.zeros(call.v.shape, dtype=work)  # with the zero row
    factor = _query_factor(call.scale, softcap, work)
    for idx in call.heads:
        qh, kh, vh, listed = call.of(idx)
        dk_h, dv_h = _kv_grad(dk, dv, call, idx)
        dead = np.isneginf(lse_[idx])  # as in the dense backward: +∞ makes every P of the row 0
        lse_h = np.where(dead, work.type(np.inf), lse_[idx])
        for q0 in range(0, n_q, block_q):
            q1 = min(q0 + block_q, n_q)
            q_t = qh[q0:q1] * factor
            for t0 in range(0, listed.shape[-1], entries):
                j = listed[q0:q1, t0 : t0 + entries]
                s, keys, t = _gathered_scores(q_t, kh, j, q0, head=idx, softcap=softcap, alibi=alibi,
                                              seen=seen, n_k=n_k, tanh=True)
                p = np.exp(s - lse_h[q0:q1, None])
                p[dead[q0:q1]] = 0  # a row that saw nothing in the forward gets no gradient
                values = np.take(vh, j, axis=0)  # [rows, entries, d_v]
                np.add.at(dv_h, j, p[..., None] * do[idx][q0:q1, None, :])
                dp = np.matmul(values, do[idx][q0:q1, :, None])[..., 0]  # [rows, entries]
                ds = p * (dp - d_row[idx][q0:q1, None])
                if t is not None:
                    ds *= 1 - t * t  # through c·tanh(u/c)
                dq[idx][q0:q1] += np.matmul(ds[:, None, :], keys)[:, 0] * work.type(call.scale)
                np.add.at(dk_h, j, ds[..., None] * (qh[q0:q1, None, :] * work.type(call.scale)))
    dk, dv = dk[..., :-1, :], dv[..., :-1, :]  # the zero row past the last key takes no gradient
    return tuple(  # type: ignore[return-value]
        _unbroadcast(g, np.shape(x)).astype(call.dtype, copy=False)
        for g, x in ((dq, q), (dk, k), (dv, v)))


def _kv_grad(dk: Array, dv: Array, call: _Sparse, idx: tuple[int, ...]) -> tuple[Array, Array]:
    """The rows of dk and dv that query head ``idx``'s K/V head accumulates into (views)."""
    if not idx:
        return dk, dv
    kv = (*idx[:-1], idx[-1] // (call.batch[-1] // call.k.shape[-3])) if call.grouped else idx
    return dk[kv], dv[kv]
