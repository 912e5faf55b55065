"""impl.flash_attention: equal to impl.attention at every tiling, and the tiling's own promises; its
argument checks and tilings at their edges (the first value past each boundary)."""

import concurrent.futures
import contextlib
import os
import sys
import threading
import time
import tracemalloc
import warnings

import numpy as np
import pytest
import threadpoolctl

import impl.flash
from impl import (
    attention,
    attention_backward,
    causal_mask,
    flash_attention,
    flash_attention_backward,
    gradcheck,
    sliding_window_mask,
)

TOL = {np.float32: dict(atol=2e-6, rtol=1e-5), np.float64: dict(atol=1e-13, rtol=1e-12)}


def qkv(rng, n_q, n_k, d_k=16, d_v=8, *, lead_q=(), lead_kv=(), dtype=np.float64):
    q = rng.standard_normal((*lead_q, n_q, d_k)).astype(dtype)
    k = rng.standard_normal((*lead_kv, n_k, d_k)).astype(dtype)
    v = rng.standard_normal((*lead_kv, n_k, d_v)).astype(dtype)
    return q, k, v


def big(rng, *, lead=(2,), n=512, d_k=16, d_v=8, dtype=np.float64):
    """q, k, v with ``lead + (n, n)`` scores, at least 512² in all: a call past the size below which
    flash_attention keeps its row blocks in the caller's thread (a pool costs more than it saves)."""
    return qkv(rng, n, n, d_k, d_v, lead_q=lead, lead_kv=lead, dtype=dtype)


def blas_threads():
    """The thread counts of the BLAS libraries loaded, as threadpoolctl reports them."""
    return {lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"}


@contextlib.contextmanager
def new_threads(*, meet=0, pause=0.0, blas=False):
    """What each thread started inside the block saw as it started (``threading.setprofile`` runs
    in each new thread before its first call): its name, with ``blas`` the BLAS thread counts, and
    after ``pause`` seconds the names of the threads alive. With ``meet``, each waits (2 s at most)
    until ``meet`` threads have started, so that a pool starts every worker it may have instead of
    handing the work to an idle one."""
    seen = []
    started = threading.Condition()

    def hook(frame, event, arg):
        sys.setprofile(None)  # once, as the thread starts
        me = dict(name=threading.current_thread().name)
        try:  # an exception here would end the thread before its work: recorded instead
            me["blas"] = blas_threads() if blas else None
            with started:
                seen.append(me)
                started.notify_all()
                started.wait_for(lambda: len(seen) >= meet, timeout=2)
            time.sleep(pause)
            me["alive"] = {t.name for t in threading.enumerate()}
        except BaseException as e:
            me["error"] = e

    previous = threading.getprofile()
    threading.setprofile(hook)
    try:
        yield seen
    finally:
        threading.setprofile(previous)


def pool_of(name):  # a pool worker's thread name -> its pool's: "ThreadPoolExecutor-3_1" -> "...-3"
    return name.rsplit("_", 1)[0]


# --- equal to the reference ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n_q", "n_k"), [(1, 1), (7, 5), (5, 7), (33, 33), (70, 45), (45, 70)])
@pytest.mark.parametrize("block", [1, 3, (4, 7), (16, 5), (64, 64)])
def test_equals_attention_at_every_tiling(dtype, causal, n_q, n_k, block):
    # Sizes that are not multiples of the tile, n_q ≠ n_k both ways, tiles of one entry and tiles
    # larger than the whole problem.
    q, k, v = qkv(np.random.default_rng(n_q * 100 + n_k), n_q, n_k, dtype=dtype)
    out = flash_attention(q, k, v, causal=causal, block=block)
    assert out.dtype == dtype
    np.testing.assert_allclose(out, attention(q, k, v, causal=causal), **TOL[dtype])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n_q", "n_k"), [(600, 600), (513, 1000), (1000, 513)])
def test_equals_attention_at_the_default_tiles(causal, n_q, n_k):
    q, k, v = qkv(np.random.default_rng(n_q + n_k), n_q, n_k, 32, 24, dtype=np.float32)
    out = flash_attention(q, k, v, causal=causal)
    np.testing.assert_allclose(out, attention(q, k, v, causal=causal), **TOL[np.float32])


def test_a_maximum_that_grows_tile_after_tile_is_rescaled():
    # Scores rise by 10 per key, so every new tile raises the row max: without the e^(m − m')
    # correction the early tiles would keep weights e^40 times too large.
    q = np.ones((3, 1))
    k = np.arange(9.0)[:, None] * 10
    v = np.arange(9.0 * 2).reshape(9, 2)
    for causal in (False, True):
        np.testing.assert_allclose(
            flash_attention(q, k, v, causal=causal, scale=1.0, block=(2, 2)),
            attention(q, k, v, causal=causal, scale=1.0),
            rtol=1e-12,
        )


def test_leading_dims_broadcast_like_attention():
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng, 20, 30, lead_q=(2, 3), lead_kv=(2, 1))  # one K/V head for three query heads
    out = flash_attention(q, k, v, causal=True, block=(8, 8))
    assert out.shape == (2, 3, 20, 8)
    np.testing.assert_allclose(out, attention(q, k, v, causal=True), **TOL[np.float64])


def test_strided_inputs_equal_contiguous_ones():
    rng = np.random.default_rng(2)
    q, k, v = (np.swapaxes(x, 0, 1) for x in qkv(rng, 40, 40, lead_q=(3,), lead_kv=(3,)))  # bnhd views
    assert not q.flags.c_contiguous
    np.testing.assert_allclose(
        flash_attention(q, k, v, causal=True, block=16), attention(q, k, v, causal=True), **TOL[np.float64]
    )


def test_large_logits_stay_finite_and_correct():
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, 50, 50, 4, 4)
    q *= 100  # |scores| up to ~1e4
    out = flash_attention(q, k, v, causal=True, block=(8, 16))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, attention(q, k, v, causal=True), **TOL[np.float64])


# --- numerics and dtypes --------------------------------------------------------------------------


def test_float16_is_computed_in_float32_and_cast_back():
    q, k, v = qkv(np.random.default_rng(4), 40, 50, dtype=np.float16)
    out = flash_attention(q, k, v, causal=True, block=(8, 16))
    assert out.dtype == np.float16
    wide = attention(*(x.astype(np.float32) for x in (q, k, v)), causal=True)
    np.testing.assert_allclose(out.astype(np.float32), wide, atol=1e-3, rtol=1e-3)  # one float16 ulp


def test_float64_stays_float64():
    q, k, v = qkv(np.random.default_rng(5), 30, 30)
    out = flash_attention(q, k, v, block=7)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, attention(q, k, v), atol=1e-13)  # far below float32 rounding


