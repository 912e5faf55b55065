"""Merge operators under test: `MergeTarget`, the declaration of a function that merges attention
states (``(out, lse)`` of attention over disjoint key sets) into the state over their union, and how
the suite calls it.

    fn(out_a, lse_a, out_b, lse_b) -> (out, lse)      out [..., n_q, d_v], lse [..., n_q]
    fn_n(outs, lses) -> (out, lse)                    outs [s, ..., n_q, d_v], lses [s, ..., n_q]

Layouts: ``bhnd`` gives 4-D states as ``out [batch, heads, n_q, d_v]``, ``lse [batch, heads, n_q]``;
``bnhd`` gives ``out [batch, n_q, heads, d_v]`` and the lse as FlashAttention returns its
``softmax_lse`` next to such an output (and as `spec.target.Target` reads a ``bnhd`` target's lse),
``[batch, heads, n_q]``. A merge target is run by `spec.check` on the merge laws alone
(`spec.laws.merge`), judged against the suite's float64 merge and golden, never against `impl`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from spec import dtypes as dt
from spec.target import FLOAT_DTYPES, LseBase, TargetError, TargetFailed, _callable_name, _returned

Array = np.ndarray


@dataclass(frozen=True)
class MergeTarget:
    """A merge operator under test: the pairwise form ``fn``, the n-way form ``fn_n``, or both."""

    fn: Callable[..., Any] | None = None
    """``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``: two states merged."""
    fn_n: Callable[..., Any] | None = None
    """``fn_n(outs, lses) -> (out, lse)``: ``s`` states stacked on a leading axis, merged."""
    name: str = ""
    """Shown in reports; defaults to the callable's qualified name."""
    lse_base: LseBase = "e"
    """``"e"``: the lse given and returned is the natural log of the sum; ``2``: its base-2 log
    (FlashInfer's ``merge_state``)."""
    empty_lse: float = -math.inf
    """The lse of an empty state (a part that saw no key; its output is zeros): −inf by default,
    +inf for FlashAttention's CUDA kernels. Only this value is passed for an empty part, and a merge
    of empties must return it."""
    dtypes: tuple[str, ...] = ("float32", "float64")
    """NumPy dtype names of ``out`` the target accepts; each is tested. The lse is float32 for
    16-bit and float32 outputs, float64 for float64 ones, and must be returned so."""
    empty_parts: bool = True
    """False: the operator is never given an empty state (ring attention's merger, whose blocks
    a causal mask would empty are skipped before it): no row is drawn empty, and the two laws of
    empty states are skipped, naming this declaration."""
    layout: str = "bhnd"
    """``bhnd`` or ``bnhd``: the axis order of 4-D outputs (see the module's docstring)."""

    def __post_init__(self) -> None:
        for field in ("fn", "fn_n"):
            if getattr(self, field) is not None and not callable(getattr(self, field)):
                raise TargetError(f"MergeTarget {field} must be callable, "
                                  f"got {type(getattr(self, field)).__name__}")
        if self.fn is None and self.fn_n is None:
            raise TargetError("MergeTarget needs fn (pairwise) or fn_n (n-way), or both")
        if not self.name:
            named = self.fn if self.fn is not None else self.fn_n
            assert named is not None
            object.__setattr__(self, "name", _callable_name(named))
        if self.lse_base == "2":
            object.__setattr__(self, "lse_base", 2)
        if isinstance(self.lse_base, bool) or self.lse_base not in ("e", 2):
            raise TargetError(f"MergeTarget lse_base must be 'e' (natural) or 2, got {self.lse_base!r}")
        if isinstance(self.empty_lse, bool) or not isinstance(self.empty_lse, (int, float)) \
                or math.isnan(self.empty_lse):
            raise TargetError("MergeTarget empty_lse must be a float (-inf, +inf or finite), "
                              f"got {self.empty_lse!r}")
        object.__setattr__(self, "empty_lse", float(self.empty_lse))
        if isinstance(self.dtypes, str) or not self.dtypes or not all(d in FLOAT_DTYPES for d in self.dtypes):
            raise TargetError(f"MergeTarget dtypes must be a non-empty tuple of {', '.join(FLOAT_DTYPES)}, "
                              f"got {self.dtypes!r}")
        object.__setattr__(self, "dtypes", tuple(self.dtypes))
        if not isinstance(self.empty_parts, bool):
            raise TargetError(f"MergeTarget empty_parts must be True or False, got {self.empty_parts!r}")
        if self.layout not in ("bhnd", "bnhd"):
            raise TargetError(f"MergeTarget layout must be 'bhnd' or 'bnhd', got {self.layout!r}")

    def replace(self, **changes: Any) -> MergeTarget:
        """The same declaration with ``changes`` (validated again)."""
        return replace(self, **changes)


