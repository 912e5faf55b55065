"""Mask functions (``mask_mod=``, FlexAttention's): ``mask_mod(b, h, q_idx, kv_idx) -> bool``.

A target that declares ``supports_mask_mod`` is called with a Python callable, drawn by the suite
from its library (`MASKS`), and calls it itself on int64 index arrays broadcastable to
``[batch, heads, n_q, n_k]`` (b = h = 0 for 2-D inputs; 3-D inputs have b = 0): True = query
``q_idx`` may attend key ``kv_idx``. It is ANDed with ``causal=`` and every other restriction; a
row it empties is emptied by the cause ``"mask"``. The golden evaluates it once, densely, on NumPy
index arrays (`mod_visible`); a framework adapter converts (`spec.adapters.torch_flex_mods`: torch
tensors).

Every function of the library is written with operators only (``&``, ``|``, ``~``, ``//``, ``%``,
comparisons: no ``where``), so the one body runs on NumPy arrays and on torch tensors, eager,
under ``vmap`` and under ``torch.compile``. Each is a small frozen dataclass (picklable: a call may
travel to a worker process, `spec.isolation`), in two logically equal forms (``form=0`` and
``form=1``, written differently): FlexAttention users write the same mask many ways, and the
output may not depend on which (pytorch/pytorch#165838).

The library: causal, sliding window, prefix-LM, document (packed sequences), dilated,
block-causal, and two that read the batch and head indices (a window per head, a prefix per
batch row: a kernel that evaluates the mask for head 0 only and broadcasts it, pytorch/pytorch
#163314, gets those wrong).

Its declaration (`MASK_MOD`) and the functions it is made of; its laws are `spec.laws.mods`'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import strategies as st

from spec.keywords.record import Geometry, Keyword, Restricts

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


# --- the index arrays a function is evaluated on ---------------------------------------------------


def index_arrays(geo: Geometry) -> tuple[Array, Array, Array, Array]:
    # -> b [B, 1, 1, 1], h [1, H, 1, 1], q_idx [1, 1, r, 1], kv_idx [1, 1, 1, n_k], int64
    """The indices a mask or score function reads for the queries of ``geo`` (its rows, if some
    only), broadcastable to ``[batch, heads, r, n_k]``: b = 0 and h = 0 where the inputs have no
    batch (3-D) or no heads (2-D)."""
    lead = (1, 1, *geo.lead)[-2:]
    b = np.arange(lead[0], dtype=np.int64).reshape(-1, 1, 1, 1)
    h = np.arange(lead[1], dtype=np.int64).reshape(1, -1, 1, 1)
    q_idx = np.asarray(geo.queries, dtype=np.int64).reshape(1, 1, -1, 1)
    kv_idx = np.arange(geo.n_k, dtype=np.int64).reshape(1, 1, 1, -1)
    return b, h, q_idx, kv_idx


def in_lead(x: Array, geo: Geometry) -> Array:  # [B, H, r, n_k] (broadcastable) -> [*lead, r, n_k]
    """A function's value over `index_arrays`, shaped as the call's scores."""
    lead = (1, 1, *geo.lead)[-2:]
    full = np.broadcast_to(x, (*lead, len(geo.queries), geo.n_k))
    return full.reshape(*geo.lead, len(geo.queries), geo.n_k)


def mod_visible(geo: Geometry, mask_mod: Any) -> Array:  # -> [*lead, r, n_k] bool
    """What ``mask_mod`` lets each query see, evaluated densely on `index_arrays`; refused with
    TypeError unless it gives booleans."""
    found = np.asarray(mask_mod(*index_arrays(geo)))
    if found.dtype != np.bool_:
        raise TypeError(f"mask_mod must return booleans, got dtype {found.dtype} from {mask_mod!r}")
    return in_lead(found, geo)


# --- the library ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Causal:
    """Query i sees keys j ≤ i (top-left, whatever the target's alignment)."""

    form: int = 0

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return q_idx >= kv_idx if self.form == 0 else ~(kv_idx > q_idx)


@dataclass(frozen=True)
class SlidingWindow:
    """Causal, and at most ``window`` keys back: i − window ≤ j ≤ i (Mistral's)."""

    window: int
    form: int = 0

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if self.form == 0:
            return (q_idx >= kv_idx) & (q_idx - kv_idx <= self.window)
        return (kv_idx >= q_idx - self.window) & ~(kv_idx > q_idx)


@dataclass(frozen=True)
class PrefixLM:
    """Every query sees the first ``prefix`` keys, and the others causally (T5's prefix-LM)."""

    prefix: int
    form: int = 0

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if self.form == 0:
            return (kv_idx < self.prefix) | (q_idx >= kv_idx)
        return ~((kv_idx >= self.prefix) & (kv_idx > q_idx))


@dataclass(frozen=True)
class Document:
    """Packed documents: positions split at ``cuts`` (increasing); a query sees the keys of its own
    document only. A position's document is the number of cuts at or below it."""

    cuts: tuple[int, ...]
    form: int = 0

    def document(self, x: Any) -> Any:
        found = x * 0
        for cut in self.cuts:
            found = found + (x >= cut) * 1
        return found

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if self.form == 0:
            return self.document(q_idx) == self.document(kv_idx)
        return (self.document(q_idx) - self.document(kv_idx)) * 1 == 0


@dataclass(frozen=True)
class Dilated:
    """Every ``step``-th key from the query's own position: (i − j) mod step = 0 (floored)."""

    step: int
    form: int = 0

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if self.form == 0:
            return (q_idx - kv_idx) % self.step == 0
        return (kv_idx - q_idx) % self.step == 0


@dataclass(frozen=True)
class BlockCausal:
    """Blocks of ``size`` positions see themselves and earlier blocks: i // size ≥ j // size."""

    size: int
    form: int = 0

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if self.form == 0:
            return q_idx // self.size >= kv_idx // self.size
        return kv_idx < (q_idx // self.size + 1) * self.size


@dataclass(frozen=True)
class HeadWindow:
    """A window per head: head h sees keys i − h·``width`` ≤ j ≤ i (head 0 only its diagonal)."""

    width: int
    form: int = 0

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if self.form == 0:
            return (q_idx >= kv_idx) & (q_idx - kv_idx <= h * self.width)
        return ~(kv_idx > q_idx) & (kv_idx + h * self.width >= q_idx)


@dataclass(frozen=True)
class BatchPrefix:
    """A prefix per batch row: row b sees its first b + ``prefix`` keys whatever the query, the
    others causally."""

    prefix: int
    form: int = 0

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if self.form == 0:
            return (kv_idx < b + self.prefix) | (q_idx >= kv_idx)
        return ~((kv_idx >= b + self.prefix) & (kv_idx > q_idx))


MASKS: dict[str, type] = {
    "causal": Causal, "sliding_window": SlidingWindow, "prefix_lm": PrefixLM, "document": Document,
    "dilated": Dilated, "block_causal": BlockCausal, "head_window": HeadWindow, "batch_prefix": BatchPrefix,
}
"""The library of mask functions, by name; a drawn parameter is ``(name, arguments)``."""

BY_INDEX = ("head_window", "batch_prefix")
"""The mask functions that read the batch or head index."""


def mask_mod(parameter: tuple[str, tuple[Any, ...]], form: int = 0) -> Any:
    """The library's function for a drawn ``(name, arguments)``, in ``form`` 0 or 1."""
    name, arguments = parameter
    if name not in MASKS:
        raise ValueError(f"mask_mod must name one of {', '.join(MASKS)}, got {name!r}")
    return MASKS[name](*arguments, form=form)


@st.composite
def parameters(draw: st.DrawFn, n: int, names: tuple[str, ...] = tuple(MASKS)) -> tuple[str, tuple[Any, ...]]:
    """A library entry and its arguments for calls of about ``n`` positions: windows, prefixes,
    cuts, steps and block sizes within them (a block size that does not divide n among them)."""
    name = draw(st.sampled_from(names))
    if name == "causal":
        return name, ()
    if name == "document":
        cuts = draw(st.lists(st.integers(1, max(n - 1, 1)), min_size=1, max_size=3, unique=True))
        return name, (tuple(sorted(cuts)),)
    low, high = {"sliding_window": (0, n), "prefix_lm": (0, n), "dilated": (2, 4),
                 "block_causal": (1, 8), "head_window": (1, 3), "batch_prefix": (0, n)}[name]
    return name, (draw(st.integers(low, max(low, high))),)


def draw(draw_fn: st.DrawFn, target: Target, case: Case) -> Case:
    """A function from the library (`parameters`), sized to the case's keys."""
    return case.with_keyword("mask_mod", draw_fn(parameters(max(case.n_q, case.n_k))))


MASK_MOD = Keyword(
    name="mask_mod",
    field="supports_mask_mod",
    passes=("mask_mod",),
    meaning="mask_mod(b, h, q_idx, kv_idx) -> bool, FlexAttention's signature: a Python callable the "
            "target calls on int64 index arrays broadcastable to [batch, heads, n_q, n_k] (b = h = 0 "
            "for 2-D inputs; NumPy arrays, which an adapter converts); True = may attend. ANDed with "
            "causal and every other restriction. The suite draws it from its library: causal, sliding "
            "window, prefix-LM, document, dilated, block-causal, a window per head, a prefix per batch row.",
    terms=(Restricts(mod_visible, cause="mask"),),
    received=lambda case, parameter: (mask_mod(parameter),),
    draw=draw,
)