# NaN and inf inputs on purpose: NumPy calls the arithmetic that carries them "invalid value", in
# the flash path's tile threads too (where np.errstate set here does not reach)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("causal", [False, True])
def test_nan_and_inf_propagate_exactly_where_attention_puts_them(causal):
    rng = np.random.default_rng(6)
    q, k, v = qkv(rng, 24, 24, 4, 3)
    q[2, 1] = np.nan
    k[17, 0] = np.nan  # under the causal mask only queries ≥ 17 see it
    v[9, 2] = np.inf
    q[20, 3] = np.inf
    got = flash_attention(q, k, v, causal=causal, block=(8, 4))
    want = attention(q, k, v, causal=causal)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    assert np.isnan(got).any() and np.isfinite(got).any() == causal
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], **TOL[np.float64])


@pytest.mark.parametrize("block", [1, (4, 8), (8, 4), 64])
def test_a_nan_key_reaches_only_the_queries_that_see_it(block):
    q, k, v = qkv(np.random.default_rng(15), 24, 24)
    k[17, 0] = np.nan
    got = flash_attention(q, k, v, causal=True, block=block)
    assert np.isnan(got[17:]).all()
    np.testing.assert_allclose(got[:17], attention(q, k, v, causal=True)[:17], **TOL[np.float64])


# NaN and inf inputs on purpose: NumPy calls the arithmetic that carries them "invalid value", in
# the flash path's tile threads too (where np.errstate set here does not reach)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("block", [1, (4, 8), (8, 4), 64])
def test_an_inf_value_behind_the_mask_gives_what_attention_gives_at_any_tiling(block):
    # impl.attention multiplies the masked weight 0 by Inf (= NaN); skipping that tile would not.
    q, k, v = qkv(np.random.default_rng(16), 24, 24, 4, 3)
    v[20, 1] = np.inf
    got = flash_attention(q, k, v, causal=True, block=block)
    want = attention(q, k, v, causal=True)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], **TOL[np.float64])


@pytest.mark.parametrize("block", [1, (2, 3), 64])
def test_a_row_whose_every_score_is_minus_inf_gives_zeros_like_attention(block):
    # q·k = −Inf for every key (an Inf in q, negative keys): impl.attention's softmax gives that
    # row zeros; the online update must not compute −Inf − (−Inf) = NaN on the way.
    q, k, v = qkv(np.random.default_rng(17), 6, 6, 2, 3)
    k[:, 0] = -np.abs(k[:, 0]) - 0.5
    k[:, 1] = 0.0
    q[3] = [np.inf, 0.0]
    for causal in (False, True):
        got = flash_attention(q, k, v, causal=causal, block=block)
        want = attention(q, k, v, causal=causal)
        assert (want[3] == 0).all()
        np.testing.assert_allclose(got, want, **TOL[np.float64])


def test_rows_with_no_visible_key_get_zeros():
    q, k, v = qkv(np.random.default_rng(7), 5, 0, 4, 3, lead_q=(2,), lead_kv=(2,))
    for causal in (False, True):
        out = flash_attention(q, k, v, causal=causal)
        assert out.shape == (2, 5, 3) and (out == 0).all()
    q, k, v = qkv(np.random.default_rng(7), 0, 6, 4, 3)
    assert flash_attention(q, k, v, causal=True).shape == (0, 3)


def test_inputs_are_not_mutated():
    q, k, v = qkv(np.random.default_rng(8), 30, 30, dtype=np.float32)
    before = [x.copy() for x in (q, k, v)]
    flash_attention(q, k, v, causal=True, block=8)
    for x, y in zip((q, k, v), before, strict=True):
        np.testing.assert_array_equal(x, y)


# --- threads ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_threaded_row_blocks_equal_the_reference(causal):
    q, k, v = qkv(np.random.default_rng(9), 256, 256, lead_q=(2, 2), lead_kv=(2, 1), dtype=np.float32)
    with new_threads(meet=2) as pool:
        out = flash_attention(q, k, v, causal=causal, block=(16, 32), threads=2)
    assert len(pool) == 2
    np.testing.assert_allclose(out, attention(q, k, v, causal=causal), **TOL[np.float32])


def test_row_blocks_run_on_a_one_thread_blas_and_the_callers_count_comes_back():
    q, k, v = big(np.random.default_rng(10), dtype=np.float32)
    with threadpoolctl.threadpool_limits(3, user_api="blas"):  # a count no default would give
        with new_threads(meet=2, blas=True) as pool:
            flash_attention(q, k, v, block=64, threads=2)
        assert blas_threads() == {3}
    assert [thread["blas"] for thread in pool] == [{1}, {1}]


def test_concurrent_calls_take_turns_with_the_blas_thread_count():
    # Each call lowers BLAS to one thread and restores the count it found. Two calls overlapping
    # would restore each other's lowered count: the second finds 1 and, finishing last, leaves 1.
    # They take turns: no worker of one call's pool ever sees a worker of the other's alive.
    q, k, v = big(np.random.default_rng(18), dtype=np.float32)
    start = threading.Barrier(2)

    def call(_):
        start.wait()
        return flash_attention(q, k, v, block=64, threads=2)

    with threadpoolctl.threadpool_limits(3, user_api="blas"):
        with new_threads(pause=0.02) as workers, concurrent.futures.ThreadPoolExecutor(
                2, thread_name_prefix="caller") as callers:
            outs = list(callers.map(call, range(2)))
        assert blas_threads() == {3}
    pools = [thread for thread in workers if not thread["name"].startswith("caller")]
    assert len({pool_of(thread["name"]) for thread in pools}) == 2  # each call ran its own pool
    for thread in pools:
        others = {pool_of(name) for name in thread["alive"] & {t["name"] for t in pools}}
        assert others == {pool_of(thread["name"])}, f"{thread['name']} ran beside {others}"
    np.testing.assert_array_equal(outs[0], outs[1])


def test_a_failing_row_block_raises_in_the_caller():
    # Values +Inf at the first key and -Inf at the last, in two key tiles: each row's running sum
    # meets Inf + -Inf, and NumPy warns in the thread that adds them. As an error, that warning
    # must reach the caller, from a pool's worker as from the caller's own thread.
    q, k, v = big(np.random.default_rng(11))
    v[:, 0], v[:, -1] = np.inf, -np.inf
    for threads in (1, 2):
        with warnings.catch_warnings(), new_threads() as pool:
            warnings.simplefilter("error")
            with pytest.raises(RuntimeWarning, match="invalid value"):
                flash_attention(q, k, v, block=64, threads=threads)
        assert bool(pool) == (threads > 1)  # the second call ran in a pool


def test_costliest_row_blocks_are_handed_out_first_under_the_causal_mask():
    jobs = list(impl.flash._jobs(2, 10, 4, causal=True))
    assert [q0 for _, q0, _ in jobs] == [8, 8, 4, 4, 0, 0]
    assert jobs[0] == (0, 8, 10)


# --- threads= -------------------------------------------------------------------------------------


