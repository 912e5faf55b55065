"""Running properties against a target with Hypothesis, and the report that comes out.

``check(target, profile="ci")`` is the Python door; the CLI and the pytest plugin call
`check_law` and read the same `Result` objects.
"""

from __future__ import annotations

import contextlib
import math
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, example, given, settings
from hypothesis.errors import HypothesisException, Unsatisfiable

from cmdline.blas import one_thread_blas
from spec.builtin import NoSource, did_you_mean, load_merge_target, load_rank_target, load_target, source_of
from spec.call import Call
from spec.cases import Case, limits_text, outside_limits
from spec.compared import Compared, compact
from spec.context import BudgetSpent, RunContext, running
from spec.isolation import TargetHung, TargetStopped, run_law, workers
from spec.merge_target import MergeTarget
from spec.power import Power
from spec.profiles import PROFILES, Profile, checking, runs_at
from spec.rank_target import RankTarget, kept_ranks
from spec.registry import LAWS, Law
from spec.report import Counterexample, Report, Result, figures
from spec.shard import Shard, parse_shard, shard_seed
from spec.signature import SignatureMismatch
from spec.target import (
    Target,
    TargetError,
    TargetFailed,
    expected_failure,
    parse_expected_failures,
    split_dtypes,
)

SMALL_ARRAY = 48  # counterexample arrays with at most this many entries are printed in full


def select(only: Iterable[str] | None = None) -> list[Law]:
    """The properties named in ``only`` (all when None), in registry order.

    Raises ValueError naming the unknown names.
    """
    if only is None:
        return list(LAWS.values())
    wanted = list(only)
    unknown = [n for n in wanted if n not in LAWS]
    if unknown:
        named = [f"{n!r} ({hint.lstrip('; ')})" if (hint := did_you_mean(n, list(LAWS))) else repr(n)
                 for n in unknown]
        raise ValueError(f"unknown law {', '.join(named)}; see python -m spec check --list")
    return [p for name, p in LAWS.items() if name in wanted]


def _settings(profile: Profile, max_examples: int | None, seed: int | None) -> settings:
    return settings(
        max_examples=max_examples or profile.max_examples,
        derandomize=profile.derandomize and seed is None,
        database=None,  # a report must be a function of target, profile and seed alone
        deadline=None,  # the per-call deadline is ours (spec.isolation), not per example
        suppress_health_check=list(HealthCheck),  # slow targets are not the target's failure
        # a profile that runs one family alone runs its explicit cases only (spec.profiles)
        phases=[Phase.explicit] if profile.family else [Phase.explicit, Phase.generate, Phase.shrink],
        report_multiple_bugs=False,
        print_blob=False,
        verbosity=Verbosity.quiet,
    )


