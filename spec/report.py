"""The report: per-law results as data (`Result`, `Report`, `Counterexample`) and the ONE
renderer (`render`) that the CLI, the pytest plugin (`failure`) and ``str(report)`` share.
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tabulate import tabulate


@dataclass(frozen=True)
class Counterexample:
    """What a failure shows: the shrunk case and the call of the law's last example that broke."""

    case: dict[str, Any]
    """The case as plain values, defaults left out (`spec.cases.Case.describe`): ``spec.replay``
    takes them as keywords."""
    reproduce: str
    """A command line that replays the case, or why none can name this target."""
    call: str | None = None
    """Which callable the law's last call reached (``fn`` or ``grad_fn``), or None if none was made."""
    shapes: dict[str, list[int]] = field(default_factory=dict)
    """Each array the callable received, by argument name: its shape (in the target's layout)..."""
    dtypes: dict[str, str] = field(default_factory=dict)
    """... its dtype's name ..."""
    arrays: dict[str, Any] = field(default_factory=dict)
    """... and, for small arrays, its values as nested lists."""
    keywords: dict[str, Any] = field(default_factory=dict)
    """The keyword values passed (plain Python), by argument name."""

    def to_dict(self) -> dict[str, Any]:
        """As the JSON report writes it: the call's fields only when a call was made."""
        found: dict[str, Any] = {"case": self.case, "reproduce": self.reproduce}
        if self.call is not None:
            found |= {"call": self.call, "shapes": self.shapes, "dtypes": self.dtypes, "arrays": self.arrays,
                      "keywords": self.keywords}
        return found


