"""The false-alarm sweep: correct targets under many seeds, where a failure is a bug in a law.

Each cell is one ``python -m spec check TARGET --profile P --seed S`` in a process of its own, run
from an empty folder outside the checkout, so the ``spec`` imported is the one installed (a
wheel, as a user installs it: Hypothesis draws constants from the source of the modules it
counts as local, so an editable checkout and an installed package draw other examples). The
``default`` column is the run without a seed, the derandomized one a user gets first.

A target is a name ``spec check`` takes, or a group of every correct target the project has:

- ``builtins`` — ``reference``, ``flash``, ``reference_latent``, ``flash_latent``, the merge
  operator ``merge`` and each framework built-in whose library is installed (with torch, the merge
  operator ``torch_sdpa_merger`` and the context-parallel ``ring`` and ``torch_cp``, on gloo ranks)
  (`spec.adapters.ADAPTERS`), the slow ones aside;
- ``gallery`` — every correct variant of the suite's gallery (``tests/spec/gallery``: each family's
  ``CORRECT``, the declarations the built-ins do not make among them), loaded from the checkout
  as ``gallery:CORRECT_BY_NAME.<name>`` beside the installed package (``gallery/<name>``: one);
- ``examples`` — the example targets (``examples/serving_kernels.py``'s five,
  ``examples/my_attention.py:target``);
- ``slow`` — the built-ins that take minutes a run (`SLOW`: JAX's, which compiles each shape,
  the Pallas kernels under their interpreters, FlexAttention over a paged cache eagerly, PyTorch's
  context parallelism, a DTensor dispatch per call), run at
  ``--slow-profile``;
- ``all`` — builtins, gallery and examples.

    python tools/sweep.py                                  # reference, flash, torch; seeds 0-19
    python tools/sweep.py --targets builtins gallery examples --seeds default 0-19
    python tools/sweep.py --targets reference flash --seeds 0-4
    python tools/sweep.py --seeds 3 7 --only large_values  # any spec check option after --only

Prints a table (target × seed: ``conforms`` or the laws that failed) and exits 1 if any cell does
not conform, 2 if a target cannot be checked at all. ``tox -e sweep`` runs the whole sweep on a
wheel; CI runs ``tox -e sweep-ci``, a subset.

The cells are pytest tests (`tools.sweep_cells`), run by pytest-xdist on ``--jobs`` workers (the
machine's cores by default): a worker takes the next cell when its own is done, so the slow ones
balance out. It needs ``pip install pytest-xdist`` (the ``test`` extra, which the tox environments
install); ``--jobs 1`` runs the cells one after another in pytest alone, without it.

Spread over machines as a check is (`spec.shard`): ``--shard I/N`` (counted from 1) runs every N-th
cell of the table, from the I-th (on its ``--jobs`` workers), and ``--json`` writes them;
``--merge A.json B.json ...`` prints the table of all the shards' cells and exits as the whole sweep
would::

    python tools/sweep.py --targets all --shard 2/3 --json sweep-2.json    # on machine 2 of 3
    python tools/sweep.py --merge sweep-1.json sweep-2.json sweep-3.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spec.shard import Shard

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("reference", "flash", "reference_latent", "flash_latent", "torch")
DEFAULT = "default"  # the column of the run without --seed
SLOW = ("jax", "torch_cp", "torch_flex_paged", "torch_flex_topk", "torch_flex", "torch_flex_compiled",
        "pallas_mha", "pallas_decode", "pallas_gpu_paged", "pallas_tpu_flash", "pallas_tpu_paged",
        "pallas_splash")
"""Built-ins that take minutes a run (a compilation per shape, an interpreter, an eager trace; jax's
takes 7 minutes at profile ci on two shared cores): the group ``slow``."""
LIBRARY = {"onnxruntime": "onnxruntime", "onnx_reference": "onnx"}
"""The library a framework built-in needs, where it is not its adapter's name (`spec.adapters.ADAPTERS`)."""
SERVING_EXAMPLES = ("causal", "decode", "chunked_prefill", "prefill", "paged")
EXAMPLES = (*(f"examples/serving_kernels.py:{name}" for name in SERVING_EXAMPLES),
            "examples/my_attention.py:target")
GALLERY = ROOT / "tests" / "spec"
"""Where the gallery package is (``tests/spec/gallery``), put on the cells' path for its targets."""
PLAN = "sweep-plan.json"
"""The file that lists the cells for pytest, which `tools.sweep_cells` collects as a test per cell."""
PYTEST_OWN = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_CURRENT_TEST",
              "PYTEST_VERSION", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")
