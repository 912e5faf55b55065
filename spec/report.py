"""The report: per-law results as data (`Result`, `Report`, `Counterexample`) and the ONE
renderer (`render`) that the CLI, the pytest plugin (`failure`) and ``str(report)`` share.

What the renderer does, as plain functions other renderers reuse: `failure_groups` (failures with
the same ``broken:`` message are one cause, shown once), `telling_order` (the law named for the bug
before the generic comparisons), `figures` (a law's measured figures as its note: one labelled value
per dtype, dtypes in a fixed order), `terminal_width` (what a report is fitted to).
"""

from __future__ import annotations

import ast
import json
import math
import re
import shlex
import shutil
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from spec import power, registry
from spec.compared import Compared

if TYPE_CHECKING:
    from spec.shard import Shard


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

    def case_text(self) -> str:
        """The case as the reports write it: ``key=value`` pairs."""
        return " ".join(f"{key}={value}" for key, value in self.case.items())

    def received(self) -> tuple[str, str]:
        """Who the law's last call reached (``grad_fn`` or ``the target``) and what it received:
        each array's shape and dtype, then the keywords passed (``; name=value, ...``)."""
        shapes = ", ".join(f"{name} {tuple(shape)} {self.dtypes[name]}"
                           for name, shape in self.shapes.items())
        given = ", ".join(f"{name}={value!r}" for name, value in self.keywords.items())
        return "grad_fn" if self.call == "grad_fn" else "the target", shapes + (f"; {given}" if given else "")

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
    not_run: bool = False
    """Skipped because the run ended before this law (`spec.runner.Stopping`), not for want of a
    capability: the summary counts it apart."""
    expected: str = ""
    """Why the target declares this law (in these dtypes) an expected failure, or ""."""
    compared: Compared | None = None
    """A failure's last comparison (`spec.compared.compact`: the worst slice, at most
    `spec.compared.KEPT` a side), what ``spec.html`` draws, whether it held or not (the law may
    have failed on another check after it); None when its example compared no arrays. Not in the
    JSON report."""
    power: list[str] | None = None
    """The trivial kernels (`spec.power.KERNELS`) the law's cases told from the golden, when the
    check judged its power (`Report.power`); None: n/a (the law compared no output with the
    golden), or not judged."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "status": self.status, "examples": self.examples,
            "seconds": round(self.seconds, 3), "message": self.message,
            "counterexample": None if self.counterexample is None else self.counterexample.to_dict(),
            "law": self.law,
            "observed": dict(self.observed),
            **({"expected": self.expected} if self.expected else {}),
            **({"not_run": True} if self.not_run else {}),
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
    power: bool = False  # the power guard judged the laws' cases (each Result's ``power``)
    budget_s: float | None = None  # the wall-time budget the run was given (None: none)
    shard: Shard | None = None  # the shard of a check this run is (`spec.shard`), None: the whole check
    base_seed: int | None = None  # a shard's: the seed the whole check was given (``seed``: the shard's own)
    merged: list[tuple[Shard, int | None]] = field(default_factory=list)
    """A report merged from shards (`spec.shard.merge`): each shard, with the seed it drew with."""

    @property
    def ok(self) -> bool:
        """True when no law failed and no expected failure passed (skips and expected
        failures do not count against conformance; a stale declaration does)."""
        return all(r.status not in ("fail", "xpass") for r in self.results)

    @property
    def complete(self) -> bool:
        """Every law ran to its end: none was left ``not run`` (by a run that ended early, or a
        time budget spent)."""
        return not any(r.not_run for r in self.results)

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
            **({"budget_s": self.budget_s, "complete": self.complete} if self.budget_s is not None else {}),
            **({"shard": self.shard.to_dict(self.base_seed)} if self.shard is not None else {}),
            **({"shards": [shard.to_dict(seed, key="seed") for shard, seed in self.merged]}
               if self.merged else {}),
            "results": [r.to_dict() | ({"power": r.power} if self.power else {}) for r in self.results],
            **({"power": self.power_table()} if self.power else {}),
        }

    def power_table(self) -> dict[str, Any]:
        """The run's power (`spec.power.table`) over the laws run (skipped ones are not judged)."""
        return power.table({r.name: r.power for r in self.results if r.status != "skip"})

    def __str__(self) -> str:
        """What ``python -m spec check`` prints: the table, each failure, the summary line."""
        return render(self)

    def to_json(self) -> str:
        """The report as strict JSON (RFC 8259), whatever the target did: a non-finite number (an
        infinite error ratio, an inf or NaN in a counterexample's arrays) is written as the string
        ``"Infinity"``, ``"-Infinity"`` or ``"NaN"``, as JSON Schema and protobuf's JSON mapping
        write them, so any JSON parser reads the file and no figure is dropped."""
        return strict_json(self.to_dict())


