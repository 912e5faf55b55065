"""The report as one self-contained HTML page (``python -m spec check TARGET --html FILE``;
``render_html(report)`` in Python): the header, the table, each failure as the text report shows it, and
for each failure whose example compared arrays (`spec.compared`) a heat map of its last comparison.

The heat map is error / allowance per output element — query row down, output column across —
with the cells over the allowance marked, the golden and what the target returned beside it on one
colour scale, lines at the tile edges (multiples of 16, 64 and 128) and at the multiples of a
declared ``seq_multiple`` that fall inside the shape, and a legend. A 3-D or 4-D output shows the
(batch, head) slice holding the worst error; a large one is reduced by blocks, each cell its
block's worst entry; the caption says which. Inline CSS and SVG only: no script, nothing fetched,
every text escaped (`html.escape`). A map is at most `MAP_PX` pixels a side and every block of
text wraps, so the page fits a window 1,280 pixels wide.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable

import numpy as np

from spec.compared import Compared, downsample
from spec.report import Report, Result, failure_groups, summary

Array = np.ndarray

CELLS = 64
"""At most this many cells a side in a drawn map (a larger comparison is reduced by blocks)."""
MAP_PX = 320
"""At most this many pixels a side for a map."""
CELL_PX = 28
"""At most this many pixels a side for a cell (a 1 × 3 output is not drawn 320 pixels tall)."""
TILES = (16, 64, 128)
"""Tile sizes whose multiples are drawn: query-row and key tiles of FlashAttention-style kernels."""
LEVELS = 16
"""Colours per scale: neighbouring cells of one colour are drawn as one rectangle."""

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 16px;
       color: #1b1b1b; box-sizing: border-box; overflow-wrap: anywhere; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
code, pre { font: 13px/1.4 ui-monospace, monospace; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f4f4f4; padding: 6px 8px; margin: 4px 0; }
dl.head { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; }
dl.head dt { font-weight: 600; } dl.head dd { margin: 0; overflow-wrap: anywhere; }
table.laws { border-collapse: collapse; width: 100%; table-layout: fixed; }
table.laws th, table.laws td { border-bottom: 1px solid #ddd; padding: 3px 6px; text-align: left;
       vertical-align: top; overflow-wrap: anywhere; }
table.laws col.law { width: 26%; } table.laws col.status { width: 8%; } table.laws col.num { width: 8%; }
td.fail, td.xpass { color: #a50026; font-weight: 700; } td.xfail { color: #b35806; } td.skip { color: #777; }
details { margin: 8px 0; } summary { cursor: pointer; color: #555; }
section.failure { border-top: 2px solid #a50026; margin-top: 1.5em; }
section.failure p { overflow-wrap: anywhere; }
.maps { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
figure { margin: 0; max-width: 100%; } figcaption { font-size: 13px; max-width: 360px; }
svg { max-width: 100%; height: auto; display: block; }
p.caption { font-size: 14px; overflow-wrap: anywhere; }
"""


def render_html(report: Report) -> str:
    """One self-contained page for ``report``: the header (target, profile, seed, declared limits),
    the table, each failure in the text report's order (`spec.report.failure_groups`: one cause at a
    time, the most telling law first), with its heat map where it compared arrays, each
    expected failure, and the summary line."""
    verdict = "conforms" if report.ok else "DOES NOT CONFORM"
    # the failures as the text report orders them: one cause at a time, its most telling law first
    # (`spec.report.failure_groups`), each later law of a cause pointing to that first one
    shown = [(r, None if r is group[0] else group[0]) for group in failure_groups(report) for r in group]
    shown += [(r, None) for r in report.failures if r.status == "xpass"]
    failing = {id(r): i for i, (r, _) in enumerate(shown)}
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{_e(report.target)}: {verdict}</title><style>{STYLE}</style></head><body>",
             f"<h1>{_e(report.target)}: {verdict}</h1>", _header(report),
             _table([r for r in report.results if r.status != "skip"], failing)]
    skipped = [r for r in report.results if r.status == "skip"]
    if skipped:  # folded: what a kernel author reads first is what failed
        parts.append(f"<details><summary>skipped laws ({len(skipped)}), and why</summary>"
                     f"{_table(skipped, failing)}</details>")
    parts += [_failure(r, i, None if first is None else (first.name, failing[id(first)]))
              for i, (r, first) in enumerate(shown)]
    parts += [_expected(r) for r in report.expected_failures]
    parts += [f"<p>{_e(summary(report, report.seconds))}</p>", "</body></html>"]
    return "\n".join(parts)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _header(report: Report) -> str:
    rows = [("target", report.target), ("profile", report.profile),
            ("seed", "none (derandomized where the profile is)" if report.seed is None else report.seed),
            ("declared limits", report.limits or "none")]
    rows += [("scale", report.scale)] if report.scale else []
    return '<dl class="head">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in rows) + "</dl>"


