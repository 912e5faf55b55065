"""PyTorch's FlexAttention over a paged cache (spec.adapters.torch_flex.torch_flex_paged_attention) against
impl's paged path, and what it reads that it should not.

The eager path runs on a handful of shapes (decode, chunked prefill, grouped heads, block sizes 1 and
not dividing the lengths, a window, float8). The compiled path — the fused kernel, ~15 s of
compilation per new shape on this CPU — runs on one shape: its agreement, and the two reads
measured on torch 2.13.0: the eager path reads every physical block (a NaN in a block nobody owns
reaches every row), and the compiled kernel skips unowned blocks but reads the values in the tail of
a sequence's last block (a NaN there reaches that sequence; one in the keys' tail does not).
"""

import numpy as np
import pytest
from paged_caches import draw_seqs, paged

from impl import attention

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from spec.adapters.torch_flex import torch_flex_paged_attention  # noqa: E402  (needs torch)

# (lengths, h, g, n_q, block_size, keywords)
SHAPES = [
    ([9, 1, 30], 4, 2, 1, 4, {"causal": True}),  # decode
    ([3, 10, 5], 2, 1, 3, 4, {"causal": True}),  # chunked prefill, a query before row 0's start
    ([7, 12], 3, 3, 2, 1, {}),  # block size 1
    ([7, 12, 0], 4, 1, 2, 5, {"causal": True}),  # 5 divides no length; an empty sequence
    ([11, 6], 2, 2, 3, 3, {"causal": True, "window": (2, 0)}),
]


def problem(lengths, h, g, n_q, block_size, *, seed=0, fill=0.0, d=8):
    rng = np.random.default_rng(seed)
    k_seqs, v_seqs = draw_seqs(rng, lengths, g, d, np.float32), draw_seqs(rng, lengths, g, d, np.float32)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, block_size, rng, fill=fill)
    q = rng.standard_normal((len(lengths), h, n_q, d)).astype(np.float32)
    return q, k_pool, v_pool, table, np.array(lengths, dtype=np.int32)


def both(q, k_pool, v_pool, table, lengths, *, compiled, **kw):
    flex = torch_flex_paged_attention(q, k_pool, v_pool, block_table=table, kv_lengths=lengths,
                                      compiled=compiled, **kw)
    reference = attention(q, k_pool, v_pool, block_table=table, kv_lengths=lengths, **kw)
    return flex, reference


@pytest.mark.parametrize(("lengths", "h", "g", "n_q", "block_size", "kw"), SHAPES)
def test_eager_flex_attention_agrees_with_the_reference(lengths, h, g, n_q, block_size, kw):
    flex, reference = both(*problem(lengths, h, g, n_q, block_size), compiled=False, **kw)
    assert flex.dtype == np.float32 and flex.shape == reference.shape
    np.testing.assert_allclose(flex, reference, rtol=2e-6, atol=2e-6)


def test_eager_flex_attention_with_a_float8_cache():
    q, k_pool, v_pool, table, lengths = problem([9, 4], 4, 2, 2, 4, seed=1)
    rng = np.random.default_rng(2)
    descales = {name: rng.uniform(0.2, 3.0, (2, 2)).astype(np.float32) for name in ("k_descale", "v_descale")}
    k8, v8 = k_pool.astype(ml_dtypes.float8_e4m3fn), v_pool.astype(ml_dtypes.float8_e4m3fn)
    flex, reference = both(q, k8, v8, table, lengths, compiled=False, causal=True, **descales)
    np.testing.assert_allclose(flex, reference, rtol=2e-6, atol=2e-6)
    swapped = torch_flex_paged_attention(q, k8, v8, block_table=table, kv_lengths=lengths, causal=True,
                                         compiled=False, k_descale=descales["v_descale"],
                                         v_descale=descales["k_descale"])
    assert np.abs(swapped - reference).max() > 1e-2  # the comparison above can tell the scales apart