def check_law(
    prop: Law, target: Target, *, profile: str = "ci", max_examples: int | None = None,
    seed: int | None = None, source: str | NoSource | None = None, power: bool = False,
    until: float | None = None,
) -> Result:
    """Run one law with Hypothesis; every outcome, however the target misbehaves, is a Result.

    ``source`` is how the target was named (for the reproduction line; a `NoSource` says
    why no line can name it); defaults to its name. The run goes where the target's isolation
    says (`spec.isolation.run_law`: in process isolation, first in the check's worker process).
    ``power``: also judge the law's cases (`spec.power`): the Result's ``power`` then holds the
    trivial kernels they reject (None: the law compares no output with the golden). ``until``:
    the `time.monotonic` reading past which no call starts (the check's budget): a law stopped
    by it is ``skip``, not run to its end (`spec.context.BudgetSpent`).
    """
    chosen = PROFILES[profile]
    reason = runs_at(prop.family, profile) or prop.needs(target)
    if reason:
        return Result(prop.name, "skip", 0, 0.0, reason, law=prop.statement)
    run = RunContext(deadline=chosen.deadline_s, power=Power() if power else None, until=until)
    last: list[Case] = []  # the example being run; after a failure, the shrunk one
    made = run.calls  # the calls into the target of that example
    calls: list[int] = []  # one entry per example run

    # Its source is part of the seed of a derandomized run (Hypothesis hashes a test's source):
    # edited, every profile's examples change.
    def test(case: Case) -> None:
        last[:] = [case]
        made.clear()
        run.compared = None
        calls.append(1)
        prop.check(target, case)

    test.__name__ = test.__qualname__ = prop.name  # derandomized streams differ per law
    strategy, grid = prop.strategy(target), prop.grid(target) if prop.grid else []
    limited = limits_text(target)
    if limited:  # within the declared limits only: a law drawn outside them is skipped, naming them
        def inside(case: Case) -> bool:
            return outside_limits(target, case, reads_pattern=prop.reads_pattern) is None

        strategy, grid = strategy.filter(inside), [c for c in grid if inside(c)]
    runner = given(strategy)(test)
    for case in reversed(grid):  # explicit examples run first, in order
        runner = example(case)(runner)
    runner = _settings(chosen, max_examples, seed)(runner)
    if seed is not None:
        runner = hypothesis.seed(seed)(runner)
    start = time.perf_counter()

    def attempt() -> None:
        # BLAS on one thread, for the suite's own float64 computations and the target's calls
        # alike (process workers inherit it through the fork): the suite's arrays are small, where
        # BLAS's threads only cost (spinning after each call, waiting for the next, they took about
        # a third of the CPU time of ``spec check reference`` on two cores)
        with running(run), one_thread_blas():
            try:
                runner()
            except SignatureMismatch as met:  # often in an explicit example, which is never shrunk
                shrunk = None if chosen.family else _shrink_mismatch(
                    prop, target, strategy, _settings(chosen, max_examples, seed), seed, last, run)
                raise (shrunk or met) from None

    def conclude(error: BaseException | None, crashed: str | None) -> Result:
        if isinstance(error, Unsatisfiable) and limited:
            return Result(prop.name, "skip", len(calls), time.perf_counter() - start,
                          f"cannot be drawn inside the declared limits ({limited})", law=prop.statement)
        if error is None:
            return _passed(prop, len(calls), time.perf_counter() - start, crashed, run.observed, run.notes)
        if isinstance(error, BudgetSpent):
            return Result(prop.name, "skip", len(calls), time.perf_counter() - start,
                          f"not run to its end: {error} after {len(calls)} examples", law=prop.statement,
                          observed=run.observed, not_run=True)
        message = f"the target {error}" if isinstance(error, TargetHung) else \
            str(error) if isinstance(error, (SignatureMismatch, TargetStopped, AssertionError)) else \
            f"{type(error).__name__}: {error}"
        failed = _failure(prop, target, last, made, len(calls), start, message, source, run.observed)
        failed.fatal = isinstance(error, SignatureMismatch)
        failed.compared = _kept(run.compared, target)
        failed.hung = isinstance(error, TargetHung)
        failed.raised = (error.raised or "") if isinstance(error, TargetFailed) else ""
        return failed

    def concluded(error: BaseException | None, crashed: str | None) -> Result:
        result = conclude(error, crashed)
        if run.power is not None:
            result.power = run.power.verdict()
            if run.power.error and result.status == "pass":  # the guard's trouble, said as a note
                result.message = "; ".join(x for x in (result.message, f"power: {run.power.error}") if x)
        return result

    # the law's run in the check's worker process when the target's calls must run in one (the
    # law found again there by name: only a registered law can go)
    remote = ((_run_in_worker, (prop.name, {"profile": profile, "max_examples": max_examples, "seed": seed,
                                           "source": source, "power": power, "until": until}))
              if LAWS.get(prop.name) is prop else None)
    return run_law(target, attempt, concluded, remote=remote,
                   deadline=target.call_deadline(chosen.deadline_s))


class _Mismatched(Exception):
    """A `spec.signature.SignatureMismatch` as an ordinary exception, which Hypothesis shrinks."""

    def __init__(self, mismatch: SignatureMismatch) -> None:
        super().__init__(str(mismatch))
        self.mismatch = mismatch


