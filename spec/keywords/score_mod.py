"""Score functions (``score_mod=``, FlexAttention's): ``score_mod(score, b, h, q_idx, kv_idx) -> score``.

A target that declares ``supports_score_mod`` is called with a Python callable, drawn by the suite
from its library (`SCORES`), and applies it itself to the scaled scores (float32 for 16-bit
inputs) with the indices of each score, int64 arrays broadcastable to ``[batch, heads, n_q, n_k]``
as a mask function's (`spec.keywords.mask_mod.index_arrays`). It applies before anything hides a
key (causal, ``mask=``, ``mask_mod=``): a value it gives a hidden key is never used. The golden
evaluates it densely in float64 (an indexed `spec.keywords.Transforms` term).

The library, each written so that one body runs on NumPy arrays and torch tensors (operators,
and a form per array kind where a function or a buffer is read):

- ALiBi: ``score − slope_h·|i − j|``, slope_h = 2^−(h + 2) (a bias up to n/4);
- softcap: ``c·tanh(score / c)``;
- a relative-position bias read from a buffer: ``score + table[h mod 8, i − j + R]`` (T5's,
  through a table of `RELATIVE_RANGE` offsets each side);
- `BufferBias`: ``score + buffer[b, h, i, j]``, a buffer the size of the call, which the laws
  fill with NaN where a key is hidden (a kernel that uses a hidden score's value then gives NaN:
  pytorch/pytorch#150321).

Each carries its derivative in the score (for the golden backward; every one is at most 1 in
size, as `Transforms` asks) and ``error``, what computing it in floats may add to a score, in
units of eps (`spec.keywords.Transforms.error`).

Its declaration (`SCORE_MOD`) and the functions it is made of; its laws are `spec.laws.mods`'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import strategies as st

from spec.keywords.mask_mod import in_lead, index_arrays
from spec.keywords.record import Geometry, Keyword, Transforms

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray

RELATIVE_RANGE = 4096
"""The offsets i − j the relative-position table covers each side (calls up to 4,096 positions)."""
RELATIVE_HEADS = 8
"""The rows of the relative-position table: head h reads row h mod 8."""
ALIBI_ERROR = 1024.0
"""ALiBi's bias reaches n/4 at n positions: what its sum may add to a score, in eps, up to 4,096."""


def is_numpy(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic))


def like(buffer: Array, index: Any) -> Any:
    """``buffer`` as the kind of array ``index`` is: itself for NumPy, a torch tensor on the index's
    device for torch (the adapter's calls)."""
    if is_numpy(index):
        return buffer
    import torch

    return torch.as_tensor(buffer).to(index.device)


def tanh(x: Any) -> Any:
    return np.tanh(x) if is_numpy(x) else x.tanh()


