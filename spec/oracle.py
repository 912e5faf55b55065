"""What a call should give: the golden, the baseline, the floor and the visibility of exactly the
`spec.inputs.Inputs` a target received, composed from the keywords' declarations.

For each keyword among the arguments its declaration's terms are bound to their values and the
call's `Geometry` (shapes and diagonals); restrictions join the visibility, transforms, added
terms and sinks go to `spec.golden` in float64 and to `spec.tolerance.baseline` in the dtype the
target computes in (`Target.computes`). Nothing here names a keyword.

Every entry point starts from `meaning`: the inputs with k and v as the maths reads them (a
keyword's `spec.keywords.Reads` term: a paged pool gathered into contiguous keys, float8 codes
dequantized), so that the golden, the baseline, the floor, the visibility and the causes of
empty rows all follow what the keys mean, not how they were stored.

At any query rows: row i of attention depends on q_i, every key and value, and row i of what the
keywords make of the scores (its visibility, its added terms, its sink); no other query enters
it. So `geometry`, `restrictions`, `visibility`, `golden_of`, `expected` and `gradients` take
``rows`` (increasing query positions; None: every row): the call's geometry is computed whole
(O(n_q) integers) and cut to the rows, each keyword's term is evaluated there
(`spec.keywords.Geometry.rows`), an array of its own (``mask=``, ``bias=``) is read at them, and
the golden, baseline and floor are those of the rows alone, at their cost. ``slices`` (flat
indices into the (batch, head) slices) takes some slices only, each query head with the K/V head
it reads: `spec.sampled` cuts a call of 350,000 keys or 132,800 slices into blocks that way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from spec import golden, tolerance
from spec.dtypes import as_dtype
from spec.inputs import Inputs
from spec.keywords import (
    CAUSES,
    Adds,
    Geometry,
    Keyword,
    Leaves,
    Reads,
    Realigns,
    Restricts,
    Sinks,
    Transforms,
    Widens,
    by_argument,
    registered,
)
from spec.target import Target

Array = np.ndarray


def meaning(inputs: Inputs) -> Inputs:
    """``inputs`` with k and v as the maths reads them: every `spec.keywords.Reads` term of the
    keywords among the arguments applied to them, in declaration order (a paged pool gathered to
    ``[batch, heads_kv, n_k, d]``, then float8 codes dequantized); ``inputs`` itself when no
    keyword reads them. The arguments are otherwise as given (the block table, the descales, the
    key lengths stay, for the terms that read them). Worked out once per inputs; the meaning of a
    meaning is itself."""
    return inputs.remember("meaning", lambda: _meaning(inputs))


def _meaning(inputs: Inputs) -> Inputs:
    reads = [(term, values) for _, term, values in bound(inputs) if isinstance(term, Reads)]
    widens = [(term, values) for _, term, values in bound(inputs) if isinstance(term, Widens)]
    if not reads and not widens:
        return inputs
    q, k, v = inputs.q, inputs.k, inputs.v
    for term, values in reads:
        k, v = term.read(k, v, *values)
    for wide, given in widens:
        q, k = widened(q, k, v, wide.query(*given))
    read = dataclasses.replace(inputs, q=q, k=k, v=v)
    read.memo["meaning"] = read
    return read


def widened(q: Array, k: Array, v: Array, extra: Array) -> tuple[Array, Array]:
    # q, k, v, extra -> [..., n_q, d_k + d_v], [..., n_k, d_k + d_v]
    """``q' = [q | extra]`` and ``k' = [k | v]`` on the last axis (a `Widens` term: the score of
    query i and key j gains ``extra_i · v_j`` at the call's scale), in the wider of the dtypes.
    Refused with ValueError naming ``qv`` unless ``extra`` has q's leading shape and v's width."""
    extra = np.asarray(extra)
    if extra.shape != (*np.shape(q)[:-1], np.shape(v)[-1]):
        raise ValueError(f"qv must have shape {(*np.shape(q)[:-1], np.shape(v)[-1])} (q's queries, v's "
                         f"width d_v), got {extra.shape}")
    return np.concatenate([q, extra.astype(q.dtype, copy=False)], axis=-1), np.concatenate([k, v], axis=-1)


def check_rows(rows: Array, n_q: int) -> Array:  # -> [r] int64
    """``rows`` as int64, refused with ValueError unless strictly increasing within [0, n_q)."""
    found = np.asarray(rows)
    if found.ndim != 1 or (found.size and found.dtype.kind not in "iu"):
        raise ValueError(f"rows must be a 1-D integer array, got {found.dtype} {found.shape}")
    found = found.astype(np.int64)
    if found.size and (found[0] < 0 or found[-1] >= n_q or np.any(np.diff(found) <= 0)):
        shown = found.tolist() if found.size <= 8 else str(found[:8].tolist())[:-1] + ", …]"
        raise ValueError(f"rows must increase strictly within [0, n_q={n_q}), got {shown}")
    return found


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
                         f"and {len(rows)} rows are evaluated")
    return np.take(a, rows, axis=axis)


def geometry(align: golden.Alignment, inputs: Inputs, rows: Array | None = None) -> Geometry:
    """Shapes and diagonals of this call in the alignment ``align`` (a target's
    `Target.alignment`), moved by any keyword that realigns them (`spec.keywords.Realigns`); at
    the query ``rows`` (None: every query), the whole call's cut to them."""
    inputs = meaning(inputs)
    whole = inputs.remember(("geometry", align), lambda: _geometry(align, inputs))
    if rows is None:
        return whole
    rows = check_rows(rows, inputs.n_q)
    return dataclasses.replace(whole, diagonal=_at(whole.diagonal, rows, whole.n_q),
                               bottom_right=_at(whole.bottom_right, rows, whole.n_q), rows=rows,
                               origin=_at(whole.origin, rows, whole.n_q))


def _geometry(align: golden.Alignment, inputs: Inputs) -> Geometry:
    n_q, n_k = inputs.n_q, inputs.n_k
    per_row = align in ("kv_lengths", "top_left_kv_lengths")
    corner_align: golden.Alignment = "kv_lengths" if per_row else "bottom_right"
    geo = Geometry(inputs.lead, n_q, n_k, align, golden.diagonal(n_q, n_k, align),
                   golden.diagonal(n_q, n_k, "bottom_right"))
    for _, term, values in bound(inputs):
        if isinstance(term, Realigns):  # the bottom-right diagonal moves as in a bottom-right target
            corner = dataclasses.replace(geo, align=corner_align, diagonal=geo.bottom_right)
            geo = dataclasses.replace(geo, diagonal=term.diagonal(geo, *values),
                                      bottom_right=term.diagonal(corner, *values),
                                      origin=geo.origin if term.origin is None else term.origin(geo, *values))
    return geo


def bound(inputs: Inputs) -> list[tuple[Keyword, Any, tuple[Any, ...]]]:
    """(keyword, term, values) for every term of every keyword among the arguments, in the order
    the keywords are declared."""
    return inputs.remember("bound", lambda: _bound(inputs))


def _bound(inputs: Inputs) -> list[tuple[Keyword, Any, tuple[Any, ...]]]:
    table = by_argument()
    present = {table[name].name for name,
               value in inputs.keywords.items() if value is not None and name in table}
    found = []
    for kw in registered().values():
        given = kw.given(inputs.keywords) if kw.name in present else None
        if given is not None:
            found += [(kw, term, given) for term in kw.terms]
    return found


def restrictions(align: golden.Alignment, inputs: Inputs,
                 rows: Array | None = None) -> list[tuple[str, Array]]:
    """Each restriction of what the queries (the ``rows``; None: every query) see, with its
    cause, in the order of `CAUSES`: causal, the keywords' restrictions, mask=, and the −inf
    entries of added terms; each broadcastable to ``[*lead, n_q, n_k]`` (n_q: the rows)."""
    inputs = meaning(inputs)
    if rows is None:
        return inputs.remember(("restrictions", align),
                               lambda: _restrictions(inputs, geometry(align, inputs)))
    return _restrictions(inputs, geometry(align, inputs, rows))


def _restrictions(inputs: Inputs, geo: Geometry) -> list[tuple[str, Array]]:
    found: list[tuple[str, Array]] = []
    if inputs.causal:
        found.append(("causal", np.arange(inputs.n_k) <= geo.diagonal))
    if inputs.mask is not None:
        found.append(("mask", _cut(np.asarray(inputs.mask, dtype=bool), geo)))
    for _, term, values in bound(inputs):
        if isinstance(term, Restricts):
            found.append((term.cause, _cut(term.visible(geo, *values), geo, dtype=bool)))
        elif isinstance(term, Adds) and term.cause is not None:
            found.append((term.cause, ~np.isneginf(_cut(term.added(geo, *values), geo, dtype=np.float64))))
    return sorted(found, key=lambda pair: CAUSES.index(pair[0]))


def _cut(a: Any, geo: Geometry, *, dtype: Any = None, axis: int = -2) -> Any:
    """``a``, a term's array for the queries of ``geo``, read at its rows (`_at`) where ``geo`` is
    of some rows only; as it is for every query."""
    if geo.rows is None:
        return a
    return _at(np.asarray(a, dtype=dtype), geo.rows, geo.n_q, axis=axis)


def visibility(align: golden.Alignment, inputs: Inputs,
               rows: Array | None = None) -> Array:  # -> [*lead, n_q, n_k] bool (n_q: the rows)
    """What each query (each of the ``rows``; None: every query) may see: every restriction ANDed."""
    inputs = meaning(inputs)
    if rows is not None:
        rows = check_rows(rows, inputs.n_q)
        return golden.visibility(inputs.lead, len(rows), inputs.n_k,
                                 restrictions=[arr for _, arr in restrictions(align, inputs, rows)])
    return inputs.remember(("visibility", align), lambda: golden.visibility(
        inputs.lead, inputs.n_q, inputs.n_k, restrictions=[arr for _, arr in restrictions(align, inputs)]))


def causes(align: golden.Alignment,
           inputs: Inputs) -> Array:  # -> [*lead, n_q] str ("" where a row sees a key)
    """Why each row that sees no key sees none: the first cause in `CAUSES` order after which,
    ANDed with those before it, the row sees nothing (``no_keys`` when n_k = 0)."""
    inputs = meaning(inputs)
    shape = (*inputs.lead, inputs.n_q)
    found = np.full(shape, "", dtype=object)
    if inputs.n_k == 0:
        found[...] = "no_keys"
        return found
    seen = np.ones((*shape, inputs.n_k), dtype=bool)
    for cause, arr in restrictions(align, inputs):
        seen = seen & arr
        found[(found == "") & ~seen.any(axis=-1)] = cause
    return found


def policies(target: Target, inputs: Inputs) -> Array:  # -> [*lead, n_q] str ("" where a row sees a key)
    """The declared masked-row policy of each row that sees no key (`Target.policy` of its
    cause). A row with a finite sink logit is the exception: the sink takes all its weight and
    carries no value, so it gives zeros whatever the policy."""
    inputs = meaning(inputs)
    why = causes(target.alignment, inputs)
    out = np.full(why.shape, "", dtype=object)
    for cause in set(why.reshape(-1).tolist()) - {""}:
        out[why == cause] = target.policy(cause)
    sinks = terms(inputs, geometry(target.alignment, inputs)).sinks
    if sinks is not None:
        out[(why != "") & np.isfinite(np.broadcast_to(sinks, why.shape))] = "zeros"
    return out


def terms(inputs: Inputs, geo: Geometry, dtype: np.dtype | None = None) -> golden.Terms:
    """The keywords' terms as `spec.golden.Terms`: float64 (``dtype`` None) for the golden, or
    the baseline's, every step in ``dtype`` (of the inputs' `meaning`: ``geo`` is its geometry,
    or its geometry at some rows, `geometry`: the terms are then those rows')."""
    inputs = meaning(inputs)
    transforms, added, sinks = [], [], None
    for _, term, values in bound(inputs):
        if isinstance(term, Transforms):
            values = (geo, *values) if term.indexed else values  # a score function reads the indices
            if dtype is None:
                transforms.append((_bind(term.golden, values), _bind(term.derivative, values)))
            else:
                transforms.append((_bind_dtype(term.baseline, dtype, values), _bind(term.derivative, values)))
        elif isinstance(term, Adds):
            a = _cut(term.added(geo, *values), geo, dtype=np.float64)
            with np.errstate(over="ignore"):  # a term past the dtype's range rounds to ±inf, as in a kernel
                added.append(a if dtype is None else np.asarray(a).astype(dtype))
        elif isinstance(term, Sinks):
            logits = _cut(np.asarray(term.logits(geo, *values), dtype=np.float64), geo, axis=-1)
            with np.errstate(over="ignore"):
                sinks = logits if dtype is None else logits.astype(dtype)
    return golden.Terms(tuple(transforms), tuple(added), sinks)


def _bind(fn: Any, values: tuple[Any, ...]) -> Any:
    return lambda s: fn(s, *values)


def _bind_dtype(fn: Any, dtype: np.dtype, values: tuple[Any, ...]) -> Any:
    return lambda s: fn(s, dtype, *values)


@dataclass(frozen=True)
class Expected:
    """What a correct target gives for a call (at the query ``rows`` evaluated, if some only),
    and how far it may stray."""

    out: Array  # the float64 golden [*lead, n_q, d_v] (n_q: the rows)
    lse: Array  # its logsumexp [*lead, n_q]
    baseline: Array  # the naive computation in the target's computing dtype
    floor: float  # the a-priori error of a correct computation (spec.tolerance.floor)
    seen: Array  # [*lead, n_q] rows with weight on some key (none: it sees no key, or its sink takes all)
    pattern: tuple[Array, Array] | None
    """(weights, visible): the golden's pattern and what each query sees, ``[*lead, n_q, n_k]``;
    None where the expectation was put together from blocks (`spec.sampled`: n_k entries a row
    for every slice are what blocks avoid holding)."""
    rows: Array | None = None  # the query rows evaluated ([r] int); None: every row

    @property
    def weights(self) -> Array:  # -> [*lead, n_q, n_k]
        """The golden's pattern."""
        return self._pattern()[0]

    @property
    def visible(self) -> Array:  # -> [*lead, n_q, n_k] bool
        """What each query sees."""
        return self._pattern()[1]

    def _pattern(self) -> tuple[Array, Array]:
        if self.pattern is None:
            raise ValueError("this expectation was put together from blocks and keeps no pattern")
        return self.pattern

    def compare(self, out: Array, tolerance_factor: float) -> tolerance.Comparison:
        """``out`` (the target's, at the same rows) against the golden, by the policy of
        `spec.tolerance.compare`, on the rows that see a key."""
        return tolerance.compare(out, self.out, self.baseline, rows=self.seen, tolerance=tolerance_factor,
                                 floor_=self.floor)


@dataclass(frozen=True)
class _Part:
    """A call at some query rows and slices, as the golden reads it: q with every query (the
    golden takes the ``rows``), k and v, and what the keywords make of those rows."""

    q: Array  # [*lead, n_q, d_k], or [c, n_q, d_k] for c slices
    k: Array  # [*kv_lead, n_k, d_k], or [c, n_k, d_k]: each slice's query head's K/V head
    v: Array
    rows: Array | None
    visible: Array  # [*lead, r, n_k] or [c, r, n_k] bool
    terms: golden.Terms  # float64
    work_terms: golden.Terms | None  # in the dtype of a baseline, if asked for


def _part(align: golden.Alignment, inputs: Inputs, rows: Array | None, slices: Array | None,
          work: np.dtype | None = None) -> _Part:
    """``inputs`` (their `meaning`) at the query ``rows`` (None: every row) and the (batch, head)
    ``slices`` (flat indices into ``inputs.lead``; None: every slice)."""
    rows = None if rows is None else check_rows(rows, inputs.n_q)
    geo = geometry(align, inputs, rows)
    found = [arr for _, arr in restrictions(align, inputs, rows)]
    gold, base = terms(inputs, geo), None if work is None else terms(inputs, geo, work)
    n = inputs.n_q if rows is None else len(rows)
    if slices is None:
        vis = visibility(align, inputs) if rows is None else golden.visibility(inputs.lead, n, inputs.n_k,
                                                                               restrictions=found)
        return _Part(inputs.q, inputs.k, inputs.v, rows, vis, gold, base)
    lead, flat = inputs.lead, np.asarray(slices, dtype=np.int64)
    visible: Array = np.ones((1, 1, 1), dtype=bool)
    for r in found:
        visible = visible & _take(r, lead, flat, 2)
    q = _take(inputs.q, lead, flat, 2)
    return _Part(q, _take(inputs.k, lead, flat, 2, kv=True), _take(inputs.v, lead, flat, 2, kv=True), rows,
                 np.broadcast_to(visible, (len(flat), n, inputs.n_k)), _terms_at(gold, lead, flat),
                 None if base is None else _terms_at(base, lead, flat))


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


def _terms_at(found: golden.Terms, lead: tuple[int, ...], flat: Array) -> golden.Terms:
    return golden.Terms(found.transforms, tuple(_take(a, lead, flat, 2) for a in found.added),
                        None if found.sinks is None else _take(found.sinks, lead, flat, 1))


def golden_of(
    inputs: Inputs, align: golden.Alignment = "top_left", *, visible: Array | None = None,
    rows: Array | None = None, slices: Array | None = None,
) -> tuple[Array, Array, Array]:
    """The float64 golden ``(out, weights, lse)`` of a call in the alignment ``align``, every
    keyword among its arguments included: a reference for any kernel the suite describes.

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v], [..., n_q, n_k], [..., n_q]
    (k and v as they mean: `meaning`)

    ``rows``: only those query rows (``[r]`` int, increasing), the results ``[..., r, ...]``;
    ``slices``: only those (batch, head) slices (flat indices into the lead), the results
    ``[c, ...]``. ``visible`` replaces the visibility the arguments give (every row and slice).
    """
    inputs = meaning(inputs)
    if rows is not None or slices is not None:
        if visible is not None:
            raise ValueError("visible= replaces the whole call's visibility: give no rows or slices with it")
        part = _part(align, inputs, rows, slices)
        return golden.forward(part.q, part.k, part.v, visible=part.visible, scale=inputs.scale_value,
                              terms=part.terms, rows=part.rows)
    geo = geometry(align, inputs)
    vis = visibility(align, inputs) if visible is None else visible
    q = inputs.q
    k, v = golden.with_kv_heads(q, inputs.k), golden.with_kv_heads(q, inputs.v)
    return golden.forward(q, k, v, visible=vis, scale=inputs.scale_value, terms=terms(inputs, geo))


def expected(target: Target, inputs: Inputs, *, visible: Array | None = None, rows: Array | None = None,
             slices: Array | None = None, baseline_in: str | None = None) -> Expected:
    """The golden, baseline and floor of ``inputs`` as ``target`` declares itself (alignment,
    ``computes``); ``visible`` replaces the visibility the arguments give. ``rows`` and
    ``slices``: those query rows and (batch, head) slices only (`golden_of`); ``baseline_in``:
    the baseline in that dtype instead of the one the target computes in (the floor stays that
    dtype's)."""
    inputs = meaning(inputs)
    if rows is not None or slices is not None or baseline_in is not None:
        if visible is not None:
            raise ValueError("visible= replaces the whole call's visibility: give no rows or slices with it")
        return _expected_at(target, inputs, rows, slices, baseline_in)
    if visible is not None:
        return _expected(target, inputs, visible)
    key = ("expected", target.alignment, target.precision(np.dtype(inputs.q.dtype).name))
    return inputs.remember(key, lambda: _expected(target, inputs, None))


def _expected(target: Target, inputs: Inputs, visible: Array | None) -> Expected:
    align = target.alignment
    geo = geometry(align, inputs)
    vis = visibility(align, inputs) if visible is None else visible
    gold, weights, lse = golden_of(inputs, align, visible=vis)
    q = inputs.q
    k, v = golden.with_kv_heads(q, inputs.k), golden.with_kv_heads(q, inputs.v)
    work = as_dtype(target.precision(np.dtype(q.dtype).name))
    qw, kw, vw = (np.asarray(x).astype(work, copy=False) for x in (q, k, v))
    scale = inputs.scale_value
    base = tolerance.baseline(qw, kw, vw, visible=vis, scale=scale, terms=terms(inputs, geo, work))
    # off the values as they mean (k and v read from a float8 cache may lie past the range of the
    # dtype computed in: cast there they would be inf, and so would the floor)
    floor = tolerance.floor(q, k, v, scale=scale, added=terms(inputs, geo).added, dtype=work,
                            score_error=transform_error(inputs))
    floor = _with_weights_floor(floor, inputs, weights, v)
    return Expected(gold, lse, base, floor, weights.sum(axis=-1) > 0, (weights, vis))


def transform_error(inputs: Inputs) -> float:
    """What the keywords' transforms of the scores may add to each score when computed correctly
    in floats, in units of eps (`Transforms.error`; softcap's 2c): 0 without one."""
    return sum((float(term.error(*values)) for _, term, values in bound(inputs)
                if isinstance(term, Transforms) and term.error is not None), 0.0)


def _with_weights_floor(floor: float, inputs: Inputs, weights: Array, v: Array) -> float:
    """``floor`` and what a kernel that may round its weights to a narrower format adds to it."""
    for _, term, _ in bound(inputs):
        if isinstance(term, Reads) and term.weights_in is not None:
            floor += tolerance.weights_floor(weights, v, term.weights_in)
    return floor


def _expected_at(target: Target, inputs: Inputs, rows: Array | None, slices: Array | None,
                 baseline_in: str | None) -> Expected:
    """`expected` at some rows and slices, or with the baseline in another dtype."""
    precision = as_dtype(target.precision(np.dtype(inputs.q.dtype).name))
    work = precision if baseline_in is None else as_dtype(baseline_in)
    part = _part(target.alignment, inputs, rows, slices, work)
    scale = inputs.scale_value
    gold, weights, lse = golden.forward(part.q, part.k, part.v, visible=part.visible, scale=scale,
                                        terms=part.terms, rows=part.rows)
    q = golden.at_rows(part.q, part.rows)
    k, v = golden.with_kv_heads(q, part.k), golden.with_kv_heads(q, part.v)
    qw, kw, vw = (np.asarray(x).astype(work, copy=False) for x in (q, k, v))
    assert part.work_terms is not None
    base = tolerance.baseline(qw, kw, vw, visible=part.visible, scale=scale, terms=part.work_terms)
    floor = tolerance.floor(q, k, v, scale=scale, added=part.terms.added, dtype=precision,
                            score_error=transform_error(inputs))
    floor = _with_weights_floor(floor, inputs, weights, v)
    return Expected(gold, lse, base, floor, weights.sum(axis=-1) > 0, (weights, part.visible), part.rows)


# --- gradients ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpectedGradients:
    """What a correct backward gives for a call and an upstream gradient, by name: ``dq``, ``dk``,
    ``dv`` and the gradient of each extra input the call's keywords define (``dbias``, ``dsinks``:
    their terms' ``grad``), each in the shape of what it is the gradient of."""

    golden: dict[str, Array]  # float64
    baseline: dict[str, Array]  # the textbook backward in the target's computing dtype
    floors: dict[str, float]  # the a-priori error of a correct backward in that dtype
    weights: Array | None  # the forward's pattern P [*lead, n_q, n_k], before dropout's keep
    visible: Array | None  # what each query sees [*lead, n_q, n_k]
    """(weights, visible): None where the gradients were put together from blocks (`spec.sampled`)."""
    entry_floors: dict[str, Array] = dataclasses.field(default_factory=dict)
    """The floors entry by entry, in each gradient's shape (``floors`` are their largest)."""


BACKWARD_TERMS = (Restricts, Transforms, Adds, Sinks, Realigns, Widens, Leaves)
"""The kinds of term the golden backward differentiates through (`gradients`); a `Leaves` term
leaves it as it is (dropout's kept set is the ``keep`` given); a `Widens` term's columns are split
back off dq and dk (`unwidened`). Not `Reads`: a cache is read at
inference, and the gradient of a paged pool or of float8 codes is no kernel's contract."""


def gradients(
    target: Target, inputs: Inputs, d_out: Array, *, keep: Array | None = None, rows: Array | None = None,
    slices: Array | None = None, baseline_in: str | None = None,
) -> ExpectedGradients:
    """The golden backward of exactly these inputs (`spec.golden.backward` through the keywords'
    terms, in the target's alignment), its baseline in the dtype the target computes in
    (`spec.tolerance.baseline_backward`; or ``baseline_in``) and its floors
    (`spec.tolerance.grad_floors`, in the dtype the target computes in).

    ``d_out`` ``[*lead, n_q, d_v]``: the upstream gradient. ``keep`` (broadcastable to
    ``[*lead, n_q, n_k]``): dropout's multiplier, 0 where the forward dropped a weight and
    1/(1 − p) where it kept one — the target's own kept set, read from its forward.

    Each added term's dS is summed back to the shape of the value passed (a bias broadcast over
    the heads gets the sum over the heads), each row's dσ to the sinks' shape (``[heads]``:
    summed over the batch and the queries); grouped K/V heads sum their group's dk and dv.

    ``rows``: ``d_out`` is zero off those query rows (ValueError otherwise), and the backward is
    that of those rows alone, exact at their cost: dq is given at them (``[*lead, r, d_k]``), dk
    and dv are sums over them; the extras (a bias's, sinks') are not given. ``slices``: those
    (batch, head) slices only (flat indices into the lead), every gradient per slice ``[c, ...]``
    with dk and dv per query head (the sums over a group of query heads are the caller's).
    """
    inputs = meaning(inputs)
    work = as_dtype(target.precision(np.dtype(inputs.q.dtype).name))
    if rows is not None or slices is not None or baseline_in is not None:
        found = _gradients_at(target.alignment, work, inputs, d_out, keep, rows, slices,
                              work if baseline_in is None else as_dtype(baseline_in))
    else:
        key = ("gradients", target.alignment, work.name, np.asarray(d_out).tobytes(),
               None if keep is None else np.asarray(keep, dtype=np.float64).tobytes())
        found = inputs.remember(key, lambda: _gradients(target.alignment, work, inputs, d_out, keep))
    return folded(found) if target.v_from_k else found


def folded(grads: ExpectedGradients) -> ExpectedGradients:
    """The gradients of a ``v_from_k`` call (`spec.target.Target.v_from_k`: v is k's first d_v
    columns, the one input being the latent k): dv added into the first d_v columns of dk, and dv
    zeros (nothing reaches v but through k), in the golden, the baseline and the floors."""
    def fold(found: dict[str, Array]) -> dict[str, Array]:
        dk, dv = np.array(found["dk"], copy=True), found["dv"]
        dk[..., :dv.shape[-1]] += dv
        return found | {"dk": dk, "dv": np.zeros_like(dv)}

    floors = dict(grads.floors) | {"dk": grads.floors["dk"] + grads.floors["dv"], "dv": 0.0}
    entry = fold(grads.entry_floors) if grads.entry_floors else {}
    if entry:
        floors |= {"dk": float(np.max(entry["dk"], initial=0.0))}
    return dataclasses.replace(grads, golden=fold(grads.golden), baseline=fold(grads.baseline), floors=floors,
                               entry_floors=entry)


def _differentiable(inputs: Inputs) -> None:
    for keyword, term, _ in bound(inputs):
        if not isinstance(term, BACKWARD_TERMS):
            raise ValueError(f"the golden backward cannot differentiate through keyword {keyword.name!r} "
                             f"({type(term).__name__} term)")


def _gradients(align: golden.Alignment, work: np.dtype, inputs: Inputs, d_out: Array,
               keep: Array | None) -> ExpectedGradients:
    _differentiable(inputs)
    geo = geometry(align, inputs)
    vis = visibility(align, inputs)
    q, k, v = inputs.q, inputs.k, inputs.v
    scale = inputs.scale_value
    gold_terms = dataclasses.replace(terms(inputs, geo), keep=keep)
    gold = golden.backward(q, k, v, d_out, visible=vis, scale=scale, terms=gold_terms)
    qw, kw, vw, dw = (np.asarray(x).astype(work) for x in (q, k, v, d_out))
    base = tolerance.baseline_backward(qw, kw, vw, dw, visible=vis, scale=scale,
                                       terms=dataclasses.replace(terms(inputs, geo, work), keep=keep))
    floors = tolerance.grad_floors(qw, kw, vw, dw, p=gold.weights, scale=scale, terms=gold_terms)
    found: dict[str, dict[str, Array]] = {}
    for grads, into in ((gold, "golden"), (base, "baseline"), (floors, "floors")):
        found[into] = unwidened(inputs, dict(zip(golden.GRADS, (grads.dq, grads.dk, grads.dv), strict=True)))
        found[into] |= _extras(inputs, geo, grads)
    return ExpectedGradients(found["golden"], found["baseline"],
                             {name: float(np.max(x, initial=0.0)) for name, x in found["floors"].items()},
                             gold.weights, vis, found["floors"])


def _gradients_at(align: golden.Alignment, precision: np.dtype, inputs: Inputs, d_out: Array,
                  keep: Array | None, rows: Array | None, slices: Array | None,
                  work: np.dtype) -> ExpectedGradients:
    """`gradients` at some rows and slices, or with the baseline in another dtype."""
    _differentiable(inputs)
    d_out = np.asarray(d_out)
    if rows is not None:
        rows = check_rows(rows, inputs.n_q)
        if np.any(np.delete(d_out, rows, axis=-2)):
            raise ValueError("d_out must be zero outside the rows: the backward at rows differentiates "
                             "those rows alone")
        d_out = d_out[..., rows, :]
    part = _part(align, inputs, rows, slices, work)
    if slices is not None:
        d_out = _take(d_out, inputs.lead, np.asarray(slices, dtype=np.int64), 2)
    if keep is not None:
        keep = np.asarray(keep, dtype=np.float64)
        keep = keep if rows is None else _at(keep, rows, inputs.n_q)
        keep = keep if slices is None else _take(keep, inputs.lead, np.asarray(slices, dtype=np.int64), 2)
    scale = inputs.scale_value
    gold_terms = dataclasses.replace(part.terms, keep=keep)
    gold = golden.backward(part.q, part.k, part.v, d_out, visible=part.visible, scale=scale, terms=gold_terms,
                           rows=part.rows)
    q = golden.at_rows(part.q, part.rows)
    assert part.work_terms is not None
    qw, kw, vw, dw = (np.asarray(x).astype(work) for x in (q, part.k, part.v, d_out))
    base = tolerance.baseline_backward(qw, kw, vw, dw, visible=part.visible, scale=scale,
                                       terms=dataclasses.replace(part.work_terms, keep=keep))
    floors = tolerance.grad_floors(*(np.asarray(x).astype(precision) for x in (q, part.k, part.v, d_out)),
                                   p=gold.weights, scale=scale, terms=gold_terms)
    found = {into: unwidened(inputs, dict(zip(golden.GRADS, (grads.dq, grads.dk, grads.dv), strict=True)))
             for grads, into in ((gold, "golden"), (base, "baseline"), (floors, "floors"))}
    return ExpectedGradients(found["golden"], found["baseline"],
                             {name: float(np.max(x, initial=0.0)) for name, x in found["floors"].items()},
                             gold.weights, part.visible, found["floors"])


def unwidened(inputs: Inputs, grads: dict[str, Array]) -> dict[str, Array]:
    """The gradients of a call whose `Widens` terms widened q and k (``q' = [q | qv]``,
    ``k' = [k | v]``; ``inputs`` its `meaning`) split back: dq and dk lose the appended columns,
    the query columns' gradient is the term's ``grad`` (``dqv``, in the shape of what was
    passed), and the key columns' is added to dv (v reaches the scores through them). The last
    term's columns come off first. ``grads`` as it is without a `Widens` term."""
    found = dict(grads)
    for _, term, values in reversed(bound(inputs)):
        if not isinstance(term, Widens):
            continue
        dq, dk = found["dq"], found["dk"]
        cut = dq.shape[-1] - int(np.shape(values[0])[-1])  # the width before the term's columns
        found["dq"], found["dk"] = dq[..., :cut], dk[..., :cut]
        found["dv"] = found["dv"] + dk[..., cut:]
        if term.grad is not None:
            found[term.grad] = dq[..., cut:]
    return found


def _extras(inputs: Inputs, geo: Geometry, grads: golden.Gradients) -> dict[str, Array]:
    """The gradients of the extra inputs, by their terms' ``grad`` names: each added term's dS
    summed back to its first value's shape, the sinks' dσ to theirs (a term with a ``grad`` is
    that value itself, broadcast: its gradient is the sum over the copies)."""
    found: dict[str, Array] = {}
    added = iter(grads.added)
    for _, term, values in bound(inputs):
        if isinstance(term, Adds):
            d_term = next(added)
            if term.grad is not None:
                found[term.grad] = unbroadcast(d_term, np.shape(values[0]))
        elif isinstance(term, Sinks) and term.grad is not None and grads.sinks is not None:
            per_row = np.shape(term.logits(geo, *values))
            found[term.grad] = unbroadcast(grads.sinks, per_row).reshape(np.shape(values[0]))
    return found


def unbroadcast(grad: Array, shape: tuple[int, ...]) -> Array:  # [..., *shape broadcast] -> shape
    """The gradient of a value of ``shape`` that was broadcast up to ``grad.shape``: the sum over
    its copies (the leading axes it lacked, and the axes where it has size 1)."""
    extra = grad.ndim - len(shape)
    if extra < 0 or any(n not in (1, m) for n, m in zip(shape, grad.shape[extra:], strict=True)):
        raise ValueError(f"a value of shape {shape} does not broadcast to {grad.shape}")
    wide = grad.astype(np.float32) if grad.dtype.itemsize < 4 else grad  # 16-bit: summed in float32
    summed = wide.sum(axis=tuple(range(extra))) if extra else wide
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and summed.shape[i] != 1)
    summed = summed.sum(axis=stretched, keepdims=True) if stretched else summed
    return np.asarray(summed).astype(grad.dtype, copy=False)
