"""The HTML report in a real browser (headless Chromium through tools/browser.py): the page of a
failing check loads, has one heat map per failing law that compared arrays, and nothing overflows a
window 1,280 pixels wide — the document no wider than the window, every table and svg within its
container.

These tests need Chromium (``/usr/bin/chromium`` or ``chromium`` on PATH). Where it is missing they
fail, saying how to install it, when the environment variable CI is set (CI installs it: .ci/run),
and are skipped with that message otherwise. The docs site's own check (tools/check_site.py, run by
``tox -e docs``) is tested here on a site of two pages.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import spec
from spec.compared import Compared, compact
from spec.html import render_html
from spec.report import Report, Result
from tools import browser, check_site


@pytest.fixture(scope="module", autouse=True)
def chromium() -> str:
    found = browser.chromium()
    if found is None:
        message = f"Chromium is needed for the browser tests: {browser.INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def _page(tmp_path: Path, report: Report) -> Path:
    path = tmp_path / "report.html"
    path.write_text(render_html(report), encoding="utf-8")
    return path


@pytest.mark.parametrize("target", ["gallery.core:mask_off_by_one", "gallery.core:missing_scale",
                                    "gallery.core:nan_output"])
def test_a_failing_checks_page_has_its_heat_maps_and_fits_1280_px(tmp_path, target):
    report = spec.check(target, profile="quick")
    drawn = [r for r in report.failures if r.compared is not None]
    assert drawn, f"{target}: no failure compared arrays"
    found = browser.measure(_page(tmp_path, report))
    assert found["window"] == browser.WIDTH
    assert sum(s["cls"] == "heatmap ratio" for s in found["svgs"]) == len(drawn)
    assert sum(s["cls"] == "heatmap values" for s in found["svgs"]) == 2 * len(drawn)
    assert browser.overflows(found) == []


def test_a_large_comparison_and_long_words_fit_1280_px(tmp_path):
    gold = np.random.default_rng(0).normal(size=(2, 3, 700, 128))
    out = gold.copy()
    out[1, 2, 129:] = np.nan
    failed = Result("matches_golden", "fail", 3, 0.1, "x" * 400, law="y" * 400)
    failed.compared = compact(Compared("output " * 40, gold, out, 1e-3), limits={"seq_multiple": 64})
    report = Report("z" * 300, "ci", None, [failed], limits="seq_multiple=64")
    found = browser.measure(_page(tmp_path, report))
    assert sum(s["cls"] == "heatmap ratio" for s in found["svgs"]) == 1
    assert browser.overflows(found) == []


def test_the_check_sees_an_overflow(tmp_path):
    """The measurement can fail: a table and an svg wider than the window are named."""
    wide = tmp_path / "wide.html"
    wide.write_text('<!DOCTYPE html><html><body><table><tr><th>first</th><th>second</th></tr><tr><td>'
                    + "a" * 20 + '</td><td style="min-width:1600px">b</td></tr></table>'
                    '<div><svg class="big" width="2000" height="10"></svg></div></body></html>',
                    encoding="utf-8")
    found = browser.measure(wide)
    said = browser.overflows(found)
    assert any(line.startswith("the page is") for line in said)
    assert any("table (first, second)" in line for line in said)
    assert any("svg 'big'" in line for line in said)


def test_the_site_check_names_each_table_too_wide_and_each_page(tmp_path, capsys):
    site = tmp_path / "site"
    (site / "wide").mkdir(parents=True)
    (site / "index.html").write_text("<!DOCTYPE html><html><body><table><tr><th>a</th><th>b</th></tr>"
                                     "</table></body></html>", encoding="utf-8")
    (site / "wide" / "index.html").write_text(
        '<!DOCTYPE html><html><body><div style="overflow-x:auto"><table><tr><th>n</th><th>ms</th>'
        '<th>ratio</th><th>more</th></tr><tr><td style="min-width:1500px">x</td></tr></table></div>'
        '<pre style="width:1500px">a long line</pre></body></html>', encoding="utf-8")
    assert check_site.main([str(site)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("wide/index.html: table (n, ms, ratio) runs") for line in out)
    assert any(line.startswith("wide/index.html: the page is") for line in out)
    assert not any(line.startswith("index.html") for line in out)
    assert out[-1].endswith("2 pages at 1280 px, 2 too wide")
