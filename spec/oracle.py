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
    if not reads:
        return inputs
    k, v = inputs.k, inputs.v
    for term, values in reads:
        k, v = term.read(k, v, *values)
    read = dataclasses.replace(inputs, k=k, v=v)
    read.memo["meaning"] = read
    return read


def geometry(align: golden.Alignment, inputs: Inputs) -> Geometry:
    """Shapes and diagonals of this call in the alignment ``align`` (a target's
    `Target.alignment`), moved by any keyword that realigns them (`spec.keywords.Realigns`)."""
    inputs = meaning(inputs)
    return inputs.remember(("geometry", align), lambda: _geometry(align, inputs))


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
                                      bottom_right=term.diagonal(corner, *values))
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


def restrictions(align: golden.Alignment, inputs: Inputs) -> list[tuple[str, Array]]:
    """Each restriction of what the queries see, with its cause, in the order of `CAUSES`:
    causal, the keywords' restrictions, mask=, and the −inf entries of added terms."""
    inputs = meaning(inputs)
    return inputs.remember(("restrictions", align), lambda: _restrictions(align, inputs))


def _restrictions(align: golden.Alignment, inputs: Inputs) -> list[tuple[str, Array]]:
    geo = geometry(align, inputs)
    found: list[tuple[str, Array]] = []
    if inputs.causal:
        found.append(("causal", np.arange(inputs.n_k) <= geo.diagonal))
    if inputs.mask is not None:
        found.append(("mask", np.asarray(inputs.mask, dtype=bool)))
    for _, term, values in bound(inputs):
        if isinstance(term, Restricts):
            found.append((term.cause, term.visible(geo, *values)))
        elif isinstance(term, Adds) and term.cause is not None:
            found.append((term.cause, ~np.isneginf(term.added(geo, *values))))
    return sorted(found, key=lambda pair: CAUSES.index(pair[0]))


def visibility(align: golden.Alignment, inputs: Inputs) -> Array:  # -> [*lead, n_q, n_k] bool
    """What each query may see: every restriction ANDed."""
    inputs = meaning(inputs)
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
    the baseline's, every step in ``dtype`` (of the inputs' `meaning`: ``geo`` is its geometry)."""
    inputs = meaning(inputs)
    transforms, added, sinks = [], [], None
    for _, term, values in bound(inputs):
        if isinstance(term, Transforms):
            if dtype is None:
                transforms.append((_bind(term.golden, values), _bind(term.derivative, values)))
            else:
                transforms.append((_bind_dtype(term.baseline, dtype, values), _bind(term.derivative, values)))
        elif isinstance(term, Adds):
            a = term.added(geo, *values)
            with np.errstate(over="ignore"):  # a term past the dtype's range rounds to ±inf, as in a kernel
                added.append(a if dtype is None else np.asarray(a).astype(dtype))
        elif isinstance(term, Sinks):
            logits = np.asarray(term.logits(geo, *values), dtype=np.float64)
            with np.errstate(over="ignore"):
                sinks = logits if dtype is None else logits.astype(dtype)
    return golden.Terms(tuple(transforms), tuple(added), sinks)


def _bind(fn: Any, values: tuple[Any, ...]) -> Any:
    return lambda s: fn(s, *values)


def _bind_dtype(fn: Any, dtype: np.dtype, values: tuple[Any, ...]) -> Any:
    return lambda s: fn(s, dtype, *values)


@dataclass(frozen=True)
class Expected:
    """What a correct target gives for a call, and how far it may stray."""

    out: Array  # the float64 golden [*lead, n_q, d_v]
    weights: Array  # its pattern [*lead, n_q, n_k]
    lse: Array  # its logsumexp [*lead, n_q]
    baseline: Array  # the naive computation in the target's computing dtype
    floor: float  # the a-priori error of a correct computation (spec.tolerance.floor)
    visible: Array  # what each query sees [*lead, n_q, n_k]

    @property
    def seen(self) -> Array:  # -> [*lead, n_q] bool
        """Rows with weight on some key (a row that sees no key, or whose sink takes it all, has none)."""
        return self.weights.sum(axis=-1) > 0


def golden_of(
    inputs: Inputs, align: golden.Alignment = "top_left", *, visible: Array | None = None,
) -> tuple[Array, Array, Array]:
    """The float64 golden ``(out, weights, lse)`` of a call in the alignment ``align``, every
    keyword among its arguments included: a reference for any kernel the suite describes.

    [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v], [..., n_q, n_k], [..., n_q]
    (k and v as they mean: `meaning`)
    """
    inputs = meaning(inputs)
    geo = geometry(align, inputs)
    vis = visibility(align, inputs) if visible is None else visible
    q = inputs.q
    k, v = golden.with_kv_heads(q, inputs.k), golden.with_kv_heads(q, inputs.v)
    return golden.forward(q, k, v, visible=vis, scale=inputs.scale_value, terms=terms(inputs, geo))


def expected(target: Target, inputs: Inputs, *, visible: Array | None = None) -> Expected:
    """The golden, baseline and floor of ``inputs`` as ``target`` declares itself (alignment,
    ``computes``); ``visible`` replaces the visibility the arguments give."""
    inputs = meaning(inputs)
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
    floor = tolerance.floor(q, k, v, scale=scale, added=terms(inputs, geo).added, dtype=work)
    for _, term, _ in bound(inputs):  # a kernel that may round its weights to a narrower format
        if isinstance(term, Reads) and term.weights_in is not None:
            floor += tolerance.weights_floor(weights, v, term.weights_in)
    return Expected(gold, weights, lse, base, floor, vis)


# --- gradients ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpectedGradients:
    """What a correct backward gives for a call and an upstream gradient, by name: ``dq``, ``dk``,
    ``dv`` and the gradient of each extra input the call's keywords define (``dbias``, ``dsinks``:
    their terms' ``grad``), each in the shape of what it is the gradient of."""

    golden: dict[str, Array]  # float64
    baseline: dict[str, Array]  # the textbook backward in the target's computing dtype
    floors: dict[str, float]  # the a-priori error of a correct backward in that dtype
    weights: Array  # the forward's pattern P [*lead, n_q, n_k], before dropout's keep
    visible: Array  # what each query sees [*lead, n_q, n_k]


