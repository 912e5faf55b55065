"""One model's report: a JSON-ready dict (the contract of DESIGN.md §3) and its tables.

Table formats print human units (thousands separators; MiB = 2^20 bytes, GiB = 2^30 bytes; SI
prefixes for FLOPs and seconds); ``csv`` and ``json`` carry the exact integers.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sympy import Rational

from calc import costs, ledger
from calc.presets import Config

CONFIG_KEYS = (
    "arch", "n_layers", "d_model", "n_heads", "d_head", "n_kv_heads", "d_ff", "vocab_size", "n_ctx",
    "tied_embeddings",
)
# Architecture features, in the JSON's config beside the contract keys, and in the header when set.
FEATURE_KEYS = (
    "model_type", "qkv_bias", "qk_norm", "norms_per_layer", "sliding_window", "n_window_layers", "n_experts",
    "experts_per_token", "n_shared_experts", "d_expert", "n_dense_layers", "router_bias", "kv_lora_rank",
    "q_lora_rank", "d_rope", "d_v", "n_mtp_layers",
)
FORMATS = ("table", "github", "latex", "csv", "json")
UNITS = "MiB = 2^20 bytes, GiB = 2^30 bytes; FLOPs count a multiply-add as 2"


def build(
    config: Config,
    *,
    seqs: Sequence[int] | None = None,
    dtype: str = "bf16",
    peak_tflops: float = costs.DEFAULT_PEAK_TFLOPS,
    bandwidth_gbs: float = costs.DEFAULT_BANDWIDTH_GBS,
) -> dict[str, Any]:
    """Everything :mod:`calc` knows about ``config``, with exact numbers (ints and Rationals)."""
    seqs = list(seqs) if seqs else costs.default_seqs(config.n_ctx)
    parts = ledger.checkpoint(config)
    return {
        "model": config.name,
        "source": config.source,
        "notes": list(config.notes),
        "config": {key: getattr(config, key) for key in (*CONFIG_KEYS, *FEATURE_KEYS)},
        "ledger": ledger.source_ledger(config),
        "params": {
            "total": parts["total"],
            "active": ledger.active(config),
            "breakdown": {k: v for k, v in parts.items() if k != "total"},
            "non_embedding": ledger.non_embedding(config),
            "mtp_module": ledger.mtp_module(config),
            "published": config.published,
            "paper_size": config.paper_size,
        },
        "units": UNITS,
        "pattern_memory": costs.pattern_memory(config, seqs),
        "flops": costs.flops(config, seqs),
        "forward_flops_per_token": costs.forward_flops_per_token(config, seqs),
        "kv_cache": costs.kv_cache(config, seqs, dtype),
        "time": costs.roofline(config, seqs, dtype, peak_tflops=peak_tflops, bandwidth_gbs=bandwidth_gbs),
    }


def plain(x: Any) -> Any:
    """``x`` with SymPy numbers made Python ints (whole) or floats, through dicts, lists and tuples."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(plain(v) for v in x)
    if isinstance(x, Rational):
        return int(x) if x.is_Integer else float(x)
    return x


def to_json(report: dict[str, Any]) -> str:
    """The report as JSON: Rationals become floats (``attention_share`` also as an exact string)."""
    out = plain(report)
    out["ledger"]["attention_share_exact"] = str(report["ledger"]["attention_share"])
    return json.dumps(out, indent=2)


# --- human units -----------------------------------------------------------------------------------
def count(x: int) -> str:
    return f"{x:,}"


def _trim(x: float, digits: int) -> str:
    text = f"{x:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def binary_bytes(x: int) -> str:
    """Bytes in the largest binary unit that keeps the number ≥ 1: 16777216 → '16 MiB'."""
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if x >= 1024**power:
            return f"{_trim(x / 1024**power, 1)} {unit}"
    return f"{x} B"


def si(x: float, unit: str) -> str:
    """A quantity with an SI prefix and 3 significant digits: 3.2e17 FLOP → '320 PFLOP'."""
    if x == 0:
        return f"0 {unit}"
    for exponent, prefix in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"), (0, ""),
                             (-3, "m"), (-6, "µ"), (-9, "n")):
        if abs(x) >= 10**exponent:
            return f"{x / 10**exponent:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def percent(x: Rational | float) -> str:
    return f"{float(x) * 100:.1f} %"


