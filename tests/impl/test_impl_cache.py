"""Paged and float8 KV caches in impl.attention and impl.flash_attention, and the per-sequence
diagonal (align="kv_lengths").

Each test builds its cache the other way round from impl: it draws each sequence's keys first and
scatters them into a shuffled pool of blocks, so the expected keys are known without impl's
gather. ``golden`` is a loop over (b, h, i, j) in float64 written from the definitions (diagonal
``i + kv_lengths[b] − n_q``), sharing no code with impl. Every position of the pool that no
sequence owns — unused blocks and the tail of each last block — holds NaN unless a test says
otherwise: a read of one shows up as NaN in the output.
"""

import math

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from paged_caches import draw_seqs, lengths_of, paged

from impl import attention, attention_backward, causal_mask, flash_attention, sliding_window_mask

ml_dtypes = pytest.importorskip("ml_dtypes")
FLOAT8 = ml_dtypes.float8_e4m3fn


# --- the golden ----------------------------------------------------------------------------------------


def golden(q, k_seqs, v_seqs, *, causal=False, window=None, align="kv_lengths", scale=None, slopes=None,
           softcap=None, attention_chunk=None):
    """(out, lse) float64 for q [B, H, n_q, d_k] and per-sequence keys/values [L_b, g, d];
    ``softcap`` c: each score s becomes c·tanh(s/c); then ``slopes [B, H]``: ALiBi's
    −slope·|i + L_b − n_q − j| added to it."""
    b_, h_, n_q, d_k = q.shape
    g_ = k_seqs[0].shape[1]
    scale = 1 / math.sqrt(d_k) if scale is None else scale
    out = np.zeros((b_, h_, n_q, v_seqs[0].shape[-1]))
    lse = np.full((b_, h_, n_q), -math.inf)
    for b in range(b_):
        n_k = len(k_seqs[b])
        for h in range(h_):
            kv = h // (h_ // g_)
            for i in range(n_q):
                diag = i + n_k - n_q if align == "kv_lengths" else i
                logits = {}
                for j in range(n_k):
                    if causal and j > diag:
                        continue
                    if window is not None and not diag - window[0] <= j <= diag + window[1]:
                        continue
                    if attention_chunk is not None and diag // attention_chunk != j // attention_chunk:
                        continue  # Python's // floors: a query before the first key has no chunk's keys
                    logits[j] = scale * sum(float(q[b, h, i, t]) * float(k_seqs[b][j, kv, t])
                                            for t in range(d_k))
                    if softcap is not None:
                        logits[j] = softcap * math.tanh(logits[j] / softcap)
                    if slopes is not None:
                        logits[j] -= float(slopes[b, h]) * abs(i + n_k - n_q - j)
                if not logits:
                    continue
                m = max(logits.values())
                lse[b, h, i] = m + math.log(sum(math.exp(s - m) for s in logits.values()))
                for j, s in logits.items():
                    out[b, h, i] += math.exp(s - lse[b, h, i]) * v_seqs[b][j, kv].astype(np.float64)
    return out, lse