@dataclass
class Result:
    name: str
    status: str  # "pass" | "fail" | "skip" | "xfail" (failed, as declared) | "xpass" (declared, but held)
    examples: int
    seconds: float
    message: str = ""
    counterexample: Counterexample | None = None
    law: str = ""
    observed: dict[str, float] = field(default_factory=dict)
    """Figures the law measured, worst over the examples run (e.g. ``"error ratio float32"``:
    error / allowed of the tolerance policy), as data: read these, never the message."""
    fatal: bool = False
    """The target cannot be called as declared (its signature differs): every further law would
    fail the same way, so a run stops after this result."""
    hung: bool = False
    """The failure is a call of the target that missed its deadline (`spec.runner.Stopping`)."""
    raised: str = ""
    """The failure is an exception the target raised, as ``"Type: message"``; "" if it is not
    (`spec.runner.Stopping`)."""
    expected: str = ""
    """Why the target declares this law (in these dtypes) an expected failure, or ""."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "status": self.status, "examples": self.examples,
            "seconds": round(self.seconds, 3), "message": self.message,
            "counterexample": None if self.counterexample is None else self.counterexample.to_dict(),
            "law": self.law,
            "observed": dict(self.observed),
            **({"expected": self.expected} if self.expected else {}),
        }


@dataclass
class Report:
    target: str
    profile: str
    seed: int | None
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the whole run (for the summary line)
    limits: str = ""  # the shape limits the target declares, as the header says them
    scale: str = ""  # at --profile scale: the memory budget and the cases not run, as the header says them

    @property
    def ok(self) -> bool:
        """True when no law failed and no expected failure passed (skips and expected
        failures do not count against conformance; a stale declaration does)."""
        return all(r.status not in ("fail", "xpass") for r in self.results)

    @property
    def failures(self) -> list[Result]:
        """The results that make the run not conform: failures, and expected failures that passed."""
        return [r for r in self.results if r.status in ("fail", "xpass")]

    @property
    def expected_failures(self) -> list[Result]:
        return [r for r in self.results if r.status == "xfail"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target, "ok": self.ok, "profile": self.profile, "seed": self.seed,
            **({"limits": self.limits} if self.limits else {}),
            **({"scale": self.scale} if self.scale else {}),
            "results": [r.to_dict() for r in self.results],
        }

    def __str__(self) -> str:
        """What ``python -m spec check`` prints: the table, each failure, the summary line."""
        return render(self)

    def to_json(self) -> str:
        """The report as strict JSON (RFC 8259), whatever the target did: a non-finite number (an
        infinite error ratio, an inf or NaN in a counterexample's arrays) is written as the string
        ``"Infinity"``, ``"-Infinity"`` or ``"NaN"``, as JSON Schema and protobuf's JSON mapping
        write them, so any JSON parser reads the file and no figure is dropped."""
        return json.dumps(_strict(self.to_dict()), indent=2, allow_nan=False, ensure_ascii=False)


NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
"""How ``to_json`` spells a non-finite float (NaN is ``"NaN"``)."""


def _strict(x: Any) -> Any:
    """``x`` (dicts, lists, tuples, numbers, NumPy scalars) with every non-finite float spelled
    as a string, so that ``json.dumps(..., allow_nan=False)`` writes it."""
    if isinstance(x, dict):
        return {key: _strict(value) for key, value in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(value) for value in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return NON_FINITE.get(x, "NaN")
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    raise TypeError(f"cannot write {type(x).__name__} to JSON")


LOUD = ("fail", "xfail", "xpass")  # statuses the table shows in capitals


def table(report: Report) -> str:
    rows = [[r.name, r.status.upper() if r.status in LOUD else r.status, r.examples, f"{r.seconds:.2f}",
             _note(r)] for r in report.results]
    return tabulate(rows, headers=["law", "status", "examples", "seconds", "note"],
                    tablefmt="simple", colalign=("left", "left", "right", "right", "left"),
                    maxcolwidths=[None, None, None, None, 60])


def _note(result: Result) -> str:
    if result.status == "xfail":
        return f"expected: {result.expected}"
    return "" if result.status in ("fail", "xpass") else result.message


def failure(result: Result, *, headline: bool = False) -> str:
    """What a failure shows: the law, what broke, the shrunk case, small arrays, a reproduction.
    ``headline``: the first line also says what broke (pytest's short summary shows only it)."""
    wrap = textwrap.TextWrapper(width=100, initial_indent="  ", subsequent_indent="    ")
    head = f"FAIL {result.name}" + (f": {result.message}" if headline and result.message else "")
    lines = [head, wrap.fill("law: " + result.law), wrap.fill("broken: " + result.message)]
    example = result.counterexample
    if example:
        case = " ".join(f"{key}={value}" for key, value in example.case.items())
        lines.append(wrap.fill("case: " + case))
        if example.call is not None:
            shapes = ", ".join(f"{name} {tuple(shape)} {example.dtypes[name]}"
                               for name, shape in example.shapes.items())
            given = ", ".join(f"{name}={value!r}" for name, value in example.keywords.items())
            who = "grad_fn" if example.call == "grad_fn" else "the target"
            lines.append(wrap.fill(f"{who} received (the law's last call): {shapes}"
                                   + (f"; {given}" if given else "")))
            for name, values in example.arrays.items():
                lines.append(f"  {name} = {values}")
        lines.append(f"  reproduce: {example.reproduce}")
    return "\n".join(lines)


def expected_failure(result: Result) -> str:
    """An expected failure, compactly: the law, the reason declared, what broke, the line that
    replays it."""
    wrap = textwrap.TextWrapper(width=100, initial_indent="  ", subsequent_indent="    ")
    lines = [f"XFAIL {result.name}: {result.expected}", wrap.fill("broken: " + result.message)]
    if result.counterexample is not None:
        lines.append(f"  reproduce: {result.counterexample.reproduce}")
    return "\n".join(lines)


def stale(result: Result) -> str:
    """An expected failure that passed: the declaration to remove."""
    return (f"XPASS {result.name}: declared an expected failure ({result.expected}), but the law holds "
            f"({result.examples} examples): remove the declaration")


def summary(report: Report, seconds: float) -> str:
    counts = {s: sum(r.status == s for r in report.results)
              for s in ("pass", "fail", "skip", "xfail", "xpass")}
    verdict = "conforms" if report.ok else "DOES NOT CONFORM"
    seed = "" if report.seed is None else f", seed {report.seed}"
    expected = "".join(f", {counts[s]} {s}" for s in ("xfail", "xpass") if counts[s])
    return (f"{report.target}: {verdict} — {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['skip']} skipped{expected} in {seconds:.1f} s (profile {report.profile}{seed})")


def render(report: Report, seconds: float | None = None) -> str:
    """The declared limits (if any), the table, each failure in full (a stale expected failure in a
    line), each expected failure compactly, and the summary line."""
    parts = [f"declared limits: {report.limits}\n"] if report.limits else []
    parts += [f"scale: {report.scale}\n"] if report.scale else []
    parts += [table(report)]
    parts += ["\n" + (stale(r) if r.status == "xpass" else failure(r)) for r in report.failures]
    parts += ["\n" + expected_failure(r) for r in report.expected_failures]
    parts += ["", summary(report, report.seconds if seconds is None else seconds)]
    return "\n".join(parts)
