"""The registry of laws: what a law is (:class:`Property`), the ``@law`` decorator, and the
explicit list of the modules that hold laws.

``@law`` only marks a function (it sets ``fn.__spec_law__``); nothing registers by the side
effect of an import. :data:`PROPERTIES` is built from :data:`LAW_MODULES`, in that order and, within
a module, in the order of definition. A new family of laws is one new module under
:mod:`spec.laws` plus one line in :data:`LAW_MODULES`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from spec.cases import Case, cases
from spec.target import Target

Check = Callable[[Target, Case], None]

LAW_MODULES: tuple[str, ...] = (
    "spec.laws.core",
    "spec.laws.masks",
    "spec.laws.gradients",
    "spec.laws.bias",
    "spec.laws.window",
    "spec.laws.softcap",
    "spec.laws.sinks",
    "spec.laws.lengths",
    "spec.laws.dropout",
    "spec.laws.lse",
    "spec.laws.calls",
)
"""Every module of laws, in report order. Add a family here (one line)."""


@dataclass(frozen=True)
class Property:
    name: str
    check: Check
    strategy: Callable[[Target], st.SearchStrategy[Case]]
    needs: Callable[[Target], str | None]  # why the target cannot be tested, or None
    reads_pattern: bool = False  # feeds V = I instead of the case's values
    needs_text: str = ""  # the capability needed, as text; "" = the needs check's docstring

    @property
    def family(self) -> str:
        """The law module's short name: ``core``, ``masks``, ``gradients``, ..."""
        return self.check.__module__.rsplit(".", 1)[-1]

    @property
    def module(self) -> str:
        return self.check.__module__

    @property
    def requires(self) -> str:
        """The capability the law needs, as text (the ``needs`` check's docstring), "" if none."""
        return self.needs_text or " ".join((self.needs.__doc__ or "").split())

    @property
    def law(self) -> str:
        return _paragraphs(self.check)[0]

    @property
    def catches(self) -> str:
        found = [p for p in _paragraphs(self.check) if p.startswith("Catches")]
        return found[0] if found else ""


def _paragraphs(fn: Callable[..., Any]) -> list[str]:
    doc = (fn.__doc__ or "").strip()
    return [" ".join(line.strip() for line in p.splitlines()) for p in doc.split("\n\n")]


def law(
    strategy: Callable[[Target], st.SearchStrategy[Case]] | None = None,
    needs: Callable[[Target], str | None] | None = None,
    reads_pattern: bool = False,
    requires: str = "",
) -> Callable[[Check], Check]:
    """Mark a law with the cases it is run on and the capability it needs (``needs(target)``
    returns why the target cannot be tested, or None). The mark is collected by
    :func:`collect`; nothing is registered here. ``requires`` says the capability as text
    for generated docs (default: the docstring of ``needs``)."""

    def mark(fn: Check) -> Check:
        fn.__spec_law__ = Property(  # type: ignore[attr-defined]
            name=fn.__name__,
            check=fn,
            strategy=strategy or (lambda t: cases(t)),
            needs=needs or _needs_nothing,
            reads_pattern=reads_pattern,
            needs_text=requires,
        )
        return fn

    return mark


def _needs_nothing(t: Target) -> str | None:
    return None


def collect(modules: tuple[str, ...] = LAW_MODULES) -> dict[str, Property]:
    """The laws of ``modules``, by name, in module order then definition order."""
    found: dict[str, Property] = {}
    for name in modules:
        module = importlib.import_module(name)
        marked = [p for _, fn in inspect.getmembers(module, inspect.isfunction)
                  if isinstance(p := getattr(fn, "__spec_law__", None), Property) and fn.__module__ == name]
        for prop in sorted(marked, key=lambda p: p.check.__code__.co_firstlineno):
            if prop.name in found:
                raise ValueError(f"law {prop.name!r} is defined in both {found[prop.name].module} and {name}")
            found[prop.name] = prop
    return found


_PROPERTIES: dict[str, Property] = {}
PROPERTIES: dict[str, Property]  # annotation only: the value comes from __getattr__ below


def __getattr__(name: str) -> Any:
    """``PROPERTIES``: every law, built from :data:`LAW_MODULES` on first use (after the law
    modules, which import this one for ``@law``, have finished loading)."""
    if name == "PROPERTIES":
        if not _PROPERTIES:
            _PROPERTIES.update(collect())
        return _PROPERTIES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