def test_threads_caps_the_pool_and_1_keeps_the_call_in_the_callers_thread():
    q, k, v = big(np.random.default_rng(70))  # 2 heads × 32 row blocks of 16
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    one_per_core = 0 if cores == 1 else min(cores, 64)
    with new_threads(meet=one_per_core) as default_pool:
        default = flash_attention(q, k, v, causal=True, block=16)
    with new_threads(meet=3) as pool_of_three:
        three = flash_attention(q, k, v, causal=True, block=16, threads=3)
    with threadpoolctl.threadpool_limits(1, user_api="blas"), new_threads() as no_pool:
        one = flash_attention(q, k, v, causal=True, block=16, threads=1)  # BLAS as the pool's threads have it
    assert (len(default_pool), len(pool_of_three), len(no_pool)) == (one_per_core, 3, 0)
    np.testing.assert_array_equal(one, default)
    np.testing.assert_array_equal(three, default)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_backward_on_one_thread_is_the_one_core_path_bit_for_bit():
    rng = np.random.default_rng(71)
    q, k, v = big(rng)
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    d_out = rng.standard_normal(out.shape)
    with new_threads() as pool:
        one = flash_attention_backward(q, k, v, out, lse, d_out, causal=True, block=16, threads=1)
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # this thread, as flash sees it: a one-CPU machine
    try:
        with new_threads() as one_cpu_pool:
            alone = flash_attention_backward(q, k, v, out, lse, d_out, causal=True, block=16)
    finally:
        os.sched_setaffinity(0, cpus)
    assert pool == one_cpu_pool == []
    for got, want in zip(one, alone, strict=True):
        np.testing.assert_array_equal(got, want)


def test_paged_calls_take_threads_too():
    from paged_caches import draw_seqs, lengths_of, paged

    rng = np.random.default_rng(72)
    k_seqs, v_seqs = draw_seqs(rng, [400, 512], 1, 8), draw_seqs(rng, [400, 512], 1, 8)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 16, rng)
    q = rng.standard_normal((2, 2, 256, 8))  # 2 heads × 256 queries × 912 keys: past 512² scores
    options = dict(block_table=table, kv_lengths=lengths_of(k_seqs), causal=True, block=16)
    with new_threads(meet=2) as two_pool:
        two = flash_attention(q, k_pool, v_pool, **options, threads=2)
    with new_threads() as no_pool:
        one = flash_attention(q, k_pool, v_pool, **options, threads=1)
    assert (len(two_pool), len(no_pool)) == (2, 0)
    np.testing.assert_allclose(one, two, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_bad_threads_is_refused_and_named(threads):
    q, k, v = qkv(np.random.default_rng(73), 3, 3)
    out, lse = flash_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="threads must be a positive integer or None"):
        flash_attention(q, k, v, threads=threads)
    with pytest.raises(ValueError, match="threads must be a positive integer or None"):
        flash_attention_backward(q, k, v, out, lse, np.ones_like(out), threads=threads)


# --- memory ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_memory_grows_with_the_tile_not_with_n_squared(causal):
    # The n × n float32 pattern at n = 4096 is 64 MiB. The tiled call holds the output
    # (4096 × 16 × 4 B = 256 KiB) and one 256 × 2048 float32 tile (2 MiB) per thread, of two.
    n = 4096
    q, k, v = qkv(np.random.default_rng(13), n, n, 16, 16, dtype=np.float32)
    tracemalloc.start()
    try:
        flash_attention(q, k, v, causal=causal, threads=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 * 2**20, f"peak {peak / 2**20:.1f} MiB"


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [0, -3, True, 2.5, "8", (8,), (8, 0), (8, 8, 8), None])
def test_bad_block_is_refused_and_named(block):
    q, k, v = qkv(np.random.default_rng(14), 3, 3)
    with pytest.raises(ValueError, match=r"block must be a positive integer or a pair"):
        flash_attention(q, k, v, block=block)


# --- window, softcap and logsumexp, against an independent float64 golden -------------------------