def with_nan(pool, table, lengths, *, tails):
    """``pool`` with NaN in the blocks nobody owns, or (tails=True) in each last block's tail."""
    pool = pool.copy()
    block_size = pool.shape[1]
    owned = {int(table[b, i]) for b, n in enumerate(lengths) for i in range(-(-int(n) // block_size))}
    if not tails:
        pool[sorted(set(range(len(pool))) - owned)] = np.nan
        return pool
    for b, n in enumerate(lengths):
        if n % block_size:
            pool[table[b, (n - 1) // block_size], n % block_size:] = np.nan
    return pool


def test_eager_flex_attention_reads_blocks_nobody_owns():
    q, k_pool, v_pool, table, lengths = problem([7, 12], 2, 2, 2, 4)
    nan_pool = with_nan(v_pool, table, lengths, tails=False)
    out = torch_flex_paged_attention(q, k_pool, nan_pool, block_table=table, kv_lengths=lengths,
                                     compiled=False)
    assert np.isnan(out).all()  # a finding: the unfused path computes over the whole pool


def test_compiled_flex_attention_agrees_and_reads_only_the_value_tails():
    """One shape, so one compilation. Row 0 (7 keys in blocks of 4) has a tail of one position, row
    1 (12 keys) none."""
    q, k_pool, v_pool, table, lengths = problem([7, 12], 4, 2, 3, 4)
    run = dict(block_table=table, kv_lengths=lengths, causal=True, compiled=True)
    flex, reference = both(q, k_pool, v_pool, table, lengths, compiled=True, causal=True)
    np.testing.assert_allclose(flex, reference, rtol=2e-6, atol=2e-6)
    unowned = torch_flex_paged_attention(q, with_nan(k_pool, table, lengths, tails=False),
                                         with_nan(v_pool, table, lengths, tails=False), **run)
    np.testing.assert_array_equal(unowned, flex)  # blocks outside the block mask are never visited
    key_tails = torch_flex_paged_attention(q, with_nan(k_pool, table, lengths, tails=True), v_pool, **run)
    np.testing.assert_array_equal(key_tails, flex)  # masked scores: a NaN key never counts
    value_tails = torch_flex_paged_attention(q, k_pool, with_nan(v_pool, table, lengths, tails=True), **run)
    # a finding: weight 0 times a NaN value in the tail of row 0's last block
    assert np.isnan(value_tails[0]).all() and not np.isnan(value_tails[1]).any()


def test_the_flex_paged_target_runs_the_plain_laws_through_one_block_per_row():
    import spec
    from spec.builtin import load_target

    target = load_target("torch_flex_paged")
    report = spec.check(target, profile="quick", max_examples=4,
                        only=["matches_golden", "causal_no_leak", "window_matches_golden"])
    assert report.ok, [r.message for r in report.failures]


def test_the_flex_paged_target_reads_blocks_its_sequences_do_not_own():
    """The finding (docs/peers.md): the eager path reads the whole pool, so a NaN in a block no
    sequence owns reaches the output, which the paged laws draw on purpose."""
    import spec
    from spec.builtin import load_target

    target = load_target("torch_flex_paged")
    (result,) = spec.check(target, profile="quick", max_examples=4, only=["paged_matches_golden"]).results
    assert result.status == "xfail" and "nan" in result.message  # declared: the run conforms
    assert "masks afterwards" in result.expected
    (result,) = spec.check(target.replace(expected_failures={}), profile="quick", max_examples=4,
                           only=["paged_matches_golden"]).results
    assert result.status == "fail"


def test_the_flex_paged_target_names_the_torch_extra_when_torch_is_missing(monkeypatch):
    import sys

    from spec.builtin import load_target
    from spec.target import TargetError

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(TargetError,
                       match=r"built-in target 'torch_flex_paged' needs torch.*attention-spec\[torch\]"):
        load_target("torch_flex_paged")


# --- FlexAttention given top-k lists (spec.adapters.torch_flex_sparse) ---------------------------


def test_the_lists_table_is_each_read_entry_in_range():
    from spec.adapters.torch_flex_sparse import block_table, listed_table

    idx = np.array([[[[3, -1, 0, 9], [2, 2, 1, 0]]]])  # [1, 1, 2, 4], n_k = 4
    table = listed_table(idx, 4, np.array([[4, 2]])).numpy()
    np.testing.assert_array_equal(table[0, 0].astype(int), [[1, 0, 0, 1], [0, 0, 1, 0]])
    blocks = block_table(np.array([[[[1, -1], [0, 5]]]]), 3, 5).numpy()  # blocks of 3 over 5 keys
    np.testing.assert_array_equal(blocks[0, 0].astype(int), [[0, 0, 0, 1, 1], [1, 1, 1, 0, 0]])


def test_flex_with_lists_matches_a_dense_masked_softmax_with_grouped_heads():
    from spec.adapters.torch_flex_sparse import torch_flex_sparse

    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)))
    idx = rng.integers(-2, 9, size=(2, 2, 5, 3)).astype(np.int32)
    idx[0, 0, 0] = -1  # a row that lists no key: zeros
    listed = np.zeros((2, 2, 5, 7), dtype=bool)
    for at in np.ndindex(2, 2, 5):
        listed[at][[j for j in idx[at] if 0 <= j < 7]] = True
    out, lse = torch_flex_sparse(q, k, v, topk_indices=idx, causal=True, return_lse=True)
    want = attention(q, k, v, mask=np.repeat(listed, 2, axis=1), causal=True)
    np.testing.assert_allclose(out, want, atol=1e-12)
    assert not out[0, :2, 0].any() and np.isneginf(lse[0, :2, 0]).all()


def test_the_flex_topk_target_conforms_to_the_sparse_laws():
    import spec

    laws = [name for name in spec.LAWS if name.startswith("topk")]
    report = spec.check("torch_flex_topk", profile="quick", max_examples=4, only=laws)
    assert report.ok, [r.message for r in report.failures]
    assert sum(r.status == "pass" for r in report.results) == len(laws) - 1  # no backward on the CPU
