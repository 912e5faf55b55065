"""What a law's last comparison held side by side: the record a failure's picture is drawn from.

Every place that holds an output to the golden (`spec.tolerance.compare`) or two outputs of the
target to each other (`spec.laws._helpers.same_bits`, ``assert_same``) records what it compared
into the run in progress (`record`: references only, nothing copied, each record replacing the
last). A failing law's `spec.report.Result` carries the last one, cut down by `compact` to the
(batch, head) slice holding the worst error and at most `KEPT` entries a side, so that a Result
stays small when it is pickled back from a worker process (`spec.isolation`) and when it is held.
``spec.html`` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from spec import context

Array = np.ndarray

KEPT = 256
"""At most this many rows and columns of a comparison travel with a failure; a larger slice is
reduced by blocks, each keeping its worst entry (`downsample`)."""


@dataclass(frozen=True)
class Compared:
    """One comparison: ``returned`` held to ``expected`` within ``allowance``.

    Shapes: ``expected`` and ``returned`` ``[..., rows, columns]`` (an output: query row × output
    column); ``allowance`` a scalar or an array broadcastable to them; ``rows`` ``[..., rows]``
    bool, the rows compared (None: every row)."""

    label: str
    expected: Array
    returned: Array
    allowance: Any
    rows: Array | None = None
    shape: tuple[int, ...] = ()
    """The shape compared, before `compact` cut it down (() until then: ``expected``'s)."""
    slice_: tuple[int, ...] = ()
    """The leading (batch, head) index of the slice kept, () for a 2-D comparison."""
    block: tuple[int, int] = (1, 1)
    """Rows and columns of the comparison behind each entry kept (1, 1: not downsampled)."""
    limits: dict[str, int] = field(default_factory=dict)
    """The target's declared shape limits that fall on the rows (``seq_multiple``, ``max_seq``)."""

    @property
    def full_shape(self) -> tuple[int, ...]:
        return self.shape or tuple(np.shape(self.expected))

    def ratio(self) -> Array:  # -> same shape as expected, float64
        """error / allowance entry by entry: 0 where the two are equal (NaN equal to NaN), inf
        where they differ and nothing is allowed or either is NaN/Inf alone; NaN where a row was not
        compared."""
        return _ratio(self.expected, self.returned, self.allowance, self.rows)

    def error(self) -> Array:  # -> same shape as expected, float64
        """|returned − expected| entry by entry (inf where exactly one is NaN/Inf, 0 where both
        are the same non-finite value), NaN where a row was not compared."""
        return _error(self.expected, self.returned, self.rows)

    @property
    def held(self) -> bool:
        """No compared entry is over its allowance."""
        return not bool(np.any(self.ratio() > 1.0))  # NaN (a row not compared) is never over


def record(label: str, expected: Any, returned: Any, allowance: Any, *, rows: Any = None) -> None:
    """Make this comparison the run's last (`spec.context.RunContext.compared`); outside a run,
    nothing. Only references are kept; `compact` copies what a failure keeps."""
    run = context.current()
    if run is not None:
        run.compared = Compared(label, expected, returned, allowance, rows)


def relabel(label: str) -> None:
    """Name the run's last comparison ``label`` (the law's words for what it compared)."""
    run = context.current()
    if run is not None and isinstance(run.compared, Compared):
        run.compared = replace(run.compared, label=label)


def _as2d(x: Any) -> Array:  # [...] -> [..., rows, columns] float64: a vector is one column
    a = np.asarray(x, dtype=np.float64)
    return a.reshape(1, 1) if a.ndim == 0 else a[:, None] if a.ndim == 1 else a


def _error(expected: Any, returned: Any, rows: Any) -> Array:
    e, r = _as2d(expected), _as2d(returned)
    e, r = np.broadcast_arrays(e, r)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(r - e)
    same = (e == r) | (np.isnan(e) & np.isnan(r))
    err = np.where(same, 0.0, np.where(np.isfinite(err), err, np.inf))
    if rows is not None:
        selected = np.asarray(rows, dtype=bool)
        selected = selected[..., None] if selected.ndim == err.ndim - 1 else selected
        err = np.where(np.broadcast_to(selected, err.shape), err, np.nan)
    return err


def _ratio(expected: Any, returned: Any, allowance: Any, rows: Any) -> Array:
    err = _error(expected, returned, rows)
    allow = np.broadcast_to(_as2d(allowance) if np.ndim(allowance) else np.float64(allowance), err.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(err == 0, 0.0, np.where(allow > 0, err / np.where(allow > 0, allow, 1.0), np.inf))
    return np.where(np.isnan(err), np.nan, ratio)


def worst_slice(ratio: Array) -> tuple[int, ...]:
    """The leading index (all but the last two axes) of the entry with the largest ratio (inf
    first; rows not compared last); () for a 2-D ratio."""
    if ratio.ndim <= 2 or ratio.size == 0:
        return ()
    ranked = np.where(np.isnan(ratio), -1.0, ratio)
    at = np.unravel_index(int(np.argmax(ranked)), ratio.shape)
    return tuple(int(i) for i in at[:-2])


def downsample(ratio: Array, *arrays: Array, most: int) -> tuple[tuple[int, int], list[Array]]:
    """``ratio [r, c]`` and each of ``arrays`` (same shape) cut to at most ``most`` entries a side:
    blocks of rows × columns, each giving the entry where its ratio is largest (so the block's
    value of ``ratio`` is its maximum, and the other arrays show that entry's values). Returns the
    block and the reduced arrays, ``ratio`` first."""
    n_r, n_c = ratio.shape
    block = (max(1, -(-n_r // most)), max(1, -(-n_c // most)))
    if block == (1, 1):
        return block, [ratio, *arrays]
    out_r, out_c = -(-n_r // block[0]), -(-n_c // block[1])
    pad = ((0, out_r * block[0] - n_r), (0, out_c * block[1] - n_c))
    ranked = np.pad(np.where(np.isnan(ratio), -1.0, ratio), pad, constant_values=-2.0)

    def tiles(a: Array) -> Array:  # [R, C] -> [out_r, out_c, block_r * block_c]
        return a.reshape(out_r, block[0], out_c, block[1]).transpose(0, 2, 1, 3).reshape(out_r, out_c, -1)

    pick = np.argmax(tiles(ranked), axis=-1)[..., None]
    reduced = [np.take_along_axis(tiles(np.pad(a, pad, constant_values=np.nan)), pick, axis=-1)[..., 0]
               for a in (ratio, *arrays)]
    return block, reduced


def compact(compared: Compared, *, limits: dict[str, int] | None = None) -> Compared:
    """What a failure keeps of ``compared``: the 2-D slice holding the worst ratio, downsampled
    to at most `KEPT` a side, as float64 copies, the allowance (a scalar stays one), the rows
    compared entry by entry; ``limits``: the target's declared limits to draw."""
    ratio = _ratio(compared.expected, compared.returned, compared.allowance, compared.rows)
    shape = ratio.shape
    expected, returned = (np.broadcast_to(_as2d(x), shape) for x in (compared.expected, compared.returned))
    allow = np.broadcast_to(_as2d(compared.allowance) if np.ndim(compared.allowance)
                            else np.float64(compared.allowance), shape)
    at = worst_slice(ratio)
    ratio, expected, returned, allow = (a[at] for a in (ratio, expected, returned, allow))
    block, (ratio, expected, returned, allow) = downsample(ratio, expected, returned, allow, most=KEPT)
    kept_allowance = float(compared.allowance) if np.ndim(compared.allowance) == 0 else np.array(allow)
    return Compared(compared.label, np.array(expected), np.array(returned), kept_allowance,
                    rows=~np.isnan(ratio), shape=shape, slice_=at, block=block, limits=dict(limits or {}))