BACKWARD_TERMS = (Restricts, Transforms, Adds, Sinks, Realigns, Leaves)
"""The kinds of term the golden backward differentiates through (`gradients`); a `Leaves` term
leaves it as it is (dropout's kept set is the ``keep`` given). Not `Reads`: a cache is read at
inference, and the gradient of a paged pool or of float8 codes is no kernel's contract."""


def gradients(
    target: Target, inputs: Inputs, d_out: Array, *, keep: Array | None = None,
) -> ExpectedGradients:
    """The golden backward of exactly these inputs (`spec.golden.backward` through the keywords'
    terms, in the target's alignment), its baseline in the dtype the target computes in
    (`spec.tolerance.baseline_backward`) and its floors (`spec.tolerance.grad_floors`).

    ``d_out`` ``[*lead, n_q, d_v]``: the upstream gradient. ``keep`` (broadcastable to
    ``[*lead, n_q, n_k]``): dropout's multiplier, 0 where the forward dropped a weight and
    1/(1 − p) where it kept one — the target's own kept set, read from its forward.

    Each added term's dS is summed back to the shape of the value passed (a bias broadcast over
    the heads gets the sum over the heads), each row's dσ to the sinks' shape (``[heads]``:
    summed over the batch and the queries); grouped K/V heads sum their group's dk and dv.
    """
    inputs = meaning(inputs)
    work = as_dtype(target.precision(np.dtype(inputs.q.dtype).name))
    key = ("gradients", target.alignment, work.name, np.asarray(d_out).tobytes(),
           None if keep is None else np.asarray(keep, dtype=np.float64).tobytes())
    return inputs.remember(key, lambda: _gradients(target.alignment, work, inputs, d_out, keep))


def _gradients(align: golden.Alignment, work: np.dtype, inputs: Inputs, d_out: Array,
               keep: Array | None) -> ExpectedGradients:
    for keyword, term, _ in bound(inputs):
        if not isinstance(term, BACKWARD_TERMS):
            raise ValueError(f"the golden backward cannot differentiate through keyword {keyword.name!r} "
                             f"({type(term).__name__} term)")
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
        found[into] = dict(zip(golden.GRADS, (grads.dq, grads.dk, grads.dv), strict=True))
        found[into] |= _extras(inputs, geo, grads)
    return ExpectedGradients(found["golden"], found["baseline"],
                             {name: float(np.max(x, initial=0.0)) for name, x in found["floors"].items()},
                             gold.weights, vis)


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
