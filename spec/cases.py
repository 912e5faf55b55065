"""Test cases: a few small numbers that determine every array a property feeds a target.

A :class:`Case` holds shapes, dtype, flags and a seed; :meth:`Case.arrays` turns it into q, k, v
deterministically. Hypothesis searches and shrinks over cases, so a counterexample is a short,
printable record that replays exactly (``spec.replay``), and no time goes into drawing arrays
element by element.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec import golden
from spec.dtypes import as_dtype
from spec.target import Target

# Widths worth hitting on purpose: perfect squares (where √d_k is exact) and their neighbours.
WIDTHS = (1, 2, 3, 4, 7, 8, 9, 16, 17, 31, 32, 63, 64, 100, 128)

TILE_SIZES = (16, 32, 64, 128, 256, 2048)
"""Tile edges of real kernels, where tiled code breaks: query-row tiles of 16–256 (FlashAttention
2/3, xformers, :mod:`impl.flash`'s 256) and :mod:`impl.flash`'s key tile of 2,048. Every tile size
the suite draws comes from here (:func:`tile_edges`)."""
LONG_TILE = 2048  # past the short tiles: only causal squares (a row block spanning key tiles)
TILE_ODDS = 4  # with tiles=True, one case in TILE_ODDS (on average) is a tile-edge case
TILE_WIDTH = 8  # d_k, d_v ≤ this in tile-edge cases: the sizes are big, the widths need not be
BOUNDARY = 4  # the boundary grid: n_q, n_k ∈ 1..BOUNDARY


def tile_edges(tiles: tuple[int, ...] = TILE_SIZES) -> tuple[int, ...]:
    """Sizes just below, at and just above each tile, and one partial tile past it (t + 17 with
    the smallest tile 16: the last tile holds 17 rows), ascending."""
    return tuple(sorted({n for t in tiles for n in (t - 1, t, t + 1, t + tiles[0] + 1)}))


@dataclass(frozen=True)
class Case:
    """One example: ``q [*lead, n_q, d_k]``, ``k [*kv_lead, n_k, d_k]``, ``v [*kv_lead, n_k, d_v]``."""

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
    v_amplitude: float = 1.0  # v is multiplied by v_amplitude (values near the dtype's edge)
    mask: str = "none"  # "none"; "random": every row keeps a key; "rows": some rows see nothing
    scale: float | None = None  # passed as scale= (targets that declare supports_scale)
    # The keywords of DESIGN §2b, None = not passed (law modules draw them; see keywords()).
    bias: float | None = None  # amplitude of a N(0, 1) bias [*lead, n_q, n_k] passed as bias=
    window: tuple[int, int] | None = None  # window=(left, right)
    softcap: float | None = None  # softcap=c
    sinks: tuple[float, ...] | None = None  # sinks= [heads] ([1] for 2-D inputs)
    kv_lengths: tuple[int, ...] | None = None  # kv_lengths= [batch] (4-D inputs)
    cu_seqlens_q: tuple[int, ...] | None = None  # packed sequences (3-D inputs, heads first)
    cu_seqlens_k: tuple[int, ...] | None = None
    dropout_p: float | None = None  # dropout_p= (with seed=dropout_seed)
    dropout_seed: int | None = None

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
        return rng.standard_normal(shape).astype(self.np_dtype)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q, k, v in ``dtype``, always the same for the same case."""
        rng = self.rng()
        root = np.sqrt(self.amplitude)
        q = (self.values_like(rng, (*self.lead(), self.n_q, self.d_k)) * root).astype(self.np_dtype)
        k = (self.values_like(rng, (*self.kv_lead, self.n_k, self.d_k)) * root).astype(self.np_dtype)
        v = self.values_like(rng, (*self.kv_lead, self.n_k, self.d_v))
        if self.v_amplitude != 1.0:
            v = (v.astype(np.float64) * self.v_amplitude).astype(self.np_dtype)
        return q, k, v

    def mask_array(self) -> np.ndarray | None:  # -> [*lead, n_q, n_k] bool, True = may attend
        """The ``mask=`` argument, or None. "random" keeps at least one key in every row;
        "rows" also empties some rows (at least one), to exercise the fully-masked policy."""
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
        return keep

    def bias_array(self) -> np.ndarray | None:  # -> [*lead, n_q, n_k] in the case's dtype
        """The ``bias=`` argument, or None: N(0, 1)·bias, its own random stream."""
        if self.bias is None:
            return None
        shape = (*self.lead(), self.n_q, self.n_k)
        return (self.rng(11).standard_normal(shape) * self.bias).astype(self.np_dtype)

    @property
    def _logit_dtype(self) -> type:
        """Sinks are float32 logits (float64 for float64 cases), as kernels take them."""
        return np.float64 if self.dtype == "float64" else np.float32

    def keywords(self) -> dict[str, Any]:
        """The §2b keywords this case passes (those not None), as the target receives them."""
        given: dict[str, Any] = {
            "bias": self.bias_array(),
            "window": self.window,
            "softcap": self.softcap,
            "sinks": None if self.sinks is None else np.asarray(self.sinks, dtype=self._logit_dtype),
            "kv_lengths": None if self.kv_lengths is None else np.asarray(self.kv_lengths, dtype=np.int64),
            "cu_seqlens_q": None if self.cu_seqlens_q is None else np.asarray(self.cu_seqlens_q, np.int64),
            "cu_seqlens_k": None if self.cu_seqlens_k is None else np.asarray(self.cu_seqlens_k, np.int64),
            "dropout_p": self.dropout_p,
            "seed": self.dropout_seed,
        }
        return {name: value for name, value in given.items() if value is not None}

    def visible(self, target: Target) -> np.ndarray:  # -> [*lead, n_q, n_k] bool
        """What each query may see: the target's causal alignment ANDed with the mask, the window
        and the key lengths (computed by :mod:`spec.golden`, never by the code under test)."""
        return golden.visibility(
            self.lead(), self.n_q, self.n_k, causal=self.causal,
            align=target.alignment, mask=self.mask_array(), window=self.window,
            kv_lengths=None if self.kv_lengths is None else np.asarray(self.kv_lengths, dtype=np.int64),
        )

    def golden(self, target: Target, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float,
               visible: np.ndarray | None = None, bias: Any = "case",
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`spec.golden.forward` for this case: ``(out, weights, lse)`` in float64, with the
        case's bias (or the ``bias`` array given; None = none), softcap and sinks.
        [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v], [..., n_q, n_k], [..., n_q]"""
        sinks = None if self.sinks is None else np.asarray(self.sinks, dtype=np.float64)
        return golden.forward(q, k, v, visible=self.visible(target) if visible is None else visible,
                              scale=scale, bias=self.bias_array() if isinstance(bias, str) else bias,
                              softcap=self.softcap, sinks=sinks)

    def describe(self) -> dict[str, Any]:
        """The case as plain values, defaults left out (for reports and reproduction lines)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.default is dataclasses.MISSING or value != f.default:
                out[f.name] = value
        return out

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {
            "q": (*self.lead(), self.n_q, self.d_k),
            "k": (*self.kv_lead, self.n_k, self.d_k),
            "v": (*self.kv_lead, self.n_k, self.d_v),
        }


def lengths(n_max: int, n_min: int = 1) -> st.SearchStrategy[int]:
    """Mostly short (fast, easy to read when shrunk), sometimes long enough to cross tile edges."""
    return st.one_of(st.integers(n_min, max(n_min, 12)), st.integers(n_min, n_max))


def widths(d_max: int = 128) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([w for w in WIDTHS if w <= d_max]), st.integers(1, d_max))


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
) -> Case:
    """Cases the target accepts. ``pattern``: d_v = n_k, so that V = I reads the pattern out.
    ``tiles``: one case in :data:`TILE_ODDS` has n_q and n_k at a tile edge (:func:`tile_edges`, up
    to the short tiles, whatever ``n_max``), one head and widths ≤ :data:`TILE_WIDTH`. Sizes past
    :data:`LONG_TILE` cost seconds each: only the boundary grid has them (``boundary_cases(long=True)``)."""
    if tiles and draw(st.integers(0, TILE_ODDS - 1)) == 0:
        return draw(tile_cases(target, causal=causal, n_k_min=n_k_min, n_q_min=n_q_min, pattern=pattern,
                               masks=masks, values=values))
    ranks = [r for r in target.ndims if r in ndims]
    ndim = draw(st.sampled_from(ranks))
    dtype = draw(st.sampled_from(target.dtypes))
    batch = draw(st.integers(1, 3)) if ndim == 4 else 1
    kv_heads = None
    if gqa:
        g, group = draw(st.integers(1, 3)), draw(st.integers(2, 3))
        heads, kv_heads = g * group, g
    else:
        heads = draw(st.integers(1, 4)) if ndim >= 3 else 1
    n_q = draw(lengths(n_max, n_q_min))
    n_k = n_q if n_q >= n_k_min and draw(st.booleans()) else draw(lengths(n_max, n_k_min))
    is_causal = draw(st.sampled_from(causal)) if target.causal_alignment else False
    if is_causal and not target.causal_shape_ok(n_q, n_k):  # square_or_decoding: n_q = n_k or 1
        n_q, n_k = (1, n_k) if n_q_min <= 1 and draw(st.booleans()) else (n_q, n_q)
        assume(n_k >= n_k_min)
    d_k = draw(widths())
    d_v = n_k if pattern else (d_k if draw(st.booleans()) else draw(widths()))
    return Case(
        dtype=dtype,
        ndim=ndim,
        batch=batch,
        heads=heads,
        n_q=n_q,
        n_k=n_k,
        d_k=d_k,
        d_v=d_v,
        seed=draw(st.integers(0, 2**32 - 1)),
        causal=is_causal,
        kv_heads=kv_heads,
        values=draw(st.sampled_from(values)),
        amplitude=draw(st.sampled_from(amplitudes)),
        mask=draw(st.sampled_from(masks)) if target.supports_mask else "none",
        scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0))) if scale and target.supports_scale else None,
    )


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
    short = [n for n in tile_edges() if n < LONG_TILE - 1]
    is_causal = draw(st.sampled_from(causal)) if target.causal_alignment else False
    n_q = draw(st.sampled_from([n for n in short if n >= n_q_min]))
    n_k = draw(st.sampled_from([n for n in short if n >= n_k_min]))
    if is_causal and not target.causal_shape_ok(n_q, n_k):  # square_or_decoding: a square at the edge
        n_q = n_k = max(n_q, n_k)
    d_k = draw(st.integers(1, TILE_WIDTH))
    return Case(
        dtype=draw(st.sampled_from(target.dtypes)), ndim=min(target.ndims), batch=1, heads=1,
        n_q=n_q, n_k=n_k, d_k=d_k, d_v=n_k if pattern else draw(st.integers(1, TILE_WIDTH)),
        seed=draw(st.integers(0, 2**32 - 1)), causal=is_causal, values=draw(st.sampled_from(values)),
        mask=draw(st.sampled_from(masks)) if target.supports_mask else "none",
    )


