"""The suite's own mutation score: Cosmic Ray mutates impl's files one change at a time and runs
the suite (`tools.mutation.suite`) on each mutant.

    python -m tools.mutation.run [--jobs 3] [--timeout 120] [--sample N] [--docs docs/mutation.md] [FILE ...]
    python -m tools.mutation.run --survivors [--docs ...]   # rerun only the stored survivors
    python -m tools.mutation.run --report-only [--docs ...]  # the stored results, no run

Each file is mutated in a copy of the tree of its own (Cosmic Ray edits files in place), so the
working tree is never touched and files run side by side (``--jobs``). Mutants of the operators in
`OPERATORS` are run (one natural change per operator: ``+``→``-``, ``<``→``<=``, n→n±1, ...);
mutants inside type annotations are never run (with ``from __future__ import annotations`` they
are never evaluated). A surviving mutant must be listed in ``tools/mutation/equivalent.toml``
(the original line, the mutated line, the kind of sameness claimed and a reason; see
`load_equivalent`); the exit code is 1 when one is not, 2 when the unmutated tree fails the suite,
the list is malformed or stale, or a tool fails, 0 otherwise. A score per file is printed, and
with ``--docs`` written as Markdown.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import difflib
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.mutation.suite import IMPL, IMPL_TESTS, KILLED_BY, SUITE_CHECKS, SUITE_PROFILE

ROOT = Path(__file__).resolve().parents[2]
FILES = ("impl/attention.py", "impl/flash.py", "impl/masks.py")
EQUIVALENT = Path(__file__).with_name("equivalent.toml")
STORE = Path(__file__).with_name("results")  # the last run of each file, as JSON (what --docs reads)
COPIED = ("impl", "spec", "tests", "tools", "pyproject.toml")
SUITE = "-m tools.mutation.suite"
Key = tuple[str, str, str]  # (file, original line, mutated line), both stripped: how a mutant is matched

# One natural change per operator; Cosmic Ray's full cross product (every binary operator into
# every other, << and ** included) would be ~2,000 mutants for these files, mostly absurd ones.
OPERATORS = re.compile("|".join((
    r"core/ReplaceBinaryOperator_(Add_Sub|Sub_Add|Mul_Div|Div_Mul|FloorDiv_Div|Mod_FloorDiv|Pow_Mul"
    r"|BitAnd_BitOr|BitOr_BitAnd|BitXor_BitOr)",
    r"core/ReplaceComparisonOperator_(Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt|Eq_NotEq|NotEq_Eq|Is_IsNot|IsNot_Is)",
    r"core/NumberReplacer",
    r"core/ReplaceUnaryOperator_(USub_UAdd|Delete_Not|Delete_Invert)",
    r"core/(AddNot|ReplaceAndWithOr|ReplaceOrWithAnd|ReplaceTrueWithFalse|ReplaceFalseWithTrue)",
    r"core/(ZeroIterationForLoop|RemoveDecorator|ExceptionReplacer|ReplaceBreakWithContinue)",
)) + "$")


@dataclass(frozen=True)
class Mutant:
    file: str
    line_no: int
    operator: str
    original: str  # the source line, stripped
    mutated: str  # the line after the mutation, stripped
    outcome: str  # killed | survived | incompetent
    killed_by: str = ""  # the check that noticed it (suite.CHECKS; "" when unknown or not killed)

    @property
    def key(self) -> Key:
        return self.file, self.original, self.mutated


@dataclass
class FileResult:
    file: str
    mutants: list[Mutant] = field(default_factory=list)
    skipped: int = 0  # operators not in OPERATORS, and annotations
    eligible: int = 0  # mutants of the chosen operators outside annotations (all run unless sampled)
    seconds: float = 0.0
    when: str = ""  # when the run ended (UTC)

    def count(self, outcome: str) -> int:
        return sum(m.outcome == outcome for m in self.mutants)

    def save(self, store: Path) -> None:
        store.mkdir(parents=True, exist_ok=True)
        (store / (Path(self.file).stem + ".json")).write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def load(cls, store: Path, file: str) -> FileResult | None:
        path = store / (Path(file).stem + ".json")
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        mutants = [Mutant(**m) for m in raw["mutants"]]
        return cls(raw["file"], mutants, skipped=raw["skipped"], eligible=raw["eligible"],
                   seconds=raw["seconds"], when=raw["when"])


class ToolError(RuntimeError):
    """Cosmic Ray or the unmutated suite failed: no score can be given."""


def annotation_lines(source: str) -> set[tuple[int, int]]:
    """(line, column) of every character inside a type annotation of ``source``."""
    spots: set[tuple[int, int]] = set()
    for node in ast.walk(ast.parse(source)):
        notes = []
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            notes.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            notes.append(node.returns)
        for note in notes:
            assert note.end_lineno is not None and note.end_col_offset is not None
            for line in range(note.lineno, note.end_lineno + 1):
                first = note.col_offset if line == note.lineno else 0
                last = note.end_col_offset if line == note.end_lineno else 10_000
                spots.update((line, c) for c in range(first, last))
    return spots


def copy_tree(dest: Path) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        elif src.exists():
            shutil.copy2(src, dest / name)


def _run(cmd: list[str], cwd: Path, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(cwd), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
           "HOME": str(cwd)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def mutated_source_line(
    source: str, operator: str, occurrence: int, line_no: int, args: dict[str, Any],
) -> str:
    """The mutated line of a mutation at ``line_no`` of ``source``, without running it: what
    `mutated_line` reads from Cosmic Ray's diff of a run ("" where the mutation deletes the line, as
    a removed decorator), so a key computed here matches the stored one."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    code = mutate_code(source, get_operator(operator)(**args), occurrence)
    if code is None:
        return ""
    return mutated_line("\n".join(difflib.unified_diff(source.splitlines(), code.splitlines(), lineterm="")))


