"""Test cases: a few small numbers that determine every array a law feeds a target.

A `Case` holds shapes, dtype, flags and a seed; `Case.arrays` turns it into q, k, v
deterministically. Hypothesis searches and shrinks over cases, so a counterexample is a short,
printable record that replays exactly (``spec.replay``), and no time goes into drawing arrays
element by element.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import assume, reject
from hypothesis import strategies as st

from spec.draws import (  # the drawing primitives the keywords' draws share
    BOOLEANS,
    SHAPE_GRID,
    _admissible,
    admissible_lengths,
    between,
    one_of,
    pick,
)
from spec.dtypes import as_dtype
from spec.inputs import Inputs
from spec.keywords import Keyword, by_argument, registered
from spec.oracle import meaning
from spec.target import DECLARATIONS, Target

# Widths worth hitting on purpose: perfect squares (where √d_k is exact) and their neighbours.
WIDTHS = (1, 2, 3, 4, 7, 8, 9, 16, 17, 31, 32, 63, 64, 100, 128)

TILE_SIZES = (16, 32, 64, 128, 256, 2048)
"""Tile edges of real kernels, where tiled code breaks: query-row tiles of 16–256 (FlashAttention
2/3, xformers, `impl.flash`'s 256) and `impl.flash`'s key tile of 2,048. Every tile size
the suite draws comes from here (`tile_edges`)."""
LONG_TILE = 2048  # past the short tiles: only causal squares (a row block spanning key tiles)
TILE_ODDS = 4  # with tiles=True, one case in TILE_ODDS (on average) is a tile-edge case
TILE_WIDTH = 8  # d_k, d_v ≤ this in tile-edge cases: the sizes are big, the widths need not be
BOUNDARY = 4  # the boundary grid: n_q, n_k ∈ 1..BOUNDARY


def tile_edges(tiles: tuple[int, ...] = TILE_SIZES) -> tuple[int, ...]:
    """Sizes just below, at and just above each tile, and one partial tile past it (t + 17 with
    the smallest tile 16: the last tile holds 17 rows), ascending."""
    return tuple(sorted({n for t in tiles for n in (t - 1, t, t + 1, t + tiles[0] + 1)}))


def edges_for(target: Target) -> tuple[int, ...]:
    """The tile edges a target is drawn at, within its limits: `tile_edges`; for a target whose
    lengths are multiples of m, one tile of m below, at and above each tile size that m divides
    (and m, 2m, 3m); for one that compiles per shape, `SHAPE_GRID`; at most ``max_seq``."""
    m = target.seq_multiple
    if target.compiles_per_shape:
        found: tuple[int, ...] = admissible_lengths(target, 1, SHAPE_GRID[-1]) or ()
    elif m:
        around = {n for t in TILE_SIZES if t % m == 0 for n in (t - m, t, t + m)}
        found = tuple(sorted(around | {m, 2 * m, 3 * m}))
    else:
        found = tile_edges()
    kept = tuple(n for n in found if n > 0 and (target.max_seq is None or n <= target.max_seq))
    return kept or (m or 1,)


@dataclass(frozen=True)
class Case:
    """One example: ``q [*lead, n_q, d_k]``, ``k [*kv_lead, n_k, d_k]``, ``v [*kv_lead, n_k, d_v]``,
    the flags, and one drawn parameter per keyword (``keywords``: ``{"window": (2, 0)}``)."""

    dtype: str
    ndim: int  # 2: (n, d); 3: (heads, n, d); 4: (batch, heads, n, d)
    batch: int
    heads: int
    n_q: int
    n_k: int
    d_k: int
    d_v: int
    seed: int
    causal: bool = False
    kv_heads: int | None = None  # fewer K/V heads than query heads: grouped-query attention
    values: str = "normal"  # "normal": N(0, 1); "ints": integers in [-3, 3] (ties, exact sums)
    amplitude: float = 1.0  # q and k are multiplied by √amplitude, so scores scale by amplitude
    score_max: float | None = None  # q and k scaled so that the largest Σ_l |q_il|·|k_jl| is this
    k_max: float | None = None  # k scaled so that its largest magnitude is this (after score_max)
    v_max: float | None = None  # v scaled so that its largest magnitude is this
    mask: str = "none"  # "none"; "random": every row keeps a key; "rows": some rows see nothing
    scale: float | None = None  # passed as scale= (targets that declare supports_scale)
    v_prefix: bool = False  # v is k[..., :d_v] (d_v ≤ d_k): a target that declares v_from_k
    keywords: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    """Each keyword's drawn parameter, by keyword name (its declaration turns it into the values
    passed: `spec.keywords.Keyword.received`)."""

    @classmethod
    def from_fields(cls, **fields: Any) -> Case:
        """A case from `describe`'s plain values: keyword parameters may be given by keyword name
        beside the fields (``window=(2, 0)``), as reproduction lines give them."""
        names = {f.name for f in dataclasses.fields(cls)}
        declared = registered()
        params = dict(fields.pop("keywords", {}) or {})
        for name in [n for n in fields if n not in names]:
            if name not in declared:
                raise TypeError(f"Case has no field or keyword {name!r}; the keywords are "
                                f"{', '.join(declared)}")
            params[name] = fields.pop(name)
        return cls(**fields, keywords=params)

    def replace(self, **changes: Any) -> Case:
        """A copy with some fields changed: ``case.replace(batch=2)``."""
        return dataclasses.replace(self, **changes)

    def param(self, name: str) -> Any:
        """The drawn parameter of keyword ``name``, or None."""
        return self.keywords.get(name)

    def with_keyword(self, name: str, parameter: Any) -> Case:
        """The case with keyword ``name``'s parameter set (None removes it)."""
        params = {**self.keywords, name: parameter}
        return dataclasses.replace(self, keywords={k: p for k, p in params.items() if p is not None})

    def lead(self, heads: int | None = None) -> tuple[int, ...]:
        h = self.heads if heads is None else heads
        return {2: (), 3: (h,), 4: (self.batch, h)}[self.ndim]

    @property
    def kv_lead(self) -> tuple[int, ...]:
        return self.lead(self.kv_heads)

    def rng(self, stream: int = 0) -> np.random.Generator:
        """Randomness for this case; ``stream`` separates independent uses (permutations, changes)."""
        return np.random.default_rng([self.seed, stream])

    @property
    def np_dtype(self) -> np.dtype:
        """The case's dtype as a NumPy dtype ("bfloat16" through ml_dtypes)."""
        return as_dtype(self.dtype)

    def values_like(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Values drawn in float64 and rounded to the dtype, so each is representable in it
        (integers in [-3, 3] are exact in every float dtype, bfloat16 included)."""
        if self.values == "ints":
            return rng.integers(-3, 4, size=shape).astype(self.np_dtype)
        return rng.standard_normal(shape).astype(self.np_dtype, copy=False)

    @functools.cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = self.rng()
        q = self.values_like(rng, (*self.lead(), self.n_q, self.d_k))
        k = self.values_like(rng, (*self.kv_lead, self.n_k, self.d_k))
        v = self.values_like(rng, (*self.kv_lead, self.n_k, self.d_v))
        root = np.sqrt(self.amplitude)
        if self.score_max is not None and (products := largest_products(q, k, self.heads, self.kv_heads)) > 0:
            root = np.sqrt(self.score_max) / np.sqrt(products)  # two roots: their ratio never overflows
        if root != 1.0 and self.v_prefix:  # the latent's values are its keys: q takes the whole factor
            with np.errstate(over="ignore"):
                scaled = (q.astype(np.float64) * root * root).astype(self.np_dtype)
            if np.all(np.isfinite(scaled)):
                q, root = scaled, 1.0
        if root != 1.0:
            q, k = ((x * root).astype(self.np_dtype) for x in (q, k))
        k, v = self._to_max(k, self.k_max), self._to_max(v, self.v_max)
        if self.v_prefix and self.d_v <= self.d_k:  # MLA's shared latent: v is the keys' first d_v columns
            v = k[..., :self.d_v]  # (a law that widens d_v past d_k makes a call outside v_from_k: skipped)
        return _frozen(q), _frozen(k), _frozen(v)

    def _to_max(self, x: np.ndarray, largest: float | None) -> np.ndarray:
        """``x`` scaled so its largest magnitude is ``largest`` (as given when None or all zeros),
        as x / max|x| · largest: a ratio ≤ 1 times the magnitude, which never overflows."""
        if largest is None:
            return x
        top = float(np.max(np.abs(x.astype(np.float64)), initial=0.0))
        return x if top == 0 else (x.astype(np.float64) / top * largest).astype(self.np_dtype)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q, k, v in ``dtype``, always the same for the same case (made once, read-only)."""
        return self._arrays

    @functools.cached_property
    def _mask(self) -> np.ndarray | None:
        if self.mask == "none":
            return None
        rng = self.rng(1)
        shape = (*self.lead(), self.n_q, self.n_k)
        keep = rng.random(shape) < 0.7
        # One guaranteed key per row, so a row is empty only when "rows" empties it.
        pick = rng.integers(0, self.n_k, size=shape[:-1])
        np.put_along_axis(keep, pick[..., None], True, axis=-1)
        if self.mask == "rows":
            empty = rng.random(shape[:-1]) < 0.3
            empty.reshape(-1)[rng.integers(0, empty.size)] = True
            keep &= ~empty[..., None]
        return _frozen(keep)

    def mask_array(self) -> np.ndarray | None:  # -> [*lead, n_q, n_k] bool, True = may attend
        """The ``mask=`` argument, or None. "random" keeps at least one key in every row;
        "rows" also empties some rows (at least one), to exercise the fully-masked policy."""
        return self._mask

    @functools.cached_property
    def _received(self) -> dict[str, Any]:
        given: dict[str, Any] = {}
        for kw in registered().values():
            given |= {name: _frozen(x) if isinstance(x, np.ndarray) else x
                      for name, x in kw.values(self).items()}
        return given

    def received(self) -> dict[str, Any]:
        """The keyword arguments this case passes, as the target receives them."""
        return dict(self._received)

    @functools.cached_property
    def _inputs(self) -> Inputs:
        q, k, v = self.arrays()
        for kw in reversed(registered().values()):  # the reads, in declaration order, undo these
            parameter = self.keywords.get(kw.name)
            if kw.writes is not None and parameter is not None:
                k, v = (_frozen(x) for x in kw.writes(self, parameter, k, v))
        return Inputs(q, k, v, causal=self.causal, mask=self.mask_array(), scale=self.scale,
                      keywords=self.received())

    def inputs(self) -> Inputs:
        """Everything the target receives for this case (made once; arrays read-only: change a copy,
        through `Inputs.replace`): k and v as the case's keywords pass them (`Keyword.writes`: a
        paged pool, float8 codes), where `arrays` holds the contiguous ones they were made from."""
        return self._inputs

    def describe(self) -> dict[str, Any]:
        """The case as plain values, defaults left out, keyword parameters by keyword name (for
        reports and reproduction lines: `from_fields` reads it back)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "keywords":
                out |= dict(value)
            elif f.default is dataclasses.MISSING or value != f.default:
                out[f.name] = value
        return out

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {
            "q": (*self.lead(), self.n_q, self.d_k),
            "k": (*self.kv_lead, self.n_k, self.d_k),
            "v": (*self.kv_lead, self.n_k, self.d_v),
        }


def largest_products(q: np.ndarray, k: np.ndarray, heads: int, kv_heads: int | None) -> float:
    # [..., n_q, d_k], [..., n_k, d_k] -> max_ij Σ_l |q_il|·|k_jl| over every (batch, head), in float64
    """The largest magnitude any score q_i·k_j can have before the scale (0 for no queries or keys);
    with grouped K/V heads each query head meets its own K/V head."""
    if q.size == 0 or k.size == 0:
        return 0.0
    qa, ka = np.abs(q.astype(np.float64)), np.abs(k.astype(np.float64))
    if kv_heads is not None:
        ka = np.repeat(ka, heads // kv_heads, axis=-3)
    return float(np.max(qa @ np.swapaxes(ka, -1, -2)))


def _frozen(x: np.ndarray) -> np.ndarray:
    """``x`` made read-only: a case's arrays are shared by every use of the case."""
    x.flags.writeable = False
    return x


@functools.cache
def lengths(n_max: int, n_min: int = 1) -> tuple[st.SearchStrategy[int], ...]:
    """Mostly short (fast, easy to read when shrunk), sometimes long enough to cross tile edges
    (branches for `one_of`)."""
    return (st.integers(n_min, max(n_min, 12)), st.integers(n_min, n_max))


@functools.cache
def widths(d_max: int = 128) -> tuple[st.SearchStrategy[int], ...]:
    """The widths worth hitting (`WIDTHS`), or any (branches for `one_of`)."""
    return (st.sampled_from([w for w in WIDTHS if w <= d_max]), st.integers(1, d_max))


SHAPE_WIDTHS = (8, 64)
"""The head widths such a target is drawn at (d_v = d_k)."""


@functools.cache
def _sizes(multiple: int | None, cap: int | None, compiles: bool, n_min: int,
           n_max: int) -> tuple[st.SearchStrategy[int], ...]:
    allowed = _admissible(multiple, cap, compiles, n_min, n_max)
    if allowed is None:
        top = n_max if cap is None else max(n_min, min(n_max, cap))
        return lengths(top, n_min)
    if not allowed:
        return (st.nothing(),)
    return (st.sampled_from(allowed[:3]), st.sampled_from(allowed))


def sizes(target: Target, n_max: int, n_min: int = 1) -> tuple[st.SearchStrategy[int], ...]:
    """`lengths` within the target's shape limits (branches for `one_of`)."""
    return _sizes(target.seq_multiple, target.max_seq, target.compiles_per_shape, n_min, n_max)


@functools.cache
def _widths_within(dims: tuple[int, ...] | None, compiles: bool,
                   d_max: int) -> tuple[st.SearchStrategy[int], ...]:
    if dims is not None:
        return (st.sampled_from(dims),)
    if compiles:
        return (st.sampled_from([w for w in SHAPE_WIDTHS if w <= d_max] or [1]),)
    return widths(d_max)


def widths_for(target: Target, d_max: int = 128) -> tuple[st.SearchStrategy[int], ...]:
    """`widths` within the target's head sizes (branches for `one_of`)."""
    return _widths_within(target.head_dims, target.compiles_per_shape, d_max)


def split_point(target: Target, case: Case, *, stream: int) -> int:
    """Where a law splits the case's keys in two (1 ≤ t < n_k), from the case's random ``stream``:
    anywhere, or, for a target that compiles per shape, at a length of `SHAPE_GRID` (so the two
    parts add few shapes to compile)."""
    rng = case.rng(stream)
    if target.compiles_per_shape:
        points = [n for n in SHAPE_GRID if 0 < n < case.n_k] or [1]
        return int(points[int(rng.integers(0, len(points)))])
    return int(rng.integers(1, case.n_k))


def outside_limits(target: Target, given: Case | Inputs, *, reads_pattern: bool = False) -> str | None:
    """Which declared limit a call breaks (its widths, or the length of one of its sequences: the
    call's n_q and n_k, each packed sequence's, each row's key length), or None; ``given``: a
    case's inputs, or a call's. ``reads_pattern``: the values are V = I, read in blocks the
    target takes (`spec.laws._helpers.run_pattern`), so the case's d_v is not a limit's."""
    if not limits_text(target):
        return None
    inputs = given.inputs() if isinstance(given, Case) else given
    d_k, d_v = inputs.q.shape[-1], inputs.v.shape[-1]
    widths_used = (d_k,) if reads_pattern else (d_k, d_v)
    if target.head_dims is not None and any(w not in target.head_dims for w in widths_used):
        return f"head_dims={target.head_dims}"
    if target.equal_head_dims and not reads_pattern and d_v != d_k:
        return "equal_head_dims=True"
    if (taken := outside_keyword_forms(target, inputs)) is not None:
        return taken
    if target.v_from_k and not is_latent(inputs):
        return "v_from_k"
    queries, keys = sequence_lengths(inputs)
    every = [*queries, *keys]
    if target.seq_multiple and any(n % target.seq_multiple for n in every):
        return f"seq_multiple={target.seq_multiple}"
    if target.max_seq is not None and any(n > target.max_seq for n in every):
        return f"max_seq={target.max_seq}"
    return _outside_serving(target, inputs, queries, keys)


def _outside_serving(target: Target, inputs: Inputs, queries: list[int], keys: list[int]) -> str | None:
    """Which declaration of the shape of every call (`spec.target.DECLARATIONS`) a call breaks: a
    non-causal call (``causal_only``), a sequence with fewer keys than queries
    (``keys_cover_queries``), with keys not as many as its queries (``self_attention_only``), with
    other than one query (``decode_only``); ``queries``, ``keys``: each sequence's counts
    (`sequence_lengths`)."""
    return _broken(target, inputs, queries, keys, keyword_forms=False)


def outside_keyword_forms(target: Target, inputs: Inputs) -> str | None:
    """Which declaration of how the target takes a keyword (`spec.target.DECLARATIONS`) a call
    breaks, or None: a window with a right side (``window_sides="left"``) or without causal
    (``window_needs_causal``), ALiBi slopes ``[batch, heads]`` (``alibi_shape="heads"``),
    descales that differ (``fp8_scale="tensor"``), a paged block size that is not a multiple of
    ``block_multiple``."""
    return _broken(target, inputs, [], [], keyword_forms=True)


def _broken(target: Target, inputs: Inputs, queries: list[int], keys: list[int], *,
            keyword_forms: bool) -> str | None:
    """The first declaration of `DECLARATIONS` a call breaks, among the keywords' forms or among
    the shapes of calls, as it names it (``decode_only=True``); None if none."""
    for declaration in DECLARATIONS:
        if (declaration.narrows is not None) == keyword_forms and declaration.declared(target) and \
                declaration.broken_by(target, inputs, queries, keys):
            return declaration.given(target)
    return None


def sequence_lengths(inputs: Inputs) -> tuple[list[int], list[int]]:
    """The query and key counts of each sequence a call holds: each keyword's that says
    (`spec.keywords.Keyword.lengths`: packed sequences, per-row key lengths), else the call's
    n_q and n_k (the keys as the maths reads them: a paged pool's are its sequences')."""
    meant = meaning(inputs)
    queries, keys = [meant.n_q], [meant.n_k]
    table = by_argument()
    for name in [n for n, x in inputs.keywords.items() if x is not None and n in table]:
        kw = table[name]
        values = kw.given(inputs.keywords)
        if kw.lengths is not None and values is not None and name == kw.passes[0]:
            queries, keys = kw.lengths(meant.n_q, *values[:len(kw.passes)])
    return list(queries), list(keys)


def is_latent(inputs: Inputs) -> bool:
    """Whether the call's values are its keys' first d_v columns (``v = k[..., :d_v]``, d_v ≤ d_k),
    the only calls a ``v_from_k`` target takes (`spec.target.Target.v_from_k`)."""
    d_v = int(inputs.v.shape[-1])
    return d_v <= inputs.k.shape[-1] and bool(np.array_equal(inputs.v, inputs.k[..., :d_v], equal_nan=True))


def limits_text(target: Target) -> str:
    """The declared shape limits, then the declarations of serving kernels (`DECLARATIONS`), as the
    report's header says them ("" if none)."""
    said = [f"head_dims={target.head_dims}" if target.head_dims else "",
            "equal_head_dims" if target.equal_head_dims else "",
            f"seq_multiple={target.seq_multiple}" if target.seq_multiple else "",
            f"max_seq={target.max_seq}" if target.max_seq else "",
            "compiles_per_shape" if target.compiles_per_shape else "",
            "v_from_k" if target.v_from_k else "",
            *(declaration.said(target) for declaration in DECLARATIONS if declaration.declared(target))]
    return ", ".join(x for x in said if x)


@st.composite
def cases(
    draw: st.DrawFn,
    target: Target,
    *,
    ndims: tuple[int, ...] = (2, 3, 4),
    causal: tuple[bool, ...] = (False, True),
    n_max: int = 160,
    n_k_min: int = 1,
    n_q_min: int = 1,
    pattern: bool = False,
    masks: tuple[str, ...] = ("none",),
    values: tuple[str, ...] = ("normal", "ints"),
    amplitudes: tuple[float, ...] = (1.0,),
    gqa: bool = False,
    scale: bool = False,
    tiles: bool = False,
    keywords: tuple[Keyword, ...] = (),
) -> Case:
    """Cases the target accepts. ``pattern``: d_v = n_k, so that V = I reads the pattern out.
    ``keywords``: each draws its parameter onto the case (`spec.keywords.Keyword.draw`), in order.
    ``tiles``: one case in `TILE_ODDS` has n_q and n_k at a tile edge (`tile_edges`, up
    to the short tiles, whatever ``n_max``), one head and widths ≤ `TILE_WIDTH`. Sizes past
    `LONG_TILE` cost seconds each: only the boundary grid has them (``boundary_cases(long=True)``).
    Only the ranks every keyword applies to are drawn (`spec.keywords.Keyword.ndims`)."""
    ndims = tuple(r for r in ndims if all(r in kw.ndims for kw in keywords))
    if any("mask" in kw.excludes for kw in keywords):
        masks = ("none",)
    if tiles and draw(between(0, TILE_ODDS - 1)) == 0:
        case = draw(tile_cases(target, causal=causal, n_k_min=n_k_min, n_q_min=n_q_min, pattern=pattern,
                               masks=masks, values=values))
    else:
        case = _draw_plain(draw, target, ndims=ndims, causal=causal, n_max=n_max, n_k_min=n_k_min,
                           n_q_min=n_q_min, pattern=pattern, masks=masks, values=values,
                           amplitudes=amplitudes, gqa=gqa, scale=scale)
    if target.v_from_k:  # the values are the keys' prefix: d_v ≤ d_k, each among the head_dims
        case = case.replace(d_v=min(case.d_v, case.d_k), v_prefix=True)
    for kw in sorted(keywords, key=lambda kw: not kw.reshapes):  # those that resize the case first
        if kw.draw is None:
            raise ValueError(f"keyword {kw.name!r} declares no draw: its laws build their cases")
        case = kw.draw(draw, target, case)
    return case


SCALES = (st.none(), st.floats(0.05, 2.0))  # branches for `one_of`
SEEDS = st.integers(0, 2**32 - 1)


def _draw_plain(
    draw: st.DrawFn, target: Target, *, ndims: tuple[int, ...], causal: tuple[bool, ...], n_max: int,
    n_k_min: int, n_q_min: int, pattern: bool, masks: tuple[str, ...], values: tuple[str, ...],
    amplitudes: tuple[float, ...], gqa: bool, scale: bool,
) -> Case:
    ranks = [r for r in target.ndims if r in ndims]
    few = target.compiles_per_shape  # one rank, two heads, two batch rows: fewer shapes to compile
    ndim = max(ranks) if few else pick(draw, tuple(ranks))
    dtype = pick(draw, target.dtypes)
    batch = (2 if few else draw(between(1, 3))) if ndim == 4 else 1
    kv_heads = None
    if gqa:
        g, group = (1, 2) if few else (draw(between(1, 3)), draw(between(2, 3)))
        heads, kv_heads = g * group, g
    else:
        heads = (2 if few else draw(between(1, 4))) if ndim >= 3 else 1
    n_q = one_of(draw, sizes(target, n_max, n_q_min))
    n_k = n_q if n_q >= n_k_min and draw(BOOLEANS) else one_of(draw, sizes(target, n_max, n_k_min))
    n_q, n_k = serving_shape(target, n_q, n_k, n_q_min=n_q_min, n_k_min=n_k_min)
    is_causal = serving_causal(draw, target, causal)
    if is_causal and not target.causal_shape_ok(n_q, n_k):  # square_or_decoding: n_q = n_k or 1
        n_q, n_k = (1, n_k) if n_q_min <= 1 and draw(BOOLEANS) else (n_q, n_q)
        assume(n_k >= n_k_min)
    d_k = one_of(draw, widths_for(target))
    if pattern:
        d_v = n_k
    else:
        d_v = d_k if target.equal_head_dims or few or draw(BOOLEANS) else one_of(draw, widths_for(target))
    return Case(
        dtype=dtype,
        ndim=ndim,
        batch=batch,
        heads=heads,
        n_q=n_q,
        n_k=n_k,
        d_k=d_k,
        d_v=d_v,
        seed=draw(SEEDS),
        causal=is_causal,
        kv_heads=kv_heads,
        values=pick(draw, tuple(values)),
        amplitude=pick(draw, tuple(amplitudes)),
        mask=pick(draw, tuple(masks)) if target.supports_mask else "none",
        scale=one_of(draw, SCALES) if scale and target.supports_scale else None,
    )


def serving_causal(draw: st.DrawFn, target: Target, causal: tuple[bool, ...]) -> bool:
    """The causal flag of a drawn case: one of ``causal`` where the target has a causal mode (False
    otherwise); True for a ``causal_only`` target, whose draws are rejected where the law asks for
    non-causal cases only (the law is then skipped, naming the declaration)."""
    if not target.causal_alignment:
        return False
    if target.causal_only:
        if True not in causal:
            reject()
        return True
    return pick(draw, tuple(causal))


def serving_shape(target: Target, n_q: int, n_k: int, *, n_q_min: int = 1,
                  n_k_min: int = 1) -> tuple[int, int]:
    """n_q and n_k narrowed to the serving declarations: one query (``decode_only``), as many keys
    as queries (``self_attention_only``: n_k = n_q), at least as many (``keys_cover_queries``: the
    two swapped when the keys are fewer, both lengths already within the limits); a draw whose
    minimums that rules out is rejected."""
    n_q, n_k = serving_lengths(target, n_q, n_k)
    if n_q < n_q_min or n_k < n_k_min:
        reject()
    return n_q, n_k


def serving_lengths(target: Target, n_q: int, n_k: int) -> tuple[int, int]:
    """n_q and n_k narrowed to the serving declarations (`serving_shape`, which also rejects a
    draw below its minimums)."""
    if target.decode_only:
        n_q = 1
    if target.self_attention_only:
        n_k = n_q
    elif target.keys_cover_queries and n_k < n_q:
        n_q, n_k = n_k, n_q
    return n_q, n_k


def served(target: Target, case: Case) -> Case | None:
    """An explicit (grid) case narrowed to the serving declarations as a draw is: its lengths by
    `serving_lengths`, causal for a ``causal_only`` target; None where the causal mode is not
    defined on the lengths that leaves (``square_or_decoding``, ``queries_within_keys``). Its
    widths are kept (d_v is not resized with n_k)."""
    n_q, n_k = serving_lengths(target, case.n_q, case.n_k)
    causal = case.causal or (target.causal_only and target.causal_alignment is not None)
    if causal and not target.causal_shape_ok(n_q, n_k):
        return None
    return case.replace(n_q=n_q, n_k=n_k, causal=causal)


@st.composite
def tile_cases(
    draw: st.DrawFn,
    target: Target,
    *,
    causal: tuple[bool, ...] = (False, True),
    n_k_min: int = 1,
    n_q_min: int = 1,
    pattern: bool = False,
    masks: tuple[str, ...] = ("none",),
    values: tuple[str, ...] = ("normal", "ints"),
) -> Case:
    """n_q and n_k at the edges of the short tiles (independently: partial last tiles on either
    side), one head, narrow widths."""
    short = [n for n in edges_for(target) if n < LONG_TILE - 1]
    is_causal = serving_causal(draw, target, causal)
    n_q = pick(draw, tuple(n for n in short if n >= n_q_min) or (short[-1],))
    n_k = pick(draw, tuple(n for n in short if n >= n_k_min) or (short[-1],))
    n_q, n_k = serving_shape(target, n_q, n_k, n_q_min=n_q_min, n_k_min=n_k_min)
    if is_causal and not target.causal_shape_ok(n_q, n_k):  # square_or_decoding: a square at the edge
        n_q = n_k = max(n_q, n_k)
    d_k = _tile_width(draw, target)
    d_v = n_k if pattern else d_k if target.equal_head_dims else _tile_width(draw, target)
    return Case(
        dtype=pick(draw, target.dtypes), ndim=_grid_rank(target), batch=1, heads=1,
        n_q=n_q, n_k=n_k, d_k=d_k, d_v=d_v,
        seed=draw(SEEDS), causal=is_causal, values=pick(draw, tuple(values)),
        mask=pick(draw, tuple(masks)) if target.supports_mask else "none",
    )


def _grid_rank(target: Target) -> int:
    """The rank of the tile and boundary cases: the smallest the target takes (its highest if it
    compiles per shape: the rank its other cases have)."""
    return max(target.ndims) if target.compiles_per_shape else min(target.ndims)


def _tile_width(draw: st.DrawFn, target: Target) -> int:
    """A width ≤ `TILE_WIDTH` for a tile-edge case (one of the target's head sizes, if declared)."""
    if target.head_dims is None and not target.compiles_per_shape:
        return draw(between(1, TILE_WIDTH))
    return one_of(draw, widths_for(target, TILE_WIDTH))


def boundary_cases(
    target: Target, *, causal: tuple[bool, ...] = (False, True), n_k_min: int = 1, n_q_min: int = 1,
    pattern: bool = False, mask: str = "none", keep: Callable[[Case], bool] = lambda c: True,
    tiles: bool = False, long: bool = False,
) -> list[Case]:
    """The boundary grid, run before the random examples in every profile: n_q, n_k ∈
    1..`BOUNDARY` (from the minimums), each causal flag the target has (in its declared
    alignment), the smallest rank, d_k = d_v = 3 (d_v = n_k with ``pattern``); the dtypes rotate
    through the declared ones so each is met. ``tiles`` adds n_q, n_k = t ± 1 across the largest
    short tile t (partial last tiles on both sides), ``long`` a causal square one partial query
    tile past `LONG_TILE`, in float32 where the target declares it (its four million scores
    cost the oracle and the target about half what they cost in float64 or float16, which
    is converted). ``keep`` drops the cases a law's strategy would not draw."""
    flags = causal if target.causal_alignment else (False,)
    near = _boundary_lengths(target)
    shapes = [(n_q, n_k) for n_q in near if n_q >= n_q_min for n_k in near if n_k >= n_k_min]
    if tiles and target.seq_multiple is None and not target.compiles_per_shape:
        top = max(t for t in TILE_SIZES if t < LONG_TILE)
        shapes += [(top + 1, top - 1), (top - 1, top + 1)]
    elif tiles:  # the largest tile edge the limits admit, against the one below it
        short = [n for n in edges_for(target) if n < LONG_TILE]
        shapes += [(short[-1], short[-2]), (short[-2], short[-1])] if len(short) > 1 else []
    squares = [_long_square(target)] if long and True in flags and not pattern else []
    grid = [_grid_case(target, n_q, n_k, flag, pattern, mask) for flag in flags for n_q, n_k in shapes]
    long_dtype = "float32" if "float32" in target.dtypes else None
    grid += [_grid_case(target, n, n, True, pattern, mask, long_dtype) for n in squares if n]
    # a causal mode defined only on some shapes (square_or_decoding) is not asked for on others
    return [c for c in grid if keep(c) and (not c.causal or target.causal_shape_ok(c.n_q, c.n_k))]


def _boundary_lengths(target: Target) -> tuple[int, ...]:
    """The boundary grid's sizes: 1..`BOUNDARY`; for a target with lengths in multiples of m, m
    and 2m; for one that compiles per shape, the two smallest of its grid; within ``max_seq``."""
    if target.compiles_per_shape:
        found = (admissible_lengths(target, 1, SHAPE_GRID[-1]) or ())[:2]
    elif target.seq_multiple:
        found = (target.seq_multiple, 2 * target.seq_multiple)
    else:
        found = tuple(range(1, BOUNDARY + 1))
    return tuple(n for n in found if target.max_seq is None or n <= target.max_seq)


def grid_length(target: Target) -> int:
    """The longest n of the boundary grid (`BOUNDARY`; a target's own multiple or shape grid)."""
    return max(_boundary_lengths(target), default=1)


def _long_square(target: Target) -> int:
    """The long causal square: one partial query tile past `LONG_TILE` (rounded up to a multiple
    of ``seq_multiple``), 0 where ``max_seq`` or compiling per shape rules it out."""
    n = LONG_TILE + TILE_SIZES[0] + 1
    if target.seq_multiple:
        n = -(-n // target.seq_multiple) * target.seq_multiple
    if target.compiles_per_shape or (target.max_seq is not None and n > target.max_seq):
        return 0
    return n


def grid_width(target: Target) -> int:
    """The width of an explicit (grid) case: the smallest of ``head_dims`` where the target
    declares them, 8 for a target that compiles per shape, 3 otherwise."""
    return target.head_dims[0] if target.head_dims else SHAPE_WIDTHS[1] if target.compiles_per_shape else 3


def _grid_case(target: Target, n_q: int, n_k: int, causal: bool, pattern: bool, mask: str,
               dtype: str | None = None) -> Case:
    """One grid case: the smallest rank, one head, d_k = 3 (d_v = 3, or n_k with ``pattern``;
    the smallest of ``head_dims`` where the target declares them, 8 for a target that compiles per
    shape), the dtype ``dtype`` or the next in the rotation."""
    width = grid_width(target)
    return Case(dtype=dtype or target.dtypes[(n_q + n_k) % len(target.dtypes)], ndim=_grid_rank(target),
                batch=1, heads=1, n_q=n_q, n_k=n_k, d_k=width, d_v=n_k if pattern else width,
                seed=10 * n_q + n_k, causal=causal, mask=mask if target.supports_mask else "none")
