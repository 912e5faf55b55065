"""Block-sparse selection (``topk_blocks=``, ``topk_block_size=``): each query attends to the keys
of the blocks listed in its row only (NSA's selected branch).

- ``topk_blocks`` int32 ``[batch, heads_kv, n_q, n_blocks]`` (3-D inputs ``[heads_kv, n_q,
  n_blocks]``, 2-D ``[n_q, n_blocks]``): query i sees key j when block ``j // topk_block_size``
  is listed in row i of its K/V head; an entry ``< 0`` or ``>= ceil(n_k / topk_block_size)`` is
  invalid and ignored; a block listed twice counts once;
- ``topk_block_size`` an int > 0, passed whenever ``topk_blocks`` is;
- ANDed with every other restriction; a row with no valid block is emptied by the cause ``"topk"``.

The cases draw blocks of 1..4 keys, 16 or 64 (so n_k is seldom a multiple of the block: the last
block is partial), lists shared across queries, padded with −1 or with blocks past the last.

Its declaration (`TOPK_BLOCKS`) and the functions it is made of; its laws are
`spec.laws.topk_blocks`'s.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from spec.draws import one_of
from spec.keywords.record import Geometry, Keyword, Restricts
from spec.keywords.topk import CONTIGUOUS_ONLY, FILLS, check_topk, draw_entries, listed_counts, per_query_head

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray

BLOCK_SIZES = (1, 2, 3, 4, 16, 64)
"""Block sizes drawn: small ones, where off-by-ones at block edges live, and two a kernel tiles by."""


def check_block_size(topk_block_size: object) -> int:
    """``topk_block_size`` as an int, refused with ValueError unless an integer > 0."""
    if isinstance(topk_block_size, (bool, np.bool_)) or not isinstance(topk_block_size, (int, np.integer)) \
            or topk_block_size <= 0:
        raise ValueError(f"topk_block_size must be an integer > 0, got {topk_block_size!r}")
    return int(topk_block_size)


def n_blocks(n_k: int, block_size: int) -> int:
    """How many blocks the keys fill: ceil(n_k / block_size), the last one perhaps partial."""
    return -(-n_k // block_size)


def block_counts(blocks: Array, block_size: int, n_k: int) -> Array:
    # [*kv_lead, n_q, n_blocks] -> [*kv_lead, n_q, n_k] int64
    """How many times the block of each key is listed by the valid entries of each row."""
    per_block = listed_counts(blocks, n_blocks(n_k, block_size))  # [..., n_q, ceil(n_k / size)]
    return np.repeat(per_block, block_size, axis=-1)[..., :n_k]


def blocks_visible(geo: Geometry, topk_blocks: Array, topk_block_size: int) -> Array:
    # -> [*lead, n_q, n_k] bool (n_q: the geometry's rows)
    """Query i sees key j when a valid entry of its row lists block j // topk_block_size."""
    size = check_block_size(topk_block_size)
    kv_lead = (*geo.lead[:-1], np.asarray(topk_blocks).shape[-3]) if geo.lead else ()
    blocks, _ = check_topk(topk_blocks, None, kv_lead, geo.n_q)
    if geo.rows is not None:
        blocks = blocks[..., geo.rows, :]
    return per_query_head(block_counts(blocks, size, geo.n_k) > 0, geo.lead)


@functools.cache
def widths(n: int) -> tuple[st.SearchStrategy[int], ...]:
    """A list's width in blocks: 1..3, or up to n + 2 (wider than the blocks: the rest padding)."""
    return (st.integers(1, 3), st.integers(1, n + 2))


def received(case: Case, parameter: tuple[int, int, str]) -> tuple[Array, int]:
    size, width, fill = parameter
    rng = case.rng(32)
    listed = draw_entries(rng, (*case.kv_lead, case.n_q), n_blocks(case.n_k, size), width, fill)
    return listed.astype(np.int32), size


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """A block size (1..4, 16 or 64), a list width (1..3, or up to the number of blocks + 2) and
    its padding (none, −1, or past the last block)."""
    size = draw(st.sampled_from(BLOCK_SIZES))
    width = one_of(draw, widths(n_blocks(case.n_k, size)))
    return case.with_keyword("topk_blocks", (size, width, draw(st.sampled_from(FILLS))))


TOPK_BLOCKS = Keyword(
    name="topk_blocks",
    field="supports_topk_blocks",
    passes=("topk_blocks", "topk_block_size"),
    meaning="topk_blocks=, int32 [batch, heads_kv, n_q, n_blocks] ([heads_kv, n_q, n_blocks] for 3-D inputs, "
            "[n_q, n_blocks] for 2-D), with topk_block_size=, an int > 0: query i sees key j when block "
            "j // topk_block_size is listed in row i of its K/V head (NSA's selected branch); an entry < 0 "
            "or >= ceil(n_k / topk_block_size) is invalid and ignored; a block listed twice counts once. "
            "ANDed with every other restriction; a row with no valid block is emptied by the cause 'topk'.",
    terms=(Restricts(blocks_visible, cause="topk"),),
    received=received,
    draw=draw,
    excludes=CONTIGUOUS_ONLY,
    in_layout=("topk_blocks",),  # bnhd: [batch, n_q, heads_kv, n_blocks]
)
