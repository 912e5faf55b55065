"""The golden at chosen query rows, a block at a time: which rows are checked (`sample_rows`) and
how the work is cut so that it fits in memory (`blocks`), each block judged by `spec.oracle` at
its rows and slices.

The oracle evaluates any query rows at their cost (`spec.oracle`: the call's geometry cut to the
rows, each keyword's term evaluated there): O(rows · n_k · d) per (batch, head) slice, against
the full golden's O(n_q · n_k · d). What this module adds is the memory bound: the rows and the
slices are taken a block at a time (`BLOCK_ENTRIES`), so that n_k = 350,000 keys or 132,800
slices never hold an n_q × n_k array, and the blocks' results are put together
(`golden_rows`, `expected_rows`, `gradients_rows`). The gradients are those of an upstream
gradient that is zero outside the rows (`upstream`): then dq is zero outside them and dk, dv are
sums over them alone, so the whole backward is exact at the same cost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from spec import oracle
from spec.golden import Alignment
from spec.inputs import Inputs
from spec.target import Target

Array = np.ndarray

TILES = (16, 32, 64, 128, 256)
"""The query-tile sizes whose edges are always sampled (FlashAttention 2/3, xformers, `impl.flash`)."""
RANDOM_ROWS = 8
"""Random rows sampled beside the edges."""
BLOCK_ENTRIES = 2**22
"""About how many scores (rows × n_k, over a block of slices) one step of the golden holds."""


def sample_rows(n_q: int, *, limits: Sequence[int] = (), extra: Sequence[int] = (), random: int = RANDOM_ROWS,
                seed: int = 0) -> Array:  # -> [r] int64, sorted, distinct, in [0, n_q)
    """The query rows checked: the first and the last; each side of every tile edge of `TILES`
    and of ``limits`` (a target's ``seq_multiple`` and ``max_seq``: t − 1, t, t + 1) and the first
    row of each one's last, partial tile; each side of every power of two from 16 up (where a
    16- or 17-bit row index wraps: 2^k − 1, 2^k); ``extra`` (a packed sequence's first and last
    rows); and ``random`` rows drawn from ``seed``."""
    if n_q <= 0:
        return np.zeros(0, dtype=np.int64)
    picks = {0, n_q - 1, *extra}
    for t in (*TILES, *limits):
        if t > 0:
            picks |= {t - 1, t, t + 1, (n_q - 1) // t * t}
    power = 16
    while power <= n_q:
        picks |= {power - 1, power}
        power *= 2
    picks |= set(np.random.default_rng([seed, 7]).integers(0, n_q, size=random).tolist())
    return np.array(sorted(int(i) for i in picks if 0 <= i < n_q), dtype=np.int64)


def _count(lead: tuple[int, ...]) -> int:
    return int(np.prod(lead, dtype=np.int64)) if lead else 1


def _per_block(inputs: Inputs, rows: int) -> int:
    """Slices per block: about `BLOCK_ENTRIES` scores (and each slice's keys and values) at a time."""
    width = inputs.q.shape[-1] + inputs.v.shape[-1]
    per_slice = max(1, rows * inputs.n_k * 4 + inputs.n_k * width)
    return max(1, min(_count(inputs.lead), BLOCK_ENTRIES // per_slice))


def blocks(inputs: Inputs, rows: Array) -> Iterator[tuple[slice, Array]]:
    """The call's work at the query ``rows``, a block of rows and slices at a time: ``(at, flat)``,
    which of the ``rows`` (a slice of them) and which (batch, head) slices (flat indices into the
    lead), about `BLOCK_ENTRIES` scores each, so that the cost per row and key stays that of data
    in cache, whatever the rows and n_k."""
    inputs = oracle.meaning(inputs)
    rows = oracle.check_rows(rows, inputs.n_q)
    total = _count(inputs.lead)
    chunk = max(1, BLOCK_ENTRIES // max(1, 4 * inputs.n_k))
    for start in range(0, len(rows), chunk):
        at = slice(start, min(start + chunk, len(rows)))
        per_block = _per_block(inputs, at.stop - at.start)
        for first in range(0, total, per_block):
            yield at, np.arange(first, min(first + per_block, total))


# --- the forward -----------------------------------------------------------------------------


def golden_rows(inputs: Inputs, rows: Array,
                align: Alignment = "top_left") -> tuple[Array, Array]:
    """The float64 golden ``(out, lse)`` of the query ``rows`` of a call in the alignment ``align``,
    every keyword among its arguments included: `spec.oracle.golden_of` at those rows, a block at
    a time.

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], rows [r] -> [..., r, d_v], [..., r]
    """
    inputs = oracle.meaning(inputs)
    r = len(rows)
    out = np.zeros((_count(inputs.lead), r, inputs.v.shape[-1]))
    lse = np.zeros((_count(inputs.lead), r))
    for at, flat in blocks(inputs, rows):
        o, _, l_ = oracle.golden_of(inputs, align, rows=rows[at], slices=flat)
        out[flat, at], lse[flat, at] = o, l_
    return out.reshape(*inputs.lead, r, -1), lse.reshape(*inputs.lead, r)


def expected_rows(target: Target, inputs: Inputs, rows: Array, *,
                  baseline_in: str | None = None) -> oracle.Expected:
    """`spec.oracle.expected` at the query ``rows`` (its baseline in ``baseline_in``, if given), a
    block at a time, put together: the golden, the baseline and which rows see a key, at the
    rows; the floor the largest of the blocks' (each slice is a call of its own, so its floor
    bounds its rows; the largest bounds them all). The pattern is not kept."""
    inputs = oracle.meaning(inputs)
    n, r, d_v = _count(inputs.lead), len(rows), inputs.v.shape[-1]
    out, lse, base = np.zeros((n, r, d_v)), np.zeros((n, r)), np.zeros((n, r, d_v))
    seen = np.zeros((n, r), dtype=bool)
    floor = 0.0
    for at, flat in blocks(inputs, rows):
        part = oracle.expected(target, inputs, rows=rows[at], slices=flat, baseline_in=baseline_in)
        out[flat, at], lse[flat, at], base[flat, at] = part.out, part.lse, part.baseline
        seen[flat, at] = part.seen
        floor = max(floor, part.floor)
    lead = inputs.lead
    return oracle.Expected(out.reshape(*lead, r, d_v), lse.reshape(*lead, r), base.reshape(*lead, r, d_v),
                           floor, seen.reshape(*lead, r), None, np.asarray(rows))


# --- the backward ----------------------------------------------------------------------------


def upstream(inputs: Inputs, rows: Array, seed: int = 0) -> Array:  # -> [*lead, n_q, d_v], in q's dtype
    """An upstream gradient d_out: standard normal at the ``rows``, zero elsewhere."""
    d_out = np.zeros(inputs.out_shape, dtype=inputs.q.dtype)
    rng = np.random.default_rng([seed, 9])
    d_out[..., rows, :] = rng.standard_normal((*inputs.lead, len(rows), inputs.out_shape[-1]))
    return d_out


def gradients_rows(target: Target, inputs: Inputs, rows: Array, d_out: Array, *,
                   baseline_in: str | None = None) -> oracle.ExpectedGradients:
    """`spec.oracle.gradients` for an upstream gradient ``d_out`` that is zero outside the query
    ``rows`` (`upstream`; ValueError otherwise), a block at a time, put together: dq, dk and dv,
    their baselines (in ``baseline_in``, if given) and their floors entry by entry, each in the
    shape of what it is the gradient of (dq zero outside the rows; grouped K/V heads the sum of
    their query heads'). Keywords that add gradients of their own (a bias, sinks) are not
    differentiated here."""
    inputs = oracle.meaning(inputs)
    rows = oracle.check_rows(rows, inputs.n_q)
    if np.any(np.delete(np.asarray(d_out), rows, axis=-2)):
        raise ValueError("d_out must be zero outside the sampled rows: the sampled backward differentiates "
                         "those rows alone")
    lead, kv_lead = inputs.lead, inputs.k.shape[:-2]
    shapes = {"dq": inputs.q.shape, "dk": inputs.k.shape, "dv": inputs.v.shape}
    gold = {n: np.zeros(shapes[n]) for n in shapes}
    base = {n: np.zeros(shapes[n]) for n in shapes}
    floors = {n: np.zeros(shapes[n]) for n in shapes}
    d_rows = np.zeros_like(np.asarray(d_out))
    for at, flat in blocks(inputs, rows):
        d_rows[..., rows[at], :] = np.asarray(d_out)[..., rows[at], :]  # zero off the block's rows
        part = oracle.gradients(target, inputs, d_rows, rows=rows[at], slices=flat, baseline_in=baseline_in)
        d_rows[..., rows[at], :] = 0
        for store, found in ((gold, part.golden), (base, part.baseline), (floors, part.entry_floors)):
            _put_rows(store["dq"], lead, flat, rows[at], found["dq"])
            _add_kv(store["dk"], lead, kv_lead, flat, found["dk"])
            _add_kv(store["dv"], lead, kv_lead, flat, found["dv"])
    return oracle.ExpectedGradients(gold, base, {n: float(np.max(x, initial=0.0)) for n, x in floors.items()},
                                    None, None, floors)


def _put_rows(into: Array, lead: tuple[int, ...], flat: Array, rows: Array, g: Array) -> None:
    """dq of a block ``[c, r, d]`` into ``[*lead, n_q, d]`` at its slices and rows."""
    view = into.reshape(_count(lead), *into.shape[-2:])
    view[flat[:, None], rows[None, :]] = g


def _add_kv(into: Array, lead: tuple[int, ...], kv_lead: tuple[int, ...], flat: Array, g: Array) -> None:
    """A block's dk or dv per query head ``[c, n_k, d]`` added into ``[*kv_lead, n_k, d]`` (each K/V
    head the sum of the query heads that read it)."""
    if not lead:
        into += g[0]
        return
    index = list(np.unravel_index(flat, lead))
    if kv_lead[-1] != lead[-1]:
        index[-1] = index[-1] // (lead[-1] // kv_lead[-1])
    kv_flat = np.ravel_multi_index(tuple(index), kv_lead)
    view = into.reshape(_count(kv_lead), *into.shape[-2:])
    np.add.at(view, kv_flat, g)
