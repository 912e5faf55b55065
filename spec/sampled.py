"""The golden at chosen query rows: `spec.golden`'s float64 forward and backward for a sample of
query rows only, every keyword meaning what it means in `spec.oracle`.

Row i of attention depends on q_i, every key and value, and row i of what the keywords make of
the scores (its visibility, its added terms, its sink); no other query enters it. So the output,
the logsumexp, the baseline and the floor of some rows are those of a call with only those
queries, provided each keyword is evaluated at those rows' positions: the geometry of the call
(`spec.oracle.geometry`: each query's diagonal, moved by packed sequences, key lengths, paged
caches; O(n_q) integers) is computed whole, then cut to the rows (`row_geometry`), and each
restriction and added term is evaluated there (`spec.keywords.Geometry.rows`: packed sequences
find the rows' sequences) or, where a term is an array of its own (``mask=``, ``bias=``), read at
the rows. Causal alignment (top-left, bottom-right, per sequence) follows from the diagonals;
windows, ALiBi, sinks, softcaps and the readings of a cache (`spec.oracle.meaning`: a paged pool
gathered, float8 dequantized) from the terms as they are.

The cost is that of the rows checked: O(rows · n_k · d) per (batch, head) slice, against the
full golden's O(n_q · n_k · d), and its memory O(rows · n_k) per slice block — the slices are
taken a block at a time (`BLOCK_ENTRIES`), so that n_k = 350,000 keys or 132,800 slices never
hold an n_q × n_k array. The gradients (`gradients_rows`) are those of an upstream gradient
that is zero outside the rows: then dq is zero outside them and dk, dv are sums over them alone,
so the whole backward is exact at the same cost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spec import golden, oracle, tolerance
from spec.dtypes import as_dtype
from spec.inputs import Inputs
from spec.keywords import Adds, Geometry, Reads, Restricts, Sinks, Transforms
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


def _at(a: Array, rows: Array, n_q: int, axis: int = -2) -> Array:
    """``a`` (broadcastable to ``[..., n_q, n_k]``, or ``[..., n_q]`` with ``axis=-1``) at the
    ``rows``: as it is where its query axis already holds them (a term evaluated at the rows'
    geometry) or broadcasts (size 1, or none), read at them where it holds every query (an array
    of its own: ``mask=``, ``bias=``). The rows are increasing (`check_rows`), so all n_q of them
    are every query, in order: the two readings agree."""
    a = np.asarray(a)
    if a.ndim < -axis or a.shape[axis] in (1, len(rows)):
        return a
    if a.shape[axis] != n_q:
        raise ValueError(f"a term's query axis has {a.shape[axis]} entries, the call has {n_q} queries "
                         f"and {len(rows)} rows are sampled")
    return np.take(a, rows, axis=axis)


def check_rows(rows: Array, n_q: int) -> Array:  # -> [r] int64
    """``rows`` as int64, refused with ValueError unless strictly increasing within [0, n_q)."""
    found = np.asarray(rows)
    if found.ndim != 1 or (found.size and found.dtype.kind not in "iu"):
        raise ValueError(f"rows must be a 1-D integer array, got {found.dtype} {found.shape}")
    found = found.astype(np.int64)
    if found.size and (found[0] < 0 or found[-1] >= n_q or np.any(np.diff(found) <= 0)):
        raise ValueError(f"rows must increase strictly within [0, n_q={n_q}), got {short(found)}")
    return found


def short(rows: Array) -> str:
    items = np.asarray(rows).tolist()
    return str(items) if len(items) <= 8 else str(items[:8])[:-1] + ", …]"


def row_geometry(align: golden.Alignment, inputs: Inputs, rows: Array) -> Geometry:
    """The call's geometry (`spec.oracle.geometry`, every keyword's diagonal moves included) cut
    to the query ``rows``."""
    geo = oracle.geometry(align, inputs)
    rows = np.asarray(rows, dtype=np.int64)
    return dataclasses.replace(geo, diagonal=_at(geo.diagonal, rows, geo.n_q),
                               bottom_right=_at(geo.bottom_right, rows, geo.n_q), rows=rows)


def row_restrictions(inputs: Inputs, geo: Geometry) -> list[Array]:
    """What the rows of ``geo`` may see, one array per restriction (broadcastable to
    ``[*lead, rows, n_k]``), as `spec.oracle.restrictions` has them: causal, mask=, each keyword's
    restriction, the −inf entries of added terms."""
    inputs = oracle.meaning(inputs)
    rows, n_q = geo.queries, inputs.n_q
    found: list[Array] = []
    if inputs.causal:
        found.append(np.arange(inputs.n_k) <= geo.diagonal)
    if inputs.mask is not None:
        found.append(_at(np.asarray(inputs.mask, dtype=bool), rows, n_q))
    for _, term, values in oracle.bound(inputs):
        if isinstance(term, Restricts):
            found.append(_at(np.asarray(term.visible(geo, *values), dtype=bool), rows, n_q))
        elif isinstance(term, Adds) and term.cause is not None:
            found.append(~np.isneginf(_at(np.asarray(term.added(geo, *values), dtype=np.float64), rows, n_q)))
    return found


def row_terms(inputs: Inputs, geo: Geometry, dtype: np.dtype | None = None) -> golden.Terms:
    """The keywords' terms (`spec.oracle.terms`) at the rows of ``geo``: float64 (``dtype`` None)
    for the golden, or every step in ``dtype`` for the baseline."""
    inputs = oracle.meaning(inputs)
    rows, n_q = geo.queries, inputs.n_q
    transforms, added, sinks = [], [], None
    for _, term, values in oracle.bound(inputs):
        if isinstance(term, Transforms):
            if dtype is None:
                transforms.append((_bound(term.golden, values), _bound(term.derivative, values)))
            else:
                transforms.append((_bound_in(term.baseline, dtype, values), _bound(term.derivative, values)))
        elif isinstance(term, Adds):
            a = _at(np.asarray(term.added(geo, *values), dtype=np.float64), rows, n_q)
            with np.errstate(over="ignore"):
                added.append(a if dtype is None else a.astype(dtype))
        elif isinstance(term, Sinks):
            logits = _at(np.asarray(term.logits(geo, *values), dtype=np.float64), rows, n_q, axis=-1)
            with np.errstate(over="ignore"):
                sinks = logits if dtype is None else logits.astype(dtype)
    return golden.Terms(tuple(transforms), tuple(added), sinks)


def _bound(fn: Callable[..., Array], values: tuple[Any, ...]) -> golden.Transform:
    return lambda s: fn(s, *values)


def _bound_in(fn: Callable[..., Array], dtype: np.dtype, values: tuple[Any, ...]) -> golden.Transform:
    return lambda s: fn(s, dtype, *values)


def visible_rows(align: golden.Alignment, inputs: Inputs, rows: Array) -> Array:  # -> [*lead, r, n_k] bool
    """What the query ``rows`` see (`spec.oracle.visibility`'s rows), every restriction ANDed."""
    inputs = oracle.meaning(inputs)
    rows = check_rows(rows, inputs.n_q)
    found = np.ones((*inputs.lead, len(rows), inputs.n_k), dtype=bool)
    for r in row_restrictions(inputs, row_geometry(align, inputs, rows)):
        found &= r
    return found


# --- slices, a block at a time ---------------------------------------------------------------


def _blocks(lead: tuple[int, ...], per_block: int) -> Iterator[Array]:
    """The flat indices of the (batch, head) slices, ``per_block`` at a time."""
    total = int(np.prod(lead, dtype=np.int64)) if lead else 1
    for start in range(0, total, max(1, per_block)):
        yield np.arange(start, min(start + max(1, per_block), total))


def _take(a: Array, lead: tuple[int, ...], flat: Array, tail: int, kv: bool = False) -> Array:
    """The slices ``flat`` (flat indices into ``lead``) of ``a``, broadcastable to
    ``[*lead, <tail dims>]``: ``[len(flat), <a's tail dims>]``. ``kv``: ``a`` has K/V heads, and
    query head h reads K/V head h // (h_q / g)."""
    a = np.asarray(a)
    if a.ndim < len(lead) + tail:
        a = a.reshape((1,) * (len(lead) + tail - a.ndim) + a.shape)
    if not lead:
        return a[None]
    index = list(np.unravel_index(flat, lead))
    if kv and a.shape[len(lead) - 1] not in (1, lead[-1]):
        index[-1] = index[-1] // (lead[-1] // a.shape[len(lead) - 1])
    return a[tuple(i if a.shape[ax] != 1 else np.zeros_like(i) for ax, i in enumerate(index))]


def _per_block(inputs: Inputs, rows: int) -> int:
    """Slices per block: about `BLOCK_ENTRIES` scores (and each slice's keys and values) at a time."""
    lead = int(np.prod(inputs.lead, dtype=np.int64)) if inputs.lead else 1
    width = inputs.q.shape[-1] + inputs.v.shape[-1]
    per_slice = max(1, rows * inputs.n_k * 4 + inputs.n_k * width)
    return max(1, min(lead, BLOCK_ENTRIES // per_slice))


@dataclass(frozen=True)
class Block:
    """One block of slices at some of the sampled rows: the inputs as the golden reads them (3-D,
    one slice per row of the first axis), and the float64 terms and visibility."""

    flat: Array  # [c] flat slice indices
    at: slice  # which of the sampled rows
    q: Array  # [c, r, d_k]
    k: Array  # [c, n_k, d_k]
    v: Array  # [c, n_k, d_v]
    visible: Array  # broadcastable to [c, r, n_k]
    terms: golden.Terms
    work_terms: golden.Terms | None


def blocks(inputs: Inputs, align: golden.Alignment, rows: Array,
           work: np.dtype | None = None) -> Iterator[Block]:
    """The call's slices at the query ``rows``, a block of slices and rows at a time (about
    `BLOCK_ENTRIES` scores each: the cost per row and key stays that of data in cache, whatever
    the rows and n_k), k and v as they mean, GQA's K/V heads read by each query head; ``work``:
    also the terms in that dtype (the baseline's)."""
    inputs = oracle.meaning(inputs)
    rows = check_rows(rows, inputs.n_q)
    lead = inputs.lead
    chunk = max(1, BLOCK_ENTRIES // max(1, 4 * inputs.n_k))
    for start in range(0, len(rows), chunk):
        at = slice(start, min(start + chunk, len(rows)))
        geo = row_geometry(align, inputs, rows[at])
        restrictions = row_restrictions(inputs, geo)
        terms = row_terms(inputs, geo)
        work_terms = None if work is None else row_terms(inputs, geo, work)
        q_rows = inputs.q[..., rows[at], :]
        for flat in _blocks(lead, _per_block(inputs, at.stop - at.start)):
            visible: Array = np.ones((1, 1, 1), dtype=bool)
            for r in restrictions:
                visible = visible & _take(r, lead, flat, 2)
            yield Block(flat, at, _take(q_rows, lead, flat, 2), _take(inputs.k, lead, flat, 2, kv=True),
                        _take(inputs.v, lead, flat, 2, kv=True), visible,
                        _terms_of(terms, lead, flat),
                        None if work_terms is None else _terms_of(work_terms, lead, flat))


def _terms_of(terms: golden.Terms, lead: tuple[int, ...], flat: Array) -> golden.Terms:
    return golden.Terms(terms.transforms, tuple(_take(a, lead, flat, 2) for a in terms.added),
                        None if terms.sinks is None else _take(terms.sinks, lead, flat, 1))


# --- the forward -----------------------------------------------------------------------------


def golden_rows(inputs: Inputs, rows: Array, align: golden.Alignment = "top_left") -> tuple[Array, Array]:
    """The float64 golden ``(out, lse)`` of the query ``rows`` of a call in the alignment ``align``,
    every keyword among its arguments included: `spec.oracle.golden_of`'s ``out[..., rows, :]``
    and ``lse[..., rows]``, at the cost of those rows.

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], rows [r] -> [..., r, d_v], [..., r]
    """
    inputs = oracle.meaning(inputs)
    r = len(rows)
    out = np.zeros((_count(inputs.lead), r, inputs.v.shape[-1]))
    lse = np.zeros((_count(inputs.lead), r))
    for b in blocks(inputs, align, rows):
        vis = np.broadcast_to(b.visible, (*b.q.shape[:-1], b.k.shape[-2]))
        o, _, l_ = golden.forward(b.q, b.k, b.v, visible=vis, scale=inputs.scale_value, terms=b.terms)
        out[b.flat, b.at], lse[b.flat, b.at] = o, l_
    return out.reshape(*inputs.lead, r, -1), lse.reshape(*inputs.lead, r)


def _count(lead: tuple[int, ...]) -> int:
    return int(np.prod(lead, dtype=np.int64)) if lead else 1


@dataclass(frozen=True)
class ExpectedRows:
    """What a correct target gives at the sampled rows, and how far it may stray (the fields of
    `spec.oracle.Expected`, at the rows)."""

    rows: Array  # [r] the query positions
    out: Array  # the float64 golden [*lead, r, d_v]
    lse: Array  # [*lead, r]
    baseline: Array  # the naive computation in the target's computing dtype [*lead, r, d_v]
    floor: float  # the largest a-priori error of a block of slices (spec.tolerance.floor)
    seen: Array  # [*lead, r] rows with weight on some key

    def compare(self, out: Array, tolerance_factor: float) -> tolerance.Comparison:
        """``out`` (the target's ``[*lead, r, d_v]`` at the rows) against the golden, by the policy
        of `spec.tolerance.compare`."""
        return tolerance.compare(out, self.out, self.baseline, rows=self.seen, tolerance=tolerance_factor,
                                 floor_=self.floor)


def expected_rows(target: Target, inputs: Inputs, rows: Array, *,
                  baseline_in: str | None = None) -> ExpectedRows:
    """The golden, the baseline (in the dtype the target computes in, `Target.precision`, or
    ``baseline_in``) and the floor of the query ``rows`` of ``inputs`` as ``target`` declares
    itself (its alignment). The floor is the largest of each block's (`spec.tolerance.floor` on
    its slices and rows, in the dtype the target computes in: each slice is a call of its own, so
    its floor bounds its rows; the largest bounds them all)."""
    inputs = oracle.meaning(inputs)
    precision = as_dtype(target.precision(np.dtype(inputs.q.dtype).name))
    work = precision if baseline_in is None else as_dtype(baseline_in)
    n, r, d_v = _count(inputs.lead), len(rows), inputs.v.shape[-1]
    out, lse, base = np.zeros((n, r, d_v)), np.zeros((n, r)), np.zeros((n, r, d_v))
    seen = np.zeros((n, r), dtype=bool)
    narrows = [term.weights_in for _, term, _ in oracle.bound(inputs)
               if isinstance(term, Reads) and term.weights_in is not None]
    floor = 0.0
    scale = inputs.scale_value
    for b in blocks(inputs, target.alignment, rows, work):
        vis = np.broadcast_to(b.visible, (*b.q.shape[:-1], b.k.shape[-2]))
        o, weights, l_ = golden.forward(b.q, b.k, b.v, visible=vis, scale=scale, terms=b.terms)
        qw, kw, vw = (np.asarray(x).astype(work, copy=False) for x in (b.q, b.k, b.v))
        assert b.work_terms is not None
        base[b.flat, b.at] = tolerance.baseline(qw, kw, vw, visible=vis, scale=scale, terms=b.work_terms)
        block_floor = tolerance.floor(*(np.asarray(x).astype(precision, copy=False) for x in (b.q, b.k, b.v)),
                                      scale=scale, added=b.terms.added)
        for fmt in narrows:
            block_floor += tolerance.weights_floor(weights, b.v, fmt)
        floor = max(floor, block_floor)
        out[b.flat, b.at], lse[b.flat, b.at], seen[b.flat, b.at] = o, l_, weights.sum(axis=-1) > 0
    lead = inputs.lead
    return ExpectedRows(np.asarray(rows), out.reshape(*lead, r, d_v), lse.reshape(*lead, r),
                        base.reshape(*lead, r, d_v), floor, seen.reshape(*lead, r))


# --- the backward ----------------------------------------------------------------------------


@dataclass(frozen=True)
class GradientsRows:
    """The golden backward of an upstream gradient that is zero outside the sampled rows, with its
    baseline and per-entry floors, by name (``dq``, ``dk``, ``dv``), each in the shape of what it is
    the gradient of (dq is zero outside the rows in all three)."""

    golden: dict[str, Array]
    baseline: dict[str, Array]
    floors: dict[str, Array]


def upstream(inputs: Inputs, rows: Array, seed: int = 0) -> Array:  # -> [*lead, n_q, d_v], in q's dtype
    """An upstream gradient d_out: standard normal at the ``rows``, zero elsewhere."""
    d_out = np.zeros(inputs.out_shape, dtype=inputs.q.dtype)
    rng = np.random.default_rng([seed, 9])
    d_out[..., rows, :] = rng.standard_normal((*inputs.lead, len(rows), inputs.out_shape[-1]))
    return d_out


def _backward(q: Array, k: Array, v: Array, d_out: Array, *, visible: Array, scale: float,
              terms: golden.Terms) -> tuple[Array, Array, Array, Array]:
    """float64 (dq, dk, dv, p) of one block, each slice one row of the first axis: the softmax's
    Jacobian applied row by row as dS_i = p_i ∘ (dP_i − p_i·dP_i) (the product (diag(p) − p pᵀ) dP
    expanded, never formed: n_k² entries a row at 350,000 keys), back through each transform."""
    stages = [golden._raw_scores(q, k, scale)]
    for f, _ in terms.transforms:
        stages.append(f(stages[-1]))
    p, _ = golden._normalise(golden._finish(stages[-1], visible, terms), terms)
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))
    for (_, derivative), before in zip(reversed(terms.transforms), reversed(stages[:-1]), strict=True):
        ds = ds * derivative(before)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(p, -1, -2) @ d_out, p


def gradients_rows(target: Target, inputs: Inputs, rows: Array, d_out: Array, *,
                   baseline_in: str | None = None) -> GradientsRows:
    """The golden backward of ``inputs`` for an upstream gradient ``d_out`` that is zero outside the
    query ``rows`` (`upstream`), its textbook baseline in the target's computing dtype (or
    ``baseline_in``; `spec.tolerance.baseline_backward`) and its per-entry floors in the target's
    computing dtype (`spec.tolerance.grad_floors`),
    at the cost of those rows. Grouped K/V heads sum their query heads' dk and dv. Keywords that
    add gradients of their own (a bias, sinks) are not differentiated here."""
    inputs = oracle.meaning(inputs)
    rows = check_rows(rows, inputs.n_q)
    if np.any(np.delete(np.asarray(d_out), rows, axis=-2)):
        raise ValueError("d_out must be zero outside the sampled rows: the sampled backward differentiates "
                         "those rows alone")
    precision = as_dtype(target.precision(np.dtype(inputs.q.dtype).name))
    work = precision if baseline_in is None else as_dtype(baseline_in)
    lead, kv_lead = inputs.lead, inputs.k.shape[:-2]
    scale = inputs.scale_value
    do_rows = np.asarray(d_out)[..., rows, :]
    names = ("dq", "dk", "dv")
    shapes = {"dq": inputs.q.shape, "dk": inputs.k.shape, "dv": inputs.v.shape}
    gold = {n: np.zeros(shapes[n]) for n in names}
    base = {n: np.zeros(shapes[n]) for n in names}
    floors = {n: np.zeros(shapes[n]) for n in names}
    for b in blocks(inputs, target.alignment, rows, work):
        do_b = _take(do_rows[..., b.at, :], lead, b.flat, 2)
        vis = np.broadcast_to(b.visible, (*b.q.shape[:-1], b.k.shape[-2]))
        q64, k64, v64, do64 = (np.asarray(x, dtype=np.float64) for x in (b.q, b.k, b.v, do_b))
        dq, dk, dv, p = _backward(q64, k64, v64, do64, visible=vis, scale=scale, terms=b.terms)
        qw, kw, vw, dw = (np.asarray(x).astype(work) for x in (b.q, b.k, b.v, do_b))
        assert b.work_terms is not None
        bb = tolerance.baseline_backward(qw, kw, vw, dw, visible=vis, scale=scale, terms=b.work_terms)
        ff = tolerance.grad_floors(*(np.asarray(x).astype(precision) for x in (b.q, b.k, b.v, do_b)), p=p,
                                   scale=scale, terms=b.terms)
        for store, (g_q, g_k, g_v) in ((gold, (dq, dk, dv)), (base, (bb.dq, bb.dk, bb.dv)),
                                       (floors, (ff.dq, ff.dk, ff.dv))):
            _put_rows(store["dq"], lead, b.flat, rows[b.at], g_q)
            _add_kv(store["dk"], lead, kv_lead, b.flat, g_k)
            _add_kv(store["dv"], lead, kv_lead, b.flat, g_v)
    return GradientsRows(gold, base, floors)


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