def mutate_file(file: str, timeout: float, sample: int | None = None,
                only: set[Key] | None = None) -> FileResult:
    """Every chosen mutant of ``file`` (or a fixed sample of ``sample`` of them: the same ones on
    every run of the same source; or those whose key is in ``only``), each run against the suite
    in a copy of the tree."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    start = time.perf_counter()
    result = FileResult(file)
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        work = Path(tmp)
        copy_tree(work)
        test = f"{sys.executable} {SUITE} --first {file}"
        clean = _run(test.split(), work, timeout=timeout * 4)
        if clean.returncode != 0:
            tail = (clean.stdout + clean.stderr)[-3000:]
            raise ToolError(f"the unmutated tree fails the suite:\n{tail}")
        config = work / "cosmic-ray.toml"
        config.write_text(
            "[cosmic-ray]\n"
            f'module-path = ["{file}"]\ntimeout = {timeout}\nexcluded-modules = []\n'
            f'test-command = "{test}"\n\n[cosmic-ray.distributor]\nname = "local"\n'
        )
        session = work / "session.sqlite"
        cosmic = str(Path(sys.executable).parent / "cosmic-ray")
        done = _run([cosmic, "init", str(config), str(session)], work)
        if done.returncode != 0:
            raise ToolError(f"cosmic-ray init failed: {done.stderr[-2000:]}")
        source = (work / file).read_text()
        lines = source.splitlines()
        notes = annotation_lines(source)
        with use_db(str(session), WorkDB.Mode.open) as db:
            items = sorted(db.work_items, key=lambda i: (
                tuple(i.mutations[0].start_pos), i.mutations[0].operator_name, i.mutations[0].occurrence))
            chosen = [i for i in items if OPERATORS.match(i.mutations[0].operator_name)
                      and tuple(i.mutations[0].start_pos) not in notes]
            result.eligible = len(chosen)
            if sample is not None and sample < len(chosen):
                chosen = random.Random(0).sample(chosen, sample)
            if only is not None:
                chosen = [i for i in chosen if _key(file, source, i.mutations[0], only) in only]
            keep = {i.job_id for i in chosen}
            for item in items:
                if item.job_id not in keep:
                    db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
                    result.skipped += 1
        done = _run([cosmic, "exec", str(config), str(session)], work)
        if done.returncode != 0:
            raise ToolError(f"cosmic-ray exec failed: {done.stderr[-2000:]}")
        with use_db(str(session), WorkDB.Mode.open) as db:
            for item, res in db.completed_work_items:
                if res.worker_outcome == WorkerOutcome.SKIPPED:
                    continue
                (spec,) = item.mutations
                line_no = spec.start_pos[0]
                outcome = {TestOutcome.KILLED: "killed", TestOutcome.SURVIVED: "survived"}.get(
                    res.test_outcome, "incompetent")
                result.mutants.append(Mutant(file, line_no, spec.operator_name, lines[line_no - 1].strip(),
                                             mutated_line(res.diff or ""), outcome,
                                             killer(res.output or "") if outcome == "killed" else ""))
    result.mutants.sort(key=lambda m: (m.line_no, m.operator, m.mutated))
    result.seconds = time.perf_counter() - start
    result.when = _now()
    return result


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _key(file: str, source: str, spec: Any, only: set[Key]) -> Key | None:
    """The (file, original, mutated) key of a mutation spec, computed only if its line is in ``only``."""
    line_no = spec.start_pos[0]
    original = source.splitlines()[line_no - 1].strip()
    if not any(o == original for _, o, _ in only):
        return None
    return file, original, mutated_source_line(source, spec.operator_name, spec.occurrence, line_no,
                                               spec.operator_args)


def rerun_survivors(stored: FileResult, timeout: float, equivalent: set[Key]) -> FileResult:
    """``stored`` with its survivors not listed as equivalent run again (on the tree as it is now)
    and their outcomes updated."""
    keys = {m.key for m in stored.mutants if m.outcome == "survived" and m.key not in equivalent}
    if not keys:
        return stored
    again = {m.key: m for m in mutate_file(stored.file, timeout, only=keys).mutants}
    mutants = [again.get(m.key, m) if m.key in keys else m for m in stored.mutants]
    return dataclasses.replace(stored, mutants=mutants, when=_now() + " (survivors rerun)")


def killer(output: str) -> str:
    """The check that killed a mutant, from the test command's output (its last ``killed by:`` line)."""
    found = [line[len(KILLED_BY):].strip() for line in output.splitlines() if line.startswith(KILLED_BY)]
    return found[-1] if found else ""


