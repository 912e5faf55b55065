"""The run's state: one `RunContext` per run of a law, made by the runner and read below it.

What one run of a law carries down to the calls it makes — the per-call deadline its profile
gives, the calls into the target that the example being run made (a failure shows the last one,
exactly as the target received it), the worst figures the law measured (the report's note), the
last comparison it made (a failure's picture) — is one record, set for the run by `spec.runner`
(`running`) and read where it is needed (`current`). A context variable holds it, so two checks
running at once in two threads each see their own, and the watched thread that runs a law
(`spec.isolation.watched`) sees its caller's.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunContext:
    """One run of one law against one target."""

    deadline: float | None = None
    """Seconds per call of the target, from the profile (a target's ``deadline_s`` wins:
    `spec.target.Target.call_deadline`); None: no deadline."""
    calls: list[Any] = field(default_factory=list)
    """The calls into the target made by the example being run (`spec.call.Call`), in order."""
    observed: dict[str, float] = field(default_factory=dict)
    """The worst value of each figure the law measured (``"error ratio float32"``), over its run."""
    notes: list[str] = field(default_factory=list)
    """What the law says of its run beside its figures (the scale cases it did not run, and why)."""
    compared: Any = None
    """The last comparison the example being run made (`spec.compared.Compared`: references to
    the arrays, no copies), or None; a failure keeps it (`spec.compared.compact`)."""
    power: Any = None
    """What the run's cases tell apart (`spec.power.Power`), when the check asks for its power
    (``power=True``); None: not judged."""
    until: float | None = None
    """The `time.monotonic` reading past which no call of the target starts (the check's
    ``budget_s``: `spent`); None: no budget. The monotonic clock is the machine's, so a law run in
    the check's worker process reads the same one."""

    def spent(self) -> bool:
        """The check's time budget has run out."""
        return self.until is not None and time.monotonic() >= self.until

    def record(self, call: Any) -> None:
        self.calls.append(call)

    def note(self, text: str) -> None:
        """Say ``text`` in the law's result (once)."""
        if text not in self.notes:
            self.notes.append(text)

    def observe(self, key: str, value: float) -> None:
        """Keep ``value`` if it is the worst (largest) seen for ``key``."""
        if key not in self.observed or value > self.observed[key]:
            self.observed[key] = value


class BudgetSpent(BaseException):
    """The check's time budget (``budget_s``) ran out before a call of the target: the law stops
    where it is, not run to its end. A ``BaseException``, as `spec.isolation.TargetHung` is:
    Hypothesis stops at once, neither shrinking nor retrying."""


_CURRENT: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("RUN", default=None)
_MEMORY: contextvars.ContextVar[float | None] = contextvars.ContextVar("MEMORY", default=None)


def memory_budget() -> float | None:
    """The bytes a call of this check may need on the target's device (``--memory``), or None
    when none was given (`spec.scale_plan.default_budget` then applies)."""
    return _MEMORY.get()


@contextlib.contextmanager
def memory(budget: float | None) -> Iterator[float | None]:
    """Within: the check's memory budget is ``budget`` bytes (None: not given)."""
    token = _MEMORY.set(budget)
    try:
        yield budget
    finally:
        _MEMORY.reset(token)


def current() -> RunContext | None:
    """The run in progress in this context, or None outside one."""
    return _CURRENT.get()


@contextlib.contextmanager
def running(run: RunContext) -> Iterator[RunContext]:
    """Within: ``run`` is the run in progress (`current`)."""
    token = _CURRENT.set(run)
    try:
        yield run
    finally:
        _CURRENT.reset(token)
