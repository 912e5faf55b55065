"""``python -m calc``: parameter ledgers and n² cost tables of a model.

    python -m calc MODEL [--format table|github|latex|csv|json] [--seq N ...] [--dtype fp32|fp16|bf16|fp8]
                         [--peak-tflops T] [--bandwidth-gbs G] [--width COLUMNS]
                         [--train [--micro-batch B] [--tp T] [--no-sequence-parallel] [--dp N] [--zero 0-3]
                                  [--train-precision P]]
                         [--gpu-memory SIZE | --gpu NAME] [--weight-dtype D] [--batch B]
    python -m calc path/to/config.json [table options]      (a Hugging Face config.json, read from disk)
        table options also: --kinds (the cost per layer kind alone), --plot FILE.png (it, drawn over n)
    python -m calc compare MODEL MODEL ... [--seq N ...] [--dtype D] [--format F] [--plot FILE.png]
                           [--gpu-memory SIZE | --gpu NAME] [--weight-dtype D] [--batch B]
    python -m calc custom --d-model D --n-heads H --n-layers L [--d-head K] [--n-kv-heads G] [--d-ff F]
                          [--vocab V] [--n-ctx N] [--arch gpt|llama] [--tied|--untied] [table options]
    python -m calc --list
    python -m calc formulas

Exit status 0 on success; 2 on a usage error, with one line on stderr naming the argument. A --seq
past a model's trained context is answered, with a warning on stderr (and in the JSON's ``warnings``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import sys
import warnings as warnings_module
from collections.abc import Sequence
from typing import Any

from calc import costs
from calc.config import Config
from calc.derivations import formulas_text
from calc.hf import SUPPORTED, InertKeyWarning, load
from calc.ledger import checkpoint
from calc.presets import ARCHS, PRESETS, ConfigError, UnknownModel, custom, preset
from calc.report import DEFAULT_WIDTH, FORMATS, build, fit, render, wrap
from calc.serving import GPUS, parse_size
from calc.training import PRECISIONS, ZERO_STAGES
from cmdline import Parser, UsageError, fail, int_at_least, positive_number

FLAGS = {"vocab_size": "--vocab", "tied_embeddings": "--tied/--untied"}


positive_int = int_at_least(1, lead="must be")
positive_float = positive_number("must be a positive finite number", unparsed="must be a positive number")


def size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def width(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of columns, got {text!r}") from None
    if value != 0 and value < 40:
        raise argparse.ArgumentTypeError(f"must be 0 (no wrapping) or at least 40 columns, got {text!r}")
    return value


def _serving_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("serving memory: weights, KV cache, largest batch and context")
    device = group.add_mutually_exclusive_group()
    device.add_argument("--gpu-memory", type=size, metavar="SIZE",
                        help="memory of one device, with a unit: 80GiB, 141GB (GB = 10^9, GiB = 2^30 bytes)")
    device.add_argument("--gpu", choices=tuple(GPUS), help="a device, with its datasheet's memory")
    group.add_argument("--weight-dtype", choices=tuple(costs.DTYPE_BYTES),
                       help="value type of the served weights (default: bf16)")
    group.add_argument("--batch", type=positive_int, metavar="B",
                       help="sequences prefilled and decoded together in the serving time table (default: 1)")


def _table_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--seq", type=positive_int, nargs="+", metavar="N",
                        help="sequence lengths (default: 1,024 doubling to 4·n_ctx)")
    parser.add_argument("--dtype", choices=tuple(costs.DTYPE_BYTES), default="bf16",
                        help="value type of the KV cache and time tables (default: bf16)")
    parser.add_argument("--peak-tflops", type=positive_float,
                        help="peak TFLOP/s of the time tables (default: --gpu's datasheet figure, else "
                        f"{costs.DEFAULT_PEAK_TFLOPS:g}, an H100 SXM5's dense BF16)")
    parser.add_argument("--bandwidth-gbs", type=positive_float,
                        help="memory GB/s, 10^9 bytes (default: --gpu's datasheet figure, else "
                        f"{costs.DEFAULT_BANDWIDTH_GBS:g})")
    parser.add_argument("--width", type=width, metavar="COLUMNS",
                        help=f"widest line of the table format (default: the terminal's, {DEFAULT_WIDTH} "
                        "when stdout is not a terminal; 0: no wrapping)")
    parser.add_argument("--kinds", action="store_true",
                        help="show only the cost per layer kind (calc.kinds), for any model")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also draw each layer kind's prefill FLOPs and memory against n, up to the "
                        "largest --seq and 4·n_ctx, with the n where one kind overtakes another (needs "
                        "matplotlib: the 'plot' extra)")
    group = parser.add_argument_group("training memory (Korthikanti et al. 2022; ZeRO)")
    group.add_argument("--train", action="store_true", help="add training memory over the sequence lengths")
    group.add_argument("--micro-batch", type=positive_int, metavar="B",
                       help="sequences per step (default: 1)")
    group.add_argument("--tp", type=positive_int, metavar="T", help="tensor-parallel degree (default: 1)")
    group.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_const", const=False,
                       help="tensor parallelism without sequence parallelism: LayerNorm and dropout "
                       "activations stay whole on every device (default: sequence parallelism on)")
    group.add_argument("--dp", type=positive_int, metavar="N", help="data-parallel devices (default: 1)")
    group.add_argument("--zero", type=int, choices=ZERO_STAGES, help="ZeRO stage (default: 0)")
    group.add_argument("--train-precision", choices=tuple(PRECISIONS),
                       help="weights, gradients and Adam: mixed (2 + 2 + 12 bytes), bf16, fp32 "
                       "(default: mixed)")
    _serving_options(parser)


TRAIN_FLAGS = {"micro_batch": "--micro-batch", "tp": "--tp", "sequence_parallel": "--no-sequence-parallel",
               "dp": "--dp", "zero": "--zero", "train_precision": "--train-precision"}


def train_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """calc.training's options from the flags (None without --train; a training flag alone is an error)."""
    given = {key: getattr(args, key) for key in TRAIN_FLAGS if getattr(args, key) is not None}
    if not args.train:
        if given:
            raise UsageError(f"{TRAIN_FLAGS[next(iter(given))]} needs --train")
        return None
    options = {"precision": given.pop("train_precision", "mixed"), **given}
    if options.get("zero") and options.get("dp", 1) == 1:
        raise UsageError(f"--zero {options['zero']} partitions over data-parallel devices: give --dp N > 1")
    return options


