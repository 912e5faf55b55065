"""Top-k sparse attention (``topk_indices=``, ``topk_length=``): each query attends to the keys
listed in its row only (DeepSeek's sparse attention, FlashMLA's sparse kernels).

- ``topk_indices`` int32 ``[batch, heads_kv, n_q, topk]`` (3-D inputs ``[heads_kv, n_q, topk]``,
  2-D ``[n_q, topk]``): query i of query head h may see the keys listed in row i of its K/V head
  (h // (heads / heads_kv)); an entry ``< 0`` or ``>= n_k`` is invalid and ignored (FlashMLA pads
  with −1);
- ``topk_length`` int32 ``[batch, n_q]`` (3-D and 2-D inputs ``[n_q]``), values in ``[0, topk]``:
  only the first ``topk_length[b, i]`` entries of row i are read (FlashMLA's truncation); passed
  only with ``topk_indices``;
- the listed keys are a restriction ANDed with causal, windows, chunks, ``mask=``, key lengths
  and every other; a row left with no valid key is emptied by the cause ``"topk"`` (its output
  and LSE as the target declares for it: ``masked_rows``, ``empty_lse``).

A key listed twice in one row counts once as the golden reads it (a mask); a target whose gather
counts it each time declares ``topk_duplicates="each"``. The cases draw no key twice within a row
(so the golden holds for both), but share keys across the queries of every call — the normal case
of top-k selection, where backward kernels that scatter dK and dV without accumulating break —
and pad with −1, list keys past n_k, draw lists wider than n_k and truncate them. Only
`spec.laws.topk`'s duplicates law lists a key twice in a row, and judges it by the declaration.

Its declaration (`TOPK`) and the functions it is made of; its laws are `spec.laws.topk`'s.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from spec.draws import one_of
from spec.keywords.record import Geometry, Keyword, Restricts

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray

CONTIGUOUS_ONLY = ("block_table", "cu_seqlens_q", "cu_seqlens_k", "past_key", "past_value")
"""What a selection is never passed with: a paged cache, packed sequences, a past cache (a list
indexes the call's own contiguous keys)."""

FILLS = ("valid", "minus_one", "past_n_k")
"""What fills a list beyond its valid keys (and, but for ``valid``, some entries among them): −1
(FlashMLA's padding), or indices at and past n_k (a kernel that reads a zero-filled key there
gives it a score of 0 and a weight of exp(0))."""


def check_topk(indices: object, length: object, kv_lead: tuple[int, ...],
               n_q: int) -> tuple[Array, Array | None]:
    """``topk_indices`` (and ``topk_length``) as int64 arrays, refused with ValueError unless
    integers shaped ``[*kv_lead, n_q, topk]`` (and ``[batch, n_q]`` or ``[n_q]``, within
    ``[0, topk]``)."""
    idx = np.asarray(indices)
    if idx.dtype.kind not in "iu" or idx.shape[:-1] != (*kv_lead, n_q):
        raise ValueError(f"topk_indices must be integers shaped {[*kv_lead, n_q]} + [topk], "
                         f"got {idx.dtype} {list(idx.shape)}")
    if length is None:
        return idx.astype(np.int64), None
    got = np.asarray(length)
    want = (kv_lead[0], n_q) if len(kv_lead) == 2 else (n_q,)
    if got.dtype.kind not in "iu" or got.shape != want:
        raise ValueError(f"topk_length must be integers shaped {list(want)}, "
                         f"got {got.dtype} {list(got.shape)}")
    if got.size and (got.min() < 0 or got.max() > idx.shape[-1]):
        raise ValueError(f"topk_length must lie in [0, topk={idx.shape[-1]}], got values from {got.min()} "
                         f"to {got.max()}")
    return idx.astype(np.int64), got.astype(np.int64)


def entries_read(indices: Array, length: Array | None) -> Array:  # -> bool, indices' shape
    """Which entries of each row are read: the first ``topk_length`` of it (every entry without
    one), broadcast over the K/V heads."""
    if length is None:
        return np.ones(indices.shape, dtype=bool)
    per_row = length[:, None, :] if indices.ndim == 4 else length  # [batch, 1, n_q] or [n_q]
    return np.broadcast_to(np.arange(indices.shape[-1]) < per_row[..., None], indices.shape)


def valid_entries(indices: Array, n_k: int, length: Array | None) -> Array:  # -> bool, indices' shape
    """The entries that list a key: read (`entries_read`) and within ``[0, n_k)``."""
    return entries_read(indices, length) & (indices >= 0) & (indices < n_k)


def listed_counts(indices: Array, n_k: int, length: Array | None = None) -> Array:
    # [*kv_lead, n_q, topk] -> [*kv_lead, n_q, n_k] int64
    """How many times each key is listed by the valid entries of each row (0: not listed)."""
    valid = valid_entries(indices, n_k, length)
    counts = np.zeros((*indices.shape[:-1], n_k + 1), dtype=np.int64)  # column n_k: the invalid ones
    np.add.at(counts, (*np.indices(indices.shape, sparse=True)[:-1], np.where(valid, indices, n_k)), 1)
    return counts[..., :n_k]


def per_query_head(a: Array, lead: tuple[int, ...]) -> Array:  # [*kv_lead, n_q, x] -> [*lead, n_q, x]
    """``a``, one slab per K/V head, repeated to the query heads that read it (grouped-query)."""
    if a.ndim >= 3 and lead and a.shape[-3] != lead[-1]:
        return np.repeat(a, lead[-1] // a.shape[-3], axis=-3)
    return a


def topk_visible(geo: Geometry, topk_indices: Array, topk_length: Array | None = None) -> Array:
    # -> [*lead, n_q, n_k] bool (n_q: the geometry's rows)
    """Query i sees key j when a valid entry of its row lists j (`listed_counts` > 0)."""
    kv_lead = (*geo.lead[:-1], np.asarray(topk_indices).shape[-3]) if geo.lead else ()
    idx, length = check_topk(topk_indices, topk_length, kv_lead, geo.n_q)
    if geo.rows is not None:
        idx, length = idx[..., geo.rows, :], None if length is None else length[..., geo.rows]
    return per_query_head(listed_counts(idx, geo.n_k, length) > 0, geo.lead)


@functools.cache
def widths(n: int) -> tuple[st.SearchStrategy[int], ...]:
    """A list's width: 1..4 (a few keys a query), up to n + 3 (wider than the keys: the rest is
    padding), or 16 or 64, widths kernels tile by (branches for `spec.draws.one_of`, made once per n)."""
    return (st.integers(1, 4), st.integers(1, n + 3), st.sampled_from((16, 64)))


def draw_entries(rng: np.random.Generator, rows: tuple[int, ...], n: int, width: int, fill: str) -> Array:
    # -> [*rows, width] int64
    """Lists of up to ``width`` distinct items of ``n`` (keys, or blocks of keys) per row, rows
    preferring a shared half of the items half the time, one item listed by every row (so items
    are shared across the queries of every call with two rows or more), in random order; past
    min(width, n) entries, and at a quarter of the others unless ``fill`` is ``valid``, an
    invalid entry (−1, or n to n + 63), at the end of each row or, in half the calls, anywhere
    in it."""
    shared = rng.random(n) < 0.5
    prefers = rng.random((*rows, 1)) < 0.5
    order = np.argsort(rng.random((*rows, n)) + np.where(prefers & ~shared, 1.0, 0.0), axis=-1)
    listed = np.full((*rows, width), -1, dtype=np.int64)
    kept = min(width, n)
    listed[..., :kept] = order[..., :kept]
    hot = -2  # no item
    if kept:  # one item every row lists: shared across the queries of every call
        hot = int(rng.integers(0, n))
        has = (listed[..., :kept - 1] == hot).any(axis=-1)
        listed[..., kept - 1] = np.where(has, listed[..., kept - 1], hot)
    bad = np.broadcast_to(np.arange(width) >= kept, listed.shape)
    if fill != "valid":
        bad = bad | ((rng.random(listed.shape) < 0.25) & (listed != hot))
        invalid = -1 if fill == "minus_one" else n + rng.integers(0, 64, size=listed.shape)
        listed = np.where(bad, invalid, listed)
    if rng.random() < 0.5:  # the padding spread through each row, not only at its end
        listed = np.take_along_axis(listed, np.argsort(rng.random(listed.shape), axis=-1), axis=-1)
    return listed


def draw_lists(case: Case, width: int, fill: str, truncated: bool) -> tuple[Array, Array | None]:
    # -> [*kv_lead, n_q, width] int32, [batch, n_q] or [n_q] int32 (or None)
    """The lists of a case (`draw_entries` over its keys, per K/V head and query); with
    ``truncated``, a length per row (a quarter of them 0 or below the valid entries) and every
    entry past it a random key (read, it would show)."""
    rng = case.rng(31)
    listed = draw_entries(rng, (*case.kv_lead, case.n_q), case.n_k, width, fill)
    if not truncated:
        return listed.astype(np.int32), None
    lengths = (case.batch, case.n_q) if case.ndim == 4 else (case.n_q,)
    length = np.where(rng.random(lengths) < 0.75, width, rng.integers(0, width + 1, size=lengths))
    past = ~entries_read(listed, length)
    if case.n_k:
        listed = np.where(past, rng.integers(0, case.n_k, size=listed.shape), listed)
    return listed.astype(np.int32), length.astype(np.int32)


def received(case: Case, parameter: tuple[int, str, bool]) -> tuple[Array, Array | None]:
    width, fill, truncated = parameter
    return draw_lists(case, width, fill, truncated)


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """A list width (1..4, up to n_k + 3, 16 or 64), its padding (none, −1, or past n_k) and, half
    the time, a ``topk_length`` per row."""
    width = one_of(draw, widths(case.n_k))
    return case.with_keyword("topk", (width, draw(st.sampled_from(FILLS)), draw(st.booleans())))


TOPK = Keyword(
    name="topk",
    field="supports_topk",
    passes=("topk_indices", "topk_length"),
    meaning="topk_indices=, int32 [batch, heads_kv, n_q, topk] ([heads_kv, n_q, topk] for 3-D inputs, "
            "[n_q, topk] for 2-D): query i of head h attends only to the keys listed in row i of its K/V "
            "head; an entry < 0 or >= n_k is invalid and ignored; topk_length=, int32 [batch, n_q] ([n_q] "
            "for 3-D and 2-D), values in [0, topk]: only the first topk_length entries of each row are "
            "read. ANDed with causal, window, chunk, mask and key lengths; a row with no valid key is "
            "emptied by the cause 'topk'. A key listed twice in a row counts once, or each time for "
            "topk_duplicates='each'.",
    terms=(Restricts(topk_visible, cause="topk"),),
    received=received,
    draw=draw,
    # selected blocks: an alternative selection (NSA's branch), never passed with a token list
    excludes=(*CONTIGUOUS_ONLY, "topk_blocks", "topk_block_size"),
    in_layout=("topk_indices",),  # bnhd: [batch, n_q, heads_kv, topk], as FlashMLA takes them
)
