"""Tiled attention with an online softmax (FlashAttention's algorithm, in NumPy).

Keys and values are visited a tile at a time. Each query row i keeps three running values: the
largest score seen so far ``m``, the softmax denominator ``l`` and the unnormalised output ``acc``.
A new tile of scores ``s`` (and its values ``V_t``) updates them by the online-softmax law

    m'   = max(m, max_j s_j)
    l'   = e^(m − m') · l   + Σ_j e^(s_j − m')
    acc' = e^(m − m') · acc + Σ_j e^(s_j − m') · V_t[j]

and after the last tile ``out = acc / l``. The factor e^(m − m') re-expresses everything summed
so far relative to the new maximum, so the result is exactly softmax(s)·V — the same shift-by-the-
row-max that makes :func:`impl.attention.softmax` stable — yet the n_q × n_k pattern never exists:
memory is O(n · block) instead of O(n²) (Dao et al., 2022, "FlashAttention", Algorithm 1).

Speed in NumPy comes from doing as little per score as possible outside BLAS:

* tiles are large (hundreds of query rows by thousands of keys), so each matmul is a big sgemm
  and Python's per-tile overhead is negligible;
* under the causal mask, tiles entirely above the diagonal are never computed, and only the tiles
  that cross it are masked;
* the per-score work — max, subtract, exp, sum — runs in place in one preallocated buffer;
* row blocks are independent, so each core takes its own, in a thread running a single-threaded
  BLAS (through threadpoolctl when installed): NumPy's ufuncs and BLAS release the GIL, so one
  thread's exp overlaps another's matmul, and no core is shared by two busy threads.

What remains is BLAS time plus about one exp per visible score: ``python -m impl.bench``
measures it against PyTorch and against the sgemm floor.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from impl.attention import Array, check_qkv, check_scale, compute_dtype

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


def _row_block(
    q: Array, k: Array, v: Array, out: Array, q0: int, q1: int, *, causal: bool, scale: float,
    block_k: int, skip_masked: bool,
) -> None:  # [n_q, d_k], [n_k, d_k], [n_k, d_v] -> writes out[q0:q1]: [q1 - q0, d_v]
    """Attention for query rows ``q0:q1`` of one head, one key tile at a time (the law above)."""
    work = out.dtype
    n_k, d_v = v.shape
    rows = q1 - q0
    # Under the causal mask no key after the block's last query is visible: those tiles are skipped.
    k_end = min(n_k, q1) if causal and skip_masked else n_k
    q_t = q[q0:q1] * work.type(scale)  # [rows, d_k]; the scale folded in once
    m = np.full(rows, -np.inf, dtype=work)  # running row max
    l = np.zeros(rows, dtype=work)  # running softmax denominator
    acc = np.zeros((rows, d_v), dtype=work)  # running unnormalised output
    pv = np.empty((rows, d_v), dtype=work)
    scores = np.empty((rows, min(block_k, k_end)), dtype=work)
    for k0 in range(0, k_end, block_k):
        k1 = min(k0 + block_k, k_end)
        s = scores[:, : k1 - k0]
        np.matmul(q_t, k[k0:k1].T, out=s)  # [rows, d_k] @ [d_k, k1 - k0]
        if causal and k1 - 1 > q0:  # the tile reaches past the diagonal: hide keys j > i
            c0 = max(k0, q0 + 1)
            above = np.arange(c0, k1)[None, :] > np.arange(q0, q1)[:, None]
            np.copyto(s[:, c0 - k0 :], -np.inf, where=above)
        m_new = np.maximum(m, np.max(s, axis=1))
        # A row with nothing visible yet keeps m = -inf; shift it by 0 to avoid -inf − -inf = NaN.
        shift = np.where(np.isneginf(m_new), work.type(0), m_new)
        np.subtract(s, shift[:, None], out=s)
        np.exp(s, out=s)  # s is now e^(s − m'), the tile's unnormalised weights
        rescale = np.exp(m - shift)  # e^(m − m'): the correction for what came before
        l *= rescale
        l += np.sum(s, axis=1)
        acc *= rescale[:, None]
        acc += np.matmul(s, v[k0:k1], out=pv)  # [rows, k1-k0] @ [k1-k0, d_v]
        m = m_new
    # l is exactly 0 only for rows that saw no key (or only −Inf scores); they get zeros, as in
    # impl.attention.
    np.divide(acc, np.where(l == 0, work.type(1), l)[:, None], out=out[q0:q1])


def _cores() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@functools.cache
def _blas_controller() -> Any:
    """threadpoolctl's handle on the loaded BLAS (found once: the search takes a millisecond), or None."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # then BLAS keeps its own threads and row blocks run in turn
        return None
    return ThreadpoolController()