@dataclass(frozen=True)
class Alibi:
    """ALiBi as a score function: score − 2^−(h + 2)·|q_idx − kv_idx|."""

    error: float = ALIBI_ERROR

    def __call__(self, score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return score - 0.5 ** (h + 2) * abs(q_idx - kv_idx)

    def derivative(self, score: Array, b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
        return np.ones_like(score)


@dataclass(frozen=True)
class Softcap:
    """Logit soft-capping as a score function: c·tanh(score / c) (Gemma 2's, c = 50)."""

    cap: float

    @property
    def error(self) -> float:  # as the softcap= keyword's (spec.keywords.softcap.capped_error)
        return 2.0 * self.cap

    def __call__(self, score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return self.cap * tanh(score / self.cap)

    def derivative(self, score: Array, b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
        return 1.0 - np.tanh(score / self.cap) ** 2


def relative_table(seed: int) -> Array:  # -> [RELATIVE_HEADS, 2·RELATIVE_RANGE + 1] float32
    """A relative-position bias table, uniform in [−1, 1], from ``seed``."""
    rng = np.random.default_rng(seed)
    return rng.uniform(-1.0, 1.0, (RELATIVE_HEADS, 2 * RELATIVE_RANGE + 1)).astype(np.float32)


@dataclass(frozen=True)
class RelativeBias:
    """A relative-position bias read from a buffer: score + table[h mod 8, q_idx − kv_idx + R]."""

    seed: int
    table: Array = field(init=False, repr=False, compare=False)
    error: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", relative_table(self.seed))

    def __call__(self, score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return score + like(self.table, q_idx)[h % RELATIVE_HEADS, q_idx - kv_idx + RELATIVE_RANGE]

    def derivative(self, score: Array, b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
        return np.ones_like(score)


@dataclass(frozen=True)
class BufferBias:
    """score + buffer[b, h, q_idx, kv_idx]: a bias read from a buffer ``[batch, heads, n_q, n_k]``
    (``[1, heads, ...]`` for 3-D inputs, ``[1, 1, ...]`` for 2-D), float32, which may hold NaN."""

    buffer: Array = field(repr=False, compare=False)
    error: float = 2.0

    def __call__(self, score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return score + like(self.buffer, q_idx)[b, h, q_idx, kv_idx]

    def derivative(self, score: Array, b: Array, h: Array, q_idx: Array, kv_idx: Array) -> Array:
        return np.ones_like(score)


SCORES: dict[str, type] = {"alibi": Alibi, "softcap": Softcap, "relative_bias": RelativeBias}
"""The library of score functions, by name; a drawn parameter is ``(name, arguments)``."""


def score_mod(parameter: tuple[str, tuple[Any, ...]]) -> Any:
    """The library's function for a drawn ``(name, arguments)``."""
    name, arguments = parameter
    if name not in SCORES:
        raise ValueError(f"score_mod must name one of {', '.join(SCORES)}, got {name!r}")
    return SCORES[name](*arguments)


def parameters() -> st.SearchStrategy[tuple[str, tuple[Any, ...]]]:
    """A library entry and its arguments: ALiBi, a softcap of 1, 5, 20 or 50, a relative bias table
    from a seed."""
    return st.one_of(st.just(("alibi", ())), st.tuples(st.just("softcap"), st.tuples(st.sampled_from(
        (1.0, 5.0, 20.0, 50.0)))), st.tuples(st.just("relative_bias"), st.tuples(st.integers(0, 3))))


# --- the golden's term ----------------------------------------------------------------------------


def _evaluated(fn: Any, s: Array, geo: Geometry, score_mod: Any) -> Array:
    # [*lead, r, n_k] -> the same
    """``fn(score, b, h, q_idx, kv_idx)`` over `index_arrays` of ``geo``, on scores shaped as its
    call's; refused with ValueError for scores of some (batch, head) slices only."""
    rows = len(geo.queries)
    if s.shape[-2:] != (rows, geo.n_k) or s.size != int(np.prod(geo.lead, dtype=np.int64)) * rows * geo.n_k:
        raise ValueError(f"score_mod is evaluated on a whole call's scores {(*geo.lead, rows, geo.n_k)}, "
                         f"got scores shaped {s.shape}")
    lead = (1, 1, *geo.lead)[-2:]
    found = fn(s.reshape(*lead, rows, geo.n_k), *index_arrays(geo))
    return in_lead(np.asarray(found), geo)


def modded(s: Array, geo: Geometry, score_mod: Any) -> Array:
    """The scores through ``score_mod``, in float64."""
    return _evaluated(score_mod, np.asarray(s, dtype=np.float64), geo, score_mod).astype(np.float64)


def modded_in(s: Array, dtype: np.dtype, geo: Geometry, score_mod: Any) -> Array:
    """The scores, in ``dtype``, through ``score_mod``, rounded to ``dtype``."""
    with np.errstate(over="ignore"):
        return _evaluated(score_mod, np.asarray(s).astype(dtype), geo, score_mod).astype(dtype)


def modded_derivative(s: Array, geo: Geometry, score_mod: Any) -> Array:
    """d score_mod / d score in float64: the function's own ``derivative``, else a central
    difference (a step of 2^−20 of the score's size)."""
    own = getattr(score_mod, "derivative", None)
    if own is not None:
        return _evaluated(own, np.asarray(s, dtype=np.float64), geo, score_mod).astype(np.float64)
    step = 2.0**-20 * np.maximum(np.abs(s), 1.0)
    up, down = modded(s + step, geo, score_mod), modded(s - step, geo, score_mod)
    return (up - down) / (2 * step)


def modded_error(score_mod: Any) -> float:
    """What computing the function in floats may add to a score, in eps: its own ``error``, else 2."""
    return float(getattr(score_mod, "error", 2.0))


def draw(draw_fn: st.DrawFn, target: Target, case: Case) -> Case:
    """A function from the library (`parameters`); a softcap with scores of its size, so it bends
    them."""
    parameter = draw_fn(parameters())
    if parameter[0] == "softcap":
        cap = parameter[1][0]
        case = case.replace(amplitude=draw_fn(st.sampled_from((1.0, cap, 4 * cap))))
    return case.with_keyword("score_mod", parameter)


SCORE_MOD = Keyword(
    name="score_mod",
    field="supports_score_mod",
    passes=("score_mod",),
    meaning="score_mod(score, b, h, q_idx, kv_idx) -> score, FlexAttention's signature: a Python "
            "callable the target applies to the scaled scores (float32 for 16-bit inputs) with int64 "
            "index arrays broadcastable to [batch, heads, n_q, n_k] (b = h = 0 for 2-D inputs; NumPy "
            "arrays, which an adapter converts), before anything hides a key: the value it gives a "
            "hidden key is never used. The suite draws it from its library: ALiBi, softcap, a "
            "relative-position bias read from a buffer.",
    terms=(Transforms(golden=modded, baseline=modded_in, derivative=modded_derivative, error=modded_error,
                      indexed=True),),
    received=lambda case, parameter: (score_mod(parameter),),
    draw=draw,
)