def _shrink_mismatch(prop: Law, target: Target, strategy: Any, base: settings, seed: int | None,
                     last: list[Case], run: RunContext) -> SignatureMismatch | None:
    """The mismatch met by the smallest case Hypothesis finds whose call does not bind to the
    target's signature (n_q=1 n_k=1 ..., ``causal=True`` kept when that is the keyword it does not
    take), searching drawn examples only, that case left in ``last`` and its calls in the run's;
    None if none is found (or the target misbehaves otherwise meanwhile), ``last`` and the calls
    then as they were. A `SignatureMismatch` ends a run at once (a ``BaseException``, not shrunk),
    often in an explicit example of the boundary grid, which Hypothesis never shrinks: without this
    its case is whatever came first (``n_q=9 n_k=1 d_k=8 d_v=72``)."""
    kept, calls, observed = list(last), list(run.calls), dict(run.observed)

    def mismatched(case: Case) -> None:
        last[:] = [case]
        run.calls.clear()
        try:
            prop.check(target, case)
        except SignatureMismatch as e:
            raise _Mismatched(e) from None
        except HypothesisException:  # a rejected example: Hypothesis' own
            raise
        except Exception:  # the law's own verdict on a case that binds: not what is searched
            pass

    mismatched.__name__ = mismatched.__qualname__ = prop.name
    search = settings(base, phases=[Phase.generate, Phase.shrink])(given(strategy)(mismatched))
    if seed is not None:
        search = hypothesis.seed(seed)(search)
    found = None
    try:
        search()
    except _Mismatched as e:  # the last example run was the shrunk one
        found = e.mismatch
    except Exception:
        pass
    if found is None:
        last[:], run.calls[:] = kept, calls
    run.observed.clear()
    run.observed.update(observed)
    return found


def _passed(prop: Law, examples: int, seconds: float, crashed: str | None,
            observed: dict[str, float], notes: list[str] | None = None) -> Result:
    if crashed is not None:  # the worker's failure did not come back call by call: still a failure
        return Result(prop.name, "fail", examples, seconds,
                      f"the target {crashed} in a run of this law in its worker process, but not when "
                      "the law was run again with each call in a worker of its own (an intermittent "
                      "failure: no counterexample)", law=prop.statement, observed=observed)
    message = "; ".join(x for x in (figures(observed), *(notes or [])) if x)
    return Result(prop.name, "pass", examples, seconds, message, law=prop.statement, observed=observed)


def _kept(last: Compared | None, target: Target) -> Compared | None:
    """What a failure keeps of the last comparison of its example (`spec.compared.compact`), with the
    row limits the target declares, to draw on it."""
    if last is None:
        return None
    limits = {name: value for name, value in (("seq_multiple", target.seq_multiple),
                                              ("max_seq", target.max_seq)) if value}
    try:
        return compact(last, limits=limits)
    except (ValueError, TypeError):  # arrays that do not broadcast or convert: the failure stands, undrawn
        return None


def _run_in_worker(target: Target, job: tuple[str, dict[str, Any]]) -> Result:
    """`check_law` inside the check's worker process (`spec.isolation.run_law`)."""
    name, options = job
    return check_law(LAWS[name], target, **options)


def _failure(
    prop: Law, target: Target | MergeTarget | RankTarget, last: list[Case], made: list[Call], examples: int,
    start: float, message: str, source: str | NoSource | None, observed: dict[str, float],
) -> Result:
    case = last[0] if last else None
    example = None if case is None else counterexample(prop, case, made[-1] if made else None,
                                                       source or target.name)
    first_line = message.strip().splitlines()[0] if message.strip() else "failed"
    return Result(prop.name, "fail", examples, time.perf_counter() - start, first_line, example,
                  law=prop.statement, observed=observed)


