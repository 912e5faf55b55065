"""The record as text and as a Markdown page for the docs, and the line profile as a table.

``--markdown FILE`` writes the report with its command, date and machine, for the docs
(``python -m impl.bench --markdown docs/bench_results.md``): figures there are regenerated, never
edited by hand. ``--from-json FILE`` renders a stored record again (text, ``--markdown``,
``--plot``) without timing anything, for a change of the page's layout.
"""

from __future__ import annotations

import itertools
import os
import shlex
from collections.abc import Sequence
from typing import Any

from impl.bench.calls import PEERS, Path

MIB = 1 << 20


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _ms(seconds: float | None) -> str:
    return _fmt(None if seconds is None else seconds * 1e3, ".1f")


def _describe(name: str, path: Path) -> str:
    """One line: the path an implementation took."""
    extra = [f"{key} {path[key]}" for key in ("backend", "autograd_node", "device", "jit", "grad")
             if key in path]
    fused = "fused (no n × n pattern)" if path["fused"] else "not fused"
    head = f"{name}: {path['version']}; {path['input_ndim']}-D {path['layout']}; threads: {path['threads']}"
    return "; ".join([head, *extra, fused])


def loads(values: Sequence[float]) -> str:
    return " ".join(f"{x:.2f}" for x in values)


def format_report(record: dict[str, Any]) -> str:
    """The record as text: the time, ratio, growth and rate/memory tables, the notes, the paths, the load."""
    heading, tables, notes, paths = _report_parts(record)
    return "\n".join([heading, "", *tables, *notes[:3], "paths:", *(f"  {p}" for p in paths), *notes[3:]])


def _report_parts(record: dict[str, Any]) -> tuple[str, list[str], list[str], list[str]]:
    """The report's pieces, for text and Markdown alike: its one-line heading, the four tables
    (times, ratios, growth per doubling, rates and memory; each followed by an empty line), the
    notes (the floor, the ratios, memory, each size not run, the machine) and the path each
    implementation took."""
    from tabulate import tabulate

    config, names = record["config"], record["config"]["implementations"]
    peers = [name for name in PEERS if name in names]
    by = {(r["implementation"], r["n_tokens"]): r for r in record["results"]}
    floor = {f["n_tokens"]: f["time_s"] for f in record["floor"]}
    pairs = {p["n_tokens"]: p for p in record["paired"]}
    traced = [name for name in names if name not in PEERS]
    time_rows, ratio_rows, growth_rows, rate_rows = [], [], [], []
    for n in config["sizes"]:
        time_rows.append([n, *(_ms(by[name, n]["time_s"]) for name in names), _ms(floor[n])])
        ratio = [n] + [_fmt(pairs[n][f"flash_over_{peer}"], ".2f") for peer in peers]
        ratio += [_fmt(pairs[n]["flash_over_floor"], ".2f")]
        ratio += [_fmt(pairs[n][f"{peer}_over_floor"], ".2f") for peer in peers]
        ratio_rows.append(ratio)
        growth_rows.append([n, *(_fmt(by[name, n]["ratio"], ".2f") for name in names)])
        rate = [n] + [_fmt(by[name, n]["gflops"], ".1f") for name in names]
        rate += [_fmt(None if by[name, n]["peak_bytes"] is None else by[name, n]["peak_bytes"] / MIB, ".1f")
                 for name in traced]
        rate_rows.append(rate)
    # four narrow tables rather than one of 15 columns, which a 1280 px page cut after the tenth
    time_head = ["n", *(f"{x} ms" for x in names), "floor ms"]
    ratio_head = ["n", *(f"flash/{peer}" for peer in peers), "flash/floor"]
    ratio_head += [f"{peer}/floor" for peer in peers]
    growth_head = ["n", *(f"{x} ×/2n" for x in names)]
    rate_head = ["n", *(f"{x} GFLOP/s" for x in names), *(f"{x} MiB" for x in traced)]
    mask = "causal" if config["causal"] else "no mask"
    what = "backward (dq, dk, dv)" if config.get("mode") == "backward" else "forward"
    machine = record["machine"]
    kernels = ", ".join(f"{b['internal_api']} {b['version']} ({b['architecture']} kernels, "
                        f"{b['num_threads']} threads)" for b in machine.get("blas_runtime", []))
    heading = (f"{what}, one head, float32, d_k = {config['d_k']}, d_v = {config['d_v']}, {mask}; "
               f"median of {config['repeat']} interleaved samples")
    shown = ((time_rows, time_head), (ratio_rows, ratio_head), (growth_rows, growth_head),
             (rate_rows, rate_head))
    tables = [part for rows, head in shown
              for part in (tabulate(rows, head, tablefmt="github", disable_numparse=True), "")]
    notes = [
        f"floor: useful FLOPs at the rate of a {record['sgemm']['size']}³ float32 sgemm timed before "
        f"each size (median {record['sgemm']['gflops']:.1f} GFLOP/s, {machine['blas']}"
        + (f"; {kernels}" if kernels else "") + ")",
        *_tile_note(record.get("tile_products") or []),
        "x/y columns: median over rounds of the ratio of back-to-back samples",
        f"memory: {record['memory_method']}; MiB = 2²⁰ bytes",
    ]
    paths = [_describe(name, record["paths"][name]) for name in names if name in record["paths"]]
    skipped = [r for r in record["results"] if r["skipped"]]
    notes += [f"{r['implementation']} at {r['n_tokens']}: {r['skipped']}" for r in skipped]
    env = {key: value for key, value in machine["openblas_env"].items() if value is not None}
    notes.append(
        f"{machine['cpu_count']} CPUs; load average before {loads(machine['load_before'])}, "
        f"after {loads(machine['load_after'])}; numpy {machine['numpy']}"
        + (f", torch {machine['torch']} ({machine['torch_threads']} threads)" if machine["torch"] else "")
        + (f", jax {machine['jax']}" if machine.get("jax") else "")
        + (f"; {', '.join(f'{k}={v}' for k, v in env.items())}" if env else "")
    )
    return heading, tables, notes, paths


