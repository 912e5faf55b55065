"""Laws of the call itself: the same call twice gives the same bits (``deterministic``),
and the memory layout of the inputs does not matter (strided views)."""

from __future__ import annotations

import numpy as np

from spec.call import call
from spec.cases import Case, cases
from spec.laws import _needs
from spec.laws._helpers import assert_same, differs_at, run
from spec.registry import law
from spec.target import Target

Array = np.ndarray


@law(strategy=lambda t: cases(t, masks=("none", "random")), needs=_needs.deterministic)
def deterministic_calls(target: Target, case: Case) -> None:
    """Two identical calls (same inputs, same keywords) give bit-identical outputs.

    Catches: a scratch buffer kept between calls and accumulated into without being zeroed (the
    second call adds the first's result); split-K reductions finished with atomic adds in whatever
    order the threads arrive (FlashAttention's backward, hence its ``deterministic=`` flag).
    """
    inputs = case.inputs()
    first, second = run(target, inputs), run(target, inputs)
    if not np.array_equal(first, second, equal_nan=True):
        at = differs_at(first, second)
        raise AssertionError(f"a second identical call gave {float(second[at])!r} instead of "
                             f"{float(first[at])!r} at {list(at)}")


VIEWS = ("transposed", "reversed", "fortran", "offset")


def as_view(x: Array, kind: str) -> Array:  # [..., n, d] -> same values, another memory layout
    """The same values as a non-contiguous (or Fortran-ordered) array: ``transposed`` — the last
    two axes' strides swapped; ``reversed`` — negative strides along n; ``fortran`` — column-major;
    ``offset`` — a slice of a wider buffer starting one element in."""
    if kind == "transposed":
        return np.swapaxes(np.ascontiguousarray(np.swapaxes(x, -1, -2)), -1, -2)
    if kind == "reversed":
        return np.ascontiguousarray(x[..., ::-1, :])[..., ::-1, :]
    if kind == "fortran":
        return np.asfortranarray(x)
    if kind == "offset":
        wide = np.zeros((*x.shape[:-1], x.shape[-1] + 3), dtype=x.dtype)
        wide[..., 1:1 + x.shape[-1]] = x
        return wide[..., 1:1 + x.shape[-1]]
    raise ValueError(f"unknown view kind {kind!r}; the kinds are {', '.join(VIEWS)}")


@law(strategy=lambda t: cases(t, masks=("none", "random")))
def strided_views(target: Target, case: Case) -> None:
    """q, k and v given as non-contiguous views — strides of the last two axes swapped, negative
    strides, Fortran order, an offset into a wider buffer (one kind each, drawn) — give the output
    of contiguous copies within twice the tolerance. Not bit-identical: a layout may rightly pick
    another BLAS kernel (a transposed operand, another blocking) and so another summation order;
    a kernel that ignores strides reads other numbers altogether, far outside the tolerance.

    Catches: a kernel that reads ``data_ptr()`` as if the tensor were contiguous (a transposed
    view is then read as the untransposed matrix); a negative stride taken as unsigned; an
    offset into the buffer dropped, so every row is read one element early.
    """
    inputs = case.inputs()
    kinds = [VIEWS[int(i)] for i in case.rng(12).integers(0, len(VIEWS), size=3)]
    views = [as_view(x, kind) for x, kind in zip((inputs.q, inputs.k, inputs.v), kinds, strict=True)]
    assert all(np.array_equal(a, b) for a, b in zip(views, (inputs.q, inputs.k, inputs.v), strict=True))
    contiguous = run(target, inputs)
    out = call(target, inputs.replace(q=views[0], k=views[1], v=views[2]), copy=False).astype(np.float64)
    assert_same(target, inputs, contiguous, out,
                what=f"with q, k, v as {', '.join(kinds)} views, against contiguous copies, the output")