def strict_json(data: Any) -> str:
    """``data`` as strict JSON (RFC 8259), indented: a non-finite float is written as the string
    ``"Infinity"``, ``"-Infinity"`` or ``"NaN"`` (`Report.to_json` says why)."""
    return json.dumps(_strict(data), indent=2, allow_nan=False, ensure_ascii=False)


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

WIDTH = 100
"""Columns a report is fitted to when stdout is not a terminal (a pipe, a file, pytest's capture)."""
MIN_WIDTH = 72
"""The narrowest a report is fitted to, whatever width is asked for (the table's first four
columns take about 63)."""
SHOWN = 64
"""A counterexample array of more entries is elided: its edges, and the row the failure names."""


def terminal_width() -> int:
    """The columns a report is fitted to: the terminal's (or ``COLUMNS``), `WIDTH` when stdout is
    not a terminal."""
    return shutil.get_terminal_size((WIDTH, 24)).columns if sys.stdout.isatty() else WIDTH


def _fit(width: int | None) -> int:
    return max(MIN_WIDTH, terminal_width() if width is None else width)


def _wrap(text: str, width: int, indent: str = "  ", more: str = "    ") -> list[str]:
    """``text`` wrapped to ``width``, its first line indented by ``indent``, the rest by ``more``."""
    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=more,
                         break_on_hyphens=False) or [indent.rstrip()]


# --- which failures are one, and which comes first ------------------------------------------------

def scope(name: str) -> str:
    """What the failure of the law run ``name`` (``law`` or ``law[dtype]``) tells
    (`spec.registry.SCOPES`); ``"named"`` for a name no law has."""
    found = registry.laws().get(name.split("[", 1)[0])
    return found.scope if found is not None else "named"


def telling_order(result: Result) -> tuple[int, int]:
    """Sort key of failures, most telling first: a signature the target does not have (``fatal``),
    then the law's scope in `spec.registry.SCOPES` order (the call's shape and dtype, the laws named
    for one bug, the broad laws, the generic comparisons with the golden). Sorting is stable, so
    laws of one scope keep their run order."""
    return (0 if result.fatal else 1, registry.SCOPES.index(scope(result.name)))


