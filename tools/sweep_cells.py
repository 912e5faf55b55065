"""The false-alarm sweep's cells as pytest tests, so that pytest-xdist runs them (`tools/sweep.py`).

A pytest plugin: given the sweep's plan (``sweep-plan.json``: the cells, in table order, each a
target, a seed and a profile; the options passed to every check; the empty folder the checks run
from), it collects one test per cell, whose run is the cell's ``spec check`` in a process of its own
(`tools.sweep.run_cell`). The cell's result rides on its test report (``user_properties``), which
pytest-xdist carries from the worker back to the controller; there this plugin prints each cell as
it finishes and, when the session ends, writes every cell to ``--sweep-cells FILE``. A cell that does
not conform is a failing test (its laws the failure's text); a cell never reported (a worker lost) is
absent from the file, and the sweep counts it as an error::

    python -m pytest -p tools.sweep_cells --sweep-cells cells.json -n 2 RUN/sweep-plan.json

The sweep runs this itself; by hand it is only for a plan the sweep wrote.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from tools.sweep import PLAN, Cell, Entry, run_cell

CELL = "sweep_cell"  # the user property that carries a cell's result to the controller


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sweep-cells", metavar="FILE",
                     help="write the cells the sweep's tests report to FILE as JSON (the controller)")


def pytest_configure(config: pytest.Config) -> None:
    """The cells are gathered where the reports meet: in the controller, never in an xdist worker."""
    if not hasattr(config, "workerinput") and config.getoption("sweep_cells"):
        config.pluginmanager.register(Gather(Path(config.getoption("sweep_cells"))), "sweep_gather")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    return Plan.from_parent(parent, path=file_path) if file_path.name == PLAN else None


class Plan(pytest.File):
    """The sweep's plan: a test per cell, named ``TARGET[SEED]``, in table order."""

    def collect(self):
        plan = json.loads(self.path.read_text(encoding="utf-8"))
        for cell in plan["cells"]:
            entry = Entry(cell["label"], cell["target"], tuple(cell["path"]), cell["slow"])
            yield SweepCell.from_parent(self, name=f"{entry.label}[{cell['seed']}]", entry=entry,
                                        seed=cell["seed"], profile=cell["profile"], extra=plan["extra"],
                                        workdir=plan["workdir"])


class SweepCell(pytest.Item):
    """One cell: its ``spec check`` in its own process, so that a check that crashes, hangs on its
    ranks or leaves a framework's state behind cannot take the worker (or the next cell) with it."""

    def __init__(self, *, entry: Entry, seed: str, profile: str, extra: list[str], workdir: str, **kwargs):
        super().__init__(**kwargs)
        self.entry, self.seed, self.profile, self.extra, self.workdir = entry, seed, profile, extra, workdir

    def runtest(self) -> None:
        cell = run_cell(self.entry, self.seed, self.profile, self.extra, self.workdir)
        self.user_properties.append((CELL, asdict(cell)))
        if cell.failed:
            raise CellFailed(cell.verdict)

    def repr_failure(self, excinfo, style=None):
        return str(excinfo.value) if excinfo.errisinstance(CellFailed) else super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, self.name


class CellFailed(Exception):
    """The cell does not conform (the laws that failed) or could not be checked (``error: ...``)."""


class Gather:
    """The controller's side: each cell printed as it finishes (to stderr), all written at the end."""

    def __init__(self, out: Path) -> None:
        self.out, self.cells = out, list[Cell]()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = dict(report.user_properties).get(CELL) if report.when == "call" else None
        if isinstance(found, dict) or report.failed:
            cell = Cell(**found) if isinstance(found, dict) else lost(report)
            self.cells.append(cell)
            print(f"  {cell.target} seed {cell.seed}: {cell.verdict} ({cell.seconds:.1f} s)", file=sys.stderr,
                  flush=True)

    def pytest_sessionfinish(self) -> None:
        self.out.write_text(json.dumps([asdict(c) for c in self.cells], indent=2) + "\n", encoding="utf-8")


def lost(report: pytest.TestReport) -> Cell:
    """The error cell of a test that failed without a cell: its worker crashed (pytest-xdist's report
    of it), or the cell's run raised; named by the test's name, ``TARGET[SEED]``."""
    label, _, seed = report.nodeid.rpartition("::")[2].removesuffix("]").rpartition("[")
    said = (report.longreprtext.strip().splitlines() or [report.outcome])[-1]
    return Cell(label, seed, f"error: {said}", report.duration, failed=True, error=True)
