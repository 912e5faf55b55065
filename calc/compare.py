"""``python -m calc compare MODEL MODEL ...``: the figures people compare, side by side.

Each column is a model (a preset or a config.json); each row one of :data:`ROWS`, computed by the
same ledgers and cost functions as a single model's report. ``--plot`` draws the KV cache against the
context length for every model (matplotlib, the ``plot`` extra).
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
from calc.report import binary_bytes, count, percent, si

ROWS = (
    ("params_total", "parameters (checkpoint)"),
    ("params_active", "active per token"),
    ("attention_share", "attention share (source ledger)"),
    ("n_tokens", "context n"),
    ("kv_bytes_per_token", "KV cache per token"),
    ("kv_bytes_at_n", "KV cache at n"),
    ("forward_flops_per_token", "forward FLOPs per token at n (PaLM)"),
)


def figures(config: Config, *, n: int | None = None, dtype: str = "bf16") -> dict[str, Any]:
    """One column: exact numbers for ``config`` at context ``n`` (default: its own n_ctx)."""
    n = n or config.n_ctx
    kv = costs.kv_cache(config, [n], dtype)
    (per_token,) = costs.forward_flops_per_token(config, [n])
    return {
        "model": config.name,
        "params_total": ledger.checkpoint(config)["total"],
        "params_active": ledger.active(config),
        "attention_share": ledger.source_ledger(config)["attention_share"],
        "n_tokens": n,
        "dtype": dtype,
        "kv_bytes_per_token": kv["bytes_per_token"],
        "kv_bytes_at_n": kv["rows"][0]["bytes"],
        "forward_flops_per_token": per_token["palm"],
    }


def _human(key: str, value: Any) -> str:
    if key == "attention_share":
        return percent(value)
    if key.startswith("kv_bytes"):
        return f"{binary_bytes(value)} ({count(value)} B)"
    if key == "forward_flops_per_token":
        return si(value, "FLOP")
    return count(value)


def render(columns: Sequence[dict[str, Any]], fmt: str = "table") -> str:
    """The comparison in one of the report formats (csv and json exact)."""
    if fmt == "json":
        return json.dumps([{k: float(v) if isinstance(v, Rational) else v for k, v in c.items()}
                           for c in columns], indent=2)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["quantity", *(c["model"] for c in columns)])
        for key, _ in ROWS:
            writer.writerow([key, *(float(c[key]) if key == "attention_share" else c[key] for c in columns)])
        return out.getvalue().rstrip("\n")
    from tabulate import tabulate

    tablefmt = {"table": "simple", "github": "github", "latex": "latex"}[fmt]
    rows = [(label, *(_human(key, c[key]) for c in columns)) for key, label in ROWS]
    table = tabulate(rows, headers=("", *(c["model"] for c in columns)), tablefmt=tablefmt,
                     disable_numparse=True, colalign=("left", *("right",) * len(columns)))
    note = (f"KV cache in {columns[0]['dtype']} ({costs.DTYPE_BYTES[columns[0]['dtype']]} bytes a value), "
            "MiB = 2^20 bytes, GiB = 2^30 bytes; sliding windows cap it, MLA caches its latent. Active: "
            "the parameters a token uses (MoE: k_E routed experts, both embedding tables counted). FLOPs: "
            "2N (N active, non-embedding) + the attention a token at n does, a multiply-add = 2.")
    prefix = "% " if fmt == "latex" else ""
    return f"{table}\n\n{prefix}{note}"


def plot(configs: Sequence[Config], path: str, *, dtype: str = "bf16", n_max: int | None = None) -> None:
    """KV cache bytes (GiB, log scale) against context length (log2) for each model, into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = n_max or max(c.n_ctx for c in configs)
    seqs = [2**k for k in range(8, top.bit_length()) if 2**k <= top] + ([top] if top & (top - 1) else [])
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for config in configs:
        rows = costs.kv_cache(config, seqs, dtype)["rows"]
        gib = [r["bytes"] / 2**30 for r in rows]
        ax.plot([r["n_tokens"] for r in rows], gib, marker=".", label=config.name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length n (tokens)")
    ax.set_ylabel(f"KV cache, GiB ({dtype}, batch 1)")
    ax.set_title("KV cache against context length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