def boundary_cases(
    target: Target, *, causal: tuple[bool, ...] = (False, True), n_k_min: int = 1, n_q_min: int = 1,
    pattern: bool = False, mask: str = "none", keep: Callable[[Case], bool] = lambda c: True,
    tiles: bool = False, long: bool = False,
) -> list[Case]:
    """The boundary grid, run before the random examples in every profile: n_q, n_k ∈
    1..:data:`BOUNDARY` (from the minimums), each causal flag the target has (in its declared
    alignment), the smallest rank, d_k = d_v = 3 (d_v = n_k with ``pattern``); the dtypes rotate
    through the declared ones so each is met. ``tiles`` adds n_q, n_k = t ± 1 across the largest
    short tile t (partial last tiles on both sides), ``long`` a causal square one partial query
    tile past :data:`LONG_TILE`. ``keep`` drops the cases a law's strategy would not draw."""
    flags = causal if target.causal_alignment else (False,)
    sizes = [(n_q, n_k) for n_q in range(n_q_min, BOUNDARY + 1) for n_k in range(n_k_min, BOUNDARY + 1)]
    top = max(t for t in TILE_SIZES if t < LONG_TILE)
    sizes += [(top + 1, top - 1), (top - 1, top + 1)] if tiles else []
    squares = [LONG_TILE + TILE_SIZES[0] + 1] if long and True in flags and not pattern else []
    grid = [_grid_case(target, n_q, n_k, flag, pattern, mask) for flag in flags for n_q, n_k in sizes]
    grid += [_grid_case(target, n, n, True, pattern, mask) for n in squares]
    # a causal mode defined only on some shapes (square_or_decoding) is not asked for on others
    return [c for c in grid if keep(c) and (not c.causal or target.causal_shape_ok(c.n_q, c.n_k))]


def _grid_case(target: Target, n_q: int, n_k: int, causal: bool, pattern: bool, mask: str) -> Case:
    """One grid case: the smallest rank, one head, d_k = 3 (d_v = 3, or n_k with ``pattern``)."""
    return Case(dtype=target.dtypes[(n_q + n_k) % len(target.dtypes)], ndim=min(target.ndims), batch=1,
                heads=1, n_q=n_q, n_k=n_k, d_k=3, d_v=n_k if pattern else 3, seed=10 * n_q + n_k,
                causal=causal, mask=mask if target.supports_mask else "none")