FIGURES = re.compile(r"\((?:\d+(?:, \d+)*,?)?\)|\[\d+(?:, \d+)*\]|[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
"""A shape or an index of any rank, or a number."""


def cause(result: Result) -> str:
    """What broke, as failures share it: the ``broken:`` message with its figures (shapes, indices,
    values) masked, so that a target returning the wrong shape, whose message names each law's
    shrunk shapes (of several ranks), is one cause."""
    return FIGURES.sub("#", result.message)


def failure_groups(report: Report) -> list[list[Result]]:
    """The failed results (status ``fail``) grouped by `cause`: the laws that broke the same way
    (the same ``broken:`` message but for its figures) are shown once. Each group is in
    `telling_order`, the groups in the order of their first (most telling) result, whose
    counterexample is shown."""
    groups: dict[str, list[Result]] = {}
    for result in report.results:
        if result.status == "fail":
            groups.setdefault(cause(result), []).append(result)
    ordered = [sorted(group, key=telling_order) for group in groups.values()]
    return sorted(ordered, key=lambda group: telling_order(group[0]))


# --- the note: figures a law measured --------------------------------------------------------------

FIGURE = re.compile(r"(?P<label>.+?) (?P<dtype>b?float\d+\w*)(?P<computed> \(computed in [^)]*\))?")
"""An observed key that ends in a dtype: ``error ratio float64 (computed in float32)``."""
LABELS = {"error ratio": "error/allowed", "lse error ratio": "lse error/allowed",
          "scale error ratio": "scale error/allowed"}
"""How the note names the figures of `Result.observed` (keys kept as they are: tools read them)."""


def dtype_order(name: str) -> tuple[int, int, str]:
    """Sort key of dtype names: float8 variants, float16, bfloat16, float32, float64, then others."""
    found = re.fullmatch(r"(b?)float(\d+)(.*)", name)
    return (int(found[2]), bool(found[1]), found[3]) if found else (1 << 30, 0, name)


def figures(observed: Mapping[str, float]) -> str:
    """A law's figures (`Result.observed`, the worst of each over its run) as its note: each figure
    labelled once, then one value per dtype in `dtype_order` (``error/allowed: float16 0.0292,
    float32 0.0119, float64 0.057``); a figure of no dtype carries its label alone. The error
    ratios come first; non-finite values are left out (a failure says them)."""
    by_label: dict[str, list[tuple[str, float]]] = {}
    for key, value in observed.items():
        if math.isfinite(value):
            found = FIGURE.fullmatch(key)
            label, dtype = ((found["label"], found["dtype"] + (found["computed"] or "")) if found
                            else (key, ""))
            by_label.setdefault(label, []).append((dtype, value))
    known = list(LABELS)
    parts = []
    for label in sorted(by_label, key=lambda x: (known.index(x) if x in known else len(known), x)):
        values = sorted(by_label[label], key=lambda dv: dtype_order(dv[0].split(" ", 1)[0]))
        shown = ", ".join(f"{dtype} {value:.3g}" if dtype else f"{value:.3g}" for dtype, value in values)
        parts.append(f"{LABELS.get(label, label)}: {shown}")
    return "; ".join(parts)


# --- the table ------------------------------------------------------------------------------------

HEADERS = ("law", "status", "examples", "seconds", "note")
GAP = "  "
MIN_NOTE = 24  # a note column narrower than this moves the notes under their rows


def table(report: Report, *, width: int | None = None) -> str:
    """One row per law run (the skipped ones are `skipped`'s), in run order; the note column wraps
    within ``width`` (default `terminal_width`)."""
    width = _fit(width)
    shown = {r.name: group[0].name for group in failure_groups(report) for r in group[1:]}
    rows = [(r.name, r.status.upper() if r.status in LOUD else r.status, str(r.examples),
             f"{r.seconds:.2f}" if r.seconds else "0",
             _note(r, shown.get(r.name), judged=report.power)) for r in report.results if r.status != "skip"]
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(HEADERS[:4])]
    left = sum(widths) + len(GAP) * 4
    note_width = width - left
    below = note_width < MIN_NOTE  # too narrow: each note on lines of its own under its row
    if below:
        note_width = width - 4

    def line(cells: tuple[str, ...]) -> str:
        law, status, examples, seconds = (cell.ljust(w) if i < 2 else cell.rjust(w)
                                          for i, (cell, w) in enumerate(zip(cells, widths, strict=False)))
        return GAP.join([law, status, examples, seconds])

    notes = [textwrap.wrap(row[4], width=note_width, break_on_hyphens=False) for row in rows]
    rule = max([len(HEADERS[4]), *(len(x) for lines in notes for x in lines)])
    out = [line(HEADERS) + ("" if below else GAP + HEADERS[4]),
           GAP.join("-" * w for w in [*widths, *([] if below else [min(rule, note_width)])])]
    for row, lines in zip(rows, notes, strict=True):
        if below:
            out += [line(row), *("    " + x for x in lines)]
        else:
            out += [line(row) + (GAP + lines[0] if lines else "")]
            out += [" " * (left) + x for x in lines[1:]]
    return "\n".join(x.rstrip() for x in out)


def skipped(report: Report, *, width: int | None = None) -> str:
    """The laws skipped, under each reason once (what the target would have to declare, or why the
    run ended before them), in run order; "" when none was."""
    width = _fit(width)
    reasons: dict[str, list[str]] = {}
    for r in report.results:
        if r.status == "skip":
            reasons.setdefault(r.message, []).append(r.name)
    if not reasons:
        return ""
    count = sum(map(len, reasons.values()))
    lines = [f"skipped: {count} law{'s' if count > 1 else ''}, under each reason"]
    for reason, names in reasons.items():
        lines += _wrap(f"{reason}: {', '.join(names)}", width)
    return "\n".join(lines)


def _note(result: Result, shown_at: str | None = None, *, judged: bool = False) -> str:
    if judged:  # the law's power first (`spec.power.text`), then its note
        return "; ".join(x for x in (power.text(result.power), _note(result, shown_at)) if x)
    if result.status == "xfail":
        return f"expected: {result.expected}"
    if shown_at is not None:
        return f"the same failure as {shown_at}"
    return "" if result.status in ("fail", "xpass") else result.message


# --- a failure ------------------------------------------------------------------------------------

INDEX = re.compile(r"\[(\d+(?:, \d+)*)\]")
"""The first index a failure's message names (``output [0, 3]``, ``at index [1, 0, 2]``)."""
ROWS_OF_QUERIES = ("q", "mask", "bias")  # arrays whose rows follow the output's