def lse_dtype(dtype: str) -> np.dtype:
    """The dtype of the lse next to an output of ``dtype``: float64 for float64, float32 else."""
    return np.dtype(np.float64) if dtype == "float64" else np.dtype(np.float32)


def _given_lse(target: MergeTarget, lse: Array, dtype: str) -> Array:
    """A natural-log float64 lse (−inf: empty) as the target takes it: its base, its empty value."""
    base = lse / math.log(2.0) if target.lse_base == 2 else lse
    return np.where(np.isneginf(lse), target.empty_lse, base).astype(lse_dtype(dtype))


def _read_lse(target: MergeTarget, lse: Array) -> Array:
    """A returned lse as the natural-log float64 it stands for; ``empty_lse`` read as −inf."""
    lse = np.asarray(lse, dtype=np.float64)
    natural = lse * math.log(2.0) if target.lse_base == 2 else lse
    return np.where(lse == target.empty_lse, -np.inf, natural)


def _out_axes(target: MergeTarget, ndim: int) -> tuple[int, int] | None:
    return (-3, -2) if target.layout == "bnhd" and ndim == 4 else None


def _to_layout(target: MergeTarget, out: Array) -> Array:
    axes = _out_axes(target, out.ndim)
    return np.ascontiguousarray(np.swapaxes(out, *axes)) if axes else out


def _returned_state(target: MergeTarget, got: Any, out_shape: tuple[int, ...], dtype: str,
                    what: str) -> tuple[Array, Array, Array]:
    """``(out, lse)`` as returned, checked (shapes, dtypes), back in ``bhnd``: the output in its
    dtype, the lse as returned and as the natural float64 it stands for."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise TargetFailed(f"{what} must return (out, lse), got {type(got).__name__}")
    out = _returned(got[0], "out", dt.as_dtype(dtype))
    lse = _returned(got[1], "lse", lse_dtype(dtype))
    laid = _to_layout(target, np.zeros(out_shape, dtype=bool)).shape
    if out.shape != laid or lse.shape != out_shape[:-1]:
        raise TargetFailed(f"{what} returned out {list(out.shape)} and lse {list(lse.shape)}, expected "
                           f"{list(laid)} and {list(out_shape[:-1])}")
    axes = _out_axes(target, out.ndim)
    back = np.swapaxes(out, *axes) if axes else out
    return back, lse, _read_lse(target, lse)


def merge_call(target: MergeTarget, outs: list[Array], lses: list[Array], dtype: str, *,
               n_way: bool = False) -> tuple[Array, Array, Array]:
    # s × ([..., n_q, d_v] float64, [..., n_q] float64 natural) -> out [..., n_q, d_v], lse, natural lse
    """The target's merge of the states ``(outs[i], lses[i])`` (float64, natural lse, −inf empty),
    given in ``dtype``, its base and its empty value: pairwise left to right with ``fn`` (or
    ``fn_n`` on the stack when ``n_way`` or when only ``fn_n`` is declared). Returns the output in
    ``dtype`` (``bhnd``), the lse as returned, and that lse read as a natural float64 (−inf empty)."""
    given = [(_to_layout(target, o.astype(dt.as_dtype(dtype))), _given_lse(target, lse, dtype))
             for o, lse in zip(outs, lses, strict=True)]
    shape = outs[0].shape
    if n_way or target.fn is None:
        assert target.fn_n is not None
        got = target.fn_n(np.stack([o for o, _ in given]), np.stack([lse for _, lse in given]))
        return _returned_state(target, got, shape, dtype, "fn_n")
    (out, lse), read = given[0], None
    for o, lse_next in given[1:]:
        out, lse, read = _returned_state(target, target.fn(out, lse, o, lse_next), shape, dtype, "fn")
        out = _to_layout(target, out)
    assert read is not None
    return _returned_state(target, (out, lse), shape, dtype, "fn")
