"""What a keyword is: the `Keyword` record and the terms it declares (what it does to the maths),
with everything else a keyword may declare (the extra outputs a call given it returns, the
arguments laid out as k and v, what it needs of a target's other declarations).

A keyword (``bias=``, ``window=``, ``alibi_slopes=`` ...) is declared in its own module of
`spec.keywords`, and everything else reads the declaration (as PyTorch's ``OpInfo`` describes an
operator once):

- **capability** — the name a `spec.target.Target` declares it by (``supports_window``);
- **arguments** — the keyword arguments ``fn`` receives (``passes``; how each framework spells
  them is its adapter's, `spec.adapters`);
- **drawing** — how a `Case` draws it (``draw``) and turns the drawn parameter into the values
  passed (``received``);
- **terms** — what it does to the maths, for the golden (float64) *and* the baseline (the
  target's dtype): a restriction of what each query sees, a transform of the scores, an
  added term, a sink logit, a moved diagonal, another representation of the keys and values
  (a paged cache, float8), or an explicit statement that it leaves the maths alone;
- **outputs** — what a call given it returns beside the output (`Returns`: an LSE, the presents
  of a past cache), how they are laid out and checked.

The golden (`spec.golden`), the baseline and floor (`spec.tolerance`, composed in `spec.oracle`),
the cases, the target, the calling layer and the docs all read these records. A record cannot be
made without terms, and each kind of term supplies the golden and the baseline together, so a
keyword cannot quietly loosen the tolerance by being forgotten in one of them.

This module imports no other part of the suite but `spec.golden`: the target imports it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from spec import golden

Array = np.ndarray

CAUSES = ("causal", "window", "chunk", "topk", "mask", "bias", "kv_lengths", "varlen", "no_keys")
"""Why a query row sees no key, in the order the causes are checked: a row's cause is the first
restriction after which, ANDed with those before it, the row sees nothing (the order of
FlashAttention's reference: its causal and window mask before key padding). ``no_keys`` is a
call with n_k = 0. A target may declare a masked-row policy per cause (``masked_rows``)."""


@dataclass(frozen=True)
class Geometry:
    """What a term may depend on besides its own values: the shapes, the target's alignment, and
    each query's diagonal key (``diagonal``, broadcastable to ``[*lead, n_q, 1]``): i + 0 top-left,
    i + n_k − n_q bottom-right, or per sequence where a keyword realigns it (packed sequences).
    ``bottom_right`` is the bottom-right diagonal whatever the alignment (ALiBi's distances are
    measured from it, as FlashAttention defines them). ``rows``: the query positions the arrays
    are for, where a term is evaluated at some rows only (`spec.sampled`: ``diagonal``,
    ``bottom_right`` and ``origin`` then hold those rows'); None: every query, 0..n_q − 1.
    ``origin``: the first key of each query's sequence, broadcastable as ``diagonal`` (0; packed
    sequences: their ``cu_seqlens_k[s]``), so that key j lies at position j − origin of the
    query's sequence and the query at diagonal − origin (positions restart in each sequence)."""

    lead: tuple[int, ...]
    n_q: int
    n_k: int
    align: golden.Alignment
    diagonal: Array
    bottom_right: Array
    rows: Array | None = None
    origin: Array | int = 0

    @property
    def ndim(self) -> int:
        return len(self.lead) + 2

    @property
    def queries(self) -> Array:  # -> [n_q] or [len(rows)] int
        """The position of each query row the arrays are for: ``rows``, or 0..n_q − 1."""
        return np.arange(self.n_q) if self.rows is None else np.asarray(self.rows)


# --- terms: what a keyword does to the maths ---------------------------------------------------


@dataclass(frozen=True)
class Restricts:
    """Hides keys: ``visible(geometry, *values)`` -> bool broadcastable to ``[*lead, n_q, n_k]``
    (True = may attend), ANDed with causal and mask=. Exact in every dtype, so the golden and the
    baseline use the same array. ``cause`` names the rows it empties (one of `CAUSES`)."""

    visible: Callable[..., Array]
    cause: str

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"Restricts cause must be one of {CAUSES}, got {self.cause!r}")