def failure(result: Result, *, headline: bool = False, width: int | None = None,
            group: list[Result] | None = None) -> str:
    """What a failure shows: the law, what broke, the shrunk case, small arrays, a reproduction,
    fitted to ``width`` (default `terminal_width`). ``headline``: the first line also says what
    broke, whole (pytest's short summary shows only that line, cut to its terminal). ``group``:
    the laws that failed the same way (`failure_groups`; ``result`` first), named in the first
    line; the block shows ``result``'s counterexample."""
    width = _fit(width)
    others = [r for r in group or [] if r is not result]
    if others:
        names = ", ".join(r.name for r in [result, *others])
        same = "" if all(r.message == result.message for r in others) else " but for its figures"
        head = f"FAIL {names} ({len(others) + 1} laws, the same failure{same})"
        statement = f"law ({result.name}, shown here): {result.law}"
    else:
        head = f"FAIL {result.name}" + (f": {result.message}" if headline and result.message else "")
        statement = "law: " + result.law
    lines = [*([head] if headline else _wrap(head, width, "")), *_wrap(statement, width),
             *_wrap("broken: " + result.message, width)]
    example = result.counterexample
    if example:
        lines += _wrap("case: " + example.case_text(), width)
        if example.call is not None:
            who, what = example.received()
            lines += _wrap(f"{who} received (the law's last call): {what}", width)
            at = INDEX.search(result.message)
            focus = tuple(int(i) for i in at[1].split(", ")) if at else None
            for name, values in example.arrays.items():
                lines += array_lines(name, values, width=width,
                                     focus=focus if name in ROWS_OF_QUERIES else None)
        lines += reproduce_lines(example.reproduce, width=width)
    return "\n".join(lines)


def same_failure(result: Result, shown: str, *, width: int | None = None) -> str:
    """A failure whose message another law's block already shows (the pytest door, where each law
    is an item of its own): what broke, where the counterexample is, the line that replays this one.
    The first line, as in `failure` with ``headline``, says what broke, whole."""
    width = _fit(width)
    lines = [f"FAIL {result.name}: {result.message}",
             *_wrap(f"the same failure as {shown}: its block shows the law's counterexample", width)]
    if result.counterexample is not None:
        lines += reproduce_lines(result.counterexample.reproduce, width=width)
    return "\n".join(lines)