def counterexample(prop: Law, case: Case, received: Call | None,
                   source: str | NoSource) -> Counterexample:
    """The shrunk case as plain values; what the target received in the law's last call (every
    argument: shapes and dtypes, small arrays in full); and a reproduction line (or, for a target
    no ``module:attr`` names, why there is none and what gives one)."""
    if isinstance(source, NoSource):
        reproduce = (f"no command can load this target ({source.why}): define it at the top level of "
                     "a file and check path/to/file.py:NAME (or module:NAME) for a line that replays")
    else:
        fields = ", ".join(f"{key}={_literal(value)}" for key, value in case.describe().items())
        reproduce = f"python -c {_quote(f'import spec; spec.replay({source!r}, {prop.name!r}, {fields})')}"
    if received is None:
        return Counterexample(case=case.describe(), reproduce=reproduce)
    arrays = received.arrays()
    return Counterexample(
        case=case.describe(), reproduce=reproduce, call=received.which,
        shapes={name: list(np.shape(x)) for name, x in arrays.items()},
        dtypes={name: np.asarray(x).dtype.name for name, x in arrays.items()},
        arrays={name: np.asarray(x).tolist() for name, x in arrays.items() if np.size(x) <= SMALL_ARRAY},
        keywords={name: _plain(x) for name, x in received.inputs.values().items()},
    )


def _literal(value: Any) -> str:
    """``repr(value)``, except that a non-finite float is written ``float('inf')`` (its repr, ``inf``,
    is no Python literal: a line with it would not run), in tuples and lists too."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if isinstance(value, (tuple, list)):
        one = isinstance(value, tuple) and len(value) == 1
        inner = ", ".join(map(_literal, value)) + ("," if one else "")
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return repr(value)


def _plain(x: Any) -> Any:
    """A keyword's value as plain Python (tuples stay tuples, NumPy scalars become numbers)."""
    return x.item() if isinstance(x, np.generic) else x


def _quote(code: str) -> str:
    """Shell quoting that stays readable: double quotes unless the code needs more."""
    return f'"{code}"' if not any(c in code for c in '"$`\\!') else shlex.quote(code)


def replay(target: str | Target | Any, name: str, **case: Any) -> None:
    """Run law ``name`` on one case (the fields of a counterexample); raises AssertionError
    if the law is broken, returns None if it holds."""
    (prop,) = select([name])
    ranks = load_rank_target(target)
    if ranks is not None or prop.family == RANK_FAMILY:
        from spec.laws.ranks import RankCase

        with running(RunContext(deadline=None)), one_thread_blas(), kept_ranks():
            prop.check(ranks or load(target), RankCase.from_fields(**case))
        return
    merge = load_merge_target(target)
    if merge is not None or prop.family == MERGE_FAMILY:
        from spec.laws.merge import MergeCase

        with running(RunContext(deadline=None)), one_thread_blas():
            prop.check(merge or load(target), MergeCase.from_fields(**case))
        return
    loaded = load(target)
    with running(RunContext(deadline=PROFILES["ci"].deadline_s)), one_thread_blas(), workers():
        prop.check(loaded, Case.from_fields(**case))