def mutated_line(diff: str) -> str:
    """The first added line of a unified diff, stripped."""
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return ""


# The kinds of sameness an equivalent mutant may claim, strongest first.
KINDS = {
    "bit-identical": "every public call returns the same bits and raises the same errors",
    "within tolerance": "results differ only in rounding (a summation order, a tiling, a thread count), "
                        "within the tolerances impl documents and the laws allow",
    "unreachable from the public API": "no public call, where the suite runs, executes the mutated code",
}
NEAR = 40  # lines an entry's original may drift from its reviewed line (edits above it) before it is stale
FIELDS = ("file", "line", "original", "mutated", "kind", "reason")


@dataclass(frozen=True)
class Reviewed:
    """A reviewed equivalent mutant: the kind of sameness claimed (one of `KINDS`) and why."""

    kind: str
    reason: str
    lines: tuple[int, ...]  # where the original stood when reviewed (one key may match several)

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


def _field_problem(entry: dict[str, Any]) -> str | None:
    """What is missing, empty or unknown among an entry's fields (None when nothing)."""
    missing = [k for k in ("file", "original", "kind", "reason")
               if not isinstance(entry.get(k), str) or not entry[k].strip()]
    # mutated may be "": the mutation deleted the line (a decorator removed)
    missing += [] if isinstance(entry.get("mutated"), str) else ["mutated"]
    line = entry.get("line")
    lines = line if isinstance(line, list) else [line]
    if not lines or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in lines):
        missing.append("line (an int >= 1, or a list of them)")
    unknown = sorted(set(entry) - set(FIELDS))
    said = [f"lacks {', '.join(missing)}"] * bool(missing)
    said += [f"has unknown fields {', '.join(unknown)} (it takes {', '.join(FIELDS)})"] * bool(unknown)
    return "; ".join(said) or None


def _stale(original: str, lines: tuple[int, ...], source: list[str]) -> str | None:
    """Why ``original`` no longer stands within `NEAR` lines of each of ``lines`` (None when it does)."""
    found = [n for n, text in enumerate(source, start=1) if text.strip() == original]
    far = [n for n in lines if not any(abs(n - f) <= NEAR for f in found)]
    if not far:
        return None
    now = f"it is now at line {', '.join(map(str, found))}" if found else "it is nowhere in the file"
    return (f"is stale: {original!r} is not within {NEAR} lines of line {', '.join(map(str, far))} "
            f"({now}); review the mutant again")


