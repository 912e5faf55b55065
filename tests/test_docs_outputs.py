"""Every command output shown in README.md and docs/ is what the command prints today
(tools/docs_outputs.py; ``python tools/docs_outputs.py`` refreshes them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import docs_outputs as outputs

ROOT = Path(__file__).resolve().parent.parent

BLOCKS = [b for path in outputs.files() for b in outputs.blocks(path)]


def test_the_pages_show_outputs():
    assert {b.kind for b in BLOCKS} == {"output", "timed", "machine"}
    assert any(b.path.name == "README.md" for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b.path.name}:{b.command}")
def test_shown_output_is_fresh(block):
    why = outputs.stale(block)
    assert why is None, f"{block.path.name}: {block.command}: {why}; run python tools/docs_outputs.py"


def test_a_changed_output_is_stale():
    block = next(b for b in BLOCKS if b.kind == "output")
    body = block.body.replace("\n", "\n ", 1)
    edited = outputs.Block(block.path, block.kind, block.command, body, block.stamp)
    assert outputs.stale(edited) == "output changed"


def test_timings_are_masked_and_nothing_else():
    text = (
        "property   status      examples    seconds  note\n"
        "---------  --------  ----------  ---------  ------\n"
        "rows       pass              10       0.07  worst error ratio 0.5\n"
        "\n"
        "x: conforms — 1 passed, 0 failed, 0 skipped in 0.1 s (profile quick)\n"
        "==== 18 passed, 3 skipped in 2.18s ====\n"
    )
    slower = text.replace("0.07", "12.5").replace("0.1 s", "3 s").replace("2.18s ====", "10.5s ===")
    assert outputs.mask_timings(text) == outputs.mask_timings(slower)
    assert outputs.mask_timings(text) != outputs.mask_timings(text.replace("ratio 0.5", "ratio 0.6"))
    assert outputs.mask_timings(text) != outputs.mask_timings(text.replace("10  ", "11  "))


def test_machine_figures_need_their_stamp():
    block = next(b for b in BLOCKS if b.kind == "machine")
    assert block.stamp.startswith(f"*Run `{block.command}` on ") and " cores " in block.stamp
    assert outputs.stale(outputs.Block(block.path, block.kind, block.command, block.body, "")) is not None
