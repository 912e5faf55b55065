"""The power guard: whether the suite's own cases can tell a correct output from a trivially wrong one.

A law that compares outputs with the golden is only as strong as the cases it draws: a case whose
golden is all zeros passes a kernel that returns zeros, a case with one key passes one that
averages the values, a call whose masks hide nothing passes one that ignores the masks, a
case with d_k = 1 passes one that forgets the scale. The guard judges the cases, never the
target: while a law runs with ``power=True`` (`spec.runner.check`), each call it makes to the target
is also given to each trivial kernel of `KERNELS` on the same arguments (`see`), and the kernel's
output is compared with that call's golden by the tolerance the law applies
(`spec.tolerance.compare`, the target's factor, the same rows); the kernels rejected by at least one
call are the law's power (`Power.verdict`). A law whose run compared no output with the float64
golden (`compared_with_golden`: it checks gradients, sums, bits, refusals) has none to judge: "n/a".

Each trivial kernel is a function of the call's `spec.inputs.Inputs` (and the target's alignment
and declared precision), a transform of the golden's own terms; `as_target` wraps one as a
`spec.Target`, which the laws themselves must fail (tests/spec/test_spec_power.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spec import context, golden, oracle, tolerance
from spec.dtypes import BFLOAT16, as_dtype, has_bfloat16
from spec.inputs import Inputs
from spec.target import Target

Array = np.ndarray

LIMIT = 2**20
"""A call with more score entries than this (slices × n_q × n_k) is not judged: each trivial kernel
costs about a golden, and the calls past it (long rows, the scale laws) are few and are judged
where the same laws draw small ones."""

LOWER = {"float64": "float32", "float32": "float16", "float16": BFLOAT16}
"""The dtype a kernel that computes in a lower precision than declared uses, for each declared
(computing) dtype: one step down. bfloat16 has none the golden's baseline can compute in (float8
e4m3 has no infinity: a hidden key's −inf is NaN there), so its calls do not judge that kernel."""


@dataclass(frozen=True)
class Trivial:
    """A trivially wrong attention kernel: ``fn(target, inputs)`` is its output for the call
    ``inputs`` (float64 ``[*lead, n_q, d_v]``, as a kernel returning the inputs' dtype rounds it),
    or None where it is not defined for that call (no lower precision below bfloat16)."""

    name: str
    means: str
    fn: Callable[[Target, Inputs], Array | None]


def _values(inputs: Inputs) -> Array:  # -> [*lead, n_k, d_v] float64, each query head's K/V head
    meant = oracle.meaning(inputs)
    return golden.with_kv_heads(meant.q, np.asarray(meant.v, dtype=np.float64))


def zeros(target: Target, inputs: Inputs) -> Array:  # -> [*lead, n_q, d_v]
    """Returns zeros."""
    return np.zeros(oracle.meaning(inputs).out_shape)


def mean_v(target: Target, inputs: Inputs) -> Array:  # -> [*lead, n_q, d_v]
    """Every row the plain mean of all values: ignores q, k and every restriction."""
    meant = oracle.meaning(inputs)
    v = _values(inputs)
    if meant.n_k == 0:
        return np.zeros(meant.out_shape)
    return np.broadcast_to(v.mean(axis=-2, keepdims=True), meant.out_shape).copy()


def uniform_weights(target: Target, inputs: Inputs) -> Array:  # -> [*lead, n_q, d_v]
    """Equal weights on the keys each row sees: keeps every restriction, ignores the scores."""
    seen = oracle.visibility(target.alignment, inputs).astype(np.float64)  # [*lead, n_q, n_k]
    count = seen.sum(axis=-1, keepdims=True)
    weights = seen / np.where(count > 0, count, 1.0)
    return np.asarray(weights @ _values(inputs))


def ignores_mask(target: Target, inputs: Inputs) -> Array:  # -> [*lead, n_q, d_v]
    """Attends to every key: causal, mask= and every other restriction ignored."""
    meant = oracle.meaning(inputs)
    everywhere = np.ones((*meant.lead, meant.n_q, meant.n_k), dtype=bool)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return oracle.golden_of(inputs, target.alignment, visible=everywhere)[0]