def _tile_note(products: list[dict[str, Any]]) -> list[str]:
    """The note on the backward tile's products (none for a record without them)."""
    if not products:
        return []
    shown = "; ".join(
        f"{p['name']} {'×'.join(map(str, p['shape']))}: numpy {p['numpy_gflops']:.0f}"
        + (f", torch {p['torch_gflops']:.0f} ({p['torch_gflops'] / p['numpy_gflops']:.2f}×)"
           if p["torch_gflops"] else "")
        for p in products)
    return [f"one backward tile's five products (m×k×n, GFLOP/s on one thread of each library's BLAS): "
            f"{shown}"]


def markdown(record: dict[str, Any], page: str | None = None) -> str:
    """The report as a Markdown page that says how it was made (for docs; regenerate, never edit):
    titled by what was timed, the plot of the same run (the ``--plot`` of its command, linked
    relative to ``page``, the page's own path) above the tables, the notes as a list."""
    heading, tables, notes, paths = _report_parts(record)
    backward = record["config"].get("mode") == "backward"
    image = _plot_of(record)
    figure = []
    if image:
        where = os.path.relpath(image, os.path.dirname(page)) if page else image
        what = "backward" if backward else "forward"
        figure = [f"![{what} time against n, log-log]({where.replace(os.sep, '/')})", ""]
    return "\n".join([
        f"# Benchmark results: {'backward (dq, dk, dv)' if backward else 'forward'}",
        "",
        f"Generated by `{record['command']}` on {record['date']}; regenerate with the same command, "
        "never edit by hand. The figures depend on the machine and its load, both recorded below.",
        "",
        *figure,
        heading,
        "",
        *tables,
        "Notes:",
        "",
        *(f"- {note}" for note in notes),
        "- paths:",
        *(f"    - {path}" for path in paths),
        "",
    ])


def _plot_of(record: dict[str, Any]) -> str | None:
    """The ``--plot FILE`` of the command that made ``record``, or None."""
    words = shlex.split(record["command"])
    return next((after for flag, after in itertools.pairwise(words) if flag == "--plot"), None)


def format_profile(profile: dict[str, Any]) -> str:
    """A `impl.bench.profile_lines` profile as a table, under one line saying what was traced."""
    from tabulate import tabulate

    rows = [[row["line"] or "", f"`{row['source']}`", _fmt(100 * row["share"], ".1f"),
             _fmt(row["ns_per_pair"], ".3f")] for row in profile["lines"]]
    return "\n".join([
        f"{profile['function']}, n = {profile['n_tokens']}: {profile['traced_s'] * 1e3:.1f} ms in the "
        f"traced lines of one thread ({profile['wall_s'] * 1e3:.1f} ms wall with tracing), "
        f"{profile['visible_pairs']} visible pairs",
        "",
        tabulate(rows, ["line", "source", "% time", "ns / visible pair"], tablefmt="github",
                 disable_numparse=True),
    ])