@st.composite
def paged_problems(draw):
    """A batch of sequences of drawn lengths (0 included) in a shuffled pool of drawn block size."""
    b, g = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    h = g * draw(st.integers(1, 3))
    n_q = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(0, 11), min_size=b, max_size=b))
    block_size = draw(st.sampled_from([1, 2, 3, 4, 5, 16]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    k_seqs, v_seqs = draw_seqs(rng, lengths, g, 3), draw_seqs(rng, lengths, g, 2)
    q = rng.standard_normal((b, h, n_q, 3))
    window = st.none() | st.tuples(st.integers(0, 4), st.integers(0, 4))
    kw = {"causal": draw(st.booleans()), "window": draw(window),
          "attention_chunk": draw(st.none() | st.integers(1, 6))}
    note({"lengths": lengths, "block_size": block_size, "h": h, "g": g, "n_q": n_q, **kw})
    return q, k_seqs, v_seqs, block_size, rng, kw


# --- the paged path against the golden ----------------------------------------------------------------


@given(paged_problems())
def test_paged_attention_equals_the_golden_over_the_sequences_keys(problem):
    q, k_seqs, v_seqs, block_size, rng, kw = problem
    k_pool, v_pool, table = paged(k_seqs, v_seqs, block_size, rng)
    out, lse = attention(q, k_pool, v_pool, block_table=table, kv_lengths=lengths_of(k_seqs),
                         return_lse=True, **kw)
    gold_out, gold_lse = golden(q, k_seqs, v_seqs, **kw)
    np.testing.assert_allclose(out, gold_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, gold_lse, rtol=1e-12, atol=1e-12)


@given(paged_problems())
def test_paged_flash_attention_equals_the_golden(problem):
    q, k_seqs, v_seqs, block_size, rng, kw = problem
    k_pool, v_pool, table = paged(k_seqs, v_seqs, block_size, rng)
    out, lse = flash_attention(q, k_pool, v_pool, block_table=table, kv_lengths=lengths_of(k_seqs),
                               block=(2, 3), return_lse=True, **kw)
    gold_out, gold_lse = golden(q, k_seqs, v_seqs, **kw)
    np.testing.assert_allclose(out, gold_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, gold_lse, rtol=1e-12, atol=1e-12)


def test_top_left_alignment_over_a_paged_cache_is_the_contiguous_one():
    rng = np.random.default_rng(1)
    k_seqs, v_seqs = draw_seqs(rng, [5, 9], 1, 4), draw_seqs(rng, [5, 9], 1, 4)
    q = rng.standard_normal((2, 2, 3, 4))
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 4, rng)
    out = attention(q, k_pool, v_pool, block_table=table, kv_lengths=[5, 9], causal=True, align="top_left")
    np.testing.assert_allclose(out, golden(q, k_seqs, v_seqs, causal=True, align="top_left")[0], rtol=1e-12)


# --- what the table may do without changing a bit -------------------------------------------------------


@pytest.mark.parametrize("fn", [attention, flash_attention])
def test_reordering_the_physical_blocks_changes_no_bit(fn):
    rng = np.random.default_rng(2)
    lengths = [13, 1, 0, 8]
    k_seqs, v_seqs = draw_seqs(rng, lengths, 2, 4), draw_seqs(rng, lengths, 2, 3)
    q = rng.standard_normal((4, 4, 3, 4))
    results = []
    for seed in range(3):  # three different shuffles of the same logical cache
        k_pool, v_pool, table = paged(k_seqs, v_seqs, 3, np.random.default_rng(seed))
        results.append(fn(q, k_pool, v_pool, block_table=table, kv_lengths=lengths, causal=True))
    assert not np.array_equal(*(paged(k_seqs, v_seqs, 3, np.random.default_rng(s))[2] for s in (0, 1)))
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


@pytest.mark.parametrize("fn", [attention, flash_attention])
def test_the_block_size_changes_no_bit(fn):
    rng = np.random.default_rng(3)
    lengths = [7, 12, 1]
    k_seqs, v_seqs = draw_seqs(rng, lengths, 1, 4), draw_seqs(rng, lengths, 1, 4)
    q = rng.standard_normal((3, 2, 2, 4))
    results = []
    for block_size in (1, 5, 12, 32):  # 5 divides none of the lengths; 32 holds each in one block
        k_pool, v_pool, table = paged(k_seqs, v_seqs, block_size, rng)
        results.append(fn(q, k_pool, v_pool, block_table=table, kv_lengths=lengths, causal=True))
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


@pytest.mark.parametrize("fn", [attention, flash_attention])
@pytest.mark.parametrize("fill", [np.nan, np.inf, 1e30])
def test_unowned_positions_are_never_read(fn, fill):
    rng = np.random.default_rng(4)
    lengths = [6, 3, 0]  # block size 4: two tails (6 → 2 left, 3 → 1 left) and spare blocks
    k_seqs, v_seqs = draw_seqs(rng, lengths, 2, 4), draw_seqs(rng, lengths, 2, 4)
    q = rng.standard_normal((3, 2, 2, 4))
    clean_k, clean_v, table = paged(k_seqs, v_seqs, 4, np.random.default_rng(0), fill=0.0)
    dirty_k, dirty_v, dirty_table = paged(k_seqs, v_seqs, 4, np.random.default_rng(0), fill=fill)
    dirty_table[dirty_table < 0] = 10**6  # entries past a sequence's blocks: any integer at all
    for causal in (False, True):
        want = fn(q, clean_k, clean_v, block_table=table, kv_lengths=lengths, causal=causal)
        got = fn(q, dirty_k, dirty_v, block_table=dirty_table, kv_lengths=lengths, causal=causal)
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, want)


