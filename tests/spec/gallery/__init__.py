"""The gallery: attention implementations for the suite's own tests, one module per law family.

Each module holds ``BROKEN`` — deliberately broken implementations, each paired with the law that
must reject it — and ``CORRECT`` — variants that compute differently and must pass every law.
A new family of laws adds one module here and one name to `FAMILIES`.
"""

from __future__ import annotations

import types

from gallery import (
    alibi,
    bias,
    cache,
    calls,
    chunk,
    core,
    dropout,
    edges,
    gradients,
    invariance,
    lengths,
    long_runs,
    lse,
    masks,
    merge,
    mla,
    mods,
    pairs,
    past,
    range_edges,
    ranks,
    scale,
    sinks,
    softcap,
    stateful,
    topk,
    window,
)
from gallery.base import Broken

FAMILIES = (core, masks, gradients, range_edges, bias, alibi, window, chunk, mla, softcap, sinks, lengths,
            cache, past, dropout, lse, pairs, calls, edges, stateful, long_runs, scale, topk, merge,
            invariance, ranks, mods)

BROKEN: list[Broken] = [b for family in FAMILIES for b in family.BROKEN]
CORRECT = [t for family in FAMILIES for t in family.CORRECT]
CORRECT_BY_NAME = types.SimpleNamespace(**{t.name: t for t in CORRECT})
"""The correct variants by name, each a target ``spec check`` loads: ``gallery:CORRECT_BY_NAME.tiled``
(the false-alarm sweep's, tools/sweep.py, with ``tests`` on the path)."""

__all__ = ["BROKEN", "CORRECT", "CORRECT_BY_NAME", "FAMILIES", "Broken"]
