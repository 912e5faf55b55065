"""Gallery for the laws of long runs (`spec.laws.long_runs`, ``--profile judge``): kernels right
for their first calls only, or wrong once every so many calls."""

from __future__ import annotations

import itertools

import numpy as np

from gallery.base import broken, plain
from spec import Target, audit

Array = np.ndarray

RIGHT_FOR = 10  # calls
EVERY = 37  # calls


wrong_after_ten_calls = audit.corrupt_after(RIGHT_FOR)
"""Right for its first calls, its rows in the wrong order after (`spec.audit.corrupt_after`)."""


_NAN_CALLS = itertools.count(1)


def nan_every_37th_call(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    out = plain(q, k, v, causal=causal)
    if next(_NAN_CALLS) % EVERY == 0:
        out.reshape(-1)[:1] = np.nan  # one entry, once in 37 calls
    return out


BROKEN = [
    broken(wrong_after_ten_calls, "right_after_64_calls",
           f"right for its first {RIGHT_FOR} calls, its rows reversed after", name="wrong_after_ten_calls",
           profile="judge"),
    broken(nan_every_37th_call, "long_run_matches_golden", f"a NaN in its output every {EVERY}th call",
           profile="judge"),
]

CORRECT: list[Target] = []
