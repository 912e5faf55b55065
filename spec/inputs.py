"""One call's arguments, exactly as a target receives them: the record laws build, the calling
layer passes (and keeps, so a failure can show it), and the oracle computes its expectations from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Array = np.ndarray

CORE = ("q", "k", "v", "causal", "mask", "scale")
"""The arguments every target takes (``mask`` and ``scale`` only when declared); every other
argument is a keyword of `spec.keywords`."""


@dataclass(frozen=True)
class Inputs:
    """``fn(q, k, v, causal=, mask=, scale=, **keywords)`` in the suite's layout.

    q ``[*lead, n_q, d_k]``, k ``[*kv_lead, n_k, d_k]``, v ``[*kv_lead, n_k, d_v]``; ``mask``
    boolean, broadcastable to ``[*lead, n_q, n_k]``; ``keywords`` maps each keyword argument
    passed (``bias``, ``window``, ...) to its value. None means "not passed" throughout.
    """

    q: Array
    k: Array
    v: Array
    causal: bool = False
    mask: Array | None = None
    scale: float | None = None
    keywords: Mapping[str, Any] = field(default_factory=dict)
    memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    """What has been worked out from these arguments (by `spec.oracle`), kept with them: the
    arguments never change, and a copy made by `replace` starts empty."""

    def remember(self, key: Any, make: Any) -> Any:
        """``make()``, worked out once for these arguments and ``key``."""
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def replace(self, **changes: Any) -> Inputs:
        """A copy with some arguments changed: core ones by name, any other name a keyword
        argument (None removes it): ``inputs.replace(k=k2, window=None)``. A change that
        changes nothing (removing a keyword not passed) gives ``inputs`` itself, what it has
        worked out included."""
        if all(name not in CORE and value is None and self.keywords.get(name) is None
               for name, value in changes.items()):
            return self
        core = {name: value for name, value in changes.items() if name in CORE}
        keywords = dict(self.keywords)
        for name, value in changes.items():
            if name in CORE:
                continue
            if value is None:
                keywords.pop(name, None)
            else:
                keywords[name] = value
        return dataclasses.replace(self, **core, keywords=keywords)

    def get(self, name: str) -> Any:
        """A keyword argument's value, or None when it is not passed."""
        return self.keywords.get(name)

    @property
    def lead(self) -> tuple[int, ...]:
        """The leading dims of the output: (), (heads,) or (batch, heads)."""
        if self.q.shape[:-2] == self.v.shape[:-2]:
            return tuple(self.q.shape[:-2])
        try:
            return tuple(np.broadcast_shapes(self.q.shape[:-2], self.v.shape[:-2]))
        except ValueError:  # grouped K/V heads: the output has the query heads
            return tuple(self.q.shape[:-2])

    @property
    def n_q(self) -> int:
        return int(self.q.shape[-2])

    @property
    def n_k(self) -> int:
        return int(self.k.shape[-2])

    @property
    def d_k(self) -> int:
        return int(self.q.shape[-1])

    @property
    def scale_value(self) -> float:
        """The scale the scores are multiplied by: ``scale``, or 1/√d_k when it is not passed."""
        return 1.0 / math.sqrt(self.d_k) if self.scale is None else float(self.scale)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (*self.lead, self.n_q, int(self.v.shape[-1]))

    def arrays(self) -> dict[str, Array]:
        """Every array argument by name, core ones first (for reports and copies)."""
        found = {"q": self.q, "k": self.k, "v": self.v}
        if self.mask is not None:
            found["mask"] = np.asarray(self.mask)
        found |= {name: x for name, x in self.keywords.items() if isinstance(x, np.ndarray)}
        return found

    def values(self) -> dict[str, Any]:
        """Every non-array argument passed (``causal``, ``scale``, ``window``, ...)."""
        given: dict[str, Any] = {"causal": self.causal} if self.causal else {}
        if self.scale is not None:
            given["scale"] = self.scale
        return given | {name: x for name, x in self.keywords.items() if not isinstance(x, np.ndarray)}