def billions(x: int) -> str:
    return f"{x / 1e9:.1f} billion"


# --- tables ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    """A titled table: human cells for reading, raw cells (exact) for csv, notes printed below."""

    title: str
    headers: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]
    raw_headers: tuple[str, ...]
    raw_rows: Sequence[tuple[Any, ...]]
    notes: tuple[str, ...] = ()


def tables(report: dict[str, Any]) -> list[Table]:
    """The report as tables, in reading order."""
    return [_ledger(report), _checkpoint(report), _memory(report), _flops(report), _per_token(report),
            _kv(report), _time(report)]


def _ledger(report: dict[str, Any]) -> Table:
    led = report["ledger"]
    total = led["total"]
    parts = ("attention", "mlp", "embedding", "unembedding", "total")
    names = ("attention_per_head", "attention_per_layer", *parts)
    shares = {k: percent(Rational(int(led[k]), total)) for k in parts}
    rows = [(k.replace("_", " "), f"{float(led[k]):,.1f}" if not _is_int(led[k]) else count(int(led[k])),
             shares.get(k, "")) for k in names]
    cfg = report["config"]
    mlp = "2·d·d_ff" if cfg["arch"] in ("gpt", "neox") else "3·d·d_ff (gate, up, down)"
    attention = "2·d·h·d_k + 2·d·g·d_k"
    if cfg["n_experts"]:
        mlp = (f"{cfg['n_experts']} experts of 3·d·d_e (d_e = {count(cfg['d_expert'])}) + a router d·E"
               + (f" + {cfg['n_shared_experts']} shared expert(s)" if cfg["n_shared_experts"] else "")
               + (f"; the first {cfg['n_dense_layers']} layers 3·d·d_ff" if cfg["n_dense_layers"] else ""))
    if cfg["kv_lora_rank"]:
        attention = "MLA: d·r_q + r_q·h·d_k + d·(r_kv + d_r) + r_kv·h·(d_k − d_r + d_v) + h·d_v·d"
    return Table(
        title="Source ledger: weight matrices only, embedding and unembedding counted separately",
        headers=("component", "parameters", "share"),
        rows=rows,
        raw_headers=("component", "parameters"),
        raw_rows=[(k, led[k]) for k in names],
        notes=(f"attention per layer = {attention}; mlp per layer = {mlp}; attention share = "
               f"{percent(led['attention_share'])} (exactly {led['attention_share']})",),
    )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) or (isinstance(x, Rational) and x.is_Integer)


def _checkpoint(report: dict[str, Any]) -> Table:
    params = report["params"]
    total = params["total"]
    items = [*params["breakdown"].items(), ("total", total)]
    if params["published"] is not None:
        verdict = "equal to" if params["published"] == total else "DIFFERENT from"
        note = f"{verdict} the released checkpoint's {count(params['published'])}"
    elif params["paper_size"] is not None:
        off = total / params["paper_size"] - 1
        note = f"no checkpoint was released; the paper gives {params['paper_size'] / 1e9:g} B ({off:+.1%})"
    else:
        note = "no published count to compare with"
    notes = [f"total {count(total)}: {note}"]
    if params["active"] != total:
        share = percent(Rational(params["active"], total))
        notes.append(f"active per token {count(params['active'])} ({share}): "
                     "the routed experts a token runs, shared experts, router, attention, norms and both "
                     "embedding tables (the convention of Mixtral's 12.9 B of 46.7 B)")
    if params["mtp_module"]:
        notes.append(f"not in the total: the multi-token-prediction module(s), {count(params['mtp_module'])} "
                     f"more in the released checkpoint ({count(total + params['mtp_module'])} in all)")
    return Table(
        title="Checkpoint: every stored parameter (biases, norms, positions, tied embeddings once)",
        headers=("component", "parameters", "share"),
        rows=[(k.replace("_", " "), count(v), percent(Rational(v, total))) for k, v in items],
        raw_headers=("component", "parameters"),
        raw_rows=items,
        notes=tuple(notes),
    )


