"""One model's report: a JSON-ready dict (its keys documented in docs/calc.md; other tools read
them, so none is renamed) and its tables.

Table formats print human units (thousands separators; MiB = 2^20 bytes, GiB = 2^30 bytes; SI
prefixes for FLOPs and seconds); ``csv`` and ``json`` carry the exact integers.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sympy import Rational

from calc import costs, ledger
from calc.config import LAYOUTS
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
    # added with the layer kinds and layouts of 2024–25 (config.json readers of calc.hf)
    "learned_positions", "position_offset", "norm_bias", "o_bias", "mlp_gated", "mlp_bias", "lm_head_bias",
    "qk_norm_per_head", "attention_sinks", "attention_output_gate", "n_attention_layers", "attention_chunk",
    "n_chunked_layers", "n_nope_layers", "n_linear_layers", "linear_attention", "n_mamba_layers", "mamba",
    "d_shared_expert", "shared_expert_gate", "expert_bias", "n_sparse_layers", "index_topk", "index_heads",
    "index_head_dim", "mamba2", "n_mlp_free_layers", "n_kv_heads_window", "window_sinks",
    "d_head_full", "n_kv_heads_full", "full_values_are_keys", "n_kv_shared_layers",
    "n_kv_shared_window_layers",
    "shared_mlp_double", "per_layer_input", "per_layer_vocab", "layer_scalar",
    "n_zero_experts", "compressed",
    # added with the activations per layer kind (calc.activations)
    "d_rotary", "parallel_block", "activation",
)
FORMATS = ("table", "github", "latex", "csv", "json")
DEFAULT_WIDTH = 100  # columns of a table-format report when stdout is not a terminal
UNITS = "MiB = 2^20 bytes, GiB = 2^30 bytes; FLOPs count a multiply-add as 2"


def config_warnings(config: Config, seqs: Sequence[int]) -> list[str]:
    """Every warning a report on ``config`` at ``seqs`` gives: the config.json keys ignored as inert, and the
    lengths past the trained context."""
    from calc.hf import inert_warning

    ignored = [inert_warning(config.name, config.ignored_keys)] if config.ignored_keys else []
    return [*ignored, *past_context(config, seqs)]


def past_context(config: Config, seqs: Sequence[int]) -> list[str]:
    """The warning for the lengths asked for past the trained context n_ctx (none where none is)."""
    past = [n for n in seqs if n > config.n_ctx]
    if not past:
        return []
    return [f"n = {', '.join(map(count, past))} exceeds the trained context n_ctx = {count(config.n_ctx)} of "
            f"{config.name}: figures there extrapolate past what the model was trained on"]


def build(
    config: Config,
    *,
    seqs: Sequence[int] | None = None,
    dtype: str = "bf16",
    peak_tflops: float = costs.DEFAULT_PEAK_TFLOPS,
    bandwidth_gbs: float = costs.DEFAULT_BANDWIDTH_GBS,
    train: Mapping[str, Any] | None = None,
    serve: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything calc knows about ``config``, with exact numbers (ints and Rationals).

    ``seqs`` given and past the trained context n_ctx add a line to ``warnings``, and so do config.json keys
    ignored as inert (``config.ignored_keys``). ``train``: options of
    `calc.training.training` (precision, zero, dp, tp, micro_batch) for a ``training`` section;
    ``serve``: options of `calc.serving.serving` (memory, device, weight_dtype) for ``serving``, and of
    `calc.serving.serving_time` (peak_tflops, bandwidth_gbs, batch) for ``serving.time``.
    """
    given = list(seqs) if seqs else None
    warnings = config_warnings(config, given or [])
    seqs = given or costs.default_seqs(config.n_ctx)
    parts = ledger.checkpoint(config)
    report = {
        "model": config.name,
        "source": config.source,
        "notes": list(config.notes),
        "warnings": warnings,
        "config": {key: _config_value(getattr(config, key)) for key in (*CONFIG_KEYS, *FEATURE_KEYS)},
        "ledger": ledger.source_ledger(config),
        "params": {
            "total": parts["total"],
            "active": ledger.active(config),
            "breakdown": {k: v for k, v in parts.items() if k != "total"},
            "non_embedding": ledger.non_embedding(config),
            "mtp_module": ledger.mtp_module(config),
            "vision_tower": config.vision_parameters,
            "published": config.published,
            "paper_size": config.paper_size,
        },
        "units": UNITS,
        "pattern_memory": costs.pattern_memory(config, seqs),
        "flops": costs.flops(config, seqs),
        "forward_flops_per_token": costs.forward_flops_per_token(config, seqs),
        "kv_cache": costs.kv_cache(config, seqs, dtype),
        "time": costs.roofline(config, seqs, dtype, peak_tflops=peak_tflops, bandwidth_gbs=bandwidth_gbs),
        "cost_by_kind": cost_by_kind(config, seqs, dtype),
    }
    if train is not None:
        from calc.training import training

        report["training"] = training(config, seqs, **train)
    if serve is not None:
        from calc.serving import serving, serving_time

        # memory at the first n asked for, else at the trained context; time at every n
        memory = {k: v for k, v in serve.items() if k in ("memory", "device", "weight_dtype")}
        rate = {k: v for k, v in serve.items() if k in ("peak_tflops", "bandwidth_gbs", "batch")}
        served = serving(config, kv_dtype=dtype, n=given[0] if given else None, **memory)
        served["time"] = serving_time(config, seqs, kv_dtype=dtype,
                                      weight_dtype=serve.get("weight_dtype", "bf16"), **rate)
        report["serving"] = served
    return report