def roofline_options(args: argparse.Namespace) -> tuple[float, float]:
    """Peak TFLOP/s and GB/s of the time tables: the flags, else --gpu's datasheet, else an H100's."""
    device = GPUS[args.gpu] if getattr(args, "gpu", None) else None
    peak = getattr(args, "peak_tflops", None) or (device.peak_tflops if device else costs.DEFAULT_PEAK_TFLOPS)
    bandwidth = getattr(args, "bandwidth_gbs", None) or (
        device.bandwidth_gbs if device else costs.DEFAULT_BANDWIDTH_GBS)
    return peak, bandwidth


def serve_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """calc.serving's options from the flags (None without --gpu-memory or --gpu)."""
    if args.gpu_memory is None and args.gpu is None:
        for flag in ("weight_dtype", "batch"):
            if getattr(args, flag, None) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} needs --gpu-memory or --gpu")
        return None
    memory, device = (GPUS[args.gpu].memory, GPUS[args.gpu].label) if args.gpu else (args.gpu_memory,
                                                                                    "one device")
    peak, bandwidth = roofline_options(args)
    return {"memory": memory, "device": device, "weight_dtype": args.weight_dtype or "bf16",
            "peak_tflops": peak, "bandwidth_gbs": bandwidth, "batch": getattr(args, "batch", None) or 1}


def terminal_width(args: argparse.Namespace) -> int:
    """--width, else the terminal's columns, else DEFAULT_WIDTH (output to a file or a pipe)."""
    if args.width is not None:
        return int(args.width)
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else DEFAULT_WIDTH


def model_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m calc", description="Parameter ledgers and n² attention costs of a "
                    "model. Also: 'python -m calc custom --help', 'python -m calc formulas'.")
    parser.add_argument("model", nargs="?", help="a preset name (see --list) or a config.json path")
    parser.add_argument("--list", action="store_true", help="list the presets and their sources")
    _table_options(parser)
    return parser