def window_notes(cfg: dict[str, Any]) -> tuple[str, ...]:
    """What the sliding window changes, for models that have one (none otherwise)."""
    if not cfg["n_window_layers"]:
        return ()
    w = count(cfg["sliding_window"])
    layers = "every layer attends" if cfg["n_window_layers"] == cfg["n_layers"] else \
        f"{cfg['n_window_layers']} of {cfg['n_layers']} layers attend"
    return (f"window: {layers} within {w} tokens: a query there sees at most {w} keys "
            f"(n×min(n, {w}) pattern entries) and the cache holds at most {w} tokens; per head/layer "
            "columns are the largest layer's",)


def _memory(report: dict[str, Any]) -> Table:
    rows = report["pattern_memory"]
    cfg = report["config"]
    notes = list(window_notes(cfg))
    at_ctx = [r for r in rows if r["n_tokens"] == cfg["n_ctx"]]
    if at_ctx:
        r = at_ctx[0]
        notes.append(
            f"at n_ctx = {count(cfg['n_ctx'])}: {billions(r['entries_per_model'])} entries in the model's "
            f"patterns, {binary_bytes(r['bytes_per_model']['fp16'])} at 2 bytes if all were stored at once"
        )
    block = costs.DEFAULT_BLOCK
    notes.append(f"fp16 and bf16 take 2 bytes, fp32 4. Tiled: one {block}×{block} score tile and 2 running "
                 "values per query, fp32, for the head at work (FlashAttention). " + UNITS)
    scopes = ("head", "layer", "model")
    return Table(
        title="Attention pattern memory (n×n entries; naive = every pattern stored at once)",
        headers=("n", *(f"entries/{s}" for s in scopes), *(f"{s}: fp32 | fp16" for s in scopes),
                 "tiled/head"),
        rows=[(count(r["n_tokens"]), *(count(r[f"entries_per_{s}"]) for s in scopes),
               *(f"{binary_bytes(r[f'bytes_per_{s}']['fp32'])} | {binary_bytes(r[f'bytes_per_{s}']['fp16'])}"
                 for s in scopes),
               binary_bytes(r["tiled_bytes_per_head"]))
              for r in rows],
        raw_headers=("n_tokens", *(f"entries_per_{s}" for s in scopes),
                     *(f"bytes_per_{s}_{t}" for s in scopes for t in ("fp32", "fp16")),
                     "tiled_bytes_per_head"),
        raw_rows=[(r["n_tokens"], *(r[f"entries_per_{s}"] for s in scopes),
                   *(r[f"bytes_per_{s}"][t] for s in scopes for t in ("fp32", "fp16")),
                   r["tiled_bytes_per_head"]) for r in rows],
        notes=tuple(notes),
    )


def _ratio(x: Rational | None) -> str:
    return "" if x is None else f"×{float(x):.2f}"


def _flops(report: dict[str, Any]) -> Table:
    rows = report["flops"]
    keys = ("qk_flops_per_head", "av_flops_per_head", "attention_flops_per_head", "attention_flops_per_layer",
            "attention_flops_per_model", "causal_flops_per_model")
    cfg = report["config"]
    keys_seen = "n·min(n, w)" if cfg["n_window_layers"] == cfg["n_layers"] else "n²"
    value = "d_v" if cfg["d_v"] != cfg["d_head"] else "d_k"
    return Table(
        title=(f"Attention FLOPs of one forward pass: QKᵀ (2·{keys_seen}·d_k) + AV (2·{keys_seen}·{value}) "
               "per head"),
        headers=("n", "QKᵀ/head", "AV/head", "per head", "per layer", "per model", "causal/model", "ratio"),
        rows=[(count(r["n_tokens"]), *(si(r[k], "FLOP") for k in keys), _ratio(r["ratio"])) for r in rows],
        raw_headers=("n_tokens", *keys, "ratio"),
        raw_rows=[(r["n_tokens"], *(r[k] for k in keys), "" if r["ratio"] is None else float(r["ratio"]))
                  for r in rows],
        notes=("causal: query i sees i + 1 keys, n(n+1)/2 of the n² entries; ratio: per head, to the "
               "row above (n² → 4 per doubling of n)", *window_notes(cfg)),
    )