"""pytest's and pytest-xdist's variables: the options and plugins of a pytest that runs the sweep (not
given to the sweep's own), and what pytest sets in a test's environment. A check reads none of them."""


@dataclass(frozen=True)
class Cell:
    target: str
    seed: str  # a seed, or DEFAULT
    verdict: str  # "conforms", the failing laws, or "error: ..." (the run could not check)
    seconds: float
    failed: bool
    error: bool


@dataclass(frozen=True)
class Entry:
    """One target of the sweep: its label in the table, what ``spec check`` is given, and the
    folders its process needs on its path (the gallery's)."""

    label: str
    target: str
    path: tuple[str, ...] = ()
    slow: bool = False


def installed_builtins() -> list[str]:
    """``reference``, ``flash``, their latent forms and each framework built-in whose library imports
    here, in the order of `spec.adapters.ADAPTERS`."""
    from spec.adapters import ADAPTERS

    names = ["reference", "flash", "reference_latent", "flash_latent", "merge"]
    for library, adapter in ADAPTERS.items():
        names += [name for name in adapter.targets
                  if importlib.util.find_spec(LIBRARY.get(name, library)) is not None]
    torch = importlib.util.find_spec("torch") is not None
    return names + ["torch_sdpa_merger", "ring", "torch_cp"] * torch


def gallery_names() -> list[str]:
    """The names of the gallery's correct variants (`tests/spec/gallery`), read in a process of its own
    with the gallery on its path, as the cells load them."""
    listing = "import gallery; print('\\n'.join(vars(gallery.CORRECT_BY_NAME)))"
    done = subprocess.run([sys.executable, "-c", listing], cwd=tempfile.gettempdir(), capture_output=True,
                          text=True, check=False, env=_env((str(GALLERY),)))
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise argparse.ArgumentTypeError(f"--targets gallery: the gallery does not load: {said}")
    return done.stdout.split("\n")[:-1]


def gallery_entry(name: str) -> Entry:
    """The gallery's correct variant ``name``, loaded beside the installed package."""
    return Entry(f"gallery/{name}", f"gallery:CORRECT_BY_NAME.{name}", (str(GALLERY),))


def entries(words: list[str]) -> list[Entry]:
    """The targets named by ``words``: groups expanded (module docstring), names as they are."""
    groups = {"all": ["builtins", "gallery", "examples"]}
    found: list[Entry] = []
    for word in words:
        for item in groups.get(word, [word]):
            if item == "builtins":
                found += [Entry(n, n) for n in installed_builtins() if n not in SLOW]
            elif item == "slow":
                found += [Entry(n, n, slow=True) for n in installed_builtins() if n in SLOW]
            elif item == "gallery":
                found += [gallery_entry(n) for n in gallery_names()]
            elif item.startswith("gallery/"):  # one variant, as the table names it
                found.append(gallery_entry(item.removeprefix("gallery/")))
            elif item == "examples":
                found += [Entry(e, str(ROOT / e)) for e in EXAMPLES]
            else:
                found.append(Entry(item, item, slow=item in SLOW))
    return list(dict.fromkeys(found))


def _env(path: tuple[str, ...]) -> dict[str, str]:
    """This process's environment with ``path`` before its PYTHONPATH, less pytest's (`PYTEST_OWN`)."""
    env = {name: value for name, value in os.environ.items() if name not in PYTEST_OWN}
    if path:
        env["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [env.get("PYTHONPATH")])])
    return env


def seeds(words: list[str]) -> list[str]:
    """``["0-19"]`` -> ``["0", ..., "19"]``; ``default`` stands for the run without a seed."""
    out: list[str] = []
    for word in words:
        low, dash, high = word.partition("-")
        if word == DEFAULT:
            out.append(word)
        elif dash and low.isdigit() and high.isdigit() and int(low) <= int(high):
            out += [str(s) for s in range(int(low), int(high) + 1)]
        elif word.isdigit():
            out.append(word)
        else:
            raise argparse.ArgumentTypeError(f"--seeds: {word!r} is not a seed, a range A-B or {DEFAULT!r}")
    return out


def run_cell(entry: Entry, seed: str, profile: str, extra: list[str], workdir: str) -> Cell:
    """One ``spec check`` in its own process, from ``workdir``; its JSON report decides the cell."""
    stem = "".join(c if c.isalnum() else "_" for c in entry.label)
    report = Path(workdir) / f"{stem}-{seed}.json"
    command = [sys.executable, "-m", "spec", "check", entry.target, "--profile", profile,
               "--json", str(report), *([] if seed == DEFAULT else ["--seed", seed]), *extra]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, check=False,
                          env=_env(entry.path))
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1) or not report.exists():
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return Cell(entry.label, seed, f"error: {said}", seconds, failed=True, error=True)
    results = json.loads(report.read_text(encoding="utf-8"))["results"]
    failing = [r["name"] for r in results if r["status"] == "fail"]
    return Cell(entry.label, seed, ", ".join(failing) or "conforms", seconds, failed=bool(failing),
                error=False)