@dataclass(frozen=True)
class Transforms:
    """Transforms the scaled scores before anything is added to them (softcap), elementwise:
    ``golden(s, *values)`` in float64, ``baseline(s, dtype, *values)`` with every step rounded to
    the dtype, and ``derivative(s, *values)`` = ds'/ds in float64, for the backward. A transform
    must not enlarge score errors (|derivative| ≤ 1), so the floor needs no term for the errors
    it carries; ``error(*values)`` is the absolute error, in units of the eps of the dtype
    computed in, that a correct float computation of the transform itself may add to each score
    (softcap: 2c, a tanh through exponentials being off by up to ~1.5·eps in [−1, 1], times c);
    the floor counts twice it, as it counts any score error (`spec.tolerance.floor`).

    ``indexed``: the transform also reads where each score lies (a score function's batch, head,
    query and key indices: ``score_mod=``): ``golden``, ``baseline`` and ``derivative`` then take
    the call's `Geometry` after the scores, ``golden(s, geometry, *values)``, and ``s`` is shaped
    ``[*geometry.lead, r, n_k]`` for the geometry's r query rows."""

    golden: Callable[..., Array]
    baseline: Callable[..., Array]
    derivative: Callable[..., Array]
    error: Callable[..., float] | None = None
    indexed: bool = False


@dataclass(frozen=True)
class Adds:
    """Adds ``added(geometry, *values)`` (float64, broadcastable to ``[*lead, n_q, n_k]``) to the
    (transformed) scores; −inf hides a key. The baseline adds it rounded to the dtype; the floor
    counts 2·max|added| (each biased score rounds once more). ``grad``: the name of its gradient
    among a backward's extras (``"dbias"``), which then has the shape of the first value.
    ``cause``: what a row emptied by its −inf entries is called (one of `CAUSES`)."""

    added: Callable[..., Array]
    grad: str | None = None
    cause: str | None = None

    def __post_init__(self) -> None:
        if self.cause is not None and self.cause not in CAUSES:
            raise ValueError(f"Adds cause must be one of {CAUSES}, got {self.cause!r}")


@dataclass(frozen=True)
class Sinks:
    """Joins each row's softmax denominator without a value: ``logits(geometry, *values)`` ->
    float64 broadcastable to ``[*lead, n_q]``; the baseline uses them rounded to the dtype.
    ``grad``: the name of its gradient among a backward's extras (``"dsinks"``)."""

    logits: Callable[..., Array]
    grad: str | None = None


@dataclass(frozen=True)
class Realigns:
    """Moves each query's diagonal key: ``diagonal(geometry, *values)`` -> broadcastable to
    ``[*lead, n_q, 1]``, in the alignment ``geometry.align`` (packed sequences: each sequence
    aligned on its own). Causal, windows and ALiBi's distances all read the diagonals from the
    geometry, so they follow. ``origin(geometry, *values)``, where given, moves the first key of
    each query's sequence as well (`Geometry.origin`: packed sequences), broadcastable as the
    diagonal; what counts positions from a sequence's start (chunks) reads it."""

    diagonal: Callable[..., Array]
    origin: Callable[..., Array] | None = None


@dataclass(frozen=True)
class Reads:
    """Changes how k and v are represented: ``read(k, v, *values) -> (k, v)`` gives the contiguous
    keys and values the maths reads, ``[batch, heads_kv, n_k, d]``, from the k and v the target
    received (a paged pool gathered through its block table; float8 codes dequantized) — exactly:
    in the received dtype or float64, never rounded. `spec.oracle.meaning` applies every `Reads`
    term first, in the order the keywords are declared, so the golden, the baseline, the floor and
    the visibility all start from what the keys and values mean. The keyword's ``writes`` is the
    other direction, for the cases.

    ``weights_in``: a float format a correct kernel may round the unnormalised weights
    exp(s − max) to before the P·V product (FlashAttention 3's float8 path rounds P to
    ``float8_e4m3fn``); the floor then counts that rounding (`spec.tolerance.weights_floor`)."""

    read: Callable[..., tuple[Array, Array]]
    weights_in: str | None = None