def custom_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m calc custom", description="A config given by flags.")
    parser.add_argument("--d-model", type=positive_int, required=True, help="model width d")
    parser.add_argument("--n-heads", type=positive_int, required=True, help="query heads h")
    parser.add_argument("--n-layers", type=positive_int, required=True, help="layers L")
    parser.add_argument("--d-head", type=positive_int, help="head width d_k (default: d/h)")
    parser.add_argument("--n-kv-heads", type=positive_int, help="key/value heads g (default: h)")
    parser.add_argument("--d-ff", type=positive_int, help="MLP width (default: 4d gpt, Llama's 8d/3 rule)")
    parser.add_argument("--vocab", type=positive_int, help="vocabulary (default: 50,257 gpt, 32,000 llama)")
    parser.add_argument("--n-ctx", type=positive_int, help="context length (default: 1,024 gpt, 4,096 llama)")
    parser.add_argument("--arch", choices=ARCHS, default="gpt", help="checkpoint layout (default: gpt)")
    tie = parser.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=None, help="tie (default for gpt)")
    tie.add_argument("--untied", dest="tied", action="store_false", help="untie (default for llama)")
    _table_options(parser)
    return parser


def compare_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m calc compare", description="Models side by side: parameters, active "
                    "parameters, attention share, KV cache and FLOPs per token.")
    parser.add_argument("models", nargs="+", metavar="MODEL", help="preset names or config.json paths")
    parser.add_argument("--seq", type=positive_int, nargs="+", metavar="N",
                        help="context lengths for every model: the first for every row, each for the rows "
                        "per layer kind (default: each model's n_ctx)")
    parser.add_argument("--dtype", choices=tuple(costs.DTYPE_BYTES), default="bf16",
                        help="value type of the KV cache (default: bf16)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--plot", metavar="FILE.png", help="also write the KV cache and training activations "
                        "against context length (needs matplotlib: the 'plot' extra)")
    parser.add_argument("--width", type=width, metavar="COLUMNS",
                        help=f"widest line of the table format (default: the terminal's, {DEFAULT_WIDTH} "
                        "when stdout is not a terminal; 0: no wrapping)")
    _serving_options(parser)
    return parser


def is_path(name: str) -> bool:
    """A MODEL argument that names a file rather than a preset."""
    return name.endswith(".json") or os.sep in name or os.path.isfile(name)


def resolve(name: str) -> Config:
    """The preset called ``name`` or the config.json at that path; errors as UsageError/UnknownModel."""
    if not is_path(name):
        return preset(name)
    try:
        return load(name)
    except ConfigError as err:
        raise UsageError(f"{name}: {err}") from None


