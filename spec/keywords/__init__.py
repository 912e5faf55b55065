"""The keywords real kernels take, each declared once, as one `Keyword` record in one module.

Each module of this package declares one keyword (``bias``, ``window``, ``paged`` ...): its
record (`spec.keywords.record.Keyword`: the capability a target declares, the arguments passed,
how a case draws it, its golden and baseline terms, any extra output a call given it returns) and
the functions the record is made of, which its laws import from it. `KEYWORD_MODULES` lists them
in declaration order: the order the cases draw and write them, the oracle reads them and the
reports list them. Nothing is registered by importing a module: `registered` collects the records
from `KEYWORD_MODULES` the first time any keyword is asked for.

A keyword sits below the laws: its module imports no law (a law module imports its keywords),
and neither does anything that reads the records (the target, the calling layer, the oracle,
the cases). A new keyword is one module here plus its line in `KEYWORD_MODULES` (and the laws
that test it, `spec.laws`); `declared` adds keywords for a while (a test's own keyword).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from spec.keywords.record import (
    CAPABILITY,
    CAUSES,
    TERMS,
    Adds,
    Arrangement,
    Geometry,
    Keyword,
    Leaves,
    Reads,
    Realigns,
    Restricts,
    Returns,
    Sinks,
    Term,
    Transforms,
    Widens,
    not_floats,
)

if TYPE_CHECKING:
    from spec.target import Target

__all__ = [
    "CAPABILITY", "CAUSES", "KEYWORD_MODULES", "TERMS", "Adds", "Arrangement", "Geometry", "Keyword",
    "Leaves", "Reads", "Realigns", "Restricts", "Returns", "Sinks", "Term", "Transforms", "Widens",
    "arrangement", "asked_outputs", "by_argument", "carried", "check_keywords", "collect_keywords",
    "declared", "declares", "gradient_extras", "in_layout", "not_floats", "registered",
]

KEYWORD_MODULES: tuple[str, ...] = (
    "spec.keywords.bias",
    "spec.keywords.alibi",
    "spec.keywords.kv_lengths",
    "spec.keywords.window",
    "spec.keywords.softcap",
    "spec.keywords.lse",
    "spec.keywords.sinks",
    "spec.keywords.varlen",
    "spec.keywords.paged",
    "spec.keywords.fp8",
    "spec.keywords.past",
    "spec.keywords.dropout",
    "spec.keywords.chunk",
    "spec.keywords.topk",
    "spec.keywords.topk_blocks",
    "spec.keywords.qv",
    "spec.keywords.mask_mod",
    "spec.keywords.score_mod",
    "spec.keywords.num_splits",
)
"""Every keyword module, in declaration order. Add a keyword here (one line)."""


def collect_keywords(modules: tuple[str, ...] = KEYWORD_MODULES) -> dict[str, Keyword]:
    """The keywords ``modules`` declare (module attributes that are `Keyword` records), by name,
    checked together (`check_keywords`). Two declarations of one name, or of one argument, are
    refused."""
    found: dict[str, Keyword] = {}
    arguments: dict[str, str] = {}
    for name in modules:
        for value in vars(importlib.import_module(name)).values():
            if not isinstance(value, Keyword) or found.get(value.name) is value:
                continue
            _add(found, arguments, value, where=name)
    return check_keywords(found)


def _add(found: dict[str, Keyword], arguments: dict[str, str], keyword: Keyword, where: str) -> None:
    if keyword.name in found:
        raise ValueError(f"keyword {keyword.name!r} is declared twice (in {where} and before)")
    for arg in keyword.passes:
        if arg in arguments:
            raise ValueError(f"argument {arg!r} is passed by both keyword {arguments[arg]!r} "
                             f"and {keyword.name!r}")
        arguments[arg] = keyword.name
    found[keyword.name] = keyword


def check_keywords(found: dict[str, Keyword]) -> dict[str, Keyword]:
    """``found``, if its keywords can be declared together: one `Sinks` term at most (the golden
    and the backward hold one sink logit per row), every argument a keyword carries passed by
    another, no capability declared twice. Raises ValueError naming what is wrong."""
    sinks = [kw.name for kw in found.values() for term in kw.terms if isinstance(term, Sinks)]
    if len(sinks) > 1:
        raise ValueError(f"keywords {', '.join(map(repr, sinks))} each declare a Sinks term; one may")
    passed = {arg for kw in found.values() for arg in kw.passes}
    for kw in found.values():
        if set(kw.carries) - passed:
            raise ValueError(f"keyword {kw.name!r} carries {sorted(set(kw.carries) - passed)}, which no "
                             "declared keyword passes")
    fields = [kw.field for kw in found.values()]
    twice = sorted({f for f in fields if fields.count(f) > 1})
    if twice:
        raise ValueError(f"capability {twice[0]!r} is declared by two keywords")
    return found


class _Tables:
    """The declared keywords, by name and by argument, read once from `KEYWORD_MODULES` (and any
    `declared` for a while) the first time any is asked for: asking twice reads the same tables."""

    by_name: ClassVar[dict[str, Keyword] | None] = None
    by_argument: ClassVar[dict[str, Keyword]] = {}
    extra: ClassVar[tuple[Keyword, ...]] = ()


def registered() -> dict[str, Keyword]:
    """Every declared keyword, by name, in declaration order (`KEYWORD_MODULES`, then any
    `declared`)."""
    if _Tables.by_name is None:
        found = dict(collect_keywords())
        arguments = {arg: kw.name for kw in found.values() for arg in kw.passes}
        for keyword in _Tables.extra:
            _add(found, arguments, keyword, where="spec.keywords.declared")
        check_keywords(found)
        _Tables.by_argument = {arg: kw for kw in found.values() for arg in kw.passes}
        _Tables.by_name = found
    return _Tables.by_name


@contextlib.contextmanager
def declared(*keywords: Keyword) -> Iterator[dict[str, Keyword]]:
    """Every keyword as `registered` says, with ``keywords`` declared after those of
    `KEYWORD_MODULES`, until the block ends: a keyword declared outside this package (a test's
    demonstration keyword, a project's own) is then read as any other — a target may declare its
    capability, a case draw it, the oracle apply its terms, a law run with it. Yields `registered`.
    Refused as `collect_keywords` refuses: a name, an argument or a capability declared twice."""
    before = _Tables.extra
    _Tables.extra, _Tables.by_name = (*before, *keywords), None
    try:
        yield registered()
    finally:
        _Tables.extra, _Tables.by_name = before, None


def by_argument() -> dict[str, Keyword]:
    """Every keyword by each argument it passes (``cu_seqlens_k`` -> the varlen keyword)."""
    registered()
    return _Tables.by_argument


def declares(target: Target, keyword: str) -> bool:
    """Whether ``target`` takes this keyword (by name or by an argument it passes)."""
    found = registered().get(keyword) or by_argument().get(keyword)
    if found is None:
        raise KeyError(f"unknown keyword {keyword!r}")
    return bool(getattr(target, found.field))


def gradient_extras() -> dict[str, Keyword]:
    """Each gradient a backward may return beside dq, dk, dv (the ``grad`` of an `Adds`, `Sinks`
    or `Widens` term: ``dbias``, ``dsinks``, ``dqv``), with the keyword whose first value it is
    the gradient of."""
    return {term.grad: kw for kw in registered().values() for term in kw.terms
            if isinstance(term, (Adds, Sinks, Widens)) and term.grad is not None}


def carried(target: Target, name: str, arguments: Mapping[str, Any]) -> bool:
    """Whether ``name`` reaches ``target`` with another keyword among ``arguments`` that carries it
    and that the target declares (``kv_lengths`` with ``block_table``)."""
    table = by_argument()
    givers = [table[arg] for arg, value in arguments.items() if value is not None and arg in table]
    return any(name in kw.carries and getattr(target, kw.field) for kw in givers)


def arrangement(arguments: Mapping[str, Any]) -> Arrangement:
    """How the arrays are arranged for these keyword arguments (packed sequences or dense)."""
    table = by_argument()
    for name, value in arguments.items():
        kw = table.get(name)
        if kw is not None and value is not None and kw.arrangement != "dense":
            return kw.arrangement
    return "dense"


def in_layout(arranged: str) -> tuple[str, ...]:
    """The arrays ``fn`` receives in its layout (``bnhd`` swaps their heads and positions) in a call
    of this arrangement (`arrangement`): the ones the keyword that arranges it moves
    (`Keyword.moves`: a paged cache's k and v never move, only q), or, in a dense call, q, k, v and
    every argument laid out as they are (`Keyword.in_layout`: a past cache); and in every
    arrangement the arguments laid out as q (`Keyword.with_q`: ``qv``)."""
    with_q = tuple(arg for kw in registered().values() for arg in kw.with_q)  # laid out as q: move with it
    if arranged != "dense":
        return (*next(kw.moves for kw in registered().values() if kw.arrangement == arranged), *with_q)
    return ("q", "k", "v", *(arg for kw in registered().values() for arg in kw.in_layout), *with_q)


def asked_outputs(arguments: Mapping[str, Any]) -> list[Returns]:
    """The extra outputs a call with these arguments returns after its output, in declaration
    order: each `Returns` of a keyword the arguments give (`Keyword.asked`)."""
    return [kw.returns for kw in registered().values() if kw.returns is not None and kw.asked(arguments)]
