"""pytest plugin: the properties as pytest tests against the target of another project.

    pytest --attention-target=mypackage.kernels:attention        # or ATTENTION_TARGET=...

adds one test per law, ``attention-spec::<law>``, to whatever else is collected (a merge operator,
`spec.MergeTarget`, or a context-parallel target, `spec.RankTarget`: its own family's laws, its
ranks started once per world size for the session)
(``-k`` selects among them; pytest-xdist spreads them over workers, each
loading the target and setting the check up once, at collection, with one process-isolation worker
for its session); with ``--attention-only``
they are all that is collected (the project's own test files are not even imported). Registered
through the ``pytest11`` entry point, so installing the package is enough; without a target the
plugin adds nothing. Options: ``--attention-profile quick|ci|thorough|judge|scale`` (default ci),
``--attention-seed N``, ``--attention-shard I/N`` (shard I of N, counted from 1: every law under the
shard's own seed, `spec.shard`), ``--attention-max-examples N``,
``--attention-isolation thread|caller|process``
(overrides the target's declaration; ``process`` turns a crash or a call stuck in C into that law's failure),
``--attention-deadline SECONDS`` (per call; overrides the profile's and the target's),
``--attention-keep-going`` (run every law: without it, once the target's signature is found to
differ, it missed its deadline in two laws or raised the same exception in three in a row, the laws
left are skipped saying why, as `spec.runner.Stopping` says; with pytest-xdist each worker stops
on what it saw),
``--attention-expected-failures FILE`` (one ``law[dtype]  # reason`` a line, added to the target's
``expected_failures``: each such law is marked ``xfail(strict=True)``, so its failure is XFAIL and
a pass fails the run, as a stale declaration), ``--attention-memory GIB`` (with
``--attention-profile scale``: the memory budget, as the CLI's ``--memory``), ``--attention-html FILE``
(the laws' results as the CLI's ``--html`` page, written at the end of the session, under
pytest-xdist too: each result travels back with its test's report). A law whose expected
failures name some dtypes is one test per such dtype (``law[float16]``) and one of the rest. A
failing law's short summary line (``-ra``) carries what broke; a law that fails as a law shown
before (in the same process: `spec.report.cause`) points to that block instead of repeating it.

The check is set up as `spec.check` sets one up (`spec.profiles.checking`: the memory budget and
the profile's own set-up), from collection to the end of the session; the profile's header line
(at ``scale``: the budget and the cases not run) is printed after the collection.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import math
import os
import pickle
import time
from typing import Any

import pytest

from spec.builtin import load_merge_target, load_rank_target
from spec.cases import limits_text
from spec.html import render_html
from spec.isolation import workers
from spec.merge_target import MergeTarget
from spec.profiles import PROFILES, checking, runs_at
from spec.rank_target import RankTarget, kept_ranks
from spec.registry import LAWS
from spec.report import Report, Result, cause, failure, same_failure
from spec.runner import (
    OWN_KIND_FAMILIES,
    LawRun,
    Stopping,
    check_law,
    check_merge_law,
    configure,
    judged,
    law_runs,
    load,
    own_family,
)
from spec.shard import Shard, parse_shard, shard_seed
from spec.target import Target, TargetError

ENV = "ATTENTION_TARGET"
HEADER = pytest.StashKey[str]()
"""The profile's header line of the check (`spec.profiles.checking`), once it is set up."""
SHARD = pytest.StashKey[Shard]()
"""The shard of the check this session runs (``--attention-shard``), when one is given."""
CARRIED = "attention-spec result"
"""The user property of a law's test report that carries its pickled result (to the xdist controller)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attention-spec", "attention conformance suite")
    group.addoption("--attention-target", metavar="TARGET", default=None,
                    help=f"check this attention target (built-in name, module:attr or "
                    f"path/to/file.py:attr; env {ENV})")
    group.addoption("--attention-only", action="store_true", default=False,
                    help="collect only the laws (none of the project's own tests)")
    group.addoption("--attention-profile", choices=list(PROFILES), default="ci",
                    help="examples per law: quick, ci (default, derandomized) or thorough; scale: the "
                    "scale laws alone; judge: every ci law and the long runs")
    group.addoption("--attention-seed", type=int, default=None, metavar="N", help="random seed")
    group.addoption("--attention-shard", default=None, metavar="I/N",
                    help="run shard I of N (counted from 1) of the check: every law under the shard's own "
                    "seed (shard 1: the check's), so N shards, on N machines, draw N times the examples "
                    "(as python -m spec check --shard)")
    group.addoption("--attention-max-examples", type=int, default=None, metavar="N",
                    help="examples per law")
    group.addoption("--attention-isolation", choices=["thread", "caller", "process"], default=None,
                    help="where each call runs (overrides the target's declaration); process: a "
                    "forked worker, so a crash or a hang in C is the law's failure (fork copies one "
                    "thread: torch runs single-threaded there; another pool used before the fork "
                    "may hang the child, which the deadline fails)")
    group.addoption("--attention-deadline", type=float, default=None, metavar="SECONDS",
                    help="time limit per call (overrides the profile's and the target's)")
    group.addoption("--attention-keep-going", action="store_true", default=False,
                    help="run every law, even after the target missed its deadline in two laws or "
                    "raised the same exception in three in a row (without it the laws left are skipped)")
    group.addoption("--attention-expected-failures", metavar="FILE", default=None,
                    help="known deviations, one 'law[dtype]  # reason' a line: each is marked "
                    "xfail(strict=True)")
    group.addoption("--attention-memory", type=float, default=None, metavar="GIB",
                    help="with --attention-profile scale: what one call may need on the target's device, "
                    "in GiB (default: half the memory this machine has available); a case over it is "
                    "not run, and the header and the laws' notes say so")
    group.addoption("--attention-html", metavar="FILE", default=None,
                    help="also write the laws' results as one self-contained HTML page, with a heat map "
                    "of each failure that compared arrays (as python -m spec check --html)")


def drawing_seed(config: pytest.Config) -> int | None:
    """The seed the laws draw with: ``--attention-seed``, or the shard's own (`spec.shard.shard_seed`)."""
    profile = PROFILES[config.getoption("attention_profile")]
    return shard_seed(config.stash.get(SHARD, None), config.getoption("attention_seed"),
                      derandomized=profile.derandomize)


