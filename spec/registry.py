"""The registry: what a law is (`Law`), the ``@law`` decorator, what a law needs (`Need`),
and the explicit list of the modules that hold laws.

``@law`` only marks a function (it sets ``fn.__spec_law__``); nothing registers by the side
effect of an import. `LAWS` is built from `LAW_MODULES`, in that order and, within a
module, in the order of definition. A new family of laws is one new module under `spec.laws`
plus one line in `LAW_MODULES`; the keywords they test are declared below them, one module each
(`spec.keywords.KEYWORD_MODULES`), and `keywords()` reads those.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from spec.cases import Case, cases
from spec.keywords import Keyword, registered
from spec.target import Target

Check = Callable[[Any, Any], None]
"""A law's check: ``(Target, Case)``, or for a merge law ``(MergeTarget, MergeCase)`` (`spec.laws.merge`),
for a rank law ``(RankTarget, RankCase)`` (`spec.laws.ranks`)."""

LAW_MODULES: tuple[str, ...] = (
    "spec.laws.core",
    "spec.laws.masks",
    "spec.laws.gradients",
    "spec.laws.bias",
    "spec.laws.alibi",
    "spec.laws.window",
    "spec.laws.chunk",
    "spec.laws.topk",
    "spec.laws.topk_blocks",
    "spec.laws.mla",
    "spec.laws.softcap",
    "spec.laws.mods",
    "spec.laws.sinks",
    "spec.laws.lengths",
    "spec.laws.cache",
    "spec.laws.past",
    "spec.laws.dropout",
    "spec.laws.lse",
    "spec.laws.invariance",
    "spec.laws.cascade",
    "spec.laws.grad_keywords",
    "spec.laws.pairs",
    "spec.laws.calls",
    "spec.laws.edges",
    "spec.laws.stateful",
    "spec.laws.long_runs",
    "spec.laws.scale",
    "spec.laws.merge",
    "spec.laws.ranks",
)
"""Every module of laws, in report order. Add a family here (one line)."""


@dataclass(frozen=True)
class Need:
    """What a law needs of a target: ``missing(target)`` says why the target cannot be tested
    (None when it can); ``text`` names the capability (the docs' "Needs:"). Needs combine with
    ``&``: the first missing one is reported. Made by the constructors of `spec.laws._needs`."""

    missing: Callable[[Any], str | None]
    text: str

    def __call__(self, target: Any) -> str | None:  # a Target; a MergeTarget, RankTarget for their laws
        return self.missing(target)

    def __and__(self, other: Need) -> Need:
        return Need(lambda t: self(t) or other(t), f"{self.text} and {other.text}")


NOTHING = Need(lambda t: None, "")

SCOPES: tuple[str, ...] = ("call", "named", "broad", "generic")
"""What a law's failure tells, most telling first (the report shows failures in this order, see
`spec.report.telling_order`): ``call``, the call itself (shape, dtype), whose failure every other law
then meets; ``named``, a law named for one bug (the default: causal_no_leak, rows_sum_to_one, the
masks, ...); ``broad``, a law many bugs break (convexity, the uniform average); ``generic``, a
comparison with the golden that any wrong output fails (matches_golden, large_values, ...)."""


@dataclass(frozen=True)
class Law:
    """A law as the registry holds it: its name, its check, its cases and what it needs."""

    name: str
    check: Check
    strategy: Callable[[Any], st.SearchStrategy[Any]]
    needs: Need = NOTHING  # why the target cannot be tested, or None
    reads_pattern: bool = False  # feeds V = I instead of the case's values
    grid: Callable[[Any], list[Case]] | None = None  # boundary cases run first, in every profile
    scope: str = "named"  # what its failure tells (`SCOPES`): the report's order of failures

    @property
    def family(self) -> str:
        """The law module's short name: ``core``, ``masks``, ``gradients``, ..."""
        return self.check.__module__.rsplit(".", 1)[-1]

    @property
    def module(self) -> str:
        return self.check.__module__

    @property
    def requires(self) -> str:
        """The capability the law needs, as text, "" if none."""
        return self.needs.text

    @property
    def statement(self) -> str:
        """What the law says: its docstring's first paragraph."""
        return _paragraphs(self.check)[0]

    @property
    def law(self) -> str:
        """Deprecated: `statement`."""
        warnings.warn("Law.law is deprecated: use Law.statement", DeprecationWarning, stacklevel=2)
        return self.statement

    @property
    def catches(self) -> str:
        found = [p for p in _paragraphs(self.check) if p.startswith("Catches")]
        return found[0] if found else ""