def _table(results: list[Result], failing: dict[int, int]) -> str:
    """The laws' table; a failure's name links to its section (``failing``: its index by ``id``)."""
    head = ('<table class="laws"><colgroup><col class="law"><col class="status"><col class="num">'
            '<col class="num"><col></colgroup><thead><tr><th>law</th><th>status</th><th>examples</th>'
            "<th>seconds</th><th>note</th></tr></thead><tbody>")
    rows = []
    for r in results:
        name = _e(r.name)
        if id(r) in failing:
            name = f'<a href="#failure-{failing[id(r)]}">{name}</a>'
        note = f"expected: {r.expected}" if r.status == "xfail" else r.message
        status = r.status.upper() if r.status in ("fail", "xfail", "xpass") else r.status
        rows.append(f'<tr><td>{name}</td><td class="{_e(r.status)}">{_e(status)}</td><td>{r.examples}</td>'
                    f"<td>{r.seconds:.2f}</td><td>{_e(note)}</td></tr>")
    return head + "".join(rows) + "</tbody></table>"


def _failure(result: Result, index: int, same_as: tuple[str, int] | None = None) -> str:
    """A failure as the text report shows it (law, broken, case, what the target received, the
    line that replays it), and its heat map. ``same_as`` (a law's name and section): the failure
    that section shows first, with its case; this one gives what broke, its map and its replay."""
    lines = [f'<section class="failure" id="failure-{index}">',
             f"<h2>{'XPASS' if result.status == 'xpass' else 'FAIL'} {_e(result.name)}</h2>"]
    if same_as is not None:
        name, at = same_as
        lines += [f'<p>the same failure as <a href="#failure-{at}">{_e(name)}</a>, whose section shows '
                  "the counterexample</p>", f"<p><b>broken:</b> {_e(result.message)}</p>"]
        if result.counterexample is not None:
            lines.append(f"<p><b>reproduce:</b></p><pre>{_e(result.counterexample.reproduce)}</pre>")
        if result.compared is not None:
            lines.append(heat_map(result.compared))
        return "\n".join([*lines, "</section>"])
    lines.append(f"<p><b>law:</b> {_e(result.law)}</p>")
    if result.status == "xpass":
        lines.append(f"<p><b>declared an expected failure</b> ({_e(result.expected)}), but the law holds "
                     f"({result.examples} examples): remove the declaration</p>")
    else:
        lines.append(f"<p><b>broken:</b> {_e(result.message)}</p>")
    example = result.counterexample
    if example is not None:
        lines.append(f"<p><b>case:</b> <code>{_e(example.case_text())}</code></p>")
        if example.call is not None:
            who, what = example.received()
            lines.append(f"<p><b>{who} received</b> (the law's last call): <code>{_e(what)}</code></p>")
            lines += [f"<pre>{_e(name)} = {_e(values)}</pre>" for name, values in example.arrays.items()]
        lines.append(f"<p><b>reproduce:</b></p><pre>{_e(example.reproduce)}</pre>")
    if result.compared is not None:
        lines.append(heat_map(result.compared))
    lines.append("</section>")
    return "\n".join(lines)


def _expected(result: Result) -> str:
    replay = "" if result.counterexample is None else f"<pre>{_e(result.counterexample.reproduce)}</pre>"
    return (f'<section class="expected"><h2>XFAIL {_e(result.name)}: {_e(result.expected)}</h2>'
            f"<p><b>broken:</b> {_e(result.message)}</p>{replay}</section>")


# --- the heat map --------------------------------------------------------------------------------


def heat_map(compared: Compared) -> str:
    """The figure of one comparison: error / allowance per cell (over the allowance marked ×), the
    golden and the returned values on one diverging scale, the tile edges and declared limits, a
    caption saying what is drawn, and the legends."""
    full = compared.ratio()
    block, (ratio, expected, returned) = downsample(full, compared.expected, compared.returned, most=CELLS)
    block = (block[0] * compared.block[0], block[1] * compared.block[1])
    rows, columns = compared.full_shape[-2:] if len(compared.full_shape) >= 2 else (1, 1)
    cell = _cell_px(ratio.shape)
    lines = _edges(rows, columns, block, compared.limits)
    finite = np.concatenate([expected[np.isfinite(expected)], returned[np.isfinite(returned)], [0.0]])
    top = float(np.max(np.abs(finite)))
    maps = [
        _figure("error / allowance", _grid(ratio, cell, _ratio_colour, lines, marked=ratio > 1, kind="ratio"),
                _ratio_legend()),
        _figure("golden (expected)", _grid(expected, cell, lambda x: _value_colour(x, top), lines),
                _value_legend(top)),
        _figure("returned by the target", _grid(returned, cell, lambda x: _value_colour(x, top), lines),
                _value_legend(top)),
    ]
    return (f'<div class="heat">{_caption(compared, full, block, rows, columns)}'
            f'<div class="maps">{"".join(maps)}</div></div>')