def pytest_command(plan: Path, out: Path, jobs: int) -> list[str]:
    """The pytest run of ``plan``'s cells (`tools.sweep_cells`), writing them to ``out``: ``jobs``
    pytest-xdist workers under its load scheduling (a worker takes the next cell when its own is done,
    so slow cells balance), or at one job pytest alone, without xdist. No configuration file, and
    neither the project's pytest plugin nor Hypothesis' (the checks run in the cells' processes)."""
    spread = ["-p", "no:xdist"] if jobs <= 1 else ["-n", str(jobs), "--dist", "load"]
    plugins = ["-p", "tools.sweep_cells", "-p", "no:attention_spec", "-p", "no:hypothesispytest",
               "-p", "no:cacheprovider"]
    return [sys.executable, "-m", "pytest", *plugins, "-c", os.devnull, "--rootdir", str(plan.parent), "-q",
            "--sweep-cells", str(out), *spread, str(plan)]


def run_cells(planned: list[tuple[Entry, str]], profile: str, slow_profile: str, extra: list[str],
              jobs: int) -> list[Cell]:
    """The cells ``planned`` run as pytest tests, ``jobs`` at once, each its own ``spec check`` from
    one empty folder (`run_cell`), in the order they finished; a cell pytest never reported (it could
    not start) is an error naming pytest's last words."""
    if not planned:
        return []
    with tempfile.TemporaryDirectory() as run:
        plan, out, workdir = Path(run) / PLAN, Path(run) / "cells.json", Path(run) / "cells"
        workdir.mkdir()
        plan.write_text(json.dumps({"workdir": str(workdir), "extra": extra, "cells": [
            {**asdict(entry), "seed": seed, "profile": slow_profile if entry.slow else profile}
            for entry, seed in planned]}), encoding="utf-8")
        # each cell's line on stderr as it finishes (`tools.sweep_cells`); pytest's own summary kept here
        command = pytest_command(plan, out, min(jobs, len(planned)))  # no worker without a cell
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False, env=_env(()))
        found = json.loads(out.read_text(encoding="utf-8")) if out.exists() else []
    cells = [Cell(**cell) for cell in found]
    if done.returncode not in (0, 1):
        print(done.stdout, file=sys.stderr, end="")
    said = (done.stdout.strip().splitlines() or ["?"])[-1]
    ran = {(c.target, c.seed) for c in cells}
    return cells + [Cell(entry.label, seed, f"error: not run (pytest exit {done.returncode}: {said})", 0.0,
                         failed=True, error=True)
                    for entry, seed in planned if (entry.label, seed) not in ran]


def where_spec_is() -> str:
    """Where the ``spec`` the cells import comes from, seen from an empty folder (as they see it)."""
    with tempfile.TemporaryDirectory() as empty:
        found = subprocess.run([sys.executable, "-c", "import spec; print(spec.__file__)"], cwd=empty,
                               capture_output=True, text=True, check=False)
    if found.returncode != 0:
        return "not importable: " + (found.stderr.strip().splitlines() or ["?"])[-1]
    path = Path(found.stdout.strip()).parent
    kind = "a checkout" if path.parent.resolve() == ROOT else "installed"
    return f"{path} ({kind})"


def table(cells: list[Cell], targets: list[str], columns: list[str]) -> str:
    """Markdown: a row per target, a column per seed; each cell ``conforms`` or what failed."""
    by = {(c.target, c.seed): c.verdict for c in cells}  # a cell another shard runs: blank
    head = ["target", *columns]
    rows = [[t, *(by.get((t, s), "") for s in columns)] for t in targets]
    return "\n".join("| " + " | ".join(row) + " |" for row in [head, ["---"] * len(head), *rows])


def mine(cells: list[tuple[Entry, str]], shard: Shard | None) -> list[tuple[Entry, str]]:
    """The cells (in table order) shard ``shard`` runs: every N-th from the I-th (all without one)."""
    return cells if shard is None else cells[shard.index - 1::shard.count]