def ignores_scale(target: Target, inputs: Inputs) -> Array:  # -> [*lead, n_q, d_v]
    """Scores q·k unscaled (scale 1, not 1/√d_k nor the scale= given)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return oracle.golden_of(inputs.replace(scale=1.0), target.alignment)[0]


def lower_precision(target: Target, inputs: Inputs) -> Array | None:  # -> [*lead, n_q, d_v]
    """The textbook computation one dtype below the one the target declares it computes in
    (`LOWER`: float16 for float32, bfloat16 for float16, float32 for float64); None below that."""
    low = LOWER.get(target.precision(np.dtype(inputs.q.dtype).name))
    if low is None or (low == BFLOAT16 and not has_bfloat16()):
        return None
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return oracle.expected(target, inputs, baseline_in=low).baseline.astype(np.float64)


KERNELS: tuple[Trivial, ...] = (
    Trivial("zeros", "returns zeros", zeros),
    Trivial("mean_v", "every row the mean of all values (ignores q, k and the masks)", mean_v),
    Trivial("uniform_weights", "equal weights on the keys a row sees (ignores the scores)", uniform_weights),
    Trivial("ignores_mask", "attends to every key (ignores causal, mask= and every restriction)",
            ignores_mask),
    Trivial("ignores_scale", "scores q·k unscaled (scale 1)", ignores_scale),
    Trivial("lower_precision", "computes one dtype below the declared one (float16 for float32)",
            lower_precision),
)
"""The trivial kernels every law that compares outputs with the golden should reject, in report order."""

NAMES = tuple(kernel.name for kernel in KERNELS)


def kernel(name: str) -> Trivial:
    """The trivial kernel called ``name``; ValueError naming the known ones otherwise."""
    for found in KERNELS:
        if found.name == name:
            return found
    raise ValueError(f"name must be one of {', '.join(NAMES)}, got {name!r}")


def output(trivial: Trivial, target: Target, inputs: Inputs) -> Array | None:  # -> [*lead, n_q, d_v]
    """``trivial``'s output for the call, rounded to the inputs' dtype as a kernel returns it."""
    out = trivial.fn(target, inputs)
    if out is None:
        return None
    dtype = as_dtype(np.dtype(inputs.q.dtype).name)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(out).astype(dtype).astype(np.float64)


def size(inputs: Inputs) -> int:
    """The call's score entries: slices × n_q × n_k of the keys it means (what a golden costs)."""
    meant = oracle.meaning(inputs)
    return math.prod(meant.lead) * meant.n_q * meant.n_k


def rejected(target: Target, inputs: Inputs) -> frozenset[str]:
    """The trivial kernels whose output for ``inputs`` the tolerance policy tells from the golden:
    the comparison of `spec.laws._helpers.assert_matches` (the target's factor, the rows that see
    a key), each kernel's output in place of the target's. The run's last comparison
    (`spec.compared`, what a failure draws) is left as the law made it."""
    if size(inputs) == 0:  # no row sees a key: nothing to tell apart
        return frozenset()
    run = context.current()
    kept = None if run is None else run.compared
    try:
        want = oracle.expected(target, inputs)
        found = set()
        for trivial in KERNELS:
            out = output(trivial, target, inputs)
            if out is None:
                continue
            cmp = tolerance.compare(out, want.out, want.baseline, rows=want.seen, tolerance=target.tolerance,
                                    floor_=want.floor)
            if not cmp.ok:
                found.add(trivial.name)
        return frozenset(found)
    finally:
        if run is not None:
            run.compared = kept


@dataclass
class Power:
    """What one run of a law tells of its cases' power (`spec.context.RunContext.power`)."""

    rejected: set[str] = field(default_factory=set)
    """The trivial kernels at least one of its calls rejected."""
    judged: int = 0
    """Calls judged."""
    too_large: int = 0
    """Calls not judged: more than `LIMIT` score entries."""
    golden: bool = False
    """The law compared an output with the float64 golden (`compared_with_golden`)."""
    error: str = ""
    """The first error the guard met judging a call ("" if none); such a call is not judged."""

    def see(self, target: Target, inputs: Inputs) -> None:
        """Judge the call ``inputs`` (within `LIMIT`), adding what it rejects."""
        try:
            if size(inputs) > LIMIT:
                self.too_large += 1
                return
            self.rejected |= rejected(target, inputs)
        except Exception as e:  # the guard's own failure never fails the law: it is reported instead
            self.error = self.error or f"{type(e).__name__}: {e}"
            return
        self.judged += 1

    def verdict(self) -> list[str] | None:
        """The names of the trivial kernels rejected, in `KERNELS` order; None (n/a) when the law
        compared no output with the golden or judged no call."""
        if not self.golden or not self.judged:
            return None
        return [name for name in NAMES if name in self.rejected]