def load_equivalent(path: Path = EQUIVALENT, root: Path = ROOT) -> dict[Key, Reviewed]:
    """The reviewed equivalent mutants: (file, original line, mutated line) -> `Reviewed`.

    Each ``[[equivalent]]`` entry has ``file``, ``line`` (the line number of the original, or a
    list of them where one key matches several mutants), ``original`` and ``mutated`` (stripped
    lines, as `Mutant.key`; ``mutated`` is "" where the mutation deletes the line), ``kind`` (one of
    `KINDS`) and ``reason``. Refused (`ToolError`, every problem named): a field missing, empty or
    unknown; a kind not in `KINDS`; a key listed twice; an entry whose ``original`` is no longer
    within `NEAR` lines of each of its ``line`` in ``root/file`` (stale: the code changed since its
    review, so the claim must be made again).
    """
    entries = tomllib.loads(path.read_text()).get("equivalent", []) if path.exists() else []
    out: dict[Key, Reviewed] = {}
    first: dict[Key, int] = {}  # the entry that listed each key
    problems: list[str] = []
    sources: dict[str, list[str] | None] = {}
    for i, entry in enumerate(entries, start=1):
        if (problem := _field_problem(entry)) is not None:
            problems.append(f"entry {i} {problem}")
            continue
        file, original, mutated = entry["file"], entry["original"].strip(), entry["mutated"].strip()
        lines = tuple(entry["line"]) if isinstance(entry["line"], list) else (entry["line"],)
        where = f"entry {i} ({file}:{','.join(map(str, lines))})"
        if entry["kind"] not in KINDS:
            problems.append(f"{where}: kind {entry['kind']!r} is none of {', '.join(map(repr, KINDS))}")
        key = (file, original, mutated)
        if key in first:
            problems.append(f"{where} repeats entry {first[key]}'s key ({file}: {original!r} -> "
                            f"{mutated!r}): one entry matches every mutant with that key; list its lines")
        first.setdefault(key, i)
        if file not in sources:
            sources[file] = (root / file).read_text().splitlines() if (root / file).is_file() else None
        if (source := sources[file]) is None:
            problems.append(f"{where}: no file {file} under {root}")
        elif (stale := _stale(original, lines, source)) is not None:
            problems.append(f"{where} {stale}")
        out[key] = Reviewed(entry["kind"], entry["reason"].strip(), lines)
    if len(problems) > 1:
        listed = "\n".join(f"  {p}" for p in problems)
        raise ToolError(f"{path.name} has {len(problems)} problems:\n{listed}")
    if problems:
        raise ToolError(f"{path.name}: {problems[0]}")
    return out


COUNTS = ("file", "mutants run (of eligible)", "killed", "by the suite's laws", "by impl's tests only",
          "otherwise")
SCORES = ("file", "equivalent (reviewed)", "survivors", "score", "seconds", "run at")
"""The score's two tables (one of eleven columns does not fit a 1280-px page), each led by the file."""


def score_table(results: list[FileResult], equivalent: dict[Key, Reviewed]) -> list[str]:
    """Markdown: what was killed and by what (`COUNTS`), then a blank line and the score (`SCORES`)."""
    counts, scores = [], []
    for r in results:
        survivors = [m for m in r.mutants if m.outcome == "survived"]
        listed = sum(m.key in equivalent for m in survivors)
        killed = r.count("killed") + r.count("incompetent")
        by_laws = sum(m.outcome == "killed" and m.killed_by in SUITE_CHECKS for m in r.mutants)
        by_impl = sum(m.outcome == "killed" and m.killed_by == IMPL for m in r.mutants)
        relevant = len(r.mutants) - listed
        score = f"{100 * killed / relevant:.1f} %" if relevant else "n/a"
        counts.append((r.file, f"{len(r.mutants)} (of {r.eligible})", killed, by_laws, by_impl,
                       killed - by_laws - by_impl))
        scores.append((r.file, listed, len(survivors) - listed, score, f"{r.seconds:.0f}", r.when))
    return [*markdown_table(COUNTS, counts), "", *markdown_table(SCORES, scores)]


