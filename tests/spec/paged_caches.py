"""Paged KV caches built the other way round from impl: each sequence's keys are drawn first and
scattered into a shuffled pool of blocks, so a test knows the keys without gathering them."""

import numpy as np


def scatter(seqs, block_size, *, spare=2, fill=np.nan, rng, max_blocks=None):
    """A paged pool holding ``seqs`` (per sequence [L_b, g, d]) in shuffled blocks, and its table.

    Returns (pool [num_blocks, block_size, g, d], block_table int32 [batch, max_blocks]). Unused
    table entries are -1; ``spare`` blocks belong to nobody; unowned positions hold ``fill``.
    """
    g, d = seqs[0].shape[1:]
    counts = [-(-len(s) // block_size) for s in seqs]
    max_blocks = max([*counts, 1]) if max_blocks is None else max_blocks
    num_blocks = sum(counts) + spare
    pool = np.full((num_blocks, block_size, g, d), fill, dtype=seqs[0].dtype)
    table = np.full((len(seqs), max_blocks), -1, dtype=np.int32)
    physical = iter(rng.permutation(num_blocks).tolist())
    for b, keys in enumerate(seqs):
        for logical in range(counts[b]):
            block = next(physical)
            table[b, logical] = block
            part = keys[logical * block_size:(logical + 1) * block_size]
            pool[block, : len(part)] = part
    return pool, table


def draw_seqs(rng, lengths, g, d, dtype=np.float64):
    """One standard-normal [L_b, g, d] array per length."""
    return [rng.standard_normal((n, g, d)).astype(dtype) for n in lengths]


def paged(k_seqs, v_seqs, block_size, rng, **scatter_kw):
    """Keys and values scattered by one table (the same physical blocks for both)."""
    state = rng.bit_generator.state
    k_pool, table = scatter(k_seqs, block_size, rng=rng, **scatter_kw)
    rng.bit_generator.state = state  # the same shuffle for the values
    v_pool, v_table = scatter(v_seqs, block_size, rng=rng, **scatter_kw)
    assert np.array_equal(table, v_table)
    return k_pool, v_pool, table


def lengths_of(seqs):
    return np.array([len(s) for s in seqs], dtype=np.int32)