def see(target: Target, inputs: Inputs) -> None:
    """Judge the call ``inputs`` of the run in progress when it asks for its power (none: nothing)."""
    run = context.current()
    if run is not None and run.power is not None:
        run.power.see(target, inputs)


def compared_with_golden() -> None:
    """Say that the run in progress compared an output with the float64 golden."""
    run = context.current()
    if run is not None and run.power is not None:
        run.power.golden = True


# --- the report's power ----------------------------------------------------------------------------

def text(verdict: list[str] | None) -> str:
    """A law's power as its note says it: ``power 6/6``, ``power 4/6 (not ignores_scale,
    lower_precision)``, ``power n/a``; none rejected is flagged in capitals."""
    if verdict is None:
        return "power n/a"
    if not verdict:
        return f"POWER 0/{len(NAMES)}: its cases reject no trivial kernel"
    missed = [name for name in NAMES if name not in verdict]
    return f"power {len(verdict)}/{len(NAMES)}" + (f" (not {', '.join(missed)})" if missed else "")


def table(powers: Mapping[str, list[str] | None]) -> dict[str, Any]:
    """The run's power, from each law run's verdict by name (None: n/a): each trivial kernel, what it
    does and the laws that rejected it; the laws whose cases rejected none (``powerless``); the
    laws that compare no output with the golden (``not_applicable``)."""
    return {
        "kernels": {k.name: {"means": k.means,
                             "rejected_by": [law for law, found in powers.items() if k.name in (found or ())]}
                    for k in KERNELS},
        "powerless": [law for law, found in powers.items() if found == []],
        "not_applicable": [law for law, found in powers.items() if found is None],
    }


def summary_lines(found: Mapping[str, Any]) -> list[str]:
    """The report's power section (`table`'s content): a line per trivial kernel with how many laws
    rejected it, then the laws that rejected none, flagged."""
    kernels = found["kernels"]
    wide = max(len(name) for name in kernels)
    lines = ["power: the trivial kernels the laws' own cases tell from the golden (the target is not judged)"]
    for name, entry in kernels.items():
        count = len(entry["rejected_by"])
        said = f"rejected by {count} law{'s' if count != 1 else ''}" if count else "REJECTED BY NO LAW"
        lines.append(f"  {name.ljust(wide)}  {said} — {entry['means']}")
    if found["powerless"]:
        lines.append("  POWERLESS (their cases reject no trivial kernel): " + ", ".join(found["powerless"]))
    return lines


# --- a trivial kernel as a target ------------------------------------------------------------------

def as_target(name: str, *, dtypes: Iterable[str] = ("float32", "float64")) -> Target:
    """The trivial kernel ``name`` as a `spec.Target` taking ``mask=`` and ``scale=`` (causal top-left),
    in ``dtypes``: what a kernel with that bug looks like to the laws."""
    trivial = kernel(name)
    holder: list[Target] = []

    def fn(q: Any, k: Any, v: Any, *, causal: bool = False, mask: Any = None, scale: Any = None) -> Array:
        inputs = Inputs(np.asarray(q), np.asarray(k), np.asarray(v), causal=causal, mask=mask, scale=scale)
        out = output(trivial, holder[0], inputs)
        if out is None:  # no lower precision than the inputs': the kernel is then correct
            out = oracle.golden_of(inputs, holder[0].alignment)[0]
        return np.asarray(out).astype(np.asarray(q).dtype)

    made = Target(fn, name=f"trivial {name}", dtypes=tuple(dtypes), supports_mask=True, supports_scale=True)
    holder.append(made)
    return made