def _one_thread_blas() -> AbstractContextManager[Any]:
    """A context in which BLAS runs single-threaded; needs threadpoolctl (``_blas_controller()``)."""
    return _blas_controller().limit(limits=1, user_api="blas")


def _jobs(n_heads: int, n_q: int, block_q: int, causal: bool) -> Iterator[tuple[int, int, int]]:
    """(head, q0, q1) for every row block, costliest first so threads finish together."""
    starts = range(0, n_q, block_q)
    for q0 in reversed(starts) if causal else starts:
        for h in range(n_heads):
            yield h, q0, min(q0 + block_q, n_q)


def flash_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    block: int | tuple[int, int] = DEFAULT_BLOCK,
) -> Array:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v]
    """Attention computed tile by tile; equal to :func:`impl.attention` up to float rounding.

    Args:
      q, k, v: as in :func:`impl.attention`; leading dims broadcast.
      causal: query i sees keys j ≤ i (top-left aligned); tiles entirely above the diagonal are
        skipped. A query with no visible key gets zeros.
      scale: multiplies the scores; default ``1/√d_k``.
      block: tile shape (query rows, keys); an int gives square tiles. Memory beyond the inputs
        and output is about ``threads × block_q × block_k`` scores.

    Numerics follow :func:`impl.attention`: float64 stays float64, narrower floats compute in
    float32 and are cast back; NaN and Inf propagate.
    """
    q, k, v, batch = check_qkv(q, k, v)
    block_q, block_k = _tile_shape(block)
    n_q, d_k = q.shape[-2:]
    n_k, d_v = v.shape[-2:]
    scale = check_scale(scale, d_k)
    work = compute_dtype(q.dtype)
    out = np.empty((*batch, n_q, d_v), dtype=work)
    # Broadcast views in the compute dtype: one 2-D slice per head, copied only to widen float16.
    heads = list(np.ndindex(*batch))
    qs, ks, vs = (np.broadcast_to(x.astype(work, copy=False), (*batch, *x.shape[-2:])) for x in (q, k, v))

    # Skipping the tiles above the diagonal is exact for finite values. A NaN or Inf value behind
    # the mask still reaches every row in impl.attention (weight 0 · Inf = NaN); then compute those
    # tiles too, so the result never depends on the tiling.
    skip_masked = bool(np.isfinite(v).all())

    def run(job: tuple[int, int, int]) -> None:
        h, q0, q1 = job
        idx = heads[h]
        _row_block(qs[idx], ks[idx], vs[idx], out[idx], q0, q1, causal=causal, scale=scale,
                   block_k=block_k, skip_masked=skip_masked)

    jobs = list(_jobs(len(heads), n_q, block_q, causal))
    threads = min(_cores(), len(jobs))
    big = len(heads) * n_q * n_k >= _THREADED_MIN_SCORES
    if threads > 1 and big and _blas_controller() is not None:
        # One thread per core, each with a one-thread BLAS: no core is oversubscribed (BLAS's own
        # threads would be, and they wait on each other at every call), and one thread's exp
        # overlaps another's matmul, since NumPy releases the GIL in both.
        with _blas_turn, _one_thread_blas(), ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, jobs))  # list() re-raises a worker's exception here
    else:
        for job in jobs:
            run(job)
    return out.astype(q.dtype, copy=False)
