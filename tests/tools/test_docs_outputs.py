"""Every command output shown in README.md and docs/ is what the command prints today
(tools/docs_outputs.py; ``python tools/docs_outputs.py`` refreshes them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import docs_outputs as outputs

ROOT = Path(__file__).resolve().parents[2]

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


def test_a_changed_timed_output_is_stale():
    block = next(b for b in BLOCKS if b.kind == "timed" and "error/allowed" in b.body)
    edited = outputs.Block(block.path, block.kind, block.command, block.body.replace(" pass ", " FAIL ", 1),
                           block.stamp)
    assert outputs.stale(edited) == "output changed (timings and error ratios masked)"


def test_timings_are_masked_and_nothing_else():
    text = (
        "law        status  examples  seconds  note\n"
        "---------  ------  --------  -------  ------\n"
        "rows       pass          10     0.07  error/allowed: float32 0.5\n"
        "\n"
        "x: conforms — 1 passed, 0 failed, 0 skipped in 0.1 s (profile quick)\n"
        "==== 18 passed, 3 skipped in 2.18s ====\n"
    )
    slower = text.replace("0.07", "12.5").replace("0.1 s", "3 s").replace("2.18s ====", "10.5s ===")
    assert outputs.mask_timings(text) == outputs.mask_timings(slower)
    assert outputs.mask_timings(text) != outputs.mask_timings(text.replace("float32 0.5", "float32 0.6"))
    assert outputs.mask_timings(text) != outputs.mask_timings(text.replace("10  ", "11  "))


def test_machine_figures_need_their_stamp():
    block = next(b for b in BLOCKS if b.kind == "machine")
    assert block.stamp.startswith(f"*Run `{block.command}` on ") and " cores " in block.stamp
    assert outputs.stale(outputs.Block(block.path, block.kind, block.command, block.body, "")) is not None


REPORT = (
    "law              status  examples  seconds  note\n"
    "---------------  ------  --------  -------  ------------------------------\n"
    "matches_golden   pass          47     0.31  error/allowed: float32 0.0401,\n"
    "                                            float64 0.057\n"
    "scale            pass          10     0.03  scale error/allowed: float32 0.00649\n"
    "exact            pass          10     0.03  error/allowed: float64 0; lse error/allowed: 2\n"
    "gqa              skip           0        0  needs grouped K/V heads\n"
    "\n"
    "x: conforms — 3 passed, 0 failed, 1 skipped in 1.6 s (profile quick)\n"
)


def test_error_ratios_are_masked_and_nothing_else():
    """Error ratios change with the BLAS kernel (OPENBLAS_CORETYPE): masked, wherever a wider
    figure moves the note's wrap or its column's rule; every other word is still compared."""
    other_kernel = (REPORT.replace("0.0401,\n", "0.0368, float64\n")  # the wrap moves a word up
                    .replace("  float64 0.057", "  0.057")
                    .replace("0.00649", "0.0123").replace("float64 0;", "float64 1.5e-07;")
                    .replace("allowed: 2\n", "allowed: 2.5\n")
                    .replace("------------------------------\n", "-------------------------------\n"))
    assert outputs.masked(REPORT) == outputs.masked(other_kernel)
    for changed in (REPORT.replace("47", "48"), REPORT.replace("skip ", "pass "),
                    REPORT.replace("float64 0.057", "float16 0.057"), REPORT.replace("grouped", "paired"),
                    REPORT.replace("scale error/allowed", "scale ratio"),
                    REPORT.replace("1 skipped", "2 skipped"), REPORT.replace("lse error", "lse"),
                    REPORT.replace("scale error/allowed: float32 0.00649", "")):
        assert outputs.masked(changed) != outputs.masked(REPORT), changed
