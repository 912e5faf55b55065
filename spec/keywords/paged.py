"""Paged KV caches (``block_table=``, with ``kv_lengths=``): keys in blocks of a shared pool.

Its declaration (`PAGED`) and the functions it is made of; its laws are `spec.laws.cache`'s.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from spec import dtypes
from spec.draws import one_of, pick
from spec.keywords.kv_lengths import draw_lengths, per_row_diagonal
from spec.keywords.record import Geometry, Keyword, Reads, Realigns

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


BLOCK_SIZES = (1, 2, 3, 4, 5, 8, 16)
"""Block sizes drawn besides any up to n_k + 1: 1 (a block per key), and sizes that divide few
lengths (3, 5) next to the powers of two kernels use (16 is vLLM's default)."""
FILLS = ("nan", "huge")
"""What the cases put where nothing may be read: NaN, or the dtype's largest value over four."""
PAGES = 60  # the random stream of a case's block placement (Case.rng)


def fill_value(fill: str, dtype: np.dtype) -> float:
    """The poison of an unowned pool position: NaN, or a quarter of the dtype's largest value (a
    key that dominates every score, a value that dominates every output, if either is read)."""
    return math.nan if fill == "nan" else float(dtypes.finfo(dtype).max) / 4


def placement(case: Case, block_size: int, lengths: tuple[int, ...],
              stream: int = PAGES) -> tuple[Array, int]:  # -> block_table [batch, max_blocks], num_blocks
    """Where each sequence's blocks sit: its ceil(L_b / block_size) blocks at shuffled physical
    places of a pool with one or two blocks nobody owns, ``max_blocks`` = ceil(n_k / block_size);
    the entries past a sequence's last block name random blocks (another's, or nobody's)."""
    rng = case.rng(stream)
    counts = [-(-n // block_size) for n in lengths]
    max_blocks = max(1, -(-case.n_k // block_size))
    num_blocks = sum(counts) + int(rng.integers(1, 3))
    physical = iter(rng.permutation(num_blocks).tolist())
    table = rng.integers(0, num_blocks, size=(len(lengths), max_blocks))
    for b, count in enumerate(counts):
        table[b, :count] = [next(physical) for _ in range(count)]
    return table.astype(np.int32), num_blocks


def owned(table: Array, lengths: Array, num_blocks: int, block_size: int) -> Array:
    # -> [num_blocks, block_size] bool: the pool positions some sequence's keys are at
    """The positions of the pool that hold a sequence's key: key j < kv_lengths[b] of each b."""
    found = np.zeros((num_blocks, block_size), dtype=bool)
    for b, n in enumerate(np.asarray(lengths).tolist()):
        j = np.arange(n)
        found[table[b, j // block_size], j % block_size] = True
    return found


def scatter(contiguous: Array, table: Array, lengths: Array, num_blocks: int, block_size: int,
            fill: float) -> Array:  # [batch, g, n_k, d] -> [num_blocks, block_size, g, d]
    """A pool holding each sequence's first kv_lengths[b] keys where the table says, ``fill``
    everywhere else."""
    g, d = contiguous.shape[1], contiguous.shape[3]
    pool = np.full((num_blocks, block_size, g, d), fill, dtype=np.float64).astype(contiguous.dtype)
    for b, n in enumerate(np.asarray(lengths).tolist()):
        j = np.arange(n)
        pool[table[b, j // block_size], j % block_size] = np.swapaxes(contiguous[b, :, :n], 0, 1)
    return pool


def gather(pool: Array, table: Array, lengths: Array) -> Array:
    # [num_blocks, block_size, g, d], [batch, max_blocks], [batch] -> [batch, g, max_blocks·block_size, d]
    """Each sequence's keys in order, read position by position from the definition: key j of
    sequence b is pool[table[b, j // block_size], j % block_size] for j < kv_lengths[b]; zeros
    after (hidden by kv_lengths, never read from the pool)."""
    block_size = pool.shape[1]
    table, lengths = np.asarray(table), np.asarray(lengths)
    capacity = table.shape[1] * block_size
    out = np.zeros((len(lengths), pool.shape[2], capacity, pool.shape[3]), dtype=pool.dtype)
    for b, n in enumerate(lengths.tolist()):
        j = np.arange(n)  # every key position of sequence b, each read where the table says
        out[b, :, :n] = np.swapaxes(pool[table[b, j // block_size], j % block_size], 0, 1)
    return out


def read_pages(k: Array, v: Array, block_table: Array, kv_lengths: Array) -> tuple[Array, Array]:
    """The paged cache's keys and values as contiguous ``[batch, heads_kv, n_k, d]`` (`gather`)."""
    if k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"a paged cache is [num_blocks, block_size, heads_kv, d], got k {k.shape}, "
                         f"v {v.shape}")
    return gather(k, block_table, kv_lengths), gather(v, block_table, kv_lengths)


def pages_diagonal(geo: Geometry, block_table: Array, kv_lengths: Array) -> Array:  # -> [batch, 1, n_q, 1]
    """Over a paged cache every alignment is per sequence: row b's diagonal is i + kv_lengths[b] − n_q."""
    return per_row_diagonal(geo.n_q, kv_lengths)


def _lengths(case: Case) -> tuple[int, ...]:
    return tuple(case.param("kv_lengths"))


def write_pages(case: Case, paged: tuple[int, str], k: Array, v: Array) -> tuple[Array, Array]:
    """The case's contiguous keys and values scattered into a pool (`placement`), poisoned
    (``paged = (block_size, fill)``) wherever no sequence's key is."""
    block_size, fill = paged
    table, num_blocks = placement(case, block_size, _lengths(case))
    lengths = np.asarray(_lengths(case))
    return tuple(scatter(x, table, lengths, num_blocks, block_size, fill_value(fill, x.dtype))  # type: ignore[return-value]
                 for x in (k, v))


def draw_paged(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """Two or three sequences with their own lengths (`spec.keywords.kv_lengths.draw_lengths`), a
    block size (1, one that does not divide the lengths, or any up to n_k + 1; multiples of
    ``block_multiple`` where the target declares it) and a poison."""
    case = draw_lengths(draw, target, case)
    block_size = one_of(draw, _block_sizes(case.n_k, target.block_multiple or 1))
    return case.with_keyword("paged", (block_size, pick(draw, FILLS)))


def block_choices(target: Target) -> tuple[int, ...]:
    """The named block sizes (`BLOCK_SIZES`) a target takes: those that are multiples of its
    ``block_multiple`` (m and 2m at least)."""
    return _named_blocks(target.block_multiple or 1)


def _named_blocks(multiple: int) -> tuple[int, ...]:
    if multiple == 1:
        return BLOCK_SIZES
    return tuple(sorted({b for b in BLOCK_SIZES if b % multiple == 0} | {multiple, 2 * multiple}))


@functools.cache
def _block_sizes(n_k: int, multiple: int) -> tuple[st.SearchStrategy[int], ...]:
    if multiple == 1:
        return (st.sampled_from(BLOCK_SIZES), st.integers(1, n_k + 1))
    return (st.sampled_from(_named_blocks(multiple)),
            st.integers(1, -(-(n_k + 1) // multiple)).map(multiple.__mul__))


PAGED = Keyword(
    name="paged",
    field="supports_paged_kv",
    passes=("block_table",),
    carries=("kv_lengths",),
    meaning="int32 [batch, max_blocks], 4-D q: k and v are paged caches "
            "[num_blocks, block_size, heads_kv, d] "
            "whatever the layout, and key j of sequence b is k[block_table[b, j // block_size], "
            "j % block_size] for j < kv_lengths[b] (kv_lengths always comes with it); nothing else in "
            "the pool is read (other sequences' blocks, unowned blocks, the tail of the last block, table "
            "entries past it). Causal, windows and ALiBi are aligned per sequence: "
            "diag = i + kv_lengths[b] - n_q.",
    terms=(Reads(read_pages), Realigns(pages_diagonal)),
    received=lambda case, paged: (placement(case, paged[0], _lengths(case))[0],),
    draw=draw_paged,
    reshapes=True,
    excludes=("mask", "bias"),
    writes=write_pages,
    arrangement="paged",
    moves=("q",),
    ndims=(4,),
)