def _per_token(report: dict[str, Any]) -> Table:
    rows = report["forward_flops_per_token"]
    big_n = rows[0]["non_embedding_params"]
    moe = (" N counts the active parameters: a token runs k_E of the E routed experts."
           if report["params"]["active"] != report["params"]["total"] else "")
    cfg = report["config"]
    headers = ("Kaplan: 2N + 2·L·n·h·d_k", "PaLM: 2N + 4·L·h·d_k·n")
    if cfg["n_window_layers"] or cfg["d_v"] != cfg["d_head"]:
        # keys = keys a token attends to, summed over layers: L·n without windows (f.keys_seen)
        headers = ("Kaplan: 2N + 2·h·d_k·keys", "PaLM: 2N + 2·h·(d_k + d_v)·keys")
        moe += " keys: the keys a token sees, summed over layers ((L − L_w)·n + L_w·min(n, w))."
    return Table(
        title="Forward FLOPs per token at context n",
        headers=("n", *headers, "attention share (PaLM)"),
        rows=[(count(r["n_tokens"]), si(r["kaplan"], "FLOP"), si(r["palm"], "FLOP"),
               percent(Rational(r["palm"] - 2 * big_n, r["palm"]))) for r in rows],
        raw_headers=("n_tokens", "non_embedding_params", "kaplan", "palm"),
        raw_rows=[(r["n_tokens"], r["non_embedding_params"], r["kaplan"], r["palm"]) for r in rows],
        notes=(f"N = {count(big_n)} non-embedding parameters (checkpoint less token and position "
               "embeddings). Kaplan et al. 2020, Table 1: C_forward = 2N + 2·n_layer·n_ctx·d_attn. PaLM "
               "(Chowdhery et al. 2022, App. B): 6N + 12·L·H·Q·T per token for training, a third of it "
               "forward; its attention term, twice Kaplan's, is QKᵀ + AV of the FLOPs table per token." + moe,
               *window_notes(report["config"])),
    )


def _kv(report: dict[str, Any]) -> Table:
    kv = report["kv_cache"]
    cfg = report["config"]
    size = kv["bytes_per_value"]
    per_token = "2·L·g·d_k·b"
    if cfg["kv_lora_rank"]:
        per_token = (f"MLA, L·(r_kv + d_r)·b = {cfg['n_layers']}·({cfg['kv_lora_rank']} + "
                     f"{cfg['d_rope']})·{size}")
    heads = (f"one latent of {cfg['kv_lora_rank']} and one rotary key of {cfg['d_rope']} per layer, "
             f"shared by the {cfg['n_heads']} heads" if cfg["kv_lora_rank"]
             else f"g = {cfg['n_kv_heads']} key/value heads of {cfg['n_heads']}")
    return Table(
        title=f"KV cache, {kv['dtype']} ({size} bytes a value): {per_token} bytes per token",
        headers=("n", "bytes", ""),
        rows=[(count(r["n_tokens"]), count(r["bytes"]), binary_bytes(r["bytes"])) for r in kv["rows"]],
        raw_headers=("n_tokens", "bytes"),
        raw_rows=[(r["n_tokens"], r["bytes"]) for r in kv["rows"]],
        notes=(f"{count(kv['bytes_per_token'])} bytes ({binary_bytes(kv['bytes_per_token'])}) per token; "
               f"{binary_bytes(kv['bytes_per_context'])} for the full context of {count(kv['n_ctx'])} "
               f"({heads})", *window_notes(cfg)),
    )