class PropertyFailed(Exception):
    def __init__(self, result: Result) -> None:
        super().__init__(result.message)
        self.result = result


class LawItem(pytest.Item):
    """One law run against the target."""

    def __init__(self, *, law_run: LawRun, source: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.law_run, self.prop, self.target, self.source = law_run, law_run.prop, law_run.target, source
        if law_run.expected is not None:  # the law still runs; a pass fails (a stale declaration)
            self.add_marker(pytest.mark.xfail(reason=law_run.expected, strict=True, raises=PropertyFailed))

    def runtest(self) -> None:
        opt = self.config.getoption
        suite = self.parent
        stopping = suite.stopping if isinstance(suite, PropertySuite) else None
        left = stopping.not_run(self.law_run, opt("attention_profile")) if stopping is not None else None
        if left is not None:  # the run has ended (a signature that differs: said once, at that law)
            raise pytest.skip.Exception(left.message, _use_item_location=True)
        target: Any = self.target
        judge = check_law if isinstance(target, Target) else check_merge_law  # a kind of its own
        result = judge(self.prop, target, profile=opt("attention_profile"),
                       max_examples=opt("attention_max_examples"), seed=drawing_seed(self.config),
                       source=self.source)
        # a copy judged as the CLI's report judges it (an expected failure is no failure), for the page
        # and for the early stop
        seen = judged(self.law_run, dataclasses.replace(result))
        if self.config.getoption("attention_html"):
            limits = limits_text(self.target) if isinstance(self.target, Target) else ""
            carried = pickle.dumps((self.target.name, limits, seen))
            self.user_properties.append((CARRIED, base64.b64encode(carried).decode("ascii")))
        if stopping is not None:
            stopping.see(seen)
        if result.status == "skip":
            # Reported at the law (the item), not at this line of the plugin.
            raise pytest.skip.Exception(result.message, _use_item_location=True)
        if result.status == "fail":
            raise PropertyFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, PropertyFailed):
            result = excinfo.value.result
            suite = self.parent
            # the cause of a law shown before in this process: its block shown once
            first = suite.shown.setdefault(cause(result), result.name) if isinstance(suite, PropertySuite) \
                else result.name
            return failure(result, headline=True) if first == result.name else same_failure(result, first)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[str, int | None, str]:
        """Where the law is written (skips and failures point there)."""
        code = self.prop.check.__code__
        return code.co_filename, code.co_firstlineno - 1, f"{self.prop.name} [{self.target.name}]"


