"""The false-alarm sweep (tools/sweep.py): a table of targets × seeds, each cell its own spec check run
outside the checkout; a failing law fails the sweep."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools import sweep

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def on_path(monkeypatch):
    """The checkout importable from the cells' empty folder (as an installed package would be)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_a_cell_that_fails_names_its_law_and_fails_the_sweep(on_path, capsys):
    code = sweep.main(["--targets", "examples.my_attention:target", "examples.my_attention:undeclared",
                       "--seeds", "default", "1", "--profile", "quick", "--allow-checkout",
                       "--only", "masked_rows_policy", "--only", "rows_sum_to_one"])
    table = capsys.readouterr().out
    assert code == 1
    assert "| examples.my_attention:target | conforms | conforms |" in table
    assert "| examples.my_attention:undeclared | masked_rows_policy | masked_rows_policy |" in table
    assert "2 of 4 runs conform" in table


def test_the_sweep_checks_an_installed_package_unless_told(on_path, capsys):
    code = sweep.main(["--targets", "reference", "--seeds", "0"])
    assert code == 2 and "a checkout" in capsys.readouterr().err


def test_a_target_that_cannot_be_checked_is_an_error(on_path, capsys):
    code = sweep.main(["--targets", "no_such_target", "--seeds", "0", "--allow-checkout"])
    assert code == 2 and "error: " in capsys.readouterr().out


@pytest.mark.parametrize(("words", "seeds"),
                         [(["0-2", "7"], ["0", "1", "2", "7"]), (["default"], ["default"])])
def test_seed_ranges(words, seeds):
    assert sweep.seeds(words) == seeds


def test_a_bad_seed_is_refused(capsys):
    assert sweep.main(["--seeds", "two"]) == 2
    assert "--seeds: 'two'" in capsys.readouterr().err