def test_sequences_may_share_blocks():
    """Prefix sharing: two rows listing the same physical blocks read the same keys."""
    rng = np.random.default_rng(5)
    k_seqs, v_seqs = draw_seqs(rng, [8], 1, 4), draw_seqs(rng, [8], 1, 4)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 4, rng)
    q = np.repeat(rng.standard_normal((1, 1, 2, 4)), 2, axis=0)
    shared = np.repeat(table, 2, axis=0)
    out = attention(q, k_pool, v_pool, block_table=shared, kv_lengths=[8, 5], causal=True)
    want = golden(q, [k_seqs[0], k_seqs[0][:5]], [v_seqs[0], v_seqs[0][:5]], causal=True)[0]
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


# --- causal attention aligned per sequence: decode and chunked prefill ------------------------------------


@pytest.mark.parametrize("fn", [attention, flash_attention])
def test_decoding_one_query_sees_its_whole_sequence(fn):
    rng = np.random.default_rng(6)
    lengths = [1, 9, 30]
    k_seqs, v_seqs = draw_seqs(rng, lengths, 2, 4), draw_seqs(rng, lengths, 2, 3)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 4, rng)
    q = rng.standard_normal((3, 4, 1, 4))
    causal = fn(q, k_pool, v_pool, block_table=table, kv_lengths=lengths, causal=True)
    np.testing.assert_array_equal(causal, fn(q, k_pool, v_pool, block_table=table, kv_lengths=lengths))
    np.testing.assert_allclose(causal, golden(q, k_seqs, v_seqs)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", [attention, flash_attention])
def test_a_chunked_prefill_sees_up_to_its_own_position(fn):
    """Three new queries at the end of each sequence: query i sees keys j <= i + L_b - 3."""
    rng = np.random.default_rng(7)
    lengths = [3, 10, 5]
    k_seqs, v_seqs = draw_seqs(rng, lengths, 1, 4), draw_seqs(rng, lengths, 1, 3)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 4, rng)
    q = rng.standard_normal((3, 2, 3, 4))
    out = fn(q, k_pool, v_pool, block_table=table, kv_lengths=lengths, causal=True)
    for b in range(len(lengths)):  # each sequence alone, bottom-right over exactly its keys
        alone = attention(q[b], np.swapaxes(k_seqs[b], 0, 1), np.swapaxes(v_seqs[b], 0, 1),
                          causal=True, align="bottom_right")
        np.testing.assert_allclose(out[b], alone, rtol=1e-12, atol=1e-12)
    # the last query of every row sees all its keys, the first one all but the last two
    np.testing.assert_allclose(out[:, :, -1], golden(q[:, :, -1:], k_seqs, v_seqs)[0][:, :, 0], rtol=1e-12)


@pytest.mark.parametrize("fn", [attention, flash_attention])
def test_queries_before_the_cache_start_see_nothing(fn):
    rng = np.random.default_rng(8)
    k_seqs, v_seqs = draw_seqs(rng, [2, 0], 1, 4), draw_seqs(rng, [2, 0], 1, 3)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 2, rng)
    q = rng.standard_normal((2, 1, 4, 4))  # n_q = 4 > kv_lengths: queries 0, 1 of row 0 come first
    out, lse = fn(q, k_pool, v_pool, block_table=table, kv_lengths=[2, 0], causal=True, return_lse=True)
    np.testing.assert_array_equal(out[0, 0, :2], 0)
    np.testing.assert_array_equal(lse[0, 0, :2], -np.inf)
    assert np.all(np.isfinite(lse[0, 0, 2:]))
    np.testing.assert_array_equal(out[1], 0)  # an empty sequence: zeros
    np.testing.assert_allclose(out, golden(q, k_seqs, v_seqs, causal=True)[0], rtol=1e-12, atol=1e-12)


def test_a_window_is_aligned_per_sequence_too():
    rng = np.random.default_rng(9)
    lengths = [4, 11]
    k_seqs, v_seqs = draw_seqs(rng, lengths, 1, 4), draw_seqs(rng, lengths, 1, 3)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 3, rng)
    q = rng.standard_normal((2, 1, 2, 4))
    for kw in ({"window": (2, 0)}, {"window": (1, 1), "causal": True}):
        out = attention(q, k_pool, v_pool, block_table=table, kv_lengths=lengths, **kw)
        np.testing.assert_allclose(out, golden(q, k_seqs, v_seqs, **kw)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", [attention, flash_attention])
def test_alibi_over_a_paged_cache_is_measured_from_each_sequences_diagonal(fn):
    rng = np.random.default_rng(12)
    lengths = [7, 2, 0]
    k_seqs, v_seqs = draw_seqs(rng, lengths, 2, 4), draw_seqs(rng, lengths, 2, 3)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 3, rng)
    q = rng.standard_normal((3, 4, 3, 4))
    slopes = rng.random((3, 4))
    for kw in ({}, {"causal": True}, {"window": (1, 0), "softcap": 2.0}):
        out = fn(q, k_pool, v_pool, block_table=table, kv_lengths=lengths, alibi_slopes=slopes, **kw)
        wanted = golden(q, k_seqs, v_seqs, slopes=slopes, **kw)[0]
        np.testing.assert_allclose(out, wanted, rtol=1e-12, atol=1e-12)