@dataclass(frozen=True)
class Widens:
    """Widens every score's product: ``query(*values)`` -> float ``[*lead, n_q, w]`` columns
    appended to each query, the values' ``w = d_v`` columns appended to each key, so that the
    score of query i and key j gains ``scale · query_i · v_j`` (FlashAttention 3's ``qv``,
    absorbed MLA): attention with ``q' = [q | query]`` and ``k' = [k | v]`` at the same explicit
    scale. `spec.oracle.meaning` applies it after every `Reads` term, so the golden, the baseline,
    the floor (products of d_k + d_v terms) and the gradients all follow. ``grad``: the name of
    the gradient of its first value among a backward's extras (``"dqv"``); the gradient of the
    key columns joins dv."""

    query: Callable[..., Array]
    grad: str | None = None


@dataclass(frozen=True)
class Leaves:
    """Leaves the golden as it is, for the ``reason`` given (dropout: the golden is the undropped
    output, and its laws read the kept set; an output asked for changes no number)."""

    reason: str

    def __post_init__(self) -> None:
        if not self.reason.strip():
            raise ValueError("Leaves needs the reason the keyword leaves the golden as it is")


@dataclass(frozen=True)
class Returns:
    """What a call given the keyword returns beside its output: ``fn`` returns ``(out, *names)``
    (``return_lse=True``: ``(out, lse)``; a past cache: ``(out, present_key, present_value)``), and
    `spec.call.call` returns them after the output, checked.

    ``asked``: how a call asks for them, as messages say it (``"with return_lse=True"``);
    ``in_layout``: they are laid out as the output (in the target's layout, moved back as it is),
    else returned as they are; ``check(meant, returned, out_shape)``: what is wrong with them (a
    message, the target's failure) or None, ``meant`` the call's `spec.inputs.Inputs` as the
    maths reads them (`spec.oracle.meaning`), ``returned`` the arrays as read (`numpy.ndarray`,
    in the suite's layout), ``out_shape`` the output's expected shape."""

    names: tuple[str, ...]
    asked: str
    check: Callable[[Any, tuple[Array, ...], tuple[int, ...]], str | None]
    in_layout: bool = False


def not_floats(x: Any, said: str) -> str | None:
    """Why ``x`` is not an array of numbers (``said`` opens the message), or None."""
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "fiuVc":
        return f"{said} {type(x).__name__} of dtype {getattr(x, 'dtype', None)}, not floats"
    return None


CAPABILITY = re.compile(r"(supports|returns)_[a-z0-9_]+")
"""How a keyword's capability is named: ``supports_window``, ``returns_lse``."""

Term = Restricts | Transforms | Adds | Sinks | Realigns | Reads | Widens | Leaves
TERMS = (Restricts, Transforms, Adds, Sinks, Realigns, Reads, Widens, Leaves)

Arrangement = Literal["dense", "packed", "paged"]
"""How a call's arrays are arranged: the one definition (`spec.target` imports it)."""


