"""Rerun every command whose output README.md and docs/ show, and rewrite (or check) the output.

A shown output is a marker line, then a fenced block that starts with ``$ COMMAND``:

    <!-- output: python -m calc formulas -->
    ```text
    $ python -m calc formulas
    ...
    ```

Three kinds of marker:

- ``output:`` deterministic. ``--check`` reruns the command and fails if one character differs.
- ``output timed:`` deterministic except its timings (the ``seconds`` column of a report table,
  ``in 1.7 s``) and its error ratios (``error/allowed: float32 0.0401``: float rounding, which
  differs with the BLAS kernel OpenBLAS picks for the CPU or ``OPENBLAS_CORETYPE``): those are
  masked when checking; a stamp line after the block says the command, date and machine the
  figures come from.
- ``output machine:`` machine-dependent figures (times, ratios): never checked for equality, only
  for the stamp line (command, date, machine: cores, BLAS, load) that this script writes beside
  them. Rerun only with ``--machine`` (they may be slow).

A generated list is text made from the project's own files, between two marker lines:

    <!-- generated: envs -->
    - `py` — unit tests, ...
    <!-- end generated -->

``envs``: tox.ini's environments (its envlist first, then the others), each with its description,
where the time it takes is stated once; ``extras``: pyproject.toml's optional extras with what each
installs. ``--check`` fails when one differs from what its source gives today.

Leading ``NAME=value`` words of a command are environment variables; ``python`` is this
interpreter, run from the repository root with the repository first on ``PYTHONPATH``. Only
stdout is shown (progress lines go to stderr).

    python tools/docs_outputs.py            # rewrite every output and timed block
    python tools/docs_outputs.py --machine  # ... and the machine-dependent ones
    python tools/docs_outputs.py --machine --only spec.peers   # just those commands
    python tools/docs_outputs.py --check    # exit 1 naming each stale block
"""

from __future__ import annotations

import argparse
import configparser
import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(
    r"^<!-- output(?P<kind> timed| machine)?: (?P<command>.+?) -->\n"
    r"(?P<fence>```+)(?P<lang>\w*)\n(?P<body>.*?)^(?P=fence)\n"
    r"(?P<stamp>\*Run [^\n]*\*\n)?",
    re.MULTILINE | re.DOTALL,
)
TIMING_SUMMARY = re.compile(r" in \d+(?:\.\d+)? s \(profile")
PYTEST_SUMMARY = re.compile(r"^=+ (.*) in \d+(?:\.\d+)?s(?: \([^)]*\))? =+$", re.MULTILINE)
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|inf|nan)"
ERROR_RATIOS = re.compile(r"(error/allowed: )([^;\n]*)")
"""The error ratios of a report's note (``error/allowed: float16 0.0292, float32 0.0119``)."""
RATIO = re.compile(r"((?:^|, )(?:b?float\w+(?: \(computed in [^)]*\))? )?)" + NUMBER)
"""One figure of those: its dtype (if any), then its value."""


@dataclass(frozen=True)
class Block:
    path: Path
    kind: str  # "output", "timed" or "machine"
    command: str
    body: str  # the fenced text, "$ command" line included
    stamp: str  # the stamp line after the block ("" if none)


def files() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    return [Block(path, (m["kind"] or " output").strip(), m["command"], m["body"], m["stamp"] or "")
            for m in BLOCK.finditer(text)]