def _time(report: dict[str, Any]) -> Table:
    t = report["time"]
    return Table(
        title=(f"Modelled time of attention's n² part, one forward pass, batch 1: roofline at "
               f"{t['peak_tflops']:g} TFLOP/s and {t['bandwidth_gbs']:g} GB/s, {t['dtype']}"),
        headers=("n", "FLOPs", "compute", "naive bytes", "naive", "tiled bytes", "tiled"),
        rows=[(count(r["n_tokens"]), si(r["flops"], "FLOP"), si(r["compute_s"], "s"),
               binary_bytes(r["naive_bytes"]), f"{si(r['naive_s'], 's')} ({r['naive_bound']})",
               binary_bytes(r["tiled_bytes"]), f"{si(r['tiled_s'], 's')} ({r['tiled_bound']})")
              for r in t["rows"]],
        raw_headers=("n_tokens", "flops", "compute_s", "naive_bytes", "naive_s", "tiled_bytes", "tiled_s"),
        raw_rows=[(r["n_tokens"], r["flops"], r["compute_s"], r["naive_bytes"], r["naive_s"],
                   r["tiled_bytes"], r["tiled_s"]) for r in t["rows"]],
        notes=("time = max(FLOPs / peak, bytes / bandwidth); naive writes and reads back every pattern, "
               "tiled moves only Q, K, V and O; GB = 10^9 bytes. Defaults: NVIDIA H100 SXM5 datasheet "
               "(dense BF16); set --peak-tflops and --bandwidth-gbs for other hardware.",),
    )


def header_lines(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    tied = "tied" if cfg["tied_embeddings"] else "untied"
    return [
        f"{report['model']} ({cfg['arch']}): L = {cfg['n_layers']}, d = {count(cfg['d_model'])}, "
        f"h = {cfg['n_heads']}, d_k = {cfg['d_head']}, g = {cfg['n_kv_heads']}, d_ff = {count(cfg['d_ff'])}, "
        f"V = {count(cfg['vocab_size'])}, n_ctx = {count(cfg['n_ctx'])}, {tied} embeddings",
        *feature_lines(cfg),
        f"source: {report['source']}",
        *(f"note: {note}" for note in report["notes"]),
    ]


def feature_lines(cfg: dict[str, Any]) -> list[str]:
    """One line naming the architecture features a model has beyond the plain GPT-2/Llama layout."""
    parts = []
    if cfg["n_experts"]:
        parts.append(f"MoE: {cfg['n_experts']} experts of d_e = {count(cfg['d_expert'])}, "
                     f"{cfg['experts_per_token']} per token"
                     + (f", {cfg['n_shared_experts']} shared" if cfg["n_shared_experts"] else "")
                     + (f", first {cfg['n_dense_layers']} layers dense" if cfg["n_dense_layers"] else ""))
    if cfg["kv_lora_rank"]:
        parts.append(f"MLA: r_q = {cfg['q_lora_rank']}, r_kv = {cfg['kv_lora_rank']}, d_r = {cfg['d_rope']}, "
                     f"d_v = {cfg['d_v']}")
    if cfg["n_window_layers"]:
        parts.append(f"sliding window {count(cfg['sliding_window'])} on {cfg['n_window_layers']} of "
                     f"{cfg['n_layers']} layers")
    for key, text in (("qkv_bias", "Q, K, V biases"), ("qk_norm", "q/k norms")):
        if cfg[key]:
            parts.append(text)
    if cfg["norms_per_layer"] != 2:
        parts.append(f"{cfg['norms_per_layer']} norms per layer")
    return [f"features: {'; '.join(parts)}"] if parts else []


def render(report: dict[str, Any], fmt: str = "table") -> str:
    """The report in one of :data:`FORMATS`."""
    if fmt == "json":
        return to_json(report)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for table in tables(report):
            out.write(f"# {table.title}\n")
            writer.writerow(table.raw_headers)
            writer.writerows(plain(list(table.raw_rows)))
            out.write("\n")
        return out.getvalue().rstrip("\n")
    from tabulate import tabulate

    tablefmt = {"table": "simple", "github": "github", "latex": "latex"}[fmt]
    prefix = {"table": "", "github": "", "latex": "% "}[fmt]
    blocks = ["\n".join(prefix + line for line in header_lines(report))]
    for table in tables(report):
        title = f"### {table.title}" if fmt == "github" else prefix + table.title
        body = tabulate(table.rows, headers=table.headers, tablefmt=tablefmt, disable_numparse=True,
                        colalign=("left", *("right",) * (len(table.headers) - 1)))
        blocks.append("\n".join([title, "", body, "", *(prefix + note for note in table.notes)]))
    return "\n\n".join(blocks)