def configure(target: Target, *, isolation: str | None = None, deadline: float | None = None,
              expected_failures: str | None = None) -> Target:
    """``target`` with the run's overrides: ``isolation`` replaces its declaration, ``deadline``
    (seconds per call) its ``deadline_s`` and so the profile's, ``expected_failures`` (a file of
    ``law[dtype]  # reason`` lines) adds to its expected failures. Raises TargetError if invalid."""
    changes: dict[str, Any] = {}
    if isolation is not None:
        changes["isolation"] = isolation
    if deadline is not None:
        changes["deadline_s"] = deadline
    if expected_failures is not None:
        try:
            with open(expected_failures, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise TargetError(f"cannot read --expected-failures {expected_failures}: {e.strerror}") from None
        changes["expected_failures"] = {**target.expected_failures,
                                        **parse_expected_failures(text, expected_failures)}
    configured = target.replace(**changes) if changes else target
    check_expected(configured)
    return configured


def check_expected(target: Target) -> None:
    """Every law the target's expected failures name exists. Raises TargetError naming one that does not."""
    for key in target.expected_failures:
        law = key.split("[", 1)[0]
        if law not in LAWS:
            raise TargetError(f"expected failure {key!r} names no law{did_you_mean(law, list(LAWS))}; "
                              "see python -m spec check --list")


def load(source: str | Target | Any, *, device: str | None = None) -> Target:
    """`spec.builtin.load_target`, with anything raised while importing or building the
    target (a factory that raises, ``Target(fn, wrong_field=1)``) a one-line TargetError."""
    try:
        return load_target(source, device=device)
    except TargetError:
        raise
    except Exception as e:
        shown = source if isinstance(source, str) else type(source).__name__
        raise TargetError(f"loading target {shown!r} raised {type(e).__name__}: {e}") from None


MISSED_DEADLINES = 2
"""Laws failed by a call that missed its deadline, after which a run ends (`Stopping`)."""
SAME_RAISE = 3
"""Laws in a row failed by the same exception of the target, after which a run ends (`Stopping`)."""


@dataclass
class Stopping:
    """When a run ends before its last law, and what each law left says: a verdict in seconds for
    a target that every further law would fail the same way, at the cost of a deadline or more each.

    A run ends after

    - a ``fatal`` result (the target's signature differs from its declaration): the rest
      point to it, so the mismatch is said once;
    - the ``MISSED_DEADLINES``-th law failed by a call past its deadline, in a row or not (a
      target that hangs costs a deadline per law: its verdict comes within about three);
    - ``SAME_RAISE`` laws in a row failed by the same exception of the target (type and message
      identical: a target that raises whatever it is given). A law that passes, or fails
      otherwise, starts the count again (the exception depends on the input, so the other laws
      tell more); a law skipped, which made no call, neither counts nor breaks the row.

    Only failures count (``fail``: an expected failure, XFAIL, is declared), so a run that ended
    early never conforms. ``keep_going`` runs every law whatever happened; ``hint`` says how to
    ask for that in the laws' notes."""

    keep_going: bool = False
    hint: str = "--keep-going runs every law"
    until: float | None = None
    """The `time.monotonic` reading at which the check's budget runs out (None: no budget): past
    it no law starts, whatever ``keep_going`` says."""
    budget_s: float | None = None
    fatal: Result | None = None
    missed: list[str] = field(default_factory=list)
    raised: str = ""  # the exception of the current row, "Type: message"
    row: list[str] = field(default_factory=list)  # the laws it failed in a row

    def see(self, result: Result) -> None:
        """Take ``result`` (as judged: `judged`) into account."""
        if result.fatal and self.fatal is None:
            self.fatal = result
        if result.status == "skip":
            return
        if result.status == "fail" and result.hung:
            self.missed.append(result.name)
        if result.status == "fail" and result.raised and result.raised == self.raised:
            self.row.append(result.name)
        else:
            failed = result.status == "fail" and result.raised
            self.raised, self.row = (result.raised, [result.name]) if failed else ("", [])

    def why(self) -> str | None:
        """Why the laws left are not run, or None while the run goes on."""
        if self.until is not None and time.monotonic() >= self.until:
            return f"the check's time budget of {self.budget_s:g} s was spent"
        if self.keep_going:
            return None
        if self.fatal is not None:
            return f"see {self.fatal.name} (the target's signature)"
        if len(self.missed) >= MISSED_DEADLINES:
            return f"the target missed its deadline in {_listed(self.missed)}; {self.hint}"
        if len(self.row) >= SAME_RAISE:
            kind = self.raised.split(":", 1)[0]  # the message is in each failure's block
            return f"the target raised the same {kind} in {_listed(self.row)}; {self.hint}"
        return None

    def not_run(self, law_run: LawRun, profile: str) -> Result | None:
        """The result of ``law_run`` not run, or None when it is to run (`check_law`): a law the
        target or the profile skips anyway (it needs a capability) is run, to say so, unless the
        signature differs."""
        why = self.why()
        if why is None or (self.fatal is None and (runs_at(law_run.prop.family, profile)
                                                   or law_run.prop.needs(law_run.target))):
            return None
        return Result(law_run.name, "skip", 0, 0.0, f"not run: {why}", law=law_run.prop.statement,
                      not_run=True)


def _listed(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def run_all(
    props: Iterable[Law], target: Target, *, profile: str = "ci", max_examples: int | None = None,
    seed: int | None = None, source: str | NoSource | None = None,
    each: Callable[[Result], None] | None = None, keep_going: bool = False, power: bool = False,
    budget_s: float | None = None,
) -> list[Result]:
    """Each law in turn (``each`` sees every result as it comes), until the run ends early
    (`Stopping`: a signature that differs, deadlines missed, the same exception in law after
    law, never with ``keep_going``; the time budget ``budget_s`` spent, always): the laws left
    are then skipped, each saying why. ``power``: judge each law's cases too (`check_law`)."""
    results: list[Result] = []
    until = None if budget_s is None else time.monotonic() + budget_s
    stopping = Stopping(keep_going=keep_going, until=until, budget_s=budget_s)
    with workers():  # process isolation: one worker for the whole run (a fresh one after a crash)
        for law_run in (one for prop in props for one in law_runs(prop, target)):
            result = stopping.not_run(law_run, profile)
            if result is None:
                result = judged(law_run, check_law(law_run.prop, law_run.target, profile=profile,
                                                      max_examples=max_examples, seed=seed, source=source,
                                                      power=power, until=until))
                stopping.see(result)
            results.append(result)
            if each is not None:
                each(result)
    return results


@dataclass(frozen=True)
class LawRun:
    """One run of a law: the law, the target restricted to the run's dtypes, and why the target
    declares the law expected to fail there (None if it does not)."""

    name: str  # the law's, with [dtype] when the expected failures give that dtype a run of its own
    prop: Law
    target: Target  # or a MergeTarget or RankTarget, in the pytest door: one run of their family's law
    expected: str | None


def law_runs(prop: Law, target: Target) -> list[LawRun]:
    """The runs of ``prop``: one, unless the target's expected failures name some of its dtypes
    (``law[float16]``): then one per dtype named, and one of the rest."""
    runs = []
    for dtypes in split_dtypes(target, prop.name):
        named = len(dtypes) == 1 and f"{prop.name}[{dtypes[0]}]" in target.expected_failures
        alone = dtypes[0] if named else None
        runs.append(LawRun(f"{prop.name}[{alone}]" if alone else prop.name, prop,
                           target if dtypes == target.dtypes else target.with_dtypes(dtypes),
                           expected_failure(target, prop.name, alone)))
    return runs


def judged(law_run: LawRun, result: Result) -> Result:
    """``result`` as the declarations read it: under its run's name; a failure the target declares
    is XFAIL, a pass it declared would fail is XPASS."""
    result.name = law_run.name
    if law_run.expected is None or result.status not in ("pass", "fail"):
        return result
    result.expected = law_run.expected
    result.status = "xfail" if result.status == "fail" else "xpass"
    return result


def check(
    target: str | Target | Any, profile: str = "ci", *, max_examples: int | None = None,
    seed: int | None = None, only: Iterable[str] | None = None, isolation: str | None = None,
    deadline: float | None = None, each: Callable[[Result], None] | None = None,
    source: str | NoSource | None = None, memory: float | None = None, keep_going: bool = False,
    power: bool = False, budget_s: float | None = None, shard: Shard | str | None = None,
) -> Report:
    """Run the properties against ``target`` (a built-in name, ``module:attr``, ``file.py:attr``, a
    callable or a `spec.Target`) and return the `Report`. ``isolation`` (``thread``, ``caller``,
    ``process``) and ``deadline`` (seconds per call) override the target's declarations; ``each``
    sees every result as it comes; ``source`` is how reproduction lines name the target (by
    default the name it was given by, or the one `spec.builtin.source_of` finds).

    A run ends early, the laws left skipped saying why, after the target's signature is found to
    differ, after it missed its deadline in two laws, or after it raised the same exception in
    three laws in a row (`Stopping`); ``keep_going`` runs every law whatever happens.
    ``budget_s`` bounds the run's wall time: once it is spent no call of the target starts, the
    law in progress stops where it is and the laws left are not run (each ``skip`` saying so;
    `Report.complete` is then False); a run ends past it by at most one call.

    ``memory`` (GiB) is what a call may need on the target's device at ``profile="scale"``
    (default: `spec.scale_plan.default_budget`). Without ``only``, a profile that runs one
    family alone (``scale``) runs its laws, the others every law but those.

    ``power``: the power guard also judges the suite's own cases, never the target (`spec.power`):
    each law's result says which trivial kernels (zeros, the mean of V, uniform weights, ignoring the
    mask or the scale, a lower precision) its calls' cases tell from the golden, and the report
    sums them up (`Report.power_table`); the verdict on the target is the same either way. A
    profile may turn it on whatever ``power`` says (``judge``: `spec.profiles.Profile.power`).

    ``shard`` (``"i/N"`` or a `spec.shard.Shard`, counted from 1): this run is shard i of N of the
    check, every law under the shard's own seed (`spec.shard.shard_seed`: shard 1 the check's,
    the others derived from it), so N shards draw N times the examples; the report records the
    shard, and `spec.shard.merge` makes one report of them all.

    Raises `spec.TargetError` when the target does not load and ValueError for an
    unknown profile or law name, a memory or time budget that is not a positive number, or a
    shard that is not I/N with 1 <= I <= N.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    part = None if shard is None else parse_shard(shard, name="shard")
    base, seed = seed, shard_seed(part, seed, derandomized=PROFILES[profile].derandomize)
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples must be a positive integer, got {max_examples}")
    if memory is not None and not (isinstance(memory, (int, float)) and math.isfinite(memory) and memory > 0):
        raise ValueError(f"memory must be a positive number of GiB, got {memory!r}")
    if budget_s is not None and not (isinstance(budget_s, (int, float)) and not isinstance(budget_s, bool)
                                     and math.isfinite(budget_s) and budget_s > 0):
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    props = select(only)
    own = load_rank_target(target) or load_merge_target(target)
    if own is not None:  # a merge operator or a context-parallel target: its own family's laws
        family = own_family(own)
        if isolation is not None or deadline is not None:
            raise TargetError(f"isolation and deadline apply to attention targets, not to {own.name!r}: "
                              f"it is {OWN_KIND_FAMILIES[family]} (a merge runs in the caller, ranks on "
                              "their own, a call bounded by deadline_s)")
        chosen = props if only is not None else [p for p in props if p.family == family]
        # a context-parallel target's ranks are started once per world size and kept for the whole check
        with kept_ranks() if isinstance(own, RankTarget) else contextlib.nullcontext():
            report = check_merge(own, chosen, profile=profile, max_examples=max_examples, seed=seed,
                                 each=each, source=target if isinstance(target, str) else source_of(own),
                                 budget_s=budget_s)
        report.shard, report.base_seed = part, base
        return report
    if only is None:  # the merge and rank laws judge their own kinds of target (check_merge), not attention
        props = [p for p in props if runs_at(p.family, profile) is None and p.family not in OWN_KIND_FAMILIES]
    loaded = configure(load(target), isolation=isolation, deadline=deadline)
    if source is None:
        source = target if isinstance(target, str) else source_of(target)
    power = power or PROFILES[profile].power
    report = Report(target=loaded.name, profile=profile, seed=seed, limits=limits_text(loaded), power=power,
                    budget_s=budget_s, shard=part, base_seed=base)
    start = time.perf_counter()
    with checking(profile, loaded, memory=memory) as header:
        report.scale = header
        report.results = run_all(props, loaded, profile=profile, max_examples=max_examples, seed=seed,
                                 source=source, each=each, keep_going=keep_going, power=power,
                                 budget_s=budget_s)
    report.seconds = time.perf_counter() - start
    return report


MERGE_FAMILY = "merge"
"""The law family that judges merge operators (`spec.laws.merge`), and only them."""
RANK_FAMILY = "ranks"
"""The law family that judges context-parallel targets (`spec.laws.ranks`), and only them."""
OWN_KIND_FAMILIES = {MERGE_FAMILY: "a merge operator (spec.MergeTarget)",
                     RANK_FAMILY: "a context-parallel target (spec.RankTarget)"}
"""The law families that judge a kind of target of their own, each with that kind, and nothing else."""


def own_family(target: MergeTarget | RankTarget) -> str:
    """The law family that judges ``target``'s kind (a key of `OWN_KIND_FAMILIES`)."""
    return RANK_FAMILY if isinstance(target, RankTarget) else MERGE_FAMILY


def check_merge_law(prop: Law, target: MergeTarget | RankTarget, *, profile: str = "ci",
                    max_examples: int | None = None, seed: int | None = None,
                    source: str | NoSource | None = None) -> Result:
    """One law on a merge operator (`spec.MergeTarget`) or a context-parallel target
    (`spec.RankTarget`), with Hypothesis, in the caller: every outcome a Result, as `check_law`'s.
    A law of another family is skipped, saying so."""
    family = own_family(target)
    if prop.family != family:
        kind = f"a {prop.family} law" if prop.family in OWN_KIND_FAMILIES else "an attention law"
        return Result(prop.name, "skip", 0, 0.0, f"{kind}: the target is {OWN_KIND_FAMILIES[family]}, "
                      f"judged by the {family} laws", law=prop.statement)
    reason = runs_at(prop.family, profile) or prop.needs(target)
    if reason:
        return Result(prop.name, "skip", 0, 0.0, reason, law=prop.statement)
    run, examples = RunContext(deadline=None), [0]
    last: list[Any] = []  # the example being run; after a failure, the shrunk one

    def test(case: Any) -> None:
        last[:] = [case]
        examples[0] += 1
        prop.check(target, case)

    test.__name__ = test.__qualname__ = prop.name  # derandomized streams differ per law
    runner = _settings(PROFILES[profile], max_examples, seed)(given(prop.strategy(target))(test))
    if seed is not None:
        runner = hypothesis.seed(seed)(runner)
    start = time.perf_counter()
    try:
        # a merge fed empty states or lse past exp's range may warn; its output is what is judged
        with running(run), one_thread_blas(), np.errstate(all="ignore"):
            runner()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:
        message = str(error) if isinstance(error, AssertionError) else f"{type(error).__name__}: {error}"
        failed = _failure(prop, target, last, [], examples[0], start, message, source, run.observed)
        failed.raised = "" if isinstance(error, AssertionError) else f"{type(error).__name__}: {error}"
        return failed
    return _passed(prop, examples[0], time.perf_counter() - start, None, run.observed, run.notes)


def check_merge(target: MergeTarget | RankTarget, props: list[Law], *, profile: str = "ci",
                max_examples: int | None = None, seed: int | None = None,
                each: Callable[[Result], None] | None = None,
                source: str | NoSource | None = None, budget_s: float | None = None) -> Report:
    """The ``props`` (the merge laws, when `check` was given no ``only``) on a merge operator (the
    rank laws on a context-parallel target), in order; the report names each law run, as for an
    attention target. ``budget_s``: no law starts once it is spent (the laws left ``skip``, saying so)."""
    report = Report(target=target.name, profile=profile, seed=seed, limits="", power=False, budget_s=budget_s)
    start = time.perf_counter()
    for prop in props:
        if budget_s is not None and time.perf_counter() - start >= budget_s:
            result = Result(prop.name, "skip", 0, 0.0, f"not run: the check's time budget of {budget_s:g} s "
                            "was spent", law=prop.statement, not_run=True)
        else:
            result = check_merge_law(prop, target, profile=profile, max_examples=max_examples, seed=seed,
                                     source=source)
        report.results.append(result)
        if each is not None:
            each(result)
    report.seconds = time.perf_counter() - start
    return report


__all__ = ["PROFILES", "Report", "Result", "Stopping", "TargetError", "check", "check_law", "check_merge",
           "configure",
           "load", "replay", "run_all", "select"]


def __getattr__(name: str) -> Any:
    """``run_property``, deprecated: `check_law`."""
    if name == "run_property":
        import warnings

        warnings.warn("spec.runner.run_property is deprecated: use spec.runner.check_law", DeprecationWarning,
                      stacklevel=2)
        return check_law
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