def visible(n_q, n_k, *, causal=False, window=None, attention_chunk=None):
    """Which (query, key) pairs are seen, written from the definitions (not impl's code)."""
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    seen = np.ones((n_q, n_k), dtype=bool)
    if causal:
        seen &= j <= i
    if window is not None:
        left, right = window
        seen &= (i - left <= j) & (j <= i + right)
    if attention_chunk is not None:  # the chunk a position lies in: position // C
        chunk_of = np.array([[x // attention_chunk for x in range(max(n_q, n_k))]])
        seen &= chunk_of[0, : n_q][:, None] == chunk_of[:, : n_k]
    return seen


def golden(q, k, v, *, causal=False, window=None, softcap=None, scale=None, attention_chunk=None):
    """(out, lse) in float64: scores, cap, mask, logsumexp and weighted sum, written out in full."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    seen = visible(q.shape[-2], k.shape[-2], causal=causal, window=window, attention_chunk=attention_chunk)
    s = np.where(seen, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    top = np.where(np.isneginf(top), 0.0, top)
    e = np.exp(s - top)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(total == 0, -np.inf, top + np.log(total))[..., 0]
    return (e / np.where(total == 0, 1, total)) @ v, lse


def assert_matches_golden(q, k, v, *, block, **options):
    out, lse = flash_attention(q, k, v, block=block, return_lse=True, **options)
    want_out, want_lse = golden(q, k, v, **options)
    tol = TOL[np.float64] if q.dtype == np.float64 else dict(atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out, want_out, **tol)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    np.testing.assert_allclose(lse, want_lse, **tol)


# Sizes just below, at and just above the tile edges of block (8, 8) and (16, 32), and a grid of
# the smallest shapes where every tile is also the first and the last.
EDGES = [1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 65]


@pytest.mark.parametrize("block", [(8, 8), (16, 32)])
@pytest.mark.parametrize("causal", [False, True])
def test_every_size_around_the_tile_edges_matches_the_golden(block, causal):
    rng = np.random.default_rng(20)
    for n_q in EDGES:
        for n_k in EDGES:
            q, k, v = qkv(rng, n_q, n_k, 4, 3)
            assert_matches_golden(q, k, v, block=block, causal=causal)


WINDOWS = [(0, 0), (1, 0), (0, 1), (3, 5), (7, 7), (8, 8), (9, 0), (0, 17), (40, 2), (100, 100)]


@pytest.mark.parametrize("block", [(8, 8), (16, 32), (3, 5)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
def test_a_sliding_window_matches_the_golden_at_every_tile_edge(block, causal, window):
    rng = np.random.default_rng(21)
    for n_q, n_k in [(1, 1), (4, 3), (9, 9), (17, 33), (33, 17), (65, 64), (40, 8)]:
        q, k, v = qkv(rng, n_q, n_k, 4, 3)
        assert_matches_golden(q, k, v, block=block, causal=causal, window=window)


# Chunks of one key, chunks dividing a tile, not dividing n, a tile's multiple, and wider than n.
CHUNKS = [1, 2, 3, 5, 8, 16, 32, 100]


@pytest.mark.parametrize("block", [(8, 8), (16, 32), (3, 5)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attention_chunk", CHUNKS)
def test_a_chunk_matches_the_golden_at_every_tile_edge(block, causal, attention_chunk):
    rng = np.random.default_rng(27)
    for n_q, n_k in [(1, 1), (4, 3), (9, 9), (17, 33), (33, 17), (65, 64)]:
        q, k, v = qkv(rng, n_q, n_k, 4, 3)
        assert_matches_golden(q, k, v, block=block, causal=causal, attention_chunk=attention_chunk)
        assert_matches_golden(q, k, v, block=block, causal=causal, attention_chunk=attention_chunk,
                              window=(4, 1))


def test_keys_of_another_chunk_cannot_leak():
    q, k, v = qkv(np.random.default_rng(28), 48, 48)
    before = flash_attention(q, k, v, attention_chunk=12, block=(8, 8))
    k[24:36], v[24:36] = 100.0, -100.0  # the third chunk: seen by queries 24 … 35 alone
    after = flash_attention(q, k, v, attention_chunk=12, block=(8, 8))
    np.testing.assert_array_equal(after[:24], before[:24])
    np.testing.assert_array_equal(after[36:], before[36:])
    assert not np.allclose(after[24:36], before[24:36])


def test_window_equals_impl_attention_with_the_sliding_window_mask():

    q, k, v = qkv(np.random.default_rng(22), 70, 70, lead_q=(2,), lead_kv=(2,))
    mask = sliding_window_mask(70, window=(9, 0)) & causal_mask(70)
    got = flash_attention(q, k, v, causal=True, window=(9, 4), block=(16, 8))
    np.testing.assert_allclose(got, attention(q, k, v, mask=mask), **TOL[np.float64])


def test_keys_outside_the_window_cannot_leak():
    q, k, v = qkv(np.random.default_rng(23), 48, 48)
    before = flash_attention(q, k, v, window=(5, 2), block=(8, 8))
    k[20:], v[20:] = 100.0, -100.0  # only queries 15 … 47 may see keys ≥ 20 (i + 2 ≥ 20 → i ≥ 18)
    after = flash_attention(q, k, v, window=(5, 2), block=(8, 8))
    np.testing.assert_array_equal(after[:18], before[:18])
    assert not np.allclose(after[18:], before[18:])


@pytest.mark.parametrize("softcap", [0.5, 3.0, 50.0])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_matches_the_golden(softcap, causal):
    rng = np.random.default_rng(24)
    for n_q, n_k in [(1, 1), (9, 17), (33, 16), (70, 45)]:
        q, k, v = qkv(rng, n_q, n_k, 4, 3)
        q *= 4  # scores of several units, so the cap bends them
        assert_matches_golden(q, k, v, block=(8, 16), causal=causal, softcap=softcap, window=(20, 3))


def test_softcap_keeps_huge_logits_finite_and_a_cap_far_above_them_changes_nothing():
    q, k, v = qkv(np.random.default_rng(25), 40, 40, 4, 4)
    q *= 1e4  # |scores| ~ 1e4: the cap holds them within ±30
    out = flash_attention(q, k, v, softcap=30.0, block=(8, 8))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, golden(q, k, v, softcap=30.0)[0], **TOL[np.float64])
    small = q / 1e4
    np.testing.assert_allclose(flash_attention(small, k, v, softcap=1e8, block=8),
                               flash_attention(small, k, v, block=8), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("block", [(8, 8), (16, 32), (3, 5)])
@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(window=(6, 2), softcap=1.5),
                                     dict(causal=True, window=(40, 0), scale=0.3)])
def test_alibi_equals_attention_with_it_at_every_tile_edge(block, options):
    # ALiBi's distance is measured from the bottom-right diagonal, so n_q ≠ n_k moves every tile's term.
    rng = np.random.default_rng(26)
    for n_q, n_k in [(1, 1), (9, 17), (17, 9), (33, 33), (65, 40)]:
        q, k, v = qkv(rng, n_q, n_k, 4, 3, lead_q=(2, 3), lead_kv=(2, 3))
        q *= 2
        for slopes in (rng.uniform(0, 1, 3), rng.uniform(0, 1, (2, 3))):
            out, lse = flash_attention(q, k, v, block=block, alibi_slopes=slopes, return_lse=True, **options)
            want_out, want_lse = attention(q, k, v, alibi_slopes=slopes, return_lse=True, **options)
            np.testing.assert_allclose(out, want_out, **TOL[np.float64])
            np.testing.assert_allclose(lse, want_lse, **TOL[np.float64])


def test_alibi_in_float32_and_on_two_dimensional_inputs_equals_attention():
    rng = np.random.default_rng(27)
    q, k, v = qkv(rng, 70, 45, 8, 4, dtype=np.float32)
    slopes = np.array([0.0625], dtype=np.float32)
    got = flash_attention(q, k, v, causal=True, block=(16, 8), alibi_slopes=slopes)
    np.testing.assert_allclose(got, attention(q, k, v, causal=True, alibi_slopes=slopes), **TOL[np.float32])


@pytest.mark.parametrize(
    ("slopes", "error", "says"),
    [
        (np.ones(2), ValueError, r"alibi_slopes must have shape \(heads,\) = \(3,\)"),
        (np.ones((3, 2)), ValueError, r"or \(batch, heads\) = \(2, 3\)"),
        (np.ones(3, dtype=int), TypeError, "alibi_slopes must be a real floating array"),
        (np.array([1.0, np.nan, 1.0]), ValueError, "alibi_slopes must be finite"),
    ],
)
def test_bad_alibi_slopes_are_refused_and_named(slopes, error, says):
    q, k, v = qkv(np.random.default_rng(28), 3, 3, lead_q=(2, 3), lead_kv=(2, 3))
    with pytest.raises(error, match=says):
        flash_attention(q, k, v, alibi_slopes=slopes)


@pytest.mark.parametrize(("dtype", "lse_dtype"), [(np.float16, np.float32), (np.float32, np.float32),
                                                  (np.float64, np.float64)])
def test_lse_is_in_the_compute_dtype(dtype, lse_dtype):
    q, k, v = qkv(np.random.default_rng(26), 20, 30, lead_q=(2,), lead_kv=(2,), dtype=dtype)
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True, block=(8, 8))
    assert out.dtype == dtype and lse.dtype == lse_dtype and lse.shape == (2, 20)
    tol = TOL[np.float64] if dtype == np.float64 else dict(atol=1e-5, rtol=1e-5)  # float32 arithmetic
    np.testing.assert_allclose(lse, golden(q, k, v, causal=True)[1], **tol)


def test_lse_of_bfloat16_is_float32():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = qkv(np.random.default_rng(27), 9, 9, dtype=ml_dtypes.bfloat16)
    out, lse = flash_attention(q, k, v, return_lse=True, block=4)
    assert out.dtype == ml_dtypes.bfloat16 and lse.dtype == np.float32


def test_lse_merges_two_halves_of_the_keys_into_the_whole():
    # What split-KV decoding relies on: out = Σ_h e^(lse_h − lse) out_h, lse = logaddexp(lse_1, lse_2).
    q, k, v = qkv(np.random.default_rng(28), 30, 50)
    (o1, l1), (o2, l2) = (flash_attention(q, k[s], v[s], return_lse=True, block=8)
                          for s in (slice(0, 23), slice(23, 50)))
    out, lse = flash_attention(q, k, v, return_lse=True, block=8)
    np.testing.assert_allclose(np.logaddexp(l1, l2), lse, rtol=1e-13)
    merged = np.exp(l1 - lse)[:, None] * o1 + np.exp(l2 - lse)[:, None] * o2
    np.testing.assert_allclose(merged, out, **TOL[np.float64])


def test_rows_that_see_nothing_get_zeros_and_minus_inf_lse():
    q, k, v = qkv(np.random.default_rng(29), 12, 4)
    # Query i sees keys i − 1 and i; with 4 keys, queries 5 … 11 see none.
    out, lse = flash_attention(q, k, v, window=(1, 0), return_lse=True, block=(4, 2))
    assert (out[5:] == 0).all() and np.isneginf(lse[5:]).all()
    assert np.isfinite(lse[:5]).all() and (out[:5] != 0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_no_keys_gives_zeros_of_the_output_shape_and_minus_inf_lse(causal):
    q, k, v = qkv(np.random.default_rng(30), 5, 0, 4, 3, lead_q=(2, 1), lead_kv=(3,))
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, block=(2, 2))
    assert out.shape == (2, 3, 5, 3) and (out == 0).all()
    assert lse.shape == (2, 3, 5) and np.isneginf(lse).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_tile_without_a_shift_is_exact_and_a_shifted_one_too(dtype):
    # Scores within ±20 skip the shift pass; a later tile of scores near 800 must be shifted (e^800
    # overflows even float64) and merged with the first; one near −600 must be shifted too, or
    # its weights would all underflow to 0 — as would those of a row that sees only it.
    q = np.ones((3, 1), dtype=dtype)
    k = np.concatenate([np.full(8, 1.0), np.full(8, 800.0), np.full(8, -600.0)]).astype(dtype)[:, None]
    v = np.arange(48.0, dtype=dtype).reshape(24, 2)
    out, lse = flash_attention(q, k, v, scale=1.0, return_lse=True, block=8)
    want_out, want_lse = golden(q, k, v, scale=1.0)
    np.testing.assert_allclose(out, want_out, rtol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6)
    out, lse = flash_attention(q, k[16:], v[16:], scale=1.0, return_lse=True, block=8)
    want_out, want_lse = golden(q, k[16:], v[16:], scale=1.0)
    np.testing.assert_allclose(out, want_out, rtol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6)


def test_an_inf_value_behind_the_mask_leaves_huge_values_before_it_finite():
    # The Inf makes every tile count (no skipping) and every row shifted by its max. Its column
    # is NaN in every row (weight 0 · Inf, as in impl.attention); the other columns of the rows
    # that cannot see it must still be finite sums of e^(s − m)·v, not overflowing e^s·v.
    q = np.ones((16, 1), dtype=np.float32)
    k = np.full((16, 1), 15.0, dtype=np.float32)
    v = np.random.default_rng(32).standard_normal((16, 3)).astype(np.float32) * np.float32(1e36)
    v[15, 0] = np.inf  # only the last query sees it
    with np.errstate(invalid="ignore"):
        out = flash_attention(q, k, v, scale=1.0, causal=True, block=8)
    assert np.isnan(out[:15, 0]).all() and np.isfinite(out[:15, 1:]).all()
    want = golden(q[:15], k[:15], v[:15, 1:] / 1e36, scale=1.0, causal=True)[0]
    np.testing.assert_allclose(out[:15, 1:] / 1e36, want, rtol=1e-5, atol=1e-6)


def test_huge_values_force_the_shifted_path_and_stay_finite():
    # Scores of 15 would skip the shift, but with |v| ~ 1e36 unshifted weights of e^15 would
    # overflow float32's sums; shifted by the max, each weight is 1/16 and the output ~1e36.
    q = np.ones((4, 1), dtype=np.float32)
    k = np.full((16, 1), 15.0, dtype=np.float32)
    v = np.random.default_rng(31).standard_normal((16, 3)).astype(np.float32) * np.float32(1e36)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the overflow that sends a row to the shifted path is no warning
        out = flash_attention(q, k, v, scale=1.0, block=8)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out / 1e36, golden(q, k, v / 1e36, scale=1.0)[0], rtol=1e-5, atol=1e-6)


def test_threaded_window_softcap_and_lse_equal_the_golden():
    q, k, v = big(np.random.default_rng(34), n=384)
    with new_threads(meet=2) as pool:
        out, lse = flash_attention(q, k, v, causal=True, window=(20, 0), softcap=2.0, block=(16, 8),
                                   return_lse=True, threads=2)
    assert len(pool) == 2
    want_out, want_lse = golden(q, k, v, causal=True, window=(20, 0), softcap=2.0)
    np.testing.assert_allclose(out, want_out, **TOL[np.float64])
    np.testing.assert_allclose(lse, want_lse, **TOL[np.float64])


@pytest.mark.parametrize("amplitude", ["scores", "values"])
def test_what_other_rows_see_changes_no_bit_of_a_row(amplitude):
    # The causal law, bit for bit, where rows take different paths: changing keys and values from
    # position 5 on gives later rows scores beyond ±20 (shifted) or sums that overflow unshifted
    # (redone alone); rows 0 … 4, in the same tiles, must not move by one bit.
    q, k, v = qkv(np.random.default_rng(33), 12, 12, dtype=np.float32)
    before = flash_attention(q, k, v, causal=True, block=(8, 8))
    if amplitude == "scores":
        k[5:] *= 50
    else:
        k[5:] = q[5:] * 30  # scores near 15 and more, unshifted
        v[5:] *= np.float32(3e37)
    after = flash_attention(q, k, v, causal=True, block=(8, 8))
    np.testing.assert_array_equal(after[:5], before[:5])
    assert np.isfinite(after).all() and not np.array_equal(after[5:], before[5:])


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        (dict(window=3), TypeError, "window must be a pair .left, right. of integers"),
        (dict(window=(1,)), TypeError, "window must be a pair .left, right. of integers"),
        (dict(window=(1.0, 2)), TypeError, "window must be a pair .left, right. of integers"),
        (dict(window=(True, 2)), TypeError, "window must be a pair .left, right. of integers"),
        (dict(window=(-1, 2)), ValueError, "window must be .left, right. with both >= 0"),
        (dict(softcap="1"), TypeError, "softcap must be a real number > 0 or None"),
        (dict(softcap=True), TypeError, "softcap must be a real number > 0 or None"),
        (dict(softcap=0.0), ValueError, "softcap must be a finite number > 0"),
        (dict(softcap=-2.0), ValueError, "softcap must be a finite number > 0"),
        (dict(softcap=np.nan), ValueError, "softcap must be a finite number > 0"),
        (dict(softcap=np.inf), ValueError, "softcap must be a finite number > 0"),
    ],
)
def test_bad_window_or_softcap_is_refused_and_named(options, error, says):
    q, k, v = qkv(np.random.default_rng(32), 3, 3)
    with pytest.raises(error, match=says):
        flash_attention(q, k, v, **options)


# --- the tiled backward ---------------------------------------------------------------------------


def grads(rng, q, k, v, *, block, **options):
    """flash's backward from flash's own (out, lse), and a d_out drawn here."""
    out, lse = flash_attention(q, k, v, return_lse=True, block=block, **options)
    d_out = rng.standard_normal(out.shape).astype(q.dtype)
    return flash_attention_backward(q, k, v, out, lse, d_out, block=block, **options), d_out


GRAD_TOL = {np.float32: dict(atol=2e-5, rtol=1e-4), np.float64: dict(atol=1e-12, rtol=1e-10)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [(8, 8), (16, 32), (5, 3)])
def test_backward_equals_attention_backward_around_the_tile_edges(dtype, causal, block):
    rng = np.random.default_rng(40)
    for n_q, n_k in [(1, 1), (2, 3), (7, 9), (8, 8), (9, 17), (17, 9), (33, 31), (65, 40)]:
        q, k, v = qkv(rng, n_q, n_k, 6, 5, dtype=dtype)
        got, d_out = grads(rng, q, k, v, block=block, causal=causal)
        for g, want in zip(got, attention_backward(q, k, v, d_out, causal=causal), strict=True):
            assert g.dtype == dtype
            np.testing.assert_allclose(g, want, **GRAD_TOL[dtype])


def test_backward_of_float16_is_computed_in_float32_and_cast_back():
    rng = np.random.default_rng(49)
    q, k, v = qkv(rng, 20, 24, 8, 4, dtype=np.float16)
    (dq, dk, dv), d_out = grads(rng, q, k, v, block=(8, 8), causal=True)
    assert dq.dtype == dk.dtype == dv.dtype == np.float16
    wide = [x.astype(np.float32) for x in (q, k, v, d_out)]
    for g, want in zip((dq, dk, dv), attention_backward(*wide[:3], wide[3], causal=True), strict=True):
        np.testing.assert_allclose(g.astype(np.float32), want, atol=2e-3, rtol=2e-3)  # float16 rounding


def test_backward_sums_gradients_over_broadcast_heads():
    rng = np.random.default_rng(41)
    q, k, v = qkv(rng, 20, 30, lead_q=(2, 3), lead_kv=(2, 1))  # one K/V head for three query heads
    got, d_out = grads(rng, q, k, v, block=(8, 8), causal=True, scale=0.7)
    want = attention_backward(q, k, v, d_out, causal=True, scale=0.7)
    for g, w, x in zip(got, want, (q, k, v), strict=True):
        assert g.shape == x.shape
        np.testing.assert_allclose(g, w, **GRAD_TOL[np.float64])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(0, 0), (3, 1), (8, 0), (0, 9), (30, 30)])
def test_backward_with_a_window_equals_attention_backward_with_its_mask(causal, window):
    rng = np.random.default_rng(42)
    for n_q, n_k in [(17, 17), (33, 16), (9, 40)]:
        q, k, v = qkv(rng, n_q, n_k, 4, 3)
        got, d_out = grads(rng, q, k, v, block=(8, 8), causal=causal, window=window)
        mask = visible(n_q, n_k, causal=causal, window=window)
        for g, want in zip(got, attention_backward(q, k, v, d_out, mask=mask), strict=True):
            np.testing.assert_allclose(g, want, **GRAD_TOL[np.float64])


def fd_check(q, k, v, d_out, got, **options):
    """Central differences of <flash_attention(q, k, v), d_out> against the analytic gradients."""
    result = gradcheck(
        lambda p: float(np.sum(flash_attention(p["q"], p["k"], p["v"], **options) * d_out)),
        {"q": q, "k": k, "v": v}, dict(zip("qkv", got, strict=True)), n_samples=None, eps=1e-6,
    )
    assert result.max_rel_diff < 1e-6, result.samples


@pytest.mark.parametrize("options", [dict(causal=True), dict(softcap=1.5), dict(softcap=0.8, causal=True,
                                                                                   window=(2, 1)),
                                     dict(alibi_slopes=np.array([0.7]), causal=True, scale=0.6),
                                     dict(alibi_slopes=np.array([0.3]), softcap=1.2, window=(3, 2))])
def test_backward_matches_finite_differences(options):
    rng = np.random.default_rng(43)
    q, k, v = qkv(rng, 7, 9, 3, 2)
    q *= 2  # scores of a few units: the softcap bends them
    got, d_out = grads(rng, q, k, v, block=(4, 4), **options)
    fd_check(q, k, v, d_out, got, block=(4, 4), **options)


# NaN and inf inputs on purpose: NumPy calls the arithmetic that carries them "invalid value", in
# the flash path's tile threads too (where np.errstate set here does not reach)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_backward_forms_the_scores_as_its_forward_did_where_they_overflow():
    # Query 0's scaled q, 3e38 · 2, overflows float32 to inf: its one visible score is inf · (−1e−39) = −∞
    # in the forward, which gives it zeros and lse = −∞. The backward must see the same −∞ (not the
    # finite 3e38 · (2 · −1e−39) = −0.6 of scaling k instead), or the e^(−0.6 − stand-in for lse) it
    # would then weigh key 0 by moves dv[0] from 1/(1 + e) to 0.82 (stand-in 0) or 1.76 (stand-in −1).
    q = np.array([[3e38], [1.0]], dtype=np.float32)
    k = np.array([[-1e-39], [0.5]], dtype=np.float32)
    v = np.array([[1.0], [2.0]], dtype=np.float32)
    with np.errstate(over="ignore"):
        out, lse = flash_attention(q, k, v, scale=2.0, causal=True, return_lse=True)
        assert out[0, 0] == 0 and lse[0] == -np.inf
        for d_row_0 in (1.0, -5.0):  # row 0 saw nothing: its upstream gradient reaches nothing
            d_out = np.array([[d_row_0], [1.0]], dtype=np.float32)
            dq, dk, dv = flash_attention_backward(q, k, v, out, lse, d_out, scale=2.0, causal=True)
            p = 1 / (1 + np.e)  # row 1's weight on key 0: scores ≈ 0 and 1
            np.testing.assert_allclose(dv.ravel(), [p, 1 - p], rtol=1e-6)
            assert dq[0, 0] == 0 and np.isfinite(dk).all()


@pytest.mark.parametrize("block", [1, 2, (4, 1)])
@pytest.mark.parametrize("options", [{}, {"softcap": 50.0}])  # S − lse in one matmul, or after the cap
@pytest.mark.parametrize("overflow", [False, True])
def test_a_row_whose_lse_is_minus_inf_gets_no_gradient_whatever_its_scores_are_here(block, options,
                                                                                    overflow):
    # A forward that saw nothing in row 0 returns lse = −∞ there, but a backward tiled otherwise may
    # sum that row's dot products in another order (BLAS's order depends on the tile's shape) and
    # find a finite score, or +∞, where the forward's overflowed to −∞. Here row 0's scores are
    # finite outright (or overflow to +∞) and only its lse says "nothing": it must still give no
    # gradient, and no NaN. (Weighing its keys by e^(S − stand-in) would give dv row 0's upstream
    # gradient; with +∞ scores, e^(∞ − stand-in) would make every gradient NaN.)
    rng = np.random.default_rng(45)
    q, k, v = qkv(rng, 3, 4, 5, 2)
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    if overflow:
        k[0] = np.abs(k[0]) + 1
        q[0] = 3e38  # q·k[0] overflows to +∞ (and the cap's tanh gives c, finite: no overflow there)
    with np.errstate(over="ignore", invalid="ignore"):
        out, lse = flash_attention(q, k, v, return_lse=True, **options)
        out[0], lse[0] = 0, -np.inf  # row 0 as a forward whose every score overflowed to −∞ leaves it
        d_out = rng.standard_normal((3, 2)).astype(np.float32) * 5
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, d_out, block=block, **options)
    assert (dq[0] == 0).all()
    want = attention_backward(q[1:], k, v, d_out[1:], **options)  # the other rows alone
    np.testing.assert_allclose(dv, want[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dk, want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("block", [(8, 8), (16, 4), (5, 3)])
@pytest.mark.parametrize("options", [dict(causal=True), dict(window=(6, 2), softcap=1.5),
                                     dict(causal=True, window=(40, 0), softcap=3.0, scale=0.3)])
def test_backward_with_alibi_equals_attention_backward_around_the_tile_edges(block, options):
    rng = np.random.default_rng(50)
    for n_q, n_k in [(1, 1), (9, 17), (17, 9), (33, 31)]:
        q, k, v = qkv(rng, n_q, n_k, 4, 3, lead_q=(2, 3), lead_kv=(2, 3))
        q *= 2
        for slopes in (rng.uniform(0, 1, 3), rng.uniform(0, 1, (2, 3))):
            got, d_out = grads(rng, q, k, v, block=block, alibi_slopes=slopes, **options)
            want = attention_backward(q, k, v, d_out, alibi_slopes=slopes, **options)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, **GRAD_TOL[np.float64])


def test_backward_of_rows_that_see_nothing_and_of_no_keys_is_zero():
    rng = np.random.default_rng(44)
    q, k, v = qkv(rng, 12, 4)
    (dq, dk, dv), _ = grads(rng, q, k, v, block=(4, 2), window=(1, 0))  # queries 5 … 11 see nothing
    assert (dq[5:] == 0).all() and np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    q, k, v = qkv(rng, 5, 0, 4, 3)
    (dq, dk, dv), _ = grads(rng, q, k, v, block=4)
    assert dq.shape == (5, 4) and (dq == 0).all() and dk.shape == (0, 4) and dv.shape == (0, 3)


@pytest.mark.parametrize("causal", [False, True])
def test_threaded_backward_equals_the_reference_and_is_deterministic(causal):
    rng = np.random.default_rng(45)
    q, k, v = qkv(rng, 256, 256, lead_q=(2, 2), lead_kv=(2, 1), dtype=np.float32)  # 4 × 256² scores
    out, lse = flash_attention(q, k, v, return_lse=True, causal=causal)
    d_out = rng.standard_normal(out.shape).astype(np.float32)

    def on_two_threads():
        with new_threads(meet=2) as pool:
            grads = flash_attention_backward(q, k, v, out, lse, d_out, causal=causal, block=(16, 8),
                                             threads=2)
        assert len(pool) == 2
        return grads

    first, again = on_two_threads(), on_two_threads()
    for g, a, want in zip(first, again, attention_backward(q, k, v, d_out, causal=causal), strict=True):
        np.testing.assert_allclose(g, want, **GRAD_TOL[np.float32])
        np.testing.assert_array_equal(g, a)


def test_backward_lets_nan_through_where_the_reference_has_it():
    rng = np.random.default_rng(46)
    q, k, v = qkv(rng, 24, 24, 4, 3)
    k[17, 0] = np.nan  # under the causal mask only queries ≥ 17 see it
    (dq, dk, dv), d_out = grads(rng, q, k, v, block=(8, 4), causal=True)
    want = attention_backward(q, k, v, d_out, causal=True)
    for g, w in zip((dq, dk, dv), want, strict=True):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    assert np.isnan(dq[17:]).all() and np.isfinite(dv).sum() == 0  # every value reached a NaN row


@pytest.mark.parametrize("causal", [False, True])
def test_backward_memory_grows_with_the_tile_not_with_n_squared(causal):
    # At n = 4096 the float32 pattern is 64 MiB. The backward holds dq, dk, dv, one more dq per
    # extra thread, q·scale and [dO, −D] (each 4096 × 16 or 17 × 4 B ≈ 0.27 MiB), lse and three
    # 1024 × 256 float32 tiles (1 MiB each) per thread, of two.
    n = 4096
    rng = np.random.default_rng(47)
    q, k, v = qkv(rng, n, n, 16, 16, dtype=np.float32)
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    d_out = rng.standard_normal(out.shape).astype(np.float32)
    tracemalloc.start()
    try:
        flash_attention_backward(q, k, v, out, lse, d_out, causal=causal, threads=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 * 2**20, f"peak {peak / 2**20:.1f} MiB"


@pytest.mark.parametrize(
    ("change", "error", "says"),
    [
        (dict(lse=np.zeros((4,))), ValueError, r"lse must have shape \(..., n_q\) = \(3,\)"),
        (dict(lse=np.zeros((3,), dtype=np.float32)), TypeError, "lse must have the dtype flash_attention"),
        (dict(lse=1.0), TypeError, "lse must be an array"),
        (dict(out=np.zeros((3, 3))), ValueError, "out must have the shape of the attention output"),
        (dict(d_out=np.zeros((3, 2), dtype=np.float32)), TypeError, "d_out must have the dtype of q"),
        (dict(block=0), ValueError, "block must be a positive integer or a pair"),
        (dict(window=(0, -1)), ValueError, "window must be"),
        (dict(alibi_slopes=np.ones(2)), ValueError, r"alibi_slopes must have shape \(heads,\) = \(1,\)"),
    ],
)
def test_backward_refuses_bad_input_by_name(change, error, says):
    q, k, v = qkv(np.random.default_rng(48), 3, 3, 4, 2)
    out, lse = flash_attention(q, k, v, return_lse=True)
    args = dict(out=out, lse=lse, d_out=np.ones_like(out)) | change
    options = {key: args.pop(key) for key in ("block", "window", "alibi_slopes") if key in args}
    with pytest.raises(error, match=says):
        flash_attention_backward(q, k, v, args["out"], args["lse"], args["d_out"], **options)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_of_no_queries_is_empty_dq_and_zero_dk_dv(causal):
    # n_q = 0 (a batch whose queries are all gone): nothing reaches dk or dv, and nothing divides by n_q.
    rng = np.random.default_rng(49)
    q, k, v = qkv(rng, 0, 5, 4, 3, lead_q=(2,), lead_kv=(2,))
    (dq, dk, dv), _ = grads(rng, q, k, v, block=4, causal=causal)
    assert dq.shape == (2, 0, 4) and dk.shape == (2, 5, 4) and dv.shape == (2, 5, 3)
    assert not dk.any() and not dv.any()


# --- equal to attention on plain inputs ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n_q", "n_k"), [(1, 1), (13, 13), (70, 45), (45, 70), (129, 129)])
def test_flash_equals_attention(dtype, causal, n_q, n_k):
    q, k, v = qkv(np.random.default_rng(n_q * 1000 + n_k), n_q, n_k, 16, 5, lead_q=(2,), lead_kv=(2,),
                  dtype=dtype)
    tol = 2e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(
        flash_attention(q, k, v, causal=causal, block=32), attention(q, k, v, causal=causal), atol=tol
    )


# --- argument checks and tilings at their edges: the first value past each boundary -------------


def _qkv(*lead: int, n_q: int = 5, n_k: int = 6, d: int = 3, kv_heads: int | None = None):
    rng = np.random.default_rng(sum(lead) + n_q + n_k)
    kv_lead = (*lead[:-1], kv_heads) if kv_heads else lead
    return (rng.standard_normal((*lead, n_q, d)), rng.standard_normal((*kv_lead, n_k, d)),
            rng.standard_normal((*kv_lead, n_k, d + 1)))


@pytest.mark.parametrize("block", [0, (0, 4), (4, 0), -1, (2, 2, 2), True, 2.0])
def test_flash_block_must_be_positive_integers(block):
    from impl import flash_attention

    x = np.ones((3, 2))
    with pytest.raises(ValueError, match="block"):
        flash_attention(x, x, x, block=block)


def test_flash_accepts_one_by_one_tiles():
    from impl import attention, flash_attention

    q, k, v = _qkv(2, n_q=3, n_k=4)
    got = flash_attention(q, k, v, causal=True, block=1)
    np.testing.assert_allclose(got, attention(q, k, v, causal=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("window", [(3, 0), (0, 2), (2, 5)])
def test_flash_window_across_key_tiles(window):
    from impl import attention, flash_attention

    q, k, v = _qkv(2, n_q=19, n_k=21)
    got = flash_attention(q, k, v, window=window, block=(4, 8))
    np.testing.assert_allclose(got, attention(q, k, v, window=window), rtol=1e-12, atol=1e-12)


def test_flash_lse_of_a_row_that_sees_nothing_is_minus_infinity():
    from impl import attention, flash_attention

    q, k, v = _qkv(2, n_q=6, n_k=4)
    _, lse = flash_attention(q, k, v, window=(0, 0), return_lse=True)
    _, want = attention(q, k, v, window=(0, 0), return_lse=True)
    assert np.all(np.isneginf(lse[:, 4:]))
    np.testing.assert_allclose(lse, want, rtol=1e-12)


def test_flash_backward_is_not_causal_by_default():
    from impl import flash_attention
    from impl.flash import flash_attention_backward
    from impl.grad import attention_backward

    q, k, v = _qkv(2, n_q=4, n_k=4)
    d_out = np.ones((2, 4, 4))
    out, lse = flash_attention(q, k, v, return_lse=True)
    got = flash_attention_backward(q, k, v, out, lse, d_out)
    for g, w in zip(got, attention_backward(q, k, v, d_out), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attention_chunk", [1, 3, 8, 16, 50])
def test_backward_with_a_chunk_equals_attention_backward_with_its_mask(causal, attention_chunk):
    rng = np.random.default_rng(43)
    for n_q, n_k in [(17, 17), (33, 16), (9, 40)]:
        q, k, v = qkv(rng, n_q, n_k, 4, 3)
        got, d_out = grads(rng, q, k, v, block=(8, 8), causal=causal, attention_chunk=attention_chunk)
        mask = visible(n_q, n_k, causal=causal, attention_chunk=attention_chunk)
        want = attention_backward(q, k, v, d_out, mask=mask)
        by_keyword = attention_backward(q, k, v, d_out, causal=causal, attention_chunk=attention_chunk)
        for g, w, by_chunk in zip(got, want, by_keyword, strict=True):
            np.testing.assert_allclose(g, w, **GRAD_TOL[np.float64])
            np.testing.assert_allclose(by_chunk, w, **GRAD_TOL[np.float64])


# --- split-KV: num_splits ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_splits", [2, 3, 7, 40])
def test_num_splits_equals_one_split_to_rounding(dtype, causal, num_splits):
    """Each split's state merged by its LSE gives the unsplit output and LSE, whatever the count
    (more splits than tiles: empty splits are the merge's identity), with a partial last tile."""
    rng = np.random.default_rng(74)
    q, k, v = qkv(rng, 21, 45, lead_q=(2,), lead_kv=(2,), dtype=dtype)
    want, want_lse = attention(q, k, v, causal=causal, return_lse=True)
    one, one_lse = flash_attention(q, k, v, causal=causal, block=(8, 8), return_lse=True)
    got, lse = flash_attention(q, k, v, causal=causal, block=(8, 8), num_splits=num_splits, return_lse=True)
    np.testing.assert_allclose(got, want, **TOL[dtype])
    np.testing.assert_allclose(lse, want_lse, **TOL[dtype])
    np.testing.assert_allclose(got, one, **TOL[dtype])
    np.testing.assert_allclose(lse, one_lse, **TOL[dtype])


def test_split_edges_cut_the_keys_into_contiguous_near_equal_splits_covering_every_key():
    from impl.flash import split_edges

    assert split_edges(45, 3) == [(0, 15), (15, 30), (30, 45)]
    assert split_edges(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert split_edges(45, 1) == [(0, 45)]
    assert split_edges(2, 4) == [(0, 0), (0, 1), (1, 1), (1, 2)]  # more splits than keys: some empty


def test_num_splits_over_a_paged_cache_equals_one_split_to_rounding():
    from paged_caches import draw_seqs, lengths_of, paged

    rng = np.random.default_rng(75)
    k_seqs, v_seqs = draw_seqs(rng, [13, 30], 1, 8), draw_seqs(rng, [13, 30], 1, 8)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 4, rng)
    q = rng.standard_normal((2, 2, 5, 8))
    options = dict(block_table=table, kv_lengths=lengths_of(k_seqs), causal=True, block=(4, 4))
    one = flash_attention(q, k_pool, v_pool, **options)
    np.testing.assert_allclose(flash_attention(q, k_pool, v_pool, **options, num_splits=3), one,
                               **TOL[np.float64])


@pytest.mark.parametrize("num_splits", [0, -1, 1.5, True, "2", None])
def test_bad_num_splits_is_refused_and_named(num_splits):
    q, k, v = qkv(np.random.default_rng(76), 3, 3)
    with pytest.raises(ValueError, match="num_splits must be an integer >= 1"):
        flash_attention(q, k, v, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [2, 5])
def test_num_splits_with_a_sparse_selection_splits_the_list_entries(num_splits):
    rng = np.random.default_rng(77)
    q, k, v = qkv(rng, 6, 40, lead_q=(2,), lead_kv=(2,))
    indices = rng.integers(-1, 40, size=(2, 6, 20))
    one = flash_attention(q, k, v, topk_indices=indices, block=(4, 4))
    got = flash_attention(q, k, v, topk_indices=indices, block=(4, 4), num_splits=num_splits)
    np.testing.assert_allclose(got, one, **TOL[np.float64])
