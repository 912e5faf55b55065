"""Chunked local attention (``attention_chunk=C``, Llama 4's): attention within chunks of C positions.

Query i sees key j only when both lie in the same chunk of C positions. Positions are measured
on the target's causal alignment, as a window's are (`spec.keywords.window`), whether or not the
call is causal:

- key j is at position j; query i at its diagonal, ``diag(i)``: i (top-left), i + n_k − n_q
  (bottom-right, and a KV cache), i + kv_lengths[b] − n_q per batch row (``causal_alignment=
  "kv_lengths"``, and over a paged cache, whatever the alignment);
- packed sequences and cache rows each count from 0: in a packed call key j is at
  j − cu_seqlens_k[s] and query i at diag(i) − cu_seqlens_k[s] of its own sequence s
  (`spec.keywords.record.Geometry.origin`);
- a position's chunk is ``position // C``, floored (Python's ``//``): a query before the first key
  (diag < 0, more queries than keys bottom-right) lies in a chunk below 0, which holds no key,
  and sees nothing (FlashAttention's ``construct_chunk_mask``);
- visible iff ``diag(i) // C == j // C``, ANDed with causal, windows, mask=, key lengths and
  packed sequences (Llama 4's chunked attention is this with ``causal=True``).

Its declaration (`CHUNK`) and the functions it is made of; its laws are `spec.laws.chunk`'s.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec.draws import one_of
from spec.keywords.record import Geometry, Keyword, Restricts

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


def check_chunk(attention_chunk: object) -> int:
    """``attention_chunk`` as an int, refused with ValueError unless an integer > 0."""
    if isinstance(attention_chunk, (bool, np.bool_)) or not isinstance(attention_chunk, (int, np.integer)) \
            or attention_chunk <= 0:
        raise ValueError(f"attention_chunk must be an integer > 0, got {attention_chunk!r}")
    return int(attention_chunk)


def chunk_of(position: Array, chunk: int) -> Array:
    """The chunk each position lies in: position // C, floored (a negative position, −1 // C = −1)."""
    return np.floor_divide(position, chunk)


def chunk_visible(geo: Geometry, attention_chunk: int) -> Array:  # -> broadcastable to [*lead, n_q, n_k]
    """Query i sees key j when (diag(i) − origin) // C == (j − origin) // C: the same chunk of its
    own sequence (origin 0 but for packed sequences)."""
    chunk = check_chunk(attention_chunk)
    query = chunk_of(geo.diagonal - geo.origin, chunk)
    key = chunk_of(np.arange(geo.n_k) - geo.origin, chunk)
    return query == key


@functools.cache
def sizes(n: int) -> tuple[st.SearchStrategy[int], ...]:
    """A chunk size: mostly small (1..4, where off-by-ones at chunk edges live), up to n + 2 (one
    chunk wider than the call, one that does not divide n), or a power of two a tile may be a
    multiple of (branches for `spec.draws.one_of`, made once per n)."""
    return (st.integers(1, 4), st.integers(1, n + 2), st.sampled_from((8, 16, 32, 64)))


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """A chunk of 1..4, up to n_k + 2, or 8, 16, 32, 64 positions, on shapes the target's alignment
    defines (as a window's: square_or_decoding: n_q = n_k or n_q = 1; queries_within_keys:
    n_q ≤ n_k and n_q ≤ each row's key length)."""
    assume(target.causal_shape_ok(case.n_q, case.n_k))
    lengths = case.param("kv_lengths")
    assume(lengths is None or all(target.causal_shape_ok(case.n_q, n) for n in lengths))
    return case.with_keyword("chunk", one_of(draw, sizes(case.n_k)))


CHUNK = Keyword(
    name="chunk",
    field="supports_chunk",
    passes=("attention_chunk",),
    meaning="attention_chunk=C, an integer > 0: query i sees key j only when both lie in the same chunk of "
            "C positions, diag // C == j // C, where diag is i (top-left) or i + n_k - n_q (bottom-right), "
            "per causal_alignment (per batch row, i + kv_lengths[b] - n_q, for causal_alignment='kv_lengths' "
            "and over a paged cache), counted from each packed sequence's start; a position before the first "
            "key floors (a chunk below 0, with no key). Llama 4's chunked attention with causal; ANDed with "
            "causal, window and mask.",
    terms=(Restricts(chunk_visible, cause="chunk"),),
    received=lambda case, chunk: (int(chunk),),
    draw=draw,
)