def cost_by_kind(config: Config, seqs: Sequence[int], dtype: str = "bf16") -> dict[str, Any]:
    """calc.kinds' figures of ``config`` at ``seqs``: each layer kind's and their sum (``rows``), and the n up
    to the largest of ``seqs`` and 4·n_ctx where one kind's prefill FLOPs, cache or naive scores overtake
    another's (``crossovers``)."""
    from calc import kinds

    size = costs.DTYPE_BYTES[dtype]
    options = {"dtype_bytes": size, "index_bytes": kinds.INDEX_BYTES, "block": costs.DEFAULT_BLOCK}
    n_max = max([*seqs, 4 * config.n_ctx])
    return {
        "dtype": dtype, "bytes_per_value": size, "index_bytes_per_value": kinds.INDEX_BYTES,
        "tile_side": costs.DEFAULT_BLOCK, "layers": kinds.layer_kinds(config),
        "rows": kinds.by_kind(config, seqs, **options),
        "crossovers": {metric: kinds.crossovers(config, metric, n_max, **options)
                       for metric in kinds.CROSSOVER_METRICS},
    }


def _config_value(value: Any) -> Any:
    """A config field for the report: a layer shape (linear attention, Mamba) as a dict."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


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
def count(x: int | Rational) -> str:
    """x with thousands separators; an exact fraction (DeepSeek V4's cache bytes a token) to two places."""
    if isinstance(x, Rational) and not x.is_Integer:
        return f"{float(x):,.2f}"
    return f"{int(x):,}" if isinstance(x, Rational) else f"{x:,}"


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
    extra = [*([_training(report)] if "training" in report else []),
             *([_serving(report), _serving_time(report)] if "serving" in report else [])]
    by_kind = [_by_kind(report)] if set(report["cost_by_kind"]["layers"]) != {"dense"} else []
    return [_ledger(report), _checkpoint(report), _memory(report), _flops(report), _per_token(report),
            _kv(report), _time(report), *by_kind, *extra]


def crossover_notes(found: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One line per metric naming the n where one kind's figure overtakes another's."""
    what = {"prefill_flops": "prefill FLOPs", "cache_bytes": "cache", "score_bytes_naive": "naive scores"}
    return [f"{what[metric]}: " + "; ".join(
        f"{c['kind']} overtakes {c['overtakes']} at n = {count(c['n_tokens'])}" for c in rows)
        for metric, rows in found.items() if rows]


def _by_kind(report: dict[str, Any]) -> Table:
    from calc.kinds import KINDS, METRICS

    cost = report["cost_by_kind"]
    size, index = cost["bytes_per_value"], cost["index_bytes_per_value"]
    flops = ("prefill_flops", "decode_flops")
    rows, raw = [], []
    layers = sum(v for k, v in cost["layers"].items() if k != "indexer")  # an indexer is in its sparse layer
    for r in cost["rows"]:
        for kind, fig in (*r["kinds"].items(), ("all", {"layers": layers, **r["total"]})):
            rows.append((count(r["n_tokens"]), kind, str(fig["layers"]),
                         *(si(fig[m], "FLOP") if m in flops else binary_bytes(fig[m]) for m in METRICS)))
            raw.append((r["n_tokens"], kind, fig["layers"], *(fig[m] for m in METRICS)))
    found = crossover_notes(cost["crossovers"])
    indexer = "indexer" in cost["layers"]
    notes = (
        "kinds: " + "; ".join(f"{k}: {KINDS[k].what}" for k in cost["layers"]) + ". all: the sum ("
        + ("a sparse layer's indexer counted as a kind beside it; " if indexer else "")
        + "tiled: the largest kind's, one head at work)",
        "prefill: the causal pass's sequence mixing (QKᵀ and AV of the keys a query sees"
        + (", the indexer's scores" if indexer else "")
        + (", the state's updates" if {"linear", "mamba"} & set(cost["layers"]) else "")
        + f"), projections aside; decode: one step at n. Scores naive: every head's stored at once, {size} "
        + "bytes a value" + (f" (the indexer's at {index}, FP8)" if indexer else "")
        + f"; tiled: a {cost['tile_side']}×{cost['tile_side']} tile and the running values, fp32; cache: "
        f"what each layer keeps for the next token, at {size} bytes a value ({cost['dtype']}). " + UNITS,
        *(["crossovers (over the kinds' layers, up to the largest n and 4·n_ctx): " + " / ".join(found)]
          if found else []),
    )
    return Table(
        title="Cost per layer kind over n, one sequence (calc.kinds; python -m calc formulas shows each)",
        headers=("n", "kind", "layers", *(METRIC_TEXT_SHORT[m] for m in METRICS)),
        rows=rows, raw_headers=("n_tokens", "kind", "layers", *METRICS), raw_rows=raw, notes=notes,
    )


METRIC_TEXT_SHORT = {"prefill_flops": "prefill", "score_bytes_naive": "scores naive",
                     "score_bytes_tiled": "scores tiled", "cache_bytes": "cache",
                     "decode_flops": "decode step"}


def _ledger(report: dict[str, Any]) -> Table:
    led = report["ledger"]
    total = led["total"]
    per = ("attention_per_head", "attention_per_layer", "total", "attention_share")
    parts = (*(k for k in led if k not in per), "total")
    names = ("attention_per_head", "attention_per_layer", *parts)
    shares = {k: percent(Rational(int(led[k]), total)) for k in parts}
    rows = [(k.replace("_", " "), f"{float(led[k]):,.1f}" if not _is_int(led[k]) else count(int(led[k])),
             shares.get(k, "")) for k in names]
    cfg = report["config"]
    mlp = "3·d·d_ff (gate, up, down)" if cfg["mlp_gated"] else "2·d·d_ff"
    attention = "2·d·h·d_k + 2·d·g·d_k"
    if cfg["n_experts"]:
        shared = count(cfg["d_shared_expert"] or cfg["d_expert"])
        k = 3 if cfg["mlp_gated"] else 2
        mlp = (f"{cfg['n_experts']} experts of {k}·d·d_e (d_e = {count(cfg['d_expert'])}) + a router d·E"
               + (f" + {cfg['n_shared_experts']} shared expert(s) of {k}·d·d_s (d_s = {shared})"
                  if cfg["n_shared_experts"] else "")
               + (f"; {cfg['n_dense_layers']} layers {k}·d·d_ff" if cfg["n_dense_layers"] else ""))
    if cfg["n_mlp_free_layers"]:
        mlp += f" ({cfg['n_layers'] - cfg['n_mlp_free_layers']} of {cfg['n_layers']} layers have an MLP)"
    if cfg["kv_lora_rank"]:
        q = "d·r_q + r_q·h·d_k" if cfg["q_lora_rank"] else "d·h·d_k"
        attention = f"MLA: {q} + d·(r_kv + d_r) + r_kv·h·(d_k − d_r + d_v) + h·d_v·d"
    if cfg["attention_output_gate"]:
        attention = "3·d·h·d_k + 2·d·g·d_k (Q and its output gate, K, V, O)"
    elif not cfg["kv_lora_rank"] and (cfg["d_v"] != cfg["d_head"] or cfg["n_kv_heads_window"]):
        attention = ("d·h·d_k + d·g·d_k + d·g·d_v + h·d_v·d"
                     + (f" (a windowed layer's K and V: g_w = {cfg['n_kv_heads_window']} heads)"
                        if cfg["n_kv_heads_window"] else ""))
    if cfg["d_head_full"] or cfg["n_kv_shared_layers"] or cfg["full_values_are_keys"]:
        attention = ("2·d·h·d_k + 2·d·g·d_k on a windowed layer (the per-layer rows), 2·d·h·d_kf + "
                     + ("d·g_f·d_kf (no V)" if cfg["full_values_are_keys"] else "2·d·g_f·d_kf")
                     + " on a full one; 2·d·h·d_k or 2·d·h·d_kf (Q and O only) on the L_x that reuse keys "
                     "and values")
    if cfg["compressed"]:
        attention = ("d·r_q + r_q·h·d_k (Q) + d·d_k (one key, the value) + r_o·h·d_k + G_o·r_o·d "
                     "(grouped O); the compressors, indexers and hyper-connections are in the checkpoint's "
                     "rows")
    if cfg["shared_mlp_double"]:
        mlp += f"; 2·d_ff on the last {cfg['n_kv_shared_layers']} layers"
    if cfg["per_layer_input"]:
        mlp += "; per-layer inputs: d·L·d_p + L·2·d·d_p, their table V_p·L·d_p"
    notes = [f"attention per layer = {attention}; mlp per layer = {mlp}; attention share = "
             f"{percent(led['attention_share'])} (exactly {led['attention_share']})"]
    if cfg["n_attention_layers"] != cfg["n_layers"]:
        kind = ("linear-attention (Gated DeltaNet)" if cfg["n_linear_layers"] else
                "Mamba-2" if cfg["mamba2"] else "Mamba")
        notes.append(f"attention counts its {cfg['n_attention_layers']} attention layers; the other "
                     f"{cfg['n_layers'] - cfg['n_attention_layers']} are {kind} layers, a component of their "
                     "own")
    return Table(
        title="Source ledger: weight matrices only, embedding and unembedding counted separately",
        headers=("component", "parameters", "share"),
        rows=rows,
        raw_headers=("component", "parameters"),
        raw_rows=[(k, led[k]) for k in names],
        notes=tuple(notes),
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
        unembedding = report["ledger"]["unembedding"]
        notes.append(f"active per token {count(params['active'])} ({share}): "
                     "the routed experts a token runs, shared experts, router, attention, norms and both "
                     "embedding tables (the convention of Mixtral's 12.9 B of 46.7 B); without the "
                     f"unembedding, as some model cards count: {count(params['active'] - unembedding)}")
    if params["mtp_module"]:
        notes.append(f"not in the total: the multi-token-prediction module(s), {count(params['mtp_module'])} "
                     f"more in the released checkpoint ({count(total + params['mtp_module'])} in all)")
    if params["vision_tower"]:
        notes.append(f"not in the total: the vision tower, {count(params['vision_tower'])} more in the "
                     f"multimodal checkpoint ({count(total + params['vision_tower'])} in all; calc.vision)")
    return Table(
        title="Checkpoint: every stored parameter (biases, norms, positions, tied embeddings once)",
        headers=("component", "parameters", "share"),
        rows=[(k.replace("_", " "), count(v), percent(Rational(v, total))) for k, v in items],
        raw_headers=("component", "parameters"),
        raw_rows=items,
        notes=tuple(notes),
    )


def window_notes(cfg: dict[str, Any]) -> tuple[str, ...]:
    """What sliding windows, chunks and layers without attention change, for models that have them."""
    notes = []
    largest = "; per head/layer columns are the largest layer's"
    if cfg["n_window_layers"]:
        w = count(cfg["sliding_window"])
        layers = "every layer attends" if cfg["n_window_layers"] == cfg["n_layers"] else \
            f"{cfg['n_window_layers']} of {cfg['n_layers']} layers attend"
        notes.append(f"window: {layers} within {w} tokens: a query there sees at most {w} keys "
                     f"(n×min(n, {w}) pattern entries) and the cache holds at most {w} tokens{largest}")
    if cfg["n_chunked_layers"]:
        c = count(cfg["attention_chunk"])
        notes.append(f"chunks: {cfg['n_chunked_layers']} of {cfg['n_layers']} layers attend within chunks of "
                     f"{c} tokens: a query sees only its own chunk (C²·⌊n/C⌋ + (n mod C)² pattern entries) "
                     f"and the cache holds at most {c} tokens{largest}")
    if cfg.get("n_sparse_layers"):
        k = count(cfg["index_topk"])
        notes.append(f"sparse: {cfg['n_sparse_layers']} of {cfg['n_layers']} layers attend to the {k} keys "
                     f"their indexer scores highest (n×min(n, {k}) pattern entries; the cache holds every "
                     f"token, and the indexer's key); the indexer's own n² scores at "
                     f"{cfg['index_heads']} heads of {cfg['index_head_dim']} are in the per-kind "
                     f"table{largest}")
    if cfg["n_attention_layers"] != cfg["n_layers"]:
        kind = "linear-attention" if cfg["n_linear_layers"] else "Mamba-2" if cfg["mamba2"] else "Mamba"
        notes.append(f"hybrid: {cfg['n_layers'] - cfg['n_attention_layers']} of {cfg['n_layers']} layers are "
                     f"{kind} layers, with no n×n pattern and no KV cache (a fixed-size state instead); the "
                     f"attention figures are those of the {cfg['n_attention_layers']} attention layers")
    return tuple(notes)


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
    sparse = cfg.get("n_sparse_layers", 0)
    keys_seen = ("n²" if cfg["n_attention_layers"] > cfg["n_window_layers"] + cfg["n_chunked_layers"] + sparse
                 else "n·min(n, w)" if cfg["n_window_layers"] else "chunk-block" if cfg["n_chunked_layers"]
                 else "n·min(n, k_I)")
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
    if (cfg["n_window_layers"] or cfg["n_chunked_layers"] or cfg["d_v"] != cfg["d_head"]
            or cfg.get("n_sparse_layers") or cfg["n_attention_layers"] != cfg["n_layers"]):
        # keys = keys a token attends to, summed over layers: L·n without windows (f.keys_seen)
        headers = ("Kaplan: 2N + 2·h·d_k·keys", "PaLM: 2N + 2·h·(d_k + d_v)·keys")
        moe += (" keys: the keys a token sees, summed over the attention layers ((L_a − L_w − L_c − L_s)·n + "
                "L_w·min(n, w) + L_c·min(n, C) + L_s·min(n, k_I), chunks at most; the indexer not counted).")
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
    layers = "L" if cfg["n_attention_layers"] == cfg["n_layers"] else "L_a"
    per_token = f"2·{layers}·g·d_k·b"
    if cfg["kv_lora_rank"]:
        per_token = (f"MLA, {layers}·(r_kv + d_r)·b = {cfg['n_attention_layers']}·({cfg['kv_lora_rank']} + "
                     f"{cfg['d_rope']})·{size}")
    heads = (f"one latent of {cfg['kv_lora_rank']} and one rotary key of {cfg['d_rope']} per layer, "
             f"shared by the {cfg['n_heads']} heads" if cfg["kv_lora_rank"]
             else f"g = {cfg['n_kv_heads']} key/value heads of {cfg['n_heads']}")
    if not cfg["kv_lora_rank"] and (cfg["d_v"] != cfg["d_head"] or cfg["n_kv_heads_window"]):
        per_token = f"(({layers} − L_w)·g + L_w·g_w)·(d_k + d_v)·b"
        heads += (f", keys of {cfg['d_head']} and values of {cfg['d_v']}"
                  + (f"; g_w = {cfg['n_kv_heads_window']} on the windowed layers" if cfg["n_kv_heads_window"]
                     else ""))
    if cfg.get("n_sparse_layers"):
        per_token = (f"MLA and indexer, (L_a·(r_kv + d_r) + L_s·d_I)·b = ({cfg['n_attention_layers']}·"
                     f"({cfg['kv_lora_rank']} + {cfg['d_rope']}) + {cfg['n_sparse_layers']}·"
                     f"{cfg['index_head_dim']})·{size}")
        heads += f", and the indexer's key of {cfg['index_head_dim']} per sparse layer"
    if cfg["d_head_full"] or cfg["n_kv_shared_layers"] or cfg["full_values_are_keys"]:
        per_token = "((L_w − L_xw)·2·g·d_k + (L_a − L_w − L_xf)·2·g_f·d_kf)·b"
        heads = split_heads(cfg)
    if cfg["compressed"]:
        per_token = ("(L_hca·d_k/m_h + L_csa·(d_k + d_I)/m_c)·b (the pooled entries, once every window is "
                     "full)")
        heads = compressed_cache(cfg)
    return Table(
        title=f"KV cache, {kv['dtype']} ({size} bytes a value): {per_token} bytes per token",
        headers=("n", "bytes", ""),
        rows=[(count(r["n_tokens"]), count(r["bytes"]), binary_bytes(r["bytes"])) for r in kv["rows"]],
        raw_headers=("n_tokens", "bytes"),
        raw_rows=[(r["n_tokens"], r["bytes"]) for r in kv["rows"]],
        notes=(f"{count(kv['bytes_per_token'])} bytes ({binary_bytes(kv['bytes_per_token'])}) per token; "
               f"{binary_bytes(kv['bytes_per_context'])} for the full context of {count(kv['n_ctx'])} "
               f"({heads})", *window_notes(cfg),
               *([f"state per sequence, whatever n: {count(kv['state_bytes_per_sequence'])} bytes "
                  f"({binary_bytes(kv['state_bytes_per_sequence'])}) in the layers without attention, at "
                  f"{size} bytes a value"] if kv["state_bytes_per_sequence"] else [])),
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


# derived per layer kind first (None: not derived), then Korthikanti et al.'s columns
DERIVED_COLUMNS = (("derived_eager", "derived: eager"), ("derived_flash", "derived: Flash"),
                   ("total_derived_eager", "total, eager"), ("total_derived_flash", "total, Flash"))
TRAINING_COLUMNS = (
    ("activations_per_layer", "per layer"), ("activations", "all layers"), ("selective", "selective"),
    ("flash", "FlashAttention"), ("full_recompute", "full recompute"), ("total_activations", "total"),
    ("total_selective", "total, selective"), ("total_flash", "total, Flash"),
)


def _training(report: dict[str, Any]) -> Table:
    t = report["training"]
    cfg, states = report["config"], t["model_states"]
    per = t["bytes_per_param"]
    zero = ("no ZeRO" if not t["zero"] else
            f"ZeRO stage {t['zero']} over {t['dp']} data-parallel devices (Rajbhandari et al. 2020 §5)")
    if t["sequence_parallel"]:
        per_layer, parallel = "n·b·d·(34 + 5·h·n/d)/t", "tensor and sequence parallelism over t"
        share, selective = "5·h·n / (34·d + 5·h·n)", "34·n·b·d/t"
    else:
        per_layer = "n·b·d·(10 + 24/t + 5·h·n/(d·t))"
        parallel = ("tensor parallelism over t and no sequence parallelism (the 10·n·b·d of the LayerNorms, "
                    "the block inputs and the dropout masks whole on every device)")
        share, selective = "5·h·n / (10·d·t + 24·d + 5·h·n)", "n·b·d·(10 + 24/t)"
    notes = [
        f"model states per device: weights {binary_bytes(states['weights'])}, gradients "
        f"{binary_bytes(states['gradients'])}, Adam {binary_bytes(states['optimizer'])}, "
        f"{binary_bytes(states['total'])} in all: {count(t['params'])} parameters at {per['weights']} + "
        f"{per['gradients']} + {per['optimizer']} bytes ({t['precision']} precision), {zero}, tensor "
        f"parallelism t = {t['tp']}",
        f"activations: Korthikanti et al. 2022 (§4, Table 2), {per_layer} bytes per layer with {parallel}, "
        "16-bit values and 1-byte dropout masks, for a GPT layer (MHA, a 4d MLP, LayerNorm, dropout); n² "
        f"share = {share}, the softmax output, its dropout mask and the dropped-out weights",
        f"selective: recompute that n² part in the backward pass, {selective}; FlashAttention: never write "
        "it, keep each row's logsumexp (fp32, 4·h·n·b/t; Dao et al. 2022, 2023); full recompute: keep only "
        "each layer's input, 2·n·b·d. Totals add the model states. " + UNITS,
    ]
    if cfg["n_attention_layers"] != cfg["n_layers"] or cfg["n_window_layers"] or cfg["n_chunked_layers"]:
        notes.append("the paper's formula counts every layer as full attention: windows, chunks and layers "
                     "without attention store less than it says")
    derived = t["derived"]
    if derived["reason"] is None:
        notes.insert(0, "derived: what every layer and the head keep for the backward pass as transformers "
                     f"implements {cfg['model_type'] or 'the layout'} (calc.activations: each layer kind "
                     "equal to the bytes PyTorch saves, python -m calc.verify --activations), "
                     f"{derived['dtype']} values with their fp32 upcasts, no dropout, the loss's fp32 "
                     "log-softmax over the vocabulary included; eager attention keeps the n×n softmax, "
                     "FlashAttention-style (SDPA) its logsumexp; totals add the model states")
    else:
        notes.insert(0, f"derived: not given, {derived['reason']}; Korthikanti et al.'s formula only")

    def shown(value: int | None) -> str:
        return "—" if value is None else binary_bytes(value)

    derived_keys, keys = [k for k, _ in DERIVED_COLUMNS], [k for k, _ in TRAINING_COLUMNS]
    return Table(
        title=(f"Training memory per device, micro-batch {t['micro_batch']}: activations derived per layer "
               "kind, and by Korthikanti et al. 2022 with the n² term's share"),
        headers=("n", *(label for _, label in DERIVED_COLUMNS), "Korthikanti: n² share",
                 *(label for _, label in TRAINING_COLUMNS)),
        rows=[(count(r["n_tokens"]), *(shown(r[k]) for k in derived_keys), percent(r["quadratic_share"]),
               *(shown(r[k]) for k in keys)) for r in t["rows"]],
        raw_headers=("n_tokens", *derived_keys, "quadratic_share", *keys),
        raw_rows=[(r["n_tokens"], *("" if r[k] is None else r[k] for k in derived_keys),
                   float(r["quadratic_share"]), *(r[k] for k in keys)) for r in t["rows"]],
        notes=tuple(notes),
    )


def _serving(report: dict[str, Any]) -> Table:
    s = report["serving"]
    cfg = report["config"]
    n = count(s["n_tokens"])
    rows, raw = [], []
    for r in s["rows"]:
        if not r["fits"]:
            rows.append((str(r["tp"]), *(binary_bytes(r[k]) if k in r else "" for k in ("weights",)), "", "",
                         r["reason"], ""))
            raw.append((r["tp"], r.get("weights", ""), r.get("kv_bytes_per_token", ""), r.get("free", ""), "",
                        ""))
            continue
        context = "unbounded" if r["context"] is None else count(r["context"])
        rows.append((str(r["tp"]), binary_bytes(r["weights"]), count(r["kv_bytes_per_token"]),
                     binary_bytes(r["free"]), count(r["batch"]), context))
        raw.append((r["tp"], r["weights"], r["kv_bytes_per_token"], r["free"], r["batch"],
                    "" if r["context"] is None else r["context"]))
    state_bytes = s["rows"][0].get("state_bytes_per_sequence")
    state = f"; each sequence also keeps a state of {count(state_bytes)} bytes at t = 1" if state_bytes else \
        ""
    return Table(
        title=(f"Serving on {s['device']} ({binary_bytes(s['memory'])} = {count(s['memory'])} bytes a "
               "device): "
               f"weights in {s['weight_dtype']}, KV cache in {s['kv_dtype']}"),
        headers=("t", "weights/device", "KV bytes/token", "free for KV", f"batch at n = {n}",
                 "context at batch 1"),
        rows=rows,
        raw_headers=("tp", "weights", "kv_bytes_per_token", "free", "batch", "context"),
        raw_rows=raw,
        notes=(f"t: tensor-parallel degree; a device holds ⌈P/t⌉ of the {count(s['params'])} parameters, the "
               "rest of its memory is free for the KV cache, and it holds "
               f"K and V of ⌈g/t⌉ of the g = {cfg['n_kv_heads']} key/value heads (replicated where t > g; "
               "MLA's "
               f"latent is whole on each){state}. Batch: sequences of n tokens that fit; context: the "
               "longest single sequence (windows and chunks cap a layer's cache). Activations, the CUDA "
               "context and fragmentation are not counted: engines fit somewhat less. " + UNITS,),
    )


def _serving_time(report: dict[str, Any]) -> Table:
    s = report["serving"]
    t = s["time"]
    keys = ("prefill_flops", "prefill_bytes", "prefill_s", "decode_flops", "decode_bytes", "decode_s",
            "tokens_per_s")
    return Table(
        title=(f"Serving time on {s['device']}, batch {t['batch']}: prefill of n tokens and one decode step "
               f"at context n, roofline at {t['peak_tflops']:g} TFLOP/s and {t['bandwidth_gbs']:g} GB/s"),
        headers=("n", "prefill FLOPs", "prefill bytes", "prefill", "decode FLOPs", "decode bytes",
                 "decode step", "tokens/s"),
        rows=[(count(r["n_tokens"]), si(r["prefill_flops"], "FLOP"), binary_bytes(r["prefill_bytes"]),
               f"{si(r['prefill_s'], 's')} ({r['prefill_bound']})", si(r["decode_flops"], "FLOP"),
               binary_bytes(r["decode_bytes"]), f"{si(r['decode_s'], 's')} ({r['decode_bound']})",
               f"{r['tokens_per_s']:,.1f}") for r in t["rows"]],
        raw_headers=("n_tokens", *keys),
        raw_rows=[(r["n_tokens"], *(r[k] for k in keys)) for r in t["rows"]],
        notes=(f"time = max(FLOPs / peak, bytes / bandwidth) for each step, one device, weights in "
               f"{t['weight_dtype']}, KV cache in {t['kv_dtype']}. FLOPs: 2·N_mm a token (N_mm = "
               f"{count(t['matmul_params'])}, the parameters it is multiplied by: active, less the "
               "looked-up embeddings, a tied head counted) and its attention (QKᵀ and AV over the keys it "
               "sees; prefill causal). Bytes: every weight once a step, a mixture's routed experts as many "
               "as its tokens touch (uniform routing, in expectation: k_E for one token), and the KV cache "
               "and state the prefill writes or a decode step reads. An ideal kernel at peak: real engines "
               "reach a fraction of it, and a decode step also launches kernels and syncs. GB/s = 10^9 bytes "
               "a second; " + UNITS,),
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
        *(f"warning: {warning}" for warning in report["warnings"]),
        *(f"note: {note}" for note in report["notes"]),
    ]


# How the header names a layout field where a model differs from its arch's layout (calc.config.LAYOUTS).
LAYOUT_TEXT = {
    "learned_positions": ("learned positions", "no learned positions"),
    "norm_bias": ("norms with biases (LayerNorm)", "norms without biases"),
    "qkv_bias": ("Q, K, V biases", "no Q, K, V biases"),
    "o_bias": ("output-projection bias", "no output-projection bias"),
    "mlp_gated": ("gated MLP", "dense MLP"),
    "mlp_bias": ("MLP biases", "no MLP biases"),
}
# Features named whenever they are set.
FEATURE_TEXT = {
    "attention_sinks": "attention sinks", "attention_output_gate": "gated attention output",
    "shared_expert_gate": "gated shared expert", "expert_bias": "expert biases",
    "window_sinks": "attention sinks on the windowed layers", "layer_scalar": "a saved scalar per layer",
                "lm_head_bias": "unembedding bias",
}


def feature_lines(cfg: dict[str, Any]) -> list[str]:
    """One line naming the architecture features a model has beyond its arch's plain layout."""
    parts = []
    if cfg["n_experts"]:
        parts.append(f"MoE: {cfg['n_experts']} experts of d_e = {count(cfg['d_expert'])}, "
                     f"{cfg['experts_per_token']} per token"
                     + (f", {cfg['n_shared_experts']} shared" if cfg["n_shared_experts"] else "")
                     + (f", {cfg['n_zero_experts']} zero experts" if cfg["n_zero_experts"] else "")
                     + (f", {plural(cfg['n_dense_layers'], 'layer')} dense" if cfg["n_dense_layers"] else ""))
    if cfg["kv_lora_rank"]:
        parts.append(f"MLA: r_q = {cfg['q_lora_rank']}, r_kv = {cfg['kv_lora_rank']}, d_r = {cfg['d_rope']}, "
                     f"d_v = {cfg['d_v']}")
    if cfg["n_window_layers"]:
        parts.append(f"sliding window {count(cfg['sliding_window'])} on {cfg['n_window_layers']} of "
                     f"{cfg['n_layers']} layers"
                     + (f", {cfg['n_kv_heads_window']} K/V heads there" if cfg["n_kv_heads_window"] else ""))
    if cfg["d_head_full"] or cfg["n_kv_heads_full"] or cfg["full_values_are_keys"]:
        parts.append(f"full-attention layers: heads of d_kf = {cfg['d_head_full'] or cfg['d_head']}, "
                     f"{cfg['n_kv_heads_full'] or cfg['n_kv_heads']} K/V heads"
                     + (", values are the keys (no V projection)" if cfg["full_values_are_keys"] else ""))
    if cfg["n_kv_shared_layers"]:
        parts.append(f"the last {cfg['n_kv_shared_layers']} layers reuse earlier keys and values"
                     + (" (their MLP twice as wide)" if cfg["shared_mlp_double"] else ""))
    if cfg["per_layer_input"]:
        parts.append(f"per-layer embeddings of d_p = {cfg['per_layer_input']} (V_p = "
                     f"{count(cfg['per_layer_vocab'])})")
    if cfg["compressed"]:
        c = cfg["compressed"]
        parts.append(f"compressed attention (DeepSeek V4): a window of {count(cfg['sliding_window'])} on "
                     f"every layer; {c['csa_layers']} CSA layers (an entry every {c['csa_rate']} tokens, the "
                     f"top {count(cfg['index_topk'])} by an indexer of {cfg['index_heads']} heads of "
                     f"{cfg['index_head_dim']}), {c['hca_layers']} HCA layers (an entry every "
                     f"{c['hca_rate']}), "
                     f"{cfg['n_window_layers']} windowed only; one key that is the value; output in "
                     f"{c['out_groups']} groups of rank {c['out_rank']}; hyper-connections of {c['hc_mult']} "
                     f"streams; {c['hash_layers']} hash-routed layers")
    if cfg["n_chunked_layers"]:
        parts.append(f"chunked attention ({count(cfg['attention_chunk'])}) on {cfg['n_chunked_layers']} of "
                     f"{cfg['n_layers']} layers")
    if cfg["n_nope_layers"]:
        parts.append(f"{cfg['n_nope_layers']} NoPE layers")
    for key, kind in (("n_linear_layers", "linear-attention (Gated DeltaNet)"),
                      ("n_mamba_layers", "Mamba-2" if cfg["mamba2"] else "Mamba")):
        if cfg[key]:
            parts.append(f"{cfg[key]} of {cfg['n_layers']} layers {kind}")
    if cfg["n_mlp_free_layers"]:
        parts.append(f"{cfg['n_mlp_free_layers']} of {cfg['n_layers']} layers without an MLP")
    layout = LAYOUTS[cfg["arch"]]
    parts += [LAYOUT_TEXT[key][0 if cfg[key] else 1] for key in LAYOUT_TEXT if cfg[key] != layout[key]]
    if cfg["qk_norm"]:
        parts.append("q/k norms" + (" per head" if cfg["qk_norm_per_head"] else ""))
    parts += [text for key, text in FEATURE_TEXT.items() if cfg[key]]
    if cfg["position_offset"]:
        parts.append(f"{plural(cfg['position_offset'], 'extra position row')}")
    if cfg["norms_per_layer"] != 2:
        parts.append(f"{plural(cfg['norms_per_layer'], 'norm')} per layer")
    return [f"features: {'; '.join(parts)}"] if parts else []


def compressed_cache(cfg: dict[str, Any]) -> str:
    """DeepSeek V4's caches as transformers keeps them (DeepseekV4HCACache, DeepseekV4CSACache)."""
    c = cfg["compressed"]
    return (f"each layer's last w − 1 = {cfg['sliding_window'] - 1} keys of d_k = {cfg['d_head']}, its "
            f"values (one tensor on the {c['csa_layers'] + c['hca_layers']} compressed layers, two on the "
            f"{cfg['n_window_layers']} windowed); an entry of d_k every m_h = {c['hca_rate']} tokens on "
            f"{c['hca_layers']} HCA layers, of d_k + d_I = {cfg['d_head']} + {cfg['index_head_dim']} every "
            f"m_c = {c['csa_rate']} on {c['csa_layers']} CSA layers; the tokens of the window in progress (a "
            "key and a gate each) and a CSA layer's overlap with the next window (its gates in fp32)")


def split_heads(cfg: dict[str, Any]) -> str:
    """Gemma 4's caches: each kind of layer's K/V heads, and the layers that keep none of their own."""
    windowed = cfg["n_window_layers"] - cfg["n_kv_shared_window_layers"]
    full = (cfg["n_layers"] - cfg["n_window_layers"] - cfg["n_kv_shared_layers"]
            + cfg["n_kv_shared_window_layers"])
    text = (f"{windowed} windowed layers of g = {cfg['n_kv_heads']} K/V heads of d_k = {cfg['d_head']}, "
            f"{full} "
            f"full of g_f = {cfg['n_kv_heads_full'] or cfg['n_kv_heads']} of d_kf = "
            f"{cfg['d_head_full'] or cfg['d_head']}")
    if cfg["full_values_are_keys"]:
        text += " (values are the keys there: no V weights, but both cached, as transformers caches them)"
    if cfg["n_kv_shared_layers"]:
        text += (f"; the last {cfg['n_kv_shared_layers']} layers (L_x, {cfg['n_kv_shared_window_layers']} "
                 "windowed) reuse an earlier layer's keys and values and cache none")
    return text


def plural(k: int, noun: str) -> str:
    return f"{k} {noun}" + ("" if k == 1 else "s")


def wrap(text: str, width: int | None, indent: str = "") -> list[str]:
    """``text`` as lines of at most ``width`` columns (one line when ``width`` is None or 0)."""
    if not width:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [""]


def fit(rows: Sequence[Sequence[str]], headers: Sequence[str], width: int | None,
        tablefmt: str = "simple") -> str:
    """A table, split into column groups that each fit ``width`` (the first column repeated in each)
    when the whole is wider; each group after the first is headed "(continued)"."""
    from tabulate import tabulate

    label_width: int | None = None  # the first column wrapped when it and any other column are too wide

    def draw(columns: Sequence[int]) -> str:
        return tabulate([[row[i] for i in columns] for row in rows], headers=[headers[i] for i in columns],
                        tablefmt=tablefmt, disable_numparse=True,
                        colalign=("left", *("right",) * (len(columns) - 1)),
                        maxcolwidths=[label_width] + [None] * (len(columns) - 1))

    whole = draw(range(len(headers)))
    lines = whole.splitlines()
    if not width or max(map(len, lines)) <= width or tablefmt != "simple":
        return whole
    # "simple" underlines each header with dashes as wide as its column, columns 2 spaces apart
    widths = [len(dashes) for dashes in lines[1].split()]
    if len(widths) > 1 and widths[0] + 2 + max(widths[1:]) > width:
        label_width = max(10, width - 2 - max(widths[1:]))
        widths[0] = min(widths[0], label_width)
    groups: list[list[int]] = [[0]]
    used = widths[0]
    for column in range(1, len(headers)):
        if len(groups[-1]) > 1 and used + 2 + widths[column] > width:
            groups.append([0])
            used = widths[0]
        groups[-1].append(column)
        used += 2 + widths[column]
    return "\n\n(continued)\n".join(draw(group) for group in groups)


def render(report: dict[str, Any], fmt: str = "table", *, width: int | None = DEFAULT_WIDTH,
           kinds_only: bool = False) -> str:
    """The report in one of ``FORMATS``. ``table``: lines of at most ``width`` columns, wide tables split
    into column groups and notes wrapped (``width`` None or 0: one line each, as the other formats).
    ``kinds_only``: the header and the per-kind table alone (JSON: ``model``, ``config`` and
    ``cost_by_kind``), whatever kinds the model has."""
    shown = [_by_kind(report)] if kinds_only else tables(report)
    if fmt == "json":
        if kinds_only:
            return json.dumps(plain({k: report[k] for k in ("model", "config", "cost_by_kind")}), indent=2)
        return to_json(report)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for table in shown:
            out.write(f"# {table.title}\n")
            writer.writerow(table.raw_headers)
            writer.writerows(plain(list(table.raw_rows)))
            out.write("\n")
        return out.getvalue().rstrip("\n")
    tablefmt = {"table": "simple", "github": "github", "latex": "latex"}[fmt]
    prefix = {"table": "", "github": "", "latex": "% "}[fmt]
    width = width if fmt == "table" else None
    blocks = ["\n".join(prefix + line for text in header_lines(report) for line in wrap(text, width, "  "))]
    for table in shown:
        title = f"### {table.title}" if fmt == "github" else prefix + table.title
        body = fit(table.rows, table.headers, width, tablefmt)
        notes = [prefix + line for note in table.notes for line in wrap(note, width)]
        blocks.append("\n".join([*wrap(title, width), "", body, "", *notes]))
    return "\n\n".join(blocks)