# --- align="kv_lengths" for contiguous keys ---------------------------------------------------------------


def loop_mask(n_q, n_k, lengths, sees):
    """[batch, 1, n_q, n_k] from the definition, with diag = i + lengths[b] - n_q."""
    out = np.zeros((len(lengths), 1, n_q, n_k), dtype=bool)
    for b, n in enumerate(lengths):
        for i in range(n_q):
            for j in range(n_k):
                out[b, 0, i, j] = sees(i + n - n_q, j)
    return out


@pytest.mark.parametrize(("n_q", "n_k", "lengths"),
                         [(1, 5, [0, 3, 5]), (3, 6, [1, 6]), (4, 4, [2]), (0, 3, [3])])
def test_the_kv_lengths_diagonal_masks_are_the_definition(n_q, n_k, lengths):
    got = causal_mask(n_q, n_k, align="kv_lengths", kv_lengths=np.array(lengths))
    np.testing.assert_array_equal(got, loop_mask(n_q, n_k, lengths, lambda d, j: j <= d))
    got = sliding_window_mask(n_q, n_k, window=(1, 2), align="kv_lengths", kv_lengths=np.array(lengths))
    np.testing.assert_array_equal(got, loop_mask(n_q, n_k, lengths, lambda d, j: d - 1 <= j <= d + 2))


def test_kv_lengths_alignment_of_contiguous_keys():
    rng = np.random.default_rng(10)
    lengths = np.array([2, 7, 5])
    q, k, v = (rng.standard_normal(shape) for shape in ((3, 2, 3, 4), (3, 2, 7, 4), (3, 2, 7, 3)))
    out = attention(q, k, v, causal=True, kv_lengths=lengths, align="kv_lengths")
    seqs = [np.swapaxes(k[b, :, :n], 0, 1) for b, n in enumerate(lengths)]
    vals = [np.swapaxes(v[b, :, :n], 0, 1) for b, n in enumerate(lengths)]
    np.testing.assert_allclose(out, golden(q, seqs, vals, causal=True)[0], rtol=1e-12, atol=1e-12)
    # with every length n_k it is plain bottom-right
    full = np.full(3, 7)
    np.testing.assert_array_equal(attention(q, k, v, causal=True, kv_lengths=full, align="kv_lengths"),
                                  attention(q, k, v, causal=True, kv_lengths=full, align="bottom_right"))


# --- float8 caches ------------------------------------------------------------------------------------


def float8_problem(rng, lengths, h, g, d=4):
    """Sequences already representable in e4m3 (so the golden needs no rounding), and their descales."""
    k_seqs = [rng.standard_normal((n, g, d)).astype(FLOAT8) for n in lengths]
    v_seqs = [rng.standard_normal((n, g, d)).astype(FLOAT8) for n in lengths]
    # distinct per (row, K/V head), far from 1, so any wrong index moves the result
    k_descale = rng.uniform(0.2, 3.0, (len(lengths), g)).astype(np.float32)
    v_descale = rng.uniform(0.2, 3.0, (len(lengths), g)).astype(np.float32)
    q = rng.standard_normal((len(lengths), h, 2, d)).astype(np.float32)
    return q, k_seqs, v_seqs, k_descale, v_descale


def dequantized(seqs, descale):  # the definition: x.astype(float32) · descale[b, g]
    return [s.astype(np.float32) * descale[b][None, :, None] for b, s in enumerate(seqs)]