def markdown_table(headers: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def report(results: list[FileResult], equivalent: dict[Key, Reviewed], command: str,
           seconds: float) -> tuple[str, list[Mutant]]:
    """The Markdown report and the survivors not on the equivalent list."""
    survivors = [m for r in results for m in r.mutants if m.outcome == "survived"]
    unlisted = [m for m in survivors if m.key not in equivalent]
    seen = {m.key for m in survivors}
    stale = [key for key in equivalent if key[0] in {r.file for r in results} and key not in seen]
    when = _now()
    out = [
        "# Mutation score",
        "",
        f"Generated by `{command}` on {when} in {seconds / 60:.1f} min, with the stored results "
        "(tools/mutation/results/) of files not run by that command (do not edit by hand). Cosmic Ray "
        "mutates each file one change at a time; the test command is `python -m tools.mutation.suite`: "
        f"the suite's laws (`python -m spec check reference|flash --profile {SUITE_PROFILE}`), then "
        f"impl's own tests ({', '.join(f'`{t}`' for t in IMPL_TESTS)}). A mutant counted under \"by "
        "impl's tests only\" got through every law of the suite on both targets; \"otherwise\" "
        "counts those that stopped the test command before any check could say (a module that no "
        "longer imports, a timeout). "
        "Score = killed / (mutants run − reviewed equivalents).",
        "",
        *score_table(results, equivalent),
        "",
        f"Mutants not run: {sum(r.skipped for r in results)} (operators outside the chosen set, "
        "mutants inside type annotations, which are never evaluated, and, where fewer were run than are "
        "eligible, those outside a fixed random sample: `--sample N`).",
        "",
        "## Survivors not on the equivalent list",
        "",
        *([f"- `{m.file}:{m.line_no}` {m.operator}: `{m.original}` → `{m.mutated}`" for m in unlisted]
          or ["None."]),
        "",
        "## Killed by impl's tests only (the suite's laws let them through)",
        "",
        *([f"- `{m.file}:{m.line_no}` `{m.original}` → `{m.mutated}`" for r in results for m in r.mutants
           if m.outcome == "killed" and m.killed_by == IMPL] or ["None."]),
        "",
        "## Reviewed equivalent mutants that survived",
        "",
        "Each entry of tools/mutation/equivalent.toml claims one kind of sameness, checked by reading "
        "the code: " + "; ".join(f"*{kind}*: {meaning}" for kind, meaning in KINDS.items()) + ".",
        "",
        *([f"- `{m.file}:{m.line_no}` `{m.original}` → `{m.mutated}`: {equivalent[m.key]}"
           for m in survivors if m.key in equivalent] or ["None."]),
    ]
    if stale:
        out += ["", "## Equivalent-list entries that no longer match a survivor", "",
                *(f"- `{f}`: `{o}` → `{m}`" for f, o, m in stale)]
    return "\n".join(out) + "\n", unlisted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mutation.run",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=list(FILES), help=f"files to mutate (default: {FILES})")
    parser.add_argument("--jobs", type=int, default=3, help="files mutated side by side (default 3: all)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant (default 120)")
    parser.add_argument("--sample", type=int, help="run a fixed random sample of N mutants per file")
    parser.add_argument("--survivors", action="store_true",
                        help="rerun only the survivors stored by the last run of each file, and update it")
    parser.add_argument("--report-only", action="store_true", help="no run: report the stored results")
    parser.add_argument("--docs", type=Path, help="write the Markdown report here (e.g. docs/mutation.md), "
                        "with the stored results of the files not run this time")
    args = parser.parse_args(argv)
    for file in args.files:
        if not (ROOT / file).is_file():
            print(f"error: file {file!r} does not exist under {ROOT}", file=sys.stderr)
            return 2
    if args.jobs < 1 or not args.timeout > 0 or (args.sample is not None and args.sample < 1):
        print("error: --jobs and --sample must be >= 1 and --timeout > 0", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        equivalent = load_equivalent()
        if args.report_only:
            results = [r for f in args.files if (r := FileResult.load(STORE, f)) is not None]
        elif args.survivors:
            stored = [r for f in args.files if (r := FileResult.load(STORE, f)) is not None]
            with ThreadPoolExecutor(args.jobs) as pool:
                results = list(pool.map(lambda r: rerun_survivors(r, args.timeout, set(equivalent)), stored))
        else:
            with ThreadPoolExecutor(args.jobs) as pool:
                results = list(pool.map(lambda f: mutate_file(f, args.timeout, args.sample), args.files))
        for r in results:
            r.save(STORE)
    except (ToolError, subprocess.TimeoutExpired, tomllib.TOMLDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    command = "python -m tools.mutation.run " + " ".join(sys.argv[1:] if argv is None else argv)
    text, unlisted = report(results, equivalent, command.strip(), time.perf_counter() - start)
    print("\n".join(score_table(results, equivalent)))
    for m in unlisted:
        print(f"SURVIVED {m.file}:{m.line_no} {m.operator}: {m.original}  ->  {m.mutated}")
    if args.docs:
        ran = {r.file for r in results}
        found = [FileResult.load(STORE, f) for f in FILES if f not in ran]
        stored = [r for r in found if r is not None]
        text, _ = report([*results, *stored], equivalent, command.strip(), time.perf_counter() - start)
        args.docs.parent.mkdir(parents=True, exist_ok=True)
        args.docs.write_text(text)
    return 1 if unlisted else 0


if __name__ == "__main__":
    sys.exit(main())
