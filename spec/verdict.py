"""``spec.judge`` and ``spec.Verdict``: the suite as a benchmark's judge — one call per kernel, one
verdict to store. (The module is not named ``judge``: importing a submodule of that name would
replace the function ``spec.judge`` by the module.)

A benchmark that scores generated kernels needs what a kernel author reads in a report, as data:
whether the kernel conforms, the laws run, each failure with the line that replays it, the power
of the suite's own cases (which trivial kernels they tell from the golden: `spec.power`), the
seed, and a bound on the time it may take. `judge` runs the ``judge`` profile (every ``ci`` law,
the stateful laws, and the long runs of 100 calls and more) with the power guard on, within
``budget_s`` seconds of wall time, and returns a `Verdict`; ``Verdict.to_json()`` is the
``--json`` report with the verdict's own keys (docs/targets.md lists them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spec.report import Report, strict_json

PROFILE = "judge"
"""The profile `judge` runs (`spec.profiles.PROFILES`)."""


@dataclass(frozen=True)
class Verdict:
    """A judged kernel: its report, and the verdict a benchmark stores."""

    report: Report
    budget_s: float | None = None

    @property
    def verdict(self) -> str:
        """``fails`` (a law failed, or an expected failure passed), ``incomplete`` (none failed,
        but the time budget stopped the run before every law ran) or ``conforms``."""
        if not self.report.ok:
            return "fails"
        return "conforms" if self.report.complete else "incomplete"

    @property
    def ok(self) -> bool:
        """The kernel conforms: every law ran, none failed. An incomplete run is not ok."""
        return self.verdict == "conforms"

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` report (power table included), then ``verdict``, ``laws_run`` (the laws
        that made calls, in order), ``failures`` (each law that failed: its message and the line
        that replays its counterexample) and ``seconds``."""
        report = self.report
        failures = [{"law": r.name, "message": r.message,
                     "reproduce": None if r.counterexample is None else r.counterexample.reproduce}
                    for r in report.failures]
        return {**report.to_dict(), "verdict": self.verdict,
                "laws_run": [r.name for r in report.results if r.status != "skip" or r.examples],
                "failures": failures, "seconds": round(report.seconds, 3)}

    def to_json(self) -> str:
        """As `to_dict`, strict JSON (a non-finite figure is a string, as `Report.to_json` writes it)."""
        return strict_json(self.to_dict())


def judge(target: Any, *, budget_s: float | None = None, seed: int | None = None,
          keep_going: bool = False, **options: Any) -> Verdict:
    """Judge ``target`` (anything `spec.check` takes) at the ``judge`` profile with the power guard
    on, within ``budget_s`` seconds of wall time (None: no bound), under ``seed`` (None: the
    profile's fixed examples, the same every run). ``keep_going`` runs every law even after the
    run would end early (`spec.runner.Stopping`); ``options`` go to `spec.check` as they are
    (``isolation``, ``deadline``, ``only``, ``each``, ``source``)."""
    from spec.runner import check

    report = check(target, PROFILE, seed=seed, power=True, budget_s=budget_s, keep_going=keep_going,
                   **options)
    return Verdict(report, budget_s)


__all__ = ["PROFILE", "Verdict", "judge"]