def check_plot(path: str) -> None:
    """--plot's file can be written: its folder exists and matplotlib is installed (else a UsageError)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--plot: folder {folder} does not exist")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'attention-spec[plot]'") from None


def run_compare(argv: Sequence[str]) -> tuple[str, list[str]]:
    from calc import compare

    args = compare_parser().parse_args(argv)
    configs = [resolve(name) for name in args.models]
    serve = serve_options(args)
    if args.plot:
        check_plot(args.plot)
    first, *more = args.seq or [None]
    columns = [compare.figures(c, n=first, dtype=args.dtype, serve=serve, seqs=more) for c in configs]
    if len(configs) > 1:
        n_max = max([*(args.seq or ()), *(4 * c.n_ctx for c in configs)])
        for column, found in zip(columns, compare.overtakes(configs, args.dtype, n_max), strict=True):
            column["cost_overtakes"] = found
    text = compare.render(columns, args.format, width=terminal_width(args))
    if args.plot:
        compare.plot(configs, args.plot, dtype=args.dtype, n_max=max(args.seq) if args.seq else None)
        if args.format == "table":
            text += f"\n\nplot: {args.plot}"
    return text, [w for c in columns for w in c["warnings"]]


def list_presets(fmt: str, width: int | None = None) -> str:
    """The presets as a table (the table format: sources wrapped to fit ``width``), CSV or JSON."""
    rows = [
        {"name": c.name, "arch": c.arch, "n_layers": c.n_layers, "d_model": c.d_model, "n_heads": c.n_heads,
         "d_head": c.d_head, "n_kv_heads": c.n_kv_heads, "params": checkpoint(c)["total"], "source": c.source}
        for c in PRESETS.values()
    ]
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    from tabulate import tabulate

    tablefmt = {"table": "simple", "github": "github", "latex": "latex"}[fmt]
    cells = [(str(r["name"]), str(r["arch"]), str(r["n_layers"]), f"{r['d_model']:,}", str(r["n_heads"]),
              str(r["d_head"]), str(r["n_kv_heads"]), f"{r['params']:,}", str(r["source"])) for r in rows]
    headers = ("name", "arch", "L", "d", "h", "d_k", "g", "parameters", "source")
    width = width if fmt == "table" else None
    sources = max(len(c[-1]) for c in cells)  # the source column takes what the others leave (≥ 20)
    while True:
        table = tabulate(cells, headers=headers, tablefmt=tablefmt, disable_numparse=True,
                         maxcolwidths=[None] * 8 + [sources])
        over = max(map(len, table.splitlines())) - (width or 10**9)
        if over <= 0:
            break
        if sources == 20:  # too narrow for a source column beside the others: sources in a table of their own
            names = max(len(c[0]) for c in cells)
            table = fit([c[:-1] for c in cells], headers[:-1], width) + "\n\n" + tabulate(
                [(c[0], c[-1]) for c in cells], headers=("name", "source"), tablefmt=tablefmt,
                disable_numparse=True, maxcolwidths=[None, max(10, (width or 0) - names - 2)])
            break
        sources = max(20, sources - over)
    note = ("'gpt3-175b' is 'gpt3'. Parameters: the checkpoint count. Any config.json of model_type "
            f"{', '.join(SUPPORTED)} also works: python -m calc path/to/config.json")
    return table + "\n\n" + "\n".join(wrap(note, width))


def run(argv: Sequence[str]) -> tuple[str, list[str]]:
    """The text ``python -m calc *argv`` prints and the warnings it gives; raises UsageError,
    ConfigError or UnknownModel."""
    if argv[:1] == ["formulas"]:
        parser = Parser(prog="python -m calc formulas", description="Every formula and the two derivations.")
        parser.add_argument("--width", type=width, metavar="COLUMNS",
                            help=f"widest line (default: the terminal's, {DEFAULT_WIDTH} when stdout is not "
                            "a terminal; 0: no wrapping)")
        return formulas_text(width=terminal_width(parser.parse_args(argv[1:]))), []
    if argv[:1] == ["compare"]:
        return run_compare(argv[1:])
    if argv[:1] == ["custom"]:
        args = custom_parser().parse_args(argv[1:])
        config = custom(
            d_model=args.d_model, n_heads=args.n_heads, n_layers=args.n_layers, d_head=args.d_head,
            n_kv_heads=args.n_kv_heads, d_ff=args.d_ff, vocab_size=args.vocab, n_ctx=args.n_ctx,
            arch=args.arch, tied_embeddings=args.tied,
        )
    else:
        args = model_parser().parse_args(argv)
        if args.list:
            if args.model is not None:
                raise UsageError(f"--list takes no MODEL, got {args.model!r}")
            return list_presets(args.format, terminal_width(args)), []
        if args.model is None:
            raise UsageError("give a MODEL (see --list), a config.json, 'custom ...', 'compare ...' or "
                             "'formulas'")
        config = resolve(args.model)
    peak, bandwidth = roofline_options(args)
    if args.plot:
        check_plot(args.plot)
    report = build(config, seqs=args.seq, dtype=args.dtype, peak_tflops=peak, bandwidth_gbs=bandwidth,
                   train=train_options(args), serve=serve_options(args))
    text = render(report, args.format, width=terminal_width(args), kinds_only=args.kinds)
    if args.plot:
        from calc import kinds

        cost = report["cost_by_kind"]
        kinds.plot(config, args.plot, n_max=max([*(args.seq or ()), 4 * config.n_ctx]),
                   dtype_bytes=cost["bytes_per_value"], dtype=args.dtype, block=cost["tile_side"])
        if args.format == "table":
            text += f"\n\nplot: {args.plot}"
    return text, report["warnings"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; 0 on success, 2 (and one line on stderr) on bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with warnings_module.catch_warnings():
            # the report names ignored keys in its own warnings, printed below: not a second time
            warnings_module.simplefilter("ignore", InertKeyWarning)
            text, warnings = run(argv)
    except SystemExit as done:  # --help
        return int(done.code or 0)
    except UsageError as err:
        return fail("python -m calc", str(err))
    except UnknownModel as err:
        return fail("python -m calc", str(err.args[0]))
    except ConfigError as err:
        flag = FLAGS.get(err.field, "--" + err.field.replace("_", "-"))
        return fail("python -m calc", f"{flag}: {err.message}")
    for warning in warnings:
        print(f"python -m calc: warning: {warning}", file=sys.stderr)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `python -m calc gpt3 | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0

