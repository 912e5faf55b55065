"""``python -m calc compare MODEL MODEL ...``: the figures people compare, side by side.

Each column is a model (a preset or a config.json); each row one of ``ROWS``, computed by the same
ledgers and cost functions as a single model's report: parameters, the KV cache, FLOPs, training
memory at n (mixed-precision Adam, micro-batch 1, one device) and, with a device's memory, the largest
batch it serves. ``--plot`` draws the KV cache and the training activations against the context length
for every model (matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from sympy import Rational

from calc import costs, ledger
from calc.config import Config
from calc.report import binary_bytes, config_warnings, cost_by_kind, count, fit, percent, si, wrap
from calc.training import training

ROWS = (
    ("params_total", "parameters (checkpoint)"),
    ("params_active", "active per token"),
    ("attention_share", "attention share (source ledger)"),
    ("n_tokens", "context n"),
    ("kv_bytes_per_token", "KV cache per token"),
    ("kv_bytes_at_n", "KV cache at n"),
    ("forward_flops_per_token", "forward FLOPs per token at n (PaLM)"),
    ("train_states", "training: weights, gradients, Adam (16 B/param)"),
    ("train_activations", "training: activations at n, batch 1"),
    ("train_quadratic_share", "training: n² share of activations"),
    ("train_flash", "training: activations, FlashAttention"),
    ("train_derived_eager", "training: derived per layer kind, eager"),
    ("train_derived_flash", "training: derived per layer kind, Flash"),
)
SERVING_ROWS = (
    ("serve_weights", "serving: weights, one device"),
    ("serve_batch", "serving: batch at n, one device"),
    ("serve_prefill_s", "serving: prefill of n tokens"),
    ("serve_decode_s", "serving: decode step at n"),
    ("serve_tokens_per_s", "serving: tokens/s at n"),
)


def figures(config: Config, *, n: int | None = None, dtype: str = "bf16",
            serve: dict[str, Any] | None = None, seqs: Sequence[int] = ()) -> dict[str, Any]:
    """One column: exact numbers for ``config`` at context ``n`` (default: its own n_ctx); with ``serve``
    (calc.serving's memory, device and weight_dtype), what one device of that memory serves at n; and each
    layer kind's costs (calc.kinds) at n and at ``seqs``."""
    warnings = config_warnings(config, [] if n is None else [n, *seqs])
    n = n or config.n_ctx
    kv = costs.kv_cache(config, [n], dtype)
    (per_token,) = costs.forward_flops_per_token(config, [n])
    train = training(config, [n])
    (row,) = train["rows"]
    column = {
        "model": config.name,
        "params_total": ledger.checkpoint(config)["total"],
        "params_active": ledger.active(config),
        "attention_share": ledger.source_ledger(config)["attention_share"],
        "n_tokens": n,
        "dtype": dtype,
        "kv_bytes_per_token": kv["bytes_per_token"],
        "kv_bytes_at_n": kv["rows"][0]["bytes"],
        "forward_flops_per_token": per_token["palm"],
        "train_states": train["model_states"]["total"],
        "train_activations": row["activations"],
        "train_quadratic_share": row["quadratic_share"],
        "train_flash": row["flash"],
        "train_derived_eager": row["derived_eager"],  # None where calc.activations does not cover the type
        "train_derived_flash": row["derived_flash"],
        # each layer kind's prefill, scores, cache and decode step over its layers at n and --seq's others
        "cost_by_kind": cost_by_kind(config, list(dict.fromkeys([n, *seqs])), dtype),
        "warnings": warnings,
    }
    if serve is not None:
        from calc.serving import serving, serving_time

        memory = {k: v for k, v in serve.items() if k in ("memory", "device", "weight_dtype")}
        one = serving(config, kv_dtype=dtype, n=n, **memory)
        tp1 = one["rows"][0]
        (time,) = serving_time(config, [n], peak_tflops=serve["peak_tflops"],
                               bandwidth_gbs=serve["bandwidth_gbs"], batch=serve.get("batch", 1),
                               kv_dtype=dtype, weight_dtype=one["weight_dtype"])["rows"]
        column.update(device=one["device"], memory=one["memory"], weight_dtype=one["weight_dtype"],
                      peak_tflops=serve["peak_tflops"], bandwidth_gbs=serve["bandwidth_gbs"],
                      serve_time_batch=serve.get("batch", 1), serve_weights=tp1.get("weights"),
                      serve_batch=tp1.get("batch"),  # None: does not fit
                      serve_prefill_s=(time["prefill_s"], time["prefill_bound"]),
                      serve_decode_s=(time["decode_s"], time["decode_bound"]),
                      serve_tokens_per_s=time["tokens_per_s"])
    return column


# The per-kind rows: each figure summed over the model's kinds at each n, and each kind's prefill FLOPs.
KIND_ROWS = (("prefill_flops", "prefill FLOPs"), ("decode_flops", "decode step FLOPs"),
             ("cache_bytes", "cache"), ("score_bytes_naive", "scores, naive"))


def kind_rows(columns: Sequence[dict[str, Any]]) -> list[tuple[str, str, list[Any]]]:
    """(key, label, one value per column or None) for the per-kind rows: at each n of the first column, each
    total of KIND_ROWS, then each kind's prefill FLOPs (None where a model has no layer of that kind)."""
    lengths = [r["n_tokens"] for r in columns[0]["cost_by_kind"]["rows"]]
    kinds = list(dict.fromkeys(k for c in columns for k in c["cost_by_kind"]["layers"]))
    out = []
    for i, n in enumerate(lengths):
        at = [c["cost_by_kind"]["rows"][i] if i < len(c["cost_by_kind"]["rows"]) else None for c in columns]
        where = f"at {count(n)}" if all(r is not None and r["n_tokens"] == n for r in at) else f"row {i + 1}"
        for metric, label in KIND_ROWS:
            out.append((f"{metric}@{n}", f"mixing {where}: {label}",
                        [None if r is None else r["total"][metric] for r in at]))
        for kind in kinds:
            out.append((f"prefill_flops@{n}:{kind}", f"  prefill FLOPs, {kind}",
                        [None if r is None or kind not in r["kinds"] else r["kinds"][kind]["prefill_flops"]
                         for r in at]))
    return out


def overtakes(configs: Sequence[Config], dtype: str, n_max: int) -> list[list[dict[str, Any]]]:
    """For each model, the n where its summed prefill FLOPs overtake another model's (``model``, ``metric``,
    ``n_tokens``), up to n_max: where the other's layer kinds start to pay."""
    from calc import kinds

    size = costs.DTYPE_BYTES[dtype]

    def total(config: Config) -> Any:
        return lambda n: kinds.by_kind(config, [n], dtype_bytes=size)[0]["total"]["prefill_flops"]

    return [[{"model": other.name, "metric": "prefill_flops", "n_tokens": found}
             for other in configs if other is not config
             and (found := kinds.crossover(total(config), total(other), n_max)) is not None]
            for config in configs]


def _human(key: str, value: Any) -> str:
    if key in ("attention_share", "train_quadratic_share"):
        return percent(value)
    if key.startswith("kv_bytes"):
        return f"{binary_bytes(value)} ({count(value)} B)"
    if key.startswith(("train_", "serve_weights")):
        return binary_bytes(value)
    if key == "forward_flops_per_token":
        return si(value, "FLOP")
    if key in ("serve_prefill_s", "serve_decode_s"):
        return f"{si(value[0], 's')} ({value[1]})"
    if key == "serve_tokens_per_s":
        return f"{value:,.1f}"
    return count(value)


def render(columns: Sequence[dict[str, Any]], fmt: str = "table", *, width: int | None = None) -> str:
    """The comparison in one of the report formats (csv and json exact); ``table`` fits ``width``."""
    rows_shown = (*ROWS, *(SERVING_ROWS if "serve_batch" in columns[0] else ()))
    if fmt == "json":
        return json.dumps([{k: float(v) if isinstance(v, Rational) else v for k, v in c.items()}
                           for c in columns], indent=2)  # a step's time: [seconds, "compute" | "memory"]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["quantity", *(c["model"] for c in columns)])
        for key, _ in rows_shown:
            values = (float(c[key]) if isinstance(c[key], Rational)
                      else c[key][0] if isinstance(c[key], tuple) else c[key] for c in columns)
            writer.writerow([key, *values])
        for key, _, kind_values in kind_rows(columns):
            writer.writerow([key, *("" if v is None else v for v in kind_values)])
        return out.getvalue().rstrip("\n")
    tablefmt = {"table": "simple", "github": "github", "latex": "latex"}[fmt]
    missing = {"serve_weights": "does not fit", "serve_batch": "does not fit"}
    rows = [(label, *(missing.get(key, "not derived") if c[key] is None else _human(key, c[key])
                      for c in columns))
            for key, label in rows_shown]
    rows += [(label, *("-" if v is None else si(v, "FLOP") if "flops" in key else binary_bytes(v)
                       for v in values))
             for key, label, values in kind_rows(columns)]
    width = width if fmt == "table" else None
    table = fit(rows, ("", *(c["model"] for c in columns)), width, tablefmt)
    note = (f"KV cache in {columns[0]['dtype']} ({costs.DTYPE_BYTES[columns[0]['dtype']]} bytes a value), "
            "MiB = 2^20 bytes, GiB = 2^30 bytes; sliding windows cap it, MLA caches its latent. Active: "
            "the parameters a token uses (MoE: k_E routed experts, both embedding tables counted). FLOPs: "
            "2N (N active, non-embedding) + the attention a token at n does, a multiply-add = 2. Training: "
            "mixed-precision Adam on one device; activations n·d·(34 + 5·h·n/d) bytes a layer (Korthikanti "
            "et al. 2022, every layer counted as full attention), FlashAttention keeps 34·n·d and each row's "
            "logsumexp; derived per layer kind: what transformers' layers and the loss keep in bf16, checked "
            "against PyTorch (calc.activations; not derived for the types it does not cover).")
    note += (" Mixing: calc.kinds' sequence mixing of one sequence summed over the layer kinds (QKᵀ and AV "
             "of the keys a query sees, a sparse layer's indexer, a linear or Mamba layer's state; "
             "projections are in the FLOPs per token); the cache in the KV cache's dtype, naive scores every "
             "head's at once (an indexer's in FP8); each kind's prefill below its totals.")
    found = [f"{c['model']}'s prefill FLOPs overtake {o['model']}'s at n = {count(o['n_tokens'])}"
             for c in columns for o in c.get("cost_overtakes", ())]
    if found:
        note += " " + "; ".join(found) + "."
    if "serve_batch" in columns[0]:
        note += (f" Serving: {columns[0]['device']}, {binary_bytes(columns[0]['memory'])}, weights in "
                 f"{columns[0]['weight_dtype']}, no tensor parallelism; the largest batch of n-token "
                 "sequences whose cache fits beside the weights; prefill and decode of a batch of "
                 f"{columns[0]['serve_time_batch']} as rooflines at {columns[0]['peak_tflops']:g} TFLOP/s "
                 f"and {columns[0]['bandwidth_gbs']:g} GB/s (weights read once a step, the KV cache at n).")
    prefix = "% " if fmt == "latex" else ""
    return table + "\n\n" + "\n".join(prefix + line for line in wrap(note, width))


def plot(configs: Sequence[Config], path: str, *, dtype: str = "bf16", n_max: int | None = None) -> None:
    """Against context length (log2), for each model, into ``path``: the KV cache (GiB, log scale) and
    the training activations of all layers at batch 1, stored whole (solid) and with FlashAttention
    (dashed), whose gap is the n² term."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = n_max or max(c.n_ctx for c in configs)
    seqs = [2**k for k in range(8, top.bit_length()) if 2**k <= top] + ([top] if top & (top - 1) else [])
    fig, (kv_ax, train_ax) = plt.subplots(1, 2, figsize=(11, 4.4))
    for config in configs:
        rows = costs.kv_cache(config, seqs, dtype)["rows"]
        line, = kv_ax.plot([r["n_tokens"] for r in rows], [r["bytes"] / 2**30 for r in rows], marker=".",
                           label=config.name)
        act = training(config, seqs)["rows"]
        train_ax.plot(seqs, [r["activations"] / 2**30 for r in act], color=line.get_color(),
                      label=config.name)
        train_ax.plot(seqs, [r["flash"] / 2**30 for r in act], color=line.get_color(), linestyle="--")
    for ax in (kv_ax, train_ax):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length n (tokens)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    kv_ax.set_ylabel(f"KV cache, GiB ({dtype}, batch 1)")
    kv_ax.set_title("KV cache against context length")
    train_ax.set_ylabel("training activations, GiB (all layers, batch 1)")
    train_ax.set_title("Activations: stored (solid), FlashAttention (dashed)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