def merged(paths: list[str]) -> tuple[list[Cell], list[str], list[str]]:
    """The cells of the shards' ``--json`` files, with the table's targets (in the order first met)
    and columns (the run without a seed first, then by seed); raises ArgumentTypeError naming a file
    that cannot be read, and a cell given twice."""
    cells: list[Cell] = []
    for path in paths:
        try:
            cells += [Cell(**found) for found in json.loads(Path(path).read_text(encoding="utf-8"))]
        except (OSError, ValueError, TypeError) as e:
            raise argparse.ArgumentTypeError(f"--merge: cannot read the cells of {path}: {e}") from None
    seen = [(c.target, c.seed) for c in cells]
    twice = sorted({cell for cell in seen if seen.count(cell) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"--merge: a cell in two files: {twice[0][0]} seed {twice[0][1]}")
    targets = list(dict.fromkeys(c.target for c in cells))
    columns = sorted({c.seed for c in cells}, key=lambda s: (s != DEFAULT, int(s) if s.isdigit() else 0))
    return cells, targets, columns


def verdict(cells: list[Cell], targets: list[str], columns: list[str], seconds: float, jobs: int) -> int:
    """Print the table and the count of the runs that conform; the exit status."""
    print(table(cells, targets, columns))
    bad = [c for c in cells if c.failed]
    print(f"\n{len(cells) - len(bad)} of {len(cells)} runs conform ({seconds:.0f} s, {jobs} at once)")
    return 2 if any(c.error for c in cells) else 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/sweep.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), metavar="TARGET",
                        help="targets spec check takes, or the groups builtins, gallery, examples, "
                             "slow, all")
    parser.add_argument("--seeds", nargs="+", default=["0-19"], metavar="SEED",
                        help=f"seeds, ranges A-B, and {DEFAULT!r} for the run without a seed (default 0-19)")
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--slow-profile", default="quick", help="the profile of the slow built-ins (SLOW)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="cells run at once: pytest-xdist's workers (1: without xdist)")
    parser.add_argument("--json", metavar="FILE", help="also write every cell as JSON")
    parser.add_argument("--allow-checkout", action="store_true",
                        help="run even when spec is imported from a checkout, not an installed package")
    parser.add_argument("--shard", metavar="I/N",
                        help="run shard I of N (counted from 1): every N-th cell of the table, from the I-th")
    parser.add_argument("--merge", nargs="+", metavar="FILE",
                        help="print the table of the shards' --json files (run nothing)")
    args, extra = parser.parse_known_args(argv)
    try:
        if args.merge:
            cells, labels, columns = merged(args.merge)
            return verdict(cells, labels, columns, sum(c.seconds for c in cells), args.jobs)
        if args.shard is not None:
            from spec.shard import parse_shard  # the check's own I/N, as the installed spec reads it
        shard = None if args.shard is None else parse_shard(args.shard, name="--shard")
        if args.jobs > 1 and importlib.util.find_spec("xdist") is None:
            raise ValueError(f"--jobs {args.jobs}: the cells run under pytest-xdist, which is not installed "
                             "(pip install pytest-xdist, in the test extra; or --jobs 1)")
        columns = seeds(args.seeds)
        targets = entries(args.targets)
    except (argparse.ArgumentTypeError, ValueError) as e:
        print(f"python tools/sweep.py: error: {e}", file=sys.stderr)
        return 2
    source = where_spec_is()
    if not source.endswith("(installed)") and not args.allow_checkout:
        print(f"python tools/sweep.py: error: spec is {source}; the sweep checks the package as a user "
              "installs it (pip install a wheel; tox -e sweep), or pass --allow-checkout", file=sys.stderr)
        return 2
    print(f"spec: {source}; profile {args.profile}; {len(targets)} targets x {len(columns)} seeds",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    planned = mine([(t, s) for t in targets for s in columns], shard)
    cells = run_cells(planned, args.profile, args.slow_profile, extra, args.jobs)
    order = {(t.label, s): i for i, (t, s) in enumerate(planned)}
    cells.sort(key=lambda c: order.get((c.target, c.seed), len(order)))  # table order, as --merge reads them
    if args.json:
        Path(args.json).write_text(json.dumps([c.__dict__ for c in cells], indent=2) + "\n", encoding="utf-8")
    return verdict(cells, [t.label for t in targets], columns, time.perf_counter() - start, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