def _paragraphs(fn: Callable[..., Any]) -> list[str]:
    doc = (fn.__doc__ or "").strip()
    return [" ".join(line.strip() for line in p.splitlines()) for p in doc.split("\n\n")]


def law(
    strategy: Callable[[Any], st.SearchStrategy[Any]] | None = None,
    needs: Need = NOTHING,
    reads_pattern: bool = False,
    grid: Callable[[Target], list[Case]] | None = None,
    scope: str = "named",
) -> Callable[[Check], Check]:
    """Mark a law with the cases it is run on and what it needs of a target (a `Need`). The mark
    is collected by `collect`; nothing is registered here. ``grid(target)``: boundary cases
    (`spec.cases.boundary_cases`) run before the random ones in every profile. ``scope``: what its
    failure tells (`SCOPES`; ``"generic"`` for a plain comparison with the golden)."""
    if not isinstance(needs, Need):
        raise TypeError(f"needs must be a Need (see spec.laws._needs), got {type(needs).__name__}")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")

    def mark(fn: Check) -> Check:
        fn.__spec_law__ = Law(  # type: ignore[attr-defined]
            name=fn.__name__,
            check=fn,
            strategy=strategy or (lambda t: cases(t)),
            needs=needs,
            reads_pattern=reads_pattern,
            grid=grid,
            scope=scope,
        )
        return fn

    return mark


def collect(modules: tuple[str, ...] = LAW_MODULES) -> dict[str, Law]:
    """The laws of ``modules``, by name, in module order then definition order."""
    found: dict[str, Law] = {}
    for name in modules:
        module = importlib.import_module(name)
        marked = [p for _, fn in inspect.getmembers(module, inspect.isfunction)
                  if isinstance(p := getattr(fn, "__spec_law__", None), Law) and fn.__module__ == name]
        for prop in sorted(marked, key=lambda p: p.check.__code__.co_firstlineno):
            if prop.name in found:
                raise ValueError(f"law {prop.name!r} is defined in both {found[prop.name].module} and {name}")
            found[prop.name] = prop
    return found


_LAWS: dict[str, Law] = {}


def laws() -> dict[str, Law]:
    """Every law, by name, in report order: collected from `LAW_MODULES` the first time it is
    asked for (after the law modules, which import this one for ``@law``, have loaded), the same
    dict after that."""
    if not _LAWS:
        _LAWS.update(collect())
    return _LAWS


def keywords() -> dict[str, Keyword]:
    """Every declared keyword, by name, in declaration order: `spec.keywords.registered` (the
    keywords are declared below the laws, and collecting them loads no law)."""
    return registered()


LAWS: dict[str, Law]  # annotation only: the value comes from __getattr__ below

DEPRECATED = {"PROPERTIES": "LAWS", "Property": "Law"}
"""Old names kept for one release, each with a DeprecationWarning naming the new one."""


def __getattr__(name: str) -> Any:
    """``LAWS``: every law (`laws`); the deprecated names of `DEPRECATED`."""
    if name in DEPRECATED:
        warnings.warn(f"spec.registry.{name} is deprecated: use {DEPRECATED[name]}", DeprecationWarning,
                      stacklevel=2)
        name = DEPRECATED[name]
    if name == "LAWS":
        return laws()
    if name == "Law":
        return Law
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