def run(command: str, timeout: float = 600) -> str:
    """The stdout of ``command`` run from the repository root, prefixed with ``$ command``."""
    words = shlex.split(command)
    env = dict(os.environ)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words[:1] == ["python"]:
        words[0] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["COLUMNS"] = "100"
    done = subprocess.run(words, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if done.returncode not in (0, 1):  # 1: a report of a failing check, which a page may show
        raise RuntimeError(f"{command!r} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    out = "\n".join(line.rstrip() for line in done.stdout.rstrip("\n").splitlines())
    return f"$ {command}\n{out}\n"


def mask_timings(text: str) -> str:
    """``text`` with the ``seconds`` column of every report table and the ``in N s`` of its
    summary line replaced by ``#``, so that only the timings may differ between runs."""
    out, span = [], None
    for line in text.splitlines():
        if "seconds" in line.split() and line.split()[0] in ("law", "property"):  # a report's header
            end = line.index("seconds") + len("seconds")
            span = (end - len("seconds") - 2, end)  # right-aligned numbers under the header
        elif span is not None and not line.strip():
            span = None
        elif span is not None and not set(line[span[0]:span[1]]) <= set("- "):
            line = line[:span[0]] + "#" * (span[1] - span[0]) + line[span[1]:]
        out.append(line)
    text = TIMING_SUMMARY.sub(" in # s (profile", "\n".join(out))
    return PYTEST_SUMMARY.sub(r"= \1 in #s =", text)


def mask_error_ratios(text: str) -> str:
    """``text`` with each error ratio of a report's notes (``error/allowed: float32 0.0401, float64
    0.057``) replaced by ``#``. The ratios are float rounding measured against the float64 golden, so they
    change with the BLAS kernel (OpenBLAS picks one per CPU; ``OPENBLAS_CORETYPE`` overrides it);
    the rest of each note, and which laws report a ratio, stay compared. A note that wraps onto
    continuation lines is joined first, since a figure's width moves the wrap."""
    out: list[str] = []
    note = None  # the note column's start while inside a report table
    for line in text.splitlines():
        words = line.split()
        if words[-1:] == ["note"] and words[0] in ("law", "property"):
            note = line.index("note")
        elif note is not None and not line.strip():
            note = None
        elif note is not None and out and len(line) > note and not line[:note].strip():
            out[-1] += " " + line[note:]  # a wrapped note's next line
            continue
        elif note is not None and re.fullmatch(r"[- ]+", line):
            line = line[:note] + "-"  # the note column's rule: as wide as the longest note
        out.append(line)
    return ERROR_RATIOS.sub(lambda m: m[1] + RATIO.sub(r"\1#", m[2]), "\n".join(out))


def masked(text: str) -> str:
    """What a timed block's check compares: ``text`` with its timings and error ratios masked."""
    return mask_timings(mask_error_ratios(text))


def machine() -> str:
    """Cores, BLAS and load of this machine, for the stamp beside machine-dependent figures."""
    import numpy as np

    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    load = os.getloadavg()[0]
    return (f"{os.cpu_count()} cores ({platform.machine()}), BLAS {blas.get('name')} "
            f"{blas.get('version')}, load average {load:.1f}")


def stamp(command: str) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"*Run `{command}` on {when}; {machine()}.*\n"


def written(command: str) -> list[Path]:
    """The files ``command`` writes besides its output (the picture of a ``--plot FILE``)."""
    words = shlex.split(command)
    return [ROOT / words[i + 1] for i, word in enumerate(words[:-1]) if word == "--plot"]


GENERATED = re.compile(r"^<!-- generated: (?P<name>[\w-]+) -->\n(?P<body>.*?)^<!-- end generated -->$",
                       re.MULTILINE | re.DOTALL)


def tox_envs(path: Path = ROOT / "tox.ini") -> list[tuple[str, str, bool]]:
    """``(name, description, in the envlist)`` of every environment of tox.ini: the envlist's in its
    order, then the others in the file's order. ``py`` is the bare ``[testenv]``."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(path, encoding="utf-8")
    default = [name.strip() for name in config["tox"]["envlist"].split(",")]
    described = {"py": config["testenv"]["description"]}
    for section in config.sections():
        if section.startswith("testenv:"):
            described[section.removeprefix("testenv:")] = config[section]["description"]
    unknown = [name for name in default if name not in described]
    if unknown:
        raise ValueError(f"tox.ini's envlist names {unknown}, which have no [testenv:NAME] description")
    others = [name for name in described if name not in default]
    return [(name, " ".join(described[name].split()), name in default) for name in [*default, *others]]


def env_list() -> str:
    """Markdown: tox.ini's environments, what ``tox`` runs first, each with its description."""
    envs = tox_envs()
    lines = ["`tox` runs these (tox.ini's envlist):", ""]
    lines += [f"- `{name}` — {text}" for name, text, default in envs if default]
    lines += ["", "and these on request (`tox -e NAME`):", ""]
    lines += [f"- `{name}` — {text}" for name, text, default in envs if not default]
    return "\n".join(lines) + "\n"


def extras(path: Path = ROOT / "pyproject.toml") -> dict[str, list[str]]:
    """pyproject.toml's optional extras: name -> the requirements it installs."""
    project = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    return dict(project.get("optional-dependencies", {}))


def extras_list() -> str:
    """Markdown: each optional extra (``pip install '.[NAME]'``) with what it installs."""
    lines = ["Optional extras (`pip install '.[NAME]'`, several: `'.[test,torch]'`):", ""]
    lines += [f"- `{name}` — {', '.join(f'`{r}`' for r in requirements)}"
              for name, requirements in extras().items()]
    return "\n".join(lines) + "\n"


GENERATORS = {"envs": env_list, "extras": extras_list}


def regenerate(text: str) -> str:
    """``text`` with every generated list rewritten from its source. Raises ValueError naming an
    unknown list."""

    def fill(m: re.Match[str]) -> str:
        if m["name"] not in GENERATORS:
            raise ValueError(f"unknown generated list {m['name']!r}; known: {', '.join(GENERATORS)}")
        return f"<!-- generated: {m['name']} -->\n{GENERATORS[m['name']]()}<!-- end generated -->"

    return GENERATED.sub(fill, text)


def stale_lists(path: Path) -> list[str]:
    """The generated lists of ``path`` that differ from what their sources give today."""
    text = path.read_text(encoding="utf-8")
    fresh = regenerate(text)
    return [m["name"] for m, f in zip(GENERATED.finditer(text), GENERATED.finditer(fresh), strict=True)
            if m[0] != f[0]]


def stale(block: Block) -> str | None:
    """Why ``block`` no longer shows its command's output, or None."""
    if block.kind == "machine":
        return None if block.stamp else "machine-dependent figures without their stamp line"
    kept = {path: path.read_bytes() for path in written(block.command) if path.exists()}
    try:
        fresh = run(block.command)
    finally:  # checking a page leaves its pictures as they are: only a refresh rewrites them
        for path, data in kept.items():
            path.write_bytes(data)
    if block.kind == "timed":
        if not block.stamp:
            return "timings without their stamp line"
        if masked(fresh) != masked(block.body):
            return "output changed (timings and error ratios masked)"
    elif fresh != block.body:
        return "output changed"
    return None


def refresh(path: Path, machine_too: bool, only: str = "") -> int:
    """Rewrite the selected blocks of ``path`` with fresh output; the number rewritten. Each block
    is written as soon as its command has run, into the file as it is then (edits made to the
    page meanwhile are kept)."""
    chosen = [b for b in blocks(path) if (machine_too or b.kind != "machine") and only in b.command]
    for block in chosen:
        print(f"{path.relative_to(ROOT)}: {block.command}", file=sys.stderr)
        body = run(block.command, timeout=3600 if block.kind == "machine" else 600)

        def rewrite(m: re.Match[str], command: str = block.command, body: str = body) -> str:
            if m["command"] != command:
                return m[0]
            kind = (m["kind"] or " output").strip()
            fence = m["fence"]
            head = f"<!-- output{m['kind'] or ''}: {command} -->\n{fence}{m['lang']}\n{body}{fence}\n"
            return head + (stamp(command) if kind != "output" else "")

        text = path.read_text(encoding="utf-8")
        new = BLOCK.sub(rewrite, text)
        if new != text:
            path.write_text(new, encoding="utf-8")
    return len(chosen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/docs_outputs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="rerun and compare; exit 1 if any is stale")
    parser.add_argument("--machine", action="store_true", help="also rerun the machine-dependent blocks")
    parser.add_argument("--only", default="", metavar="TEXT", help="only the commands containing TEXT")
    args = parser.parse_args(argv)
    if args.check:
        problems = [f"{path.relative_to(ROOT)}: generated list {name!r} differs from its source"
                    for path in files() for name in stale_lists(path)]
        problems += [f"{b.path.relative_to(ROOT)}: {b.command}: {why}"
                     for path in files() for b in blocks(path) if (why := stale(b))]
        print("\n".join(problems) or "every shown output is fresh")
        return 1 if problems else 0
    for path in files():
        text = path.read_text(encoding="utf-8")
        if (new := regenerate(text)) != text:
            path.write_text(new, encoding="utf-8")
            print(f"{path.relative_to(ROOT)}: generated lists rewritten", file=sys.stderr)
    total = sum(refresh(path, args.machine, args.only) for path in files())
    print(f"{total} blocks rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