@dataclass(frozen=True)
class Keyword:
    """One keyword of real kernels: everything the suite knows about it, in one place."""

    name: str
    """Short name, the key of a case's drawn parameter: ``window``, ``varlen``, ``alibi``."""
    field: str
    """The capability a target declares it by, ``supports_…`` or ``returns_…`` (``supports_window``):
    ``Target(fn, supports_window=True)``, read as ``target.supports_window`` (`spec.target.Target`
    keeps every keyword's capability in one mapping, so a new keyword adds no field there)."""
    passes: tuple[str, ...]
    """The keyword arguments ``fn`` receives, in order: ``("cu_seqlens_q", "cu_seqlens_k")``."""
    meaning: str
    """What it means, one paragraph (the docs, the targets page)."""
    terms: tuple[Term, ...]
    """What it does to the maths (at least one; `Leaves` says it does nothing, and why)."""
    received: Callable[[Any, Any], tuple[Any, ...]]
    """``received(case, parameter)``: the values passed, in ``passes`` order (None: not passed)."""
    draw: Callable[[Any, Any, Any], Any] | None = None
    """``draw(draw_fn, target, case)``: the case with a parameter for this keyword (and whatever it
    needs: a batch, a rank); None when its laws build the case themselves."""
    arrangement: Arrangement = "dense"
    """``packed``: 3-D inputs are packed sequences, ``(heads, total, d)`` (``(total, heads, d)``
    in ``bnhd``); ``paged``: k and v are paged caches ``[num_blocks, block_size, heads_kv, d]`` in
    every layout (``moves``: only q and the output follow the target's layout)."""
    carries: tuple[str, ...] = ()
    """Arguments of other keywords passed with this one whenever it is given (``block_table``
    carries ``kv_lengths``): its values are ``passes`` then these (`given`), and a target that
    declares this keyword receives them with it, whether or not it declares theirs alone."""
    writes: Callable[[Any, Any, Array, Array], tuple[Array, Array]] | None = None
    """``writes(case, parameter, k, v) -> (k, v)``: the case's contiguous keys and values as this
    keyword passes them (scattered into a paged pool, quantized to float8) — the inverse of its
    `Reads` term. `spec.cases.Case.inputs` applies the keywords' writes in the reverse of their
    declaration order, so the reads, in that order, undo them."""
    ndims: tuple[int, ...] = (2, 3, 4)
    """Ranks of q, k, v it applies to (per-row key lengths: 4; packed sequences: 3); `spec.cases.cases`
    draws only those ranks for a case that draws it."""
    lengths: Callable[..., tuple[Any, Any]] | None = None
    """``lengths(n_q, *values) -> (query counts, key counts)``: the sequences a call with these
    values (those it passes, as passed) holds — packed sequences, each row's own key length —
    which a target's shape limits apply to (`spec.cases.outside_limits`); None: the call's n_q
    and n_k."""
    reshapes: bool = False
    """Its ``draw`` changes the case's batch or sizes (key lengths draw batch rows; packed sequences
    their totals): `spec.cases.cases` draws it before the keywords whose parameters are sized by
    the case (ALiBi's slopes per batch row, float8 scales per row and K/V head)."""
    moves: tuple[str, ...] = ("q", "k", "v")
    """In a call this keyword arranges (``arrangement`` not dense), which of q, k, v ``fn`` receives
    in its layout (``bnhd`` swaps their heads and positions): a paged cache is
    ``[num_blocks, block_size, heads_kv, d]`` in every layout, so only ``("q",)`` (`in_layout`)."""
    in_layout: tuple[str, ...] = ()
    """Arguments it passes that are laid out as k and v, in the target's layout (a past cache:
    ``past_key``, ``past_value``): they move with q, k and v in a dense call (`in_layout`)."""
    with_q: tuple[str, ...] = ()
    """Arguments it passes that are laid out as q (``qv``: a row per query head and query): they
    move with q in every arrangement, dense, packed or paged (`in_layout`)."""
    switch: bool = False
    """Its one argument is a switch (``return_lse``): False is the same as not giving it, and is
    never passed; it asks the forward for something, so ``grad_fn`` never receives it."""
    returns: Returns | None = None
    """What a call given it returns beside the output (`Returns`), or None: the output alone."""
    check_target: Callable[[Any], str | None] | None = None
    """``check_target(target)``: what is inconsistent in a target's declarations about this
    keyword (a message, which refuses the target: `spec.target.TargetError`), or None. Run on
    every target, declaring it or not (float8 caches need ml_dtypes)."""
    excludes: tuple[str, ...] = ()
    """Arguments that have no meaning beside it, never passed with it: a paged cache's keys are its
    table's, not the ``n_k`` a ``mask=`` or ``bias=`` is shaped by. A case that draws it draws no
    ``mask=``, and no keyword that passes one of these is drawn with it."""

    def __post_init__(self) -> None:
        if not self.terms or not all(isinstance(t, TERMS) for t in self.terms):
            raise ValueError(f"keyword {self.name!r} needs its terms (Restricts, Transforms, Adds, Sinks, "
                             f"Realigns, Reads, Widens or Leaves): the golden and the baseline read them, "
                             f"got {self.terms!r}")
        if not CAPABILITY.fullmatch(self.field):
            raise ValueError(f"keyword {self.name!r}: its capability must be named supports_… or returns_… "
                             f"(a lower-case identifier), got {self.field!r}")
        if not self.passes:
            raise ValueError(f"keyword {self.name!r} passes no argument")
        if not self.ndims or any(r not in (2, 3, 4) for r in self.ndims):
            raise ValueError(f"keyword {self.name!r}: ndims must be a non-empty subset of (2, 3, 4), "
                             f"got {self.ndims!r}")
        if set(self.carries) & set(self.passes):
            raise ValueError(f"keyword {self.name!r} both passes and carries "
                             f"{sorted(set(self.carries) & set(self.passes))}")
        if self.switch and len(self.passes) != 1:
            raise ValueError(f"keyword {self.name!r} is a switch: it passes one argument, "
                             f"got {self.passes!r}")
        if set(self.in_layout + self.with_q) - set(self.passes) or set(self.moves) - {"q", "k", "v"}:
            raise ValueError(f"keyword {self.name!r}: in_layout names arguments it passes, moves some of "
                             f"q, k, v; got {self.in_layout!r}, {self.moves!r}")
        if self.draw is not None and self.writes is None and any(isinstance(t, Reads) for t in self.terms):
            raise ValueError(f"keyword {self.name!r} reads k and v in another representation (a Reads "
                             f"term) and draws cases: it needs writes=, which puts a case's keys into it")

    def combines_with(self, other: Keyword, ranks: tuple[int, ...] = (2, 3, 4)) -> bool:
        """Whether a case can draw this keyword and ``other`` together, at one of ``ranks``: a rank
        both apply to, at most one arrangement that is not dense, neither carrying nor excluding
        what the other passes."""
        if not set(self.ndims) & set(other.ndims) & set(ranks) or self is other:
            return False
        if self.arrangement != "dense" and other.arrangement != "dense":
            return False
        return not any(set(a.carries + a.excludes) & set(b.passes) for a, b in ((self, other), (other, self)))

    def values(self, case: Any) -> dict[str, Any]:
        """The arguments this keyword passes for ``case`` (none if it drew no parameter)."""
        parameter = case.keywords.get(self.name)
        if parameter is None:
            return {}
        given = self.received(case, parameter)
        return {name: value for name, value in zip(self.passes, given, strict=True) if value is not None}

    def given(self, arguments: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """This keyword's values among ``arguments``, those it passes then those it carries (None
        when none of those it passes is given)."""
        if not any(arguments.get(name) is not None for name in self.passes):
            return None
        return tuple(arguments.get(name) for name in (*self.passes, *self.carries))

    def asked(self, arguments: Mapping[str, Any]) -> bool:
        """Whether ``arguments`` give this keyword: one of its arguments is given (not None; a
        switch, true)."""
        return any(arguments.get(name) is not None and (not self.switch or bool(arguments[name]))
                   for name in self.passes)

    def replace(self, **changes: Any) -> Keyword:
        return dataclasses.replace(self, **changes)
