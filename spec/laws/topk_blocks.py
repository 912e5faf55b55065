"""Laws of block-sparse selection (``topk_blocks=``, ``topk_block_size=``, NSA's selected branch):
query i sees key j only when block ``j // topk_block_size`` is listed in its row, a block listed
twice counting once, ANDed with every other restriction (`spec.keywords.topk_blocks`). The
backward under blocks is judged by `spec.laws.grad_keywords` and `spec.laws.pairs`, which draw
every declared keyword.

Public reports: flashinfer PR #5090 (n_k not a multiple of the tile: the partial last block read
from zero-filled keys); the block laws are the token laws of `spec.laws.topk` at block
granularity.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec.cases import Case, cases
from spec.inputs import Inputs
from spec.keywords.topk_blocks import TOPK_BLOCKS, block_counts, n_blocks
from spec.laws import _needs
from spec.laws._helpers import assert_hidden_unmoved, assert_matches, assert_unchanged, run
from spec.registry import law
from spec.target import Target

Array = np.ndarray

needs_blocks = _needs.keyword(TOPK_BLOCKS)


def block_cases(target: Target, **given: object) -> st.SearchStrategy[Case]:
    return cases(target, n_max=48, keywords=(TOPK_BLOCKS,), **given)  # type: ignore[arg-type]


def blocks_of(inputs: Inputs) -> tuple[Array, int]:  # -> [*kv_lead, n_q, n_blocks] int64 (a copy), block size
    return np.array(inputs.get("topk_blocks"), dtype=np.int64), int(inputs.get("topk_block_size"))


def said(inputs: Inputs) -> str:
    blocks, size = blocks_of(inputs)
    return f"topk_blocks of width {blocks.shape[-1]} and topk_block_size={size}"


@law(strategy=lambda t: block_cases(t, masks=("none", "random"), tiles=True), needs=needs_blocks)
def topk_blocks_matches_golden(target: Target, case: Case) -> None:
    """With ``topk_blocks=`` and ``topk_block_size=`` every row that sees a key matches the float64
    golden, whose query i sees the keys of the valid blocks listed in its row, ANDed with causal
    and mask=: blocks of 1..4, 16 or 64 keys (n_k seldom a multiple: a partial last block), lists
    shared across queries, padded with −1 or blocks past the last.

    Catches: the partial last block dropped (the number of blocks taken as n_k // size); a block
    index read as a token index; a block's keys taken as [b·size, (b + 1)·size] (one key too many).
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what=f"with {said(inputs)}, the output")


@law(strategy=lambda t: block_cases(t, masks=("none", "random"), n_k_min=2), needs=needs_blocks)
def topk_blocks_no_leak(target: Target, case: Case) -> None:
    """Changing the keys and values of the blocks one query's row does not list leaves every row
    that sees none of them bit-identical (within tolerance if the target declares
    exact_masking=False).

    Catches: a block's neighbour read with it (blocks of size + 1 keys, or a tile of the next
    block); the keys of unlisted blocks in the row maximum.
    """
    inputs = case.inputs()
    blocks, size = blocks_of(inputs)
    row = int(case.rng(22).integers(0, case.n_q))
    outside = block_counts(blocks, size, case.n_k)[..., row, :] == 0  # [*kv_lead, n_k]
    assume(outside.any())
    assert_hidden_unmoved(target, case, inputs, outside,
                          what=f"changing the keys of the blocks query {row}'s topk_blocks row does not list")


@law(strategy=lambda t: block_cases(t, masks=("none", "random")), needs=needs_blocks)
def topk_blocks_invalid_ignored(target: Target, case: Case) -> None:
    """Rewriting each invalid entry (< 0 or ≥ ceil(n_k / topk_block_size)) to another invalid value
    leaves the output bit-identical (within tolerance if the target declares exact_masking=False
    or deterministic=False).

    Catches: an invalid block wrapped into range (−1 read as the last block, a block past the last
    taken modulo the number of blocks); −1 clamped to block 0.
    """
    inputs = case.inputs()
    blocks, size = blocks_of(inputs)
    count, rng = n_blocks(case.n_k, size), case.rng(23)
    invalid = (blocks < 0) | (blocks >= count)
    assume(bool(invalid.any()))
    others = np.where(rng.random(blocks.shape) < 0.5, -1 - rng.integers(0, 2**31 - 1, size=blocks.shape),
                      count + rng.integers(0, 1000, size=blocks.shape))
    changed = inputs.replace(topk_blocks=np.where(invalid, others, blocks).astype(np.int32))
    assert_unchanged(target, inputs, run(target, inputs), run(target, changed),
                     bitwise=target.exact_masking and target.deterministic,
                     what="after rewriting the invalid entries of topk_blocks, the output",
                     change=f"rewriting the invalid entries of topk_blocks (< 0 or >= {count} blocks of "
                            f"{size})")


@law(strategy=lambda t: block_cases(t, masks=("none", "random")), needs=needs_blocks)
def topk_blocks_listed_twice_count_once(target: Target, case: Case) -> None:
    """A block listed twice in one row counts once (NSA's selection is a set of blocks): with some
    entries replaced by copies of valid ones of their row, the output matches the golden of the
    listed set.

    Catches: a block-sparse gather that reads a block once per entry (its keys' weights doubled);
    a deduplication that drops both copies.
    """
    inputs = case.inputs()
    blocks, size = blocks_of(inputs)
    count, rng = n_blocks(case.n_k, size), case.rng(26)
    valid = (blocks >= 0) & (blocks < count)
    for at in np.argwhere(valid.any(axis=-1) & (rng.random(blocks.shape[:-1]) < 0.6)):
        row = tuple(at)
        source = rng.choice(np.flatnonzero(valid[row]))
        others = np.delete(np.arange(blocks.shape[-1]), source)
        if others.size:
            blocks[(*row, rng.choice(others))] = blocks[(*row, source)]
    doubled = inputs.replace(topk_blocks=blocks.astype(np.int32))
    listed = np.where((blocks >= 0) & (blocks < count), blocks, -1)
    twice = np.sort(listed, axis=-1)
    assume(bool(np.any((twice[..., 1:] == twice[..., :-1]) & (twice[..., 1:] >= 0))))
    assert_matches(target, doubled, run(target, doubled), what=f"with blocks listed twice ({said(doubled)}), "
                                                               "the output")