class PropertySuite(pytest.Collector):
    """The properties, as a collector node of the session."""

    def __init__(self, *, target: Target | MergeTarget | RankTarget, source: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target, self.source = target, source
        self.shown: dict[str, str] = {}  # each failure's cause (spec.report.cause): the law shown with it
        self.stopping = Stopping(keep_going=self.config.getoption("attention_keep_going"),
                                 hint="--attention-keep-going runs every law")

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        own: Any = self.target
        if not isinstance(own, Target):  # a merge operator or a context-parallel target: its family's laws
            return [LawItem.from_parent(self, name=prop.name, law_run=LawRun(prop.name, prop, own, None),
                                        source=self.source)
                    for prop in LAWS.values() if prop.family == own_family(own)]
        profile = self.config.getoption("attention_profile")  # its laws (the scale laws at scale alone)
        return [LawItem.from_parent(self, name=one.name, law_run=one, source=self.source)
                for prop in LAWS.values() if runs_at(prop.family, profile) is None
                and prop.family not in OWN_KIND_FAMILIES  # the merge and rank laws judge their own kinds
                for one in law_runs(prop, own)]


def pytest_configure(config: pytest.Config) -> None:
    has_target = config.getoption("attention_target") or os.environ.get(ENV)
    if config.getoption("attention_only") and not has_target:
        raise pytest.UsageError(f"--attention-only needs a target: --attention-target=TARGET or {ENV}")
    memory = config.getoption("attention_memory")
    if memory is not None and not (math.isfinite(memory) and memory > 0):
        raise pytest.UsageError(f"--attention-memory must be a positive number of GiB, got {memory}")
    if config.getoption("attention_shard") is not None:
        try:
            config.stash[SHARD] = parse_shard(config.getoption("attention_shard"), name="--attention-shard")
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
    page = config.getoption("attention_html")
    if page and not hasattr(config, "workerinput"):  # an xdist worker's results go to the controller
        config.pluginmanager.register(PageWriter(config, page), "attention-spec-html")
    if memory is not None and config.getoption("attention_profile") != "scale":
        raise pytest.UsageError("--attention-memory is the budget of --attention-profile scale; "
                                "give --attention-profile scale")


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    """With ``--attention-only`` every path is passed over, so only the laws are collected."""
    return True if config.getoption("attention_only") else None


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect, so they can select properties
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[Any]) -> None:
    source = config.getoption("attention_target") or os.environ.get(ENV)
    if not source:
        return
    set_up = contextlib.ExitStack()  # the check's set-up, as spec.check's, until the session ends
    config.add_cleanup(set_up.close)
    try:
        own = load_merge_target(source) or load_rank_target(source)
        if own is not None:
            _set_up_own_kind(config, own, source, set_up)
        target: Target | MergeTarget | RankTarget = own or _set_up(config, source, set_up)
    except TargetError as e:
        raise pytest.UsageError(f"--attention-target: {e}") from None
    suite = PropertySuite.from_parent(session, name="attention-spec", nodeid="attention-spec",
                                      target=target, source=source)
    collected = suite.collect()
    # Tell the reporters, so that "collected N items" counts the properties too.
    config.hook.pytest_collectreport(report=pytest.CollectReport(suite.nodeid, "passed", None, collected))
    items.extend(collected)


def _set_up(config: pytest.Config, source: str, set_up: contextlib.ExitStack) -> Target:
    """An attention target's check, as `spec.check` sets it up: the target configured by the
    options, the profile's set-up, and process isolation's one worker process for the session
    (each xdist worker's), as a check has one for its run, not a fork per law."""
    target = configure(load(source), isolation=config.getoption("attention_isolation"),
                       deadline=config.getoption("attention_deadline"),
                       expected_failures=config.getoption("attention_expected_failures"))
    config.stash[HEADER] = set_up.enter_context(checking(config.getoption("attention_profile"), target,
                                                         memory=config.getoption("attention_memory")))
    set_up.enter_context(workers())
    return target


def _set_up_own_kind(config: pytest.Config, target: MergeTarget | RankTarget, source: str,
                     set_up: contextlib.ExitStack) -> None:
    """A merge operator's or a context-parallel target's check, as `spec.check` sets it up: its
    laws run in the caller, and a context-parallel target's ranks are started once per world size
    for the session (`spec.rank_target.kept_ranks`)."""
    for option in ("attention_isolation", "attention_deadline", "attention_expected_failures"):
        if config.getoption(option) is not None:
            flag = "--" + option.replace("_", "-")
            raise pytest.UsageError(f"{flag} applies to attention targets, not to {source!r}: it is "
                                    f"{OWN_KIND_FAMILIES[own_family(target)]}")
    if isinstance(target, RankTarget):
        set_up.enter_context(kept_ranks())


class PageWriter:
    """With ``--attention-html FILE`` (in this process, or the xdist controller): each law's result
    as its test report brings it, and at the end of the session the page of them all, in the
    registry's order."""

    def __init__(self, config: pytest.Config, where: str) -> None:
        self.config, self.where, self.start = config, where, time.perf_counter()
        self.found: list[tuple[str, str, Result]] = []  # (target name, declared limits, result)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.found += [pickle.loads(base64.b64decode(str(value))) for name, value in report.user_properties
                       if name == CARRIED and report.when == "call"]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.found:
            return
        order = {name: i for i, name in enumerate(LAWS)}
        results = sorted((r for _, _, r in self.found),
                         key=lambda r: order.get(r.name.split("[")[0], len(order)))
        opt = self.config.getoption
        report = Report(self.found[0][0], opt("attention_profile"), drawing_seed(self.config), results,
                        limits=self.found[0][1], seconds=time.perf_counter() - self.start,
                        shard=self.config.stash.get(SHARD, None), base_seed=opt("attention_seed"))
        with open(self.where, "w", encoding="utf-8") as f:
            f.write(render_html(report))


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """The profile's header line, as the CLI's report prints it (``scale: memory budget ...``)."""
    header = config.stash.get(HEADER, "")
    return [f"scale: {header}"] if header else []


def __getattr__(name: str) -> Any:
    """``PropertyItem``, deprecated: `LawItem`."""
    if name == "PropertyItem":
        import warnings

        warnings.warn("spec.pytest_plugin.PropertyItem is deprecated: use LawItem", DeprecationWarning,
                      stacklevel=2)
        return LawItem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