def _caption(compared: Compared, ratio: Array, block: tuple[int, int], rows: int, columns: int) -> str:
    """What the maps show: the comparison, the slice, the downsampling, the worst ratio and how many
    entries are over, the lines drawn. ``ratio``: the comparison's, before the maps' downsampling."""
    shape = compared.full_shape
    said = [f"{compared.label}, {rows} rows × {columns} columns (query row down, output column across)"]
    if len(shape) > 2:
        lead = "(batch, head)" if len(shape) == 4 else "leading index"
        said.append(f"the slice {lead} {list(compared.slice_)} of the whole {tuple(shape)}, the one holding "
                    "the worst error")
    if block != (1, 1):
        said.append(f"downsampled: each cell is the worst of a block of {block[0]} rows × {block[1]} columns "
                    "(block max)")
    worst = float(np.nanmax(np.where(np.isnan(ratio), -1.0, ratio))) if ratio.size else 0.0
    if compared.held:
        said.append("this comparison held (every cell within its allowance): the law failed on another "
                    "check after it")
    else:
        over = int(np.sum(ratio > 1))
        kept = "" if compared.block == (1, 1) else " kept"
        said.append(f"worst error / allowance {_figure_text(worst)}; {over} of {ratio.size} entries{kept} "
                    "over the allowance")
    edges = [t for t in TILES if t < max(rows, columns)]
    said.append(f"tile edges at multiples of {', '.join(map(str, edges))} drawn" if edges else
                f"no multiple of {', '.join(map(str, TILES))} falls inside the shape: no tile edge drawn")
    for name, value in compared.limits.items():
        where = " marked (dotted)" if value < rows else ", past the rows shown"
        said.append(f"declared {name}={value}{where}")
    return f'<p class="caption"><b>Compared:</b> {_e("; ".join(said))}.</p>'


def _figure_text(x: float) -> str:
    return "inf (NaN or Inf where the other is finite, or any difference where none is allowed)" \
        if math.isinf(x) else f"{x:.3g}"


def _cell_px(shape: tuple[int, ...]) -> float:
    r, c = shape
    return max(1.0, min(CELL_PX, MAP_PX / max(r, 1), MAP_PX / max(c, 1)))


Line = tuple[str, float, str]  # ("row" | "column", position in cells, kind: a key of LINE_STYLE)


def _edges(rows: int, columns: int, block: tuple[int, int], limits: dict[str, int]) -> list[Line]:
    """The lines to draw, in cells: ("row" | "column", position, class) at every multiple of each
    tile size inside the shape, and at the multiples of a declared ``seq_multiple`` and at
    ``max_seq`` on the rows."""
    lines: list[Line] = []
    for axis, n, b in (("row", rows, block[0]), ("column", columns, block[1])):
        for tile in TILES:
            lines += [(axis, at / b, f"t{tile}") for at in range(tile, n, tile)]
    multiple = limits.get("seq_multiple")
    if multiple:
        lines += [("row", at / block[0], "limit") for at in range(multiple, rows, multiple)]
    if limits.get("max_seq") and limits["max_seq"] < rows:
        lines.append(("row", limits["max_seq"] / block[0], "limit"))
    return lines


LINE_STYLE = {"t16": 'stroke="#555" stroke-width="0.6" stroke-dasharray="2 2"',
              "t64": 'stroke="#222" stroke-width="1.2"', "t128": 'stroke="#000" stroke-width="2"',
              "limit": 'stroke="#7b3294" stroke-width="1.6" stroke-dasharray="1 3"'}