@pytest.mark.parametrize("fn", [attention, flash_attention])
def test_a_float8_paged_cache_means_its_dequantized_values(fn):
    rng = np.random.default_rng(11)
    lengths = [5, 9, 1]
    q, k_seqs, v_seqs, k_descale, v_descale = float8_problem(rng, lengths, h=4, g=2)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 4, rng)
    out = fn(q, k_pool, v_pool, block_table=table, kv_lengths=lengths, causal=True,
             k_descale=k_descale, v_descale=v_descale)
    assert out.dtype == np.float32
    want = golden(q, dequantized(k_seqs, k_descale), dequantized(v_seqs, v_descale), causal=True)[0]
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6)
    # the law is sharp: K's and V's scales swapped, or a query head's index, give another result
    swapped = fn(q, k_pool, v_pool, block_table=table, kv_lengths=lengths, causal=True,
                 k_descale=v_descale, v_descale=k_descale)
    assert np.abs(swapped - want).max() > 1e-2


def test_descales_are_indexed_by_batch_row_and_kv_head():
    """Query heads 0, 1 read K/V head 0 and its scale; heads 2, 3 read K/V head 1 (GQA)."""
    rng = np.random.default_rng(12)
    q, k_seqs, v_seqs, _, _ = float8_problem(rng, [6, 6], h=4, g=2)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 3, rng)
    ones = np.ones((2, 2), np.float32)
    base = attention(q, k_pool, v_pool, block_table=table, kv_lengths=[6, 6], k_descale=ones, v_descale=ones)
    for b, g in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        v_descale = ones.copy()
        v_descale[b, g] = 2.0  # doubles exactly the outputs of row b, query heads 2g and 2g + 1
        out = attention(q, k_pool, v_pool, block_table=table, kv_lengths=[6, 6], k_descale=ones,
                        v_descale=v_descale)
        expected = base.copy()
        expected[b, 2 * g: 2 * g + 2] *= 2
        np.testing.assert_array_equal(out, expected)


def test_a_contiguous_float8_cache_means_its_dequantized_values():
    rng = np.random.default_rng(13)
    q, k_seqs, v_seqs, k_descale, v_descale = float8_problem(rng, [7, 7], h=3, g=1)
    k, v = (np.stack([np.swapaxes(s, 0, 1) for s in seqs]) for seqs in (k_seqs, v_seqs))  # [2, 1, 7, 4]
    for q_dtype in (np.float16, np.float32, np.float64):
        out = attention(q.astype(q_dtype), k, v, causal=True, align="kv_lengths", kv_lengths=[7, 4],
                        k_descale=k_descale, v_descale=v_descale)
        assert out.dtype == q_dtype
        cut_k = [s[:n] for s, n in zip(dequantized(k_seqs, k_descale), [7, 4], strict=True)]
        cut_v = [s[:n] for s, n in zip(dequantized(v_seqs, v_descale), [7, 4], strict=True)]
        want = golden(q.astype(q_dtype), cut_k, cut_v, causal=True)[0]
        tol = 1e-3 if q_dtype == np.float16 else 2e-6
        np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


# --- refusals -------------------------------------------------------------------------------------------


def _good():
    rng = np.random.default_rng(14)
    k_seqs, v_seqs = draw_seqs(rng, [5, 3], 2, 4), draw_seqs(rng, [5, 3], 2, 4)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, 4, rng, fill=0.0)
    return {"q": rng.standard_normal((2, 4, 2, 4)), "k": k_pool, "v": v_pool, "block_table": table,
            "kv_lengths": np.array([5, 3])}


def _float8(kw):
    return {**kw, "k": kw["k"].astype(FLOAT8), "v": kw["v"].astype(FLOAT8),
            "k_descale": np.ones((2, 2), np.float32), "v_descale": np.ones((2, 2), np.float32)}


