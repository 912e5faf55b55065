"""The report as one HTML page (spec.html): self-contained (no script, nothing fetched), every
text escaped, one heat map per failure that compared arrays, the slice and downsampling said, tile
edges and declared limits drawn; ``python -m spec check --html FILE`` writes it whatever the
verdict, and an unwritable FILE is one line and exit 2. (tests/tools/test_browser.py loads the
pages in a real browser.)"""

from __future__ import annotations

import html
import re

import numpy as np

import spec
from spec.cli import main
from spec.compared import Compared, compact
from spec.html import render_html
from spec.report import Report, Result


def _report(compared: Compared | None, *, target: str = "t", message: str = "broken") -> Report:
    failed = Result("matches_golden", "fail", 3, 0.1, message, law="The output equals the golden.")
    failed.compared = compared
    passed = Result("rows_sum_to_one", "pass", 3, 0.1, "worst error ratio 0.1", law="Rows sum to one.")
    return Report(target, "ci", 7, [passed, failed], limits="seq_multiple=32")


def _big() -> Compared:  # a 4-D comparison whose worst error is in slice (1, 2), rows 129 on
    gold = np.random.default_rng(0).normal(size=(2, 3, 300, 64))
    out = gold.copy()
    out[1, 2, 129:] += 1.0
    return compact(Compared("output against the float64 golden", gold, out, 1e-3),
                   limits={"seq_multiple": 32})


def test_a_failing_check_gives_one_heat_map_per_failure_that_compared_arrays():
    report = spec.check("gallery.core:mask_off_by_one", profile="quick")
    page = render_html(report)
    drawn = [r for r in report.failures if r.compared is not None]
    assert drawn and page.count('class="heatmap ratio"') == len(drawn)
    assert page.count('class="heatmap values"') == 2 * len(drawn)  # the golden beside what was returned
    assert page.count('<section class="failure"') == len(report.failures)
    for r in report.failures:  # each failure with its law, what broke and the line that replays it
        assert r.counterexample is not None and html.escape(r.counterexample.reproduce) in page
        assert f"FAIL {r.name}" in page


def test_the_page_is_self_contained_and_escapes_every_text():
    page = render_html(_report(_big(), target="<script>alert(1)</script>", message="a < b & c"))
    assert "<script" not in page.lower() and "alert(1)" in page
    assert "&lt;script&gt;" in page and "a &lt; b &amp; c" in page
    links = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert all(link.startswith("#") for link in links), links  # nothing fetched, only anchors
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_the_caption_says_the_slice_the_downsampling_and_the_limits():
    page = render_html(_report(_big()))
    assert "the slice (batch, head) [1, 2] of the whole (2, 3, 300, 64)" in page
    assert "downsampled" in page and "block max" in page
    assert "declared seq_multiple=32 marked" in page
    assert "tile edges at multiples of 16, 64, 128 drawn" in page
    ratio_map = page.split('class="heatmap ratio"')[1].split("</svg>")[0]
    assert ratio_map.count('stroke="#7b3294"') == 300 // 32  # a line at each multiple of 32 inside 300 rows
    assert ratio_map.count('stroke="#000" stroke-width="2"') == 2  # 128 and 256


def test_small_outputs_are_not_downsampled_and_no_tile_edge_is_drawn():
    small = compact(Compared("bits", np.zeros((3, 5)), np.ones((3, 5)), 0.0))
    page = render_html(_report(small))
    assert "downsampled" not in page and "no tile edge drawn" in page
    assert "15 of 15 entries over the allowance" in page


def test_a_comparison_that_held_says_the_law_failed_elsewhere():
    held = compact(Compared("output", np.zeros((2, 2)), np.zeros((2, 2)), 1.0))
    assert "this comparison held" in render_html(_report(held))


def test_without_a_comparison_there_is_no_map():
    page = render_html(_report(None))
    assert "heatmap" not in page and "FAIL matches_golden" in page


def test_cli_writes_the_page_whatever_the_verdict(tmp_path):
    failing, passing = tmp_path / "fail.html", tmp_path / "pass.html"
    assert main(["check", "gallery.core:mask_off_by_one", "--profile", "quick", "--only", "causal_no_leak",
                 "--html", str(failing)]) == 1
    assert main(["check", "reference", "--profile", "quick", "--only", "causal_no_leak",
                 "--html", str(passing)]) == 0
    assert 'class="heatmap ratio"' in failing.read_text(encoding="utf-8")
    assert "reference: conforms" in passing.read_text(encoding="utf-8")


def test_cli_an_unwritable_html_file_is_one_line_and_exit_2(tmp_path, capsys):
    where = tmp_path / "no such folder" / "page.html"
    assert main(["check", "reference", "--profile", "quick", "--only", "causal_no_leak",
                 "--html", str(where)]) == 2
    err = capsys.readouterr().err.strip()  # before any law runs: no progress line
    assert len(err.splitlines()) == 1 and "--html" in err and "Traceback" not in err