def array_lines(name: str, values: Any, *, width: int, focus: tuple[int, ...] | None = None) -> list[str]:
    """``name = values`` wrapped to ``width``; an array of more than `SHOWN` entries elided to its
    edges, and then, when ``focus`` (the index the failure names, in an array of the same rank) falls
    in it, also the row that holds it (``q[0, 5] = ...``), itself elided around the index."""
    array = np.asarray(values)
    lines = _array_text(f"  {name} = ", array, width)
    if array.size > SHOWN and focus is not None and len(focus) == array.ndim >= 2:
        row = tuple(0 if n == 1 else i for i, n in zip(focus[:-1], array.shape[:-1], strict=True))
        if all(i < n for i, n in zip(row, array.shape[:-1], strict=True)):
            values_row, at = array[row], focus[-1]
            start = max(0, min(at - SHOWN // 4, len(values_row) - SHOWN // 2)) if at < len(values_row) else 0
            part = values_row[start:start + SHOWN // 2]
            where = ", ".join(map(str, row))
            span = "" if len(part) == len(values_row) else f"[{start}:{start + len(part)}]"
            lines += _array_text(f"  {name}[{where}]{span} = ", part, width)
    return lines


def _array_text(prefix: str, array: np.ndarray, width: int) -> list[str]:
    text = np.array2string(array, max_line_width=width - 2, separator=", ", prefix=prefix, threshold=SHOWN,
                           edgeitems=3)
    return [x.rstrip() for x in (prefix + text).splitlines()]


def reproduce_lines(reproduce: str, *, width: int) -> list[str]:
    """The ``reproduce:`` line fitted to ``width``: a command is broken after the commas of its
    Python call (inside the shell's quotes a newline is kept, and Python joins the lines inside
    brackets: the lines run as the one line does, which is checked, else it stays one line); a
    sentence (no command can name the target) is wrapped."""
    first = "  reproduce: "
    if len(first) + len(reproduce) <= width:
        return [first + reproduce]
    if not reproduce.startswith("python "):
        return _wrap("reproduce: " + reproduce, width)
    lines, more = [first], "    "
    for piece in re.split(r"(?<=, )|(?<=\.replay\()", reproduce):
        if len(lines[-1]) + len(piece.rstrip()) > width and lines[-1] != first:
            lines[-1] = lines[-1].rstrip()
            lines.append(more)
        lines[-1] += piece
    broken = "\n".join([lines[0][len(first):], *lines[1:]])
    return lines if _same_command(reproduce, broken) else [first + reproduce]


def _same_command(one: str, other: str) -> bool:
    """Whether two shell lines run the same ``python -c CODE`` (the same words, the same Python)."""
    try:
        a, b = shlex.split(one), shlex.split(other)
        same_words = len(a) == len(b) and all(x == y for x, y in zip(a[:-1], b[:-1], strict=True))
        return same_words and ast.dump(ast.parse(a[-1])) == ast.dump(ast.parse(b[-1]))
    except (ValueError, SyntaxError):
        return False


def expected_failure(result: Result, *, width: int | None = None) -> str:
    """An expected failure, compactly: the law, the reason declared, what broke, the line that
    replays it."""
    width = _fit(width)
    lines = [*_wrap(f"XFAIL {result.name}: {result.expected}", width, ""),
             *_wrap("broken: " + result.message, width)]
    if result.counterexample is not None:
        lines += reproduce_lines(result.counterexample.reproduce, width=width)
    return "\n".join(lines)


def stale(result: Result, *, width: int | None = None) -> str:
    """An expected failure that passed: the declaration to remove."""
    text = (f"XPASS {result.name}: declared an expected failure ({result.expected}), but the law holds "
            f"({result.examples} examples): remove the declaration")
    return "\n".join(_wrap(text, _fit(width), ""))


def summary(report: Report, seconds: float) -> str:
    counts = {s: sum(r.status == s for r in report.results)
              for s in ("pass", "fail", "skip", "xfail", "xpass")}
    not_run = sum(r.not_run for r in report.results)
    verdict = "DOES NOT CONFORM" if not report.ok else "conforms" if report.complete else \
        "no failure in the laws run (incomplete)"
    seed = "" if report.seed is None else f", seed {report.seed}"
    seed += f", shard {report.shard}" if report.shard is not None else \
        f", {len(report.merged)} shards merged" if report.merged else ""
    expected = "".join(f", {counts[s]} {s}" for s in ("xfail", "xpass") if counts[s])
    ended = f", {not_run} not run" if not_run else ""
    return (f"{report.target}: {verdict} — {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['skip'] - not_run} skipped{ended}{expected} in {seconds:.1f} s "
            f"(profile {report.profile}{seed})")


def _summary_lines(line: str, width: int) -> list[str]:
    """The summary line, or, past ``width``, broken after the verdict (the counts, time and profile
    stay on one line, as tools read them)."""
    if len(line) <= width:
        return [line]
    verdict, _, counts = line.partition(" — ")
    return [*_wrap(verdict + " —", width, ""), *_wrap(counts, width, "    ")]


def render(report: Report, seconds: float | None = None, *, width: int | None = None) -> str:
    """The declared limits (if any), the table, the laws skipped under each reason (`skipped`), each
    failure (failures with the same message in one
    block, the most telling first: `failure_groups`), a stale expected failure in a line, each
    expected failure compactly, and the summary line; every line within ``width`` columns (default
    `terminal_width`: the terminal's, 100 in a pipe), except a reproduction line that cannot be
    broken."""
    width = _fit(width)
    parts = ["\n".join(_wrap(f"declared limits: {report.limits}", width, "")) + "\n"] if report.limits else []
    parts += ["\n".join(_wrap(f"scale: {report.scale}", width, "")) + "\n"] if report.scale else []
    parts += [table(report, width=width)]
    parts += ["\n" + skipped(report, width=width)] if any(r.status == "skip" for r in report.results) else []
    parts += ["\n" + "\n".join(line for x in power.summary_lines(report.power_table())
                               for line in _wrap(x, width, "", "    "))] if report.power else []
    parts += ["\n" + failure(group[0], group=group, width=width) for group in failure_groups(report)]
    parts += ["\n" + stale(r, width=width) for r in report.results if r.status == "xpass"]
    parts += ["\n" + expected_failure(r, width=width) for r in report.expected_failures]
    total = report.seconds if seconds is None else seconds
    parts += ["", "\n".join(_summary_lines(summary(report, total), width))]
    return "\n".join(parts)