BAD = [
    ("block_table", TypeError, lambda kw: {**kw, "block_table": kw["block_table"].astype(float)}),
    ("block_table", ValueError, lambda kw: {**kw, "block_table": kw["block_table"][0]}),
    ("block_table", ValueError, lambda kw: {**kw, "block_table": kw["block_table"][:1]}),
    ("block_table", ValueError, lambda kw: {**kw, "block_table": np.where(kw["block_table"] >= 0, 99, -1)}),
    ("block_table", ValueError, lambda kw: {**kw, "block_table": np.where(kw["block_table"] >= 0, -1, 0)}),
    ("kv_lengths is required", ValueError, lambda kw: {**kw, "kv_lengths": None}),
    ("kv_lengths", ValueError, lambda kw: {**kw, "kv_lengths": np.array([5, 9])}),  # 2 blocks of 4 < 9
    ("kv_lengths", ValueError, lambda kw: {**kw, "kv_lengths": np.array([5, -1])}),
    ("kv_lengths", ValueError, lambda kw: {**kw, "kv_lengths": np.array([5])}),
    ("kv_lengths", TypeError, lambda kw: {**kw, "kv_lengths": np.array([5.0, 3.0])}),
    ("q", ValueError, lambda kw: {**kw, "q": kw["q"][0]}),
    ("k", ValueError, lambda kw: {**kw, "k": kw["k"][0]}),
    ("k and v", ValueError, lambda kw: {**kw, "v": kw["v"][:, :2]}),
    ("d_k", ValueError, lambda kw: {**kw, "q": kw["q"][..., :3]}),
    ("k_descale is required", TypeError, lambda kw: {**_float8(kw), "k_descale": None}),
    ("v_descale is required", TypeError, lambda kw: {**_float8(kw), "v_descale": None}),
    ("k_descale is given", TypeError, lambda kw: {**kw, "k_descale": np.ones((2, 2), np.float32),
                                                  "v_descale": np.ones((2, 2), np.float32)}),
    ("k and v must both", TypeError, lambda kw: {**_float8(kw), "v": kw["v"]}),
    ("k_descale", ValueError, lambda kw: {**_float8(kw), "k_descale": np.ones((2, 4), np.float32)}),
    ("v_descale", ValueError, lambda kw: {**_float8(kw), "v_descale": np.ones(2, np.float32)}),
    ("k_descale", TypeError, lambda kw: {**_float8(kw), "k_descale": np.ones((2, 2), np.int32)}),
    (r"q's heads \(h = 3.*\(g = 2\)", ValueError, lambda kw: {**kw, "q": kw["q"][:, :3]}),  # 3 % 2
    (r"q's heads \(h = 4.*\(g = 0\)", ValueError,  # no K/V heads: not a division by zero
     lambda kw: {**kw, "k": kw["k"][:, :, :0], "v": kw["v"][:, :, :0]}),
]


@pytest.mark.parametrize("fn", [attention, flash_attention])
@pytest.mark.parametrize(("match", "error", "make"), BAD)
def test_a_bad_cache_is_refused_naming_the_argument(fn, match, error, make):
    kw = make(_good())
    q, k, v = kw.pop("q"), kw.pop("k"), kw.pop("v")
    with pytest.raises(error, match=match):
        fn(q, k, v, **kw)


def test_a_paged_cache_refuses_bottom_right_alignment():
    kw = _good()
    with pytest.raises(ValueError, match="bottom_right"):
        attention(kw.pop("q"), kw.pop("k"), kw.pop("v"), align="bottom_right", **kw)


def test_align_kv_lengths_needs_kv_lengths():
    q = np.zeros((1, 1, 2, 3))
    with pytest.raises(ValueError, match="kv_lengths"):
        attention(q, q, q, causal=True, align="kv_lengths")
    with pytest.raises(ValueError, match="kv_lengths"):
        causal_mask(2, 3, align="kv_lengths")
    with pytest.raises(ValueError, match="kv_lengths"):
        causal_mask(2, 3, kv_lengths=[1])  # top-left would silently ignore it


def test_a_float8_cache_needs_4d_inputs():
    k = np.zeros((3, 4), FLOAT8)
    with pytest.raises(ValueError, match="q of shape"):
        attention(np.zeros((2, 4)), k, k, k_descale=np.ones((1, 1)), v_descale=np.ones((1, 1)))


def test_flash_takes_cache_keywords_only_with_a_block_table():
    q = np.zeros((1, 1, 2, 3))
    for name in ("kv_lengths", "k_descale", "v_descale"):
        with pytest.raises(ValueError, match=f"{name} only with a paged cache"):
            flash_attention(q, q, q, **{name: np.ones(1)})


def test_the_backward_has_no_paged_or_float8_path():
    kw = _good()
    for name in ("block_table", "k_descale"):
        with pytest.raises(TypeError, match=name):
            attention_backward(kw["q"], kw["k"], kw["v"], np.zeros((2, 4, 2, 4)), **{name: kw["block_table"]})


@pytest.mark.parametrize("fn", [attention, flash_attention])
def test_no_queries_over_a_paged_cache_is_an_empty_result(fn):
    kw = _good()
    q, k, v = kw.pop("q")[:, :, :0], kw.pop("k"), kw.pop("v")
    out = fn(q, k, v, causal=True, **kw)
    assert out.shape == (2, 4, 0, 4) and out.dtype == q.dtype