def _grid(values: Array, cell: float, colour: Callable[[float], str], lines: Iterable[Line], *,
          marked: Array | None = None, kind: str = "values") -> str:
    """An SVG of ``values [r, c]``, each cell coloured by ``colour(value) -> "#rrggbb"``; neighbouring
    cells of one colour in a row share a rectangle; ``marked`` cells get a ×; ``lines`` drawn over;
    ``kind`` (``ratio`` or ``values``) is the svg's second class."""
    n_r, n_c = values.shape
    width, height = n_c * cell, n_r * cell
    pad = 4
    outer_w, outer_h = width + 2 * pad, height + 2 * pad
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="heatmap {kind}" width="{outer_w:.0f}" '
             f'height="{outer_h:.0f}" viewBox="{-pad} {-pad} {outer_w:.1f} {outer_h:.1f}" role="img">',
             '<g shape-rendering="crispEdges">']
    for i in range(n_r):
        j = 0
        while j < n_c:
            fill = colour(float(values[i, j]))
            end = j + 1
            while end < n_c and colour(float(values[i, end])) == fill:
                end += 1
            parts.append(f'<rect x="{j * cell:.2f}" y="{i * cell:.2f}" width="{(end - j) * cell:.2f}" '
                         f'height="{cell:.2f}" fill="{fill}"/>')
            j = end
    parts.append("</g>")
    if marked is not None and marked.any():
        d = cell * 0.3
        path = "".join(f"M{(j + 0.5) * cell - d:.1f} {(i + 0.5) * cell - d:.1f}l{2 * d:.1f} {2 * d:.1f}"
                       f"m0 {-2 * d:.1f}l{-2 * d:.1f} {2 * d:.1f}" for i, j in np.argwhere(marked))
        parts.append(f'<path d="{path}" stroke="#fff" stroke-width="{max(0.5, cell * 0.12):.2f}"/>')
    for axis, at, kind in lines:
        x1, y1, x2, y2 = (0, at * cell, width, at * cell) if axis == "row" else \
            (at * cell, 0, at * cell, height)
        parts.append(f'<line x1="{x1:.2f}" y1="{y1:.2f}" x2="{x2:.2f}" y2="{y2:.2f}" {LINE_STYLE[kind]}/>')
    parts.append(f'<rect x="0" y="0" width="{width:.2f}" height="{height:.2f}" fill="none" stroke="#444" '
                 'stroke-width="0.5"/></svg>')
    return "".join(parts)


def _figure(title: str, svg: str, legend: str) -> str:
    return f"<figure><figcaption><b>{_e(title)}</b></figcaption>{svg}{legend}</figure>"


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> str:
    t = min(1.0, max(0.0, t))
    t = round(t * LEVELS) / LEVELS
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b, strict=True))


WHITE, BLUE, ORANGE, RED, DARK = (255, 255, 255), (44, 123, 182), (253, 174, 97), (165, 0, 38), (64, 0, 16)
NOT_COMPARED, NAN, INF = "#d9d9d9", "#e7298a", "#000000"


def _ratio_colour(x: float) -> str:
    """Within the allowance white to blue; over it orange to red, a decade a quarter of the way
    (1 to 10⁴); inf dark; a row not compared grey."""
    if math.isnan(x):
        return NOT_COMPARED
    if math.isinf(x):
        return _mix(DARK, DARK, 0)
    if x <= 1:
        return _mix(WHITE, BLUE, x)
    return _mix(ORANGE, RED, math.log10(x) / 4)


def _value_colour(x: float, top: float) -> str:
    """Blue (negative) through white (0) to red (positive), ±``top`` the ends; NaN pink, ±inf black."""
    if math.isnan(x):
        return NAN
    if math.isinf(x):
        return INF
    t = 0.0 if top == 0 else x / top
    return _mix(WHITE, RED, t) if t >= 0 else _mix(WHITE, BLUE, -t)


def _swatches(items: list[tuple[str, str]]) -> str:
    """A legend: a row of colour swatches with their words (wrapping within its figure)."""
    cells = "".join(f'<span style="display:inline-block;margin-right:8px"><span style="display:inline-block;'
                    f'width:12px;height:12px;background:{fill};border:1px solid #888;vertical-align:middle">'
                    f"</span> {_e(text)}</span>" for fill, text in items)
    return f'<div style="font-size:12px;max-width:{MAP_PX}px">{cells}</div>'


def _ratio_legend() -> str:
    steps = [(0.0, "0"), (0.5, "0.5"), (1.0, "1 (allowed)"), (10.0, "10"), (1e4, "≥ 10⁴"), (math.inf, "inf")]
    return _swatches([(_ratio_colour(x), text) for x, text in steps]
                     + [(NOT_COMPARED, "not compared"), ("#888", "× over the allowance")]) + _lines_legend()


def _value_legend(top: float) -> str:
    return _swatches([(_value_colour(-top, top), f"{-top:.3g}"), (_value_colour(0.0, top), "0"),
                      (_value_colour(top, top), f"{top:.3g}"), (NAN, "NaN"), (INF, "±inf")])


def _lines_legend() -> str:
    kinds = [("t16", "16"), ("t64", "64"), ("t128", "128"), ("limit", "declared limit")]
    items = "".join(f'<svg width="22" height="10" style="display:inline;vertical-align:middle">'
                    f'<line x1="0" y1="5" x2="22" y2="5" {LINE_STYLE[k]}/></svg> {_e(text)} '
                    for k, text in kinds)
    return f'<div style="font-size:12px;max-width:{MAP_PX}px">lines: {items}</div>'
