"""What attention costs at n tokens: pattern memory, FLOPs, KV cache, modelled time.

Each row is a formula of `calc.formulas` evaluated for a configuration and a sequence length.
Bytes are exact integers; the human units used when printing are MiB = 2^20 and GiB = 2^30 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sympy import Expr, Integer, Max, Min, Rational

from calc import formulas as f
from calc.ledger import evaluate_layers, non_embedding, values
from calc.presets import Config

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
# A common FlashAttention tile side (impl.flash's default too, not imported so that NumPy stays out of
# the CLI's start-up). The tiled column is per head, in fp32: the running statistics and the score
# tile are kept in fp32 whatever the input dtype.
DEFAULT_BLOCK = 128
# NVIDIA H100 SXM5 datasheet: 989 TFLOP/s dense BF16/FP16 tensor core, 3.35 TB/s HBM3.
DEFAULT_PEAK_TFLOPS = 989.0
DEFAULT_BANDWIDTH_GBS = 3350.0


def default_seqs(n_ctx: int) -> list[int]:
    """1,024, 2,048, ... doubling up to 4·n_ctx (or just 4·n_ctx when that is below 1,024)."""
    seqs, n = [], 1024
    while n <= 4 * n_ctx:
        seqs.append(n)
        n *= 2
    return seqs or [4 * n_ctx]


def _at(expr: Expr, config: Config, **extra: int) -> int:
    env = values(config)
    env.update({getattr(f, name): value for name, value in extra.items()})
    if f.n in env:
        env.update(f.chunk_values(env[f.n], env[f.C]))
    result = evaluate_layers(expr, env, config)  # each attention layer at its own shape (Gemma 4)
    if not result.is_Integer:
        raise ValueError(f"{expr} is not a whole number for {config.name}: {result}")
    return int(result)


def largest_head_entries(config: Config) -> Expr:
    """Entries of the largest head's pattern: n² where any attention layer sees every key, else (DeepSeek
    V4) n·(min(n, w) + the pooled entries a query reads), the larger of its CSA and HCA layers', else
    n·min(n, w) where layers have a window (a query sees at most w keys), else the chunks' blocks."""
    if config.n_full_layers:
        return f.entries_per_head
    if config.n_csa_layers or config.n_hca_layers:
        pooled = [entries for layers, entries in ((config.n_csa_layers, Min(f.csa_entries, f.k_I)),
                                                  (config.n_hca_layers, f.hca_entries)) if layers]
        return f.n * (Min(f.n, f.w) + Max(*pooled))
    if config.n_window_layers:
        return f.windowed_entries_per_head
    return f.chunked_entries_per_head if config.n_chunked_layers else f.sparse_entries_per_head


def pattern_memory(config: Config, seqs: Sequence[int], *, block: int = DEFAULT_BLOCK) -> list[dict]:
    """Entries of the attention pattern and its bytes in fp32 and fp16/bf16, per head and layer (the
    largest) and per model (all stored at once, the naive upper bound; sliding-window layers hold
    n×min(n, w)), beside a tiled kernel's per-head working set."""
    per_head = largest_head_entries(config)
    rows = []
    for n in seqs:
        entries = {
            scope: _at(expr, config, n=n)
            for scope, expr in (("head", per_head), ("layer", f.h * per_head), ("model", f.entries_per_model))
        }
        row: dict[str, Any] = {"n_tokens": n}
        row.update({f"entries_per_{scope}": count for scope, count in entries.items()})
        for scope, count in entries.items():
            row[f"bytes_per_{scope}"] = {"fp32": 4 * count, "fp16": 2 * count}
        row["tiled_bytes_per_head"] = 4 * _at(f.tiled_entries_per_head, config, n=n, B=block)
        rows.append(row)
    return rows


def flops(config: Config, seqs: Sequence[int]) -> list[dict[str, Any]]:
    """Attention FLOPs (QKᵀ over d_k and AV over d_v, 2 per multiply-add) per head and layer (the
    largest) and per model, the causal count, and the ratio to the previous row (4 per doubling of n:
    the n² law; 2 once every layer's window is full)."""
    entries = largest_head_entries(config)
    qk, av = 2 * f.d_k * entries, 2 * f.d_v * entries
    rows: list[dict[str, Any]] = []
    for n in seqs:
        per_head = _at(qk + av, config, n=n)
        previous = rows[-1]["attention_flops_per_head"] if rows else None
        rows.append({
            "n_tokens": n,
            "qk_flops_per_head": _at(qk, config, n=n),
            "av_flops_per_head": _at(av, config, n=n),
            "attention_flops_per_head": per_head,
            "attention_flops_per_layer": _at(f.h * (qk + av), config, n=n),
            "attention_flops_per_model": _at(f.attention_flops_per_model, config, n=n),
            "causal_flops_per_model": _at(f.causal_flops_per_model, config, n=n),
            "ratio": None if previous is None else Rational(per_head, previous),
        })
    return rows


def forward_flops_per_token(config: Config, seqs: Sequence[int]) -> list[dict[str, Any]]:
    """Forward FLOPs per token at context n by Kaplan et al.'s and PaLM's conventions, with N the active
    non-embedding parameters (all of them for a dense model) and the keys each layer's window lets a
    token see."""
    big_n = non_embedding(config, per_token=True)
    return [
        {
            "n_tokens": n,
            "non_embedding_params": big_n,
            "kaplan": _at(f.forward_flops_per_token_kaplan, config, n=n, N=big_n),
            "palm": _at(f.forward_flops_per_token_palm, config, n=n, N=big_n),
        }
        for n in seqs
    ]


def kv_cache_formulas(config: Config) -> tuple[Expr, Expr]:
    """(bytes per token while no window is full, bytes held at n tokens) for the architecture: K and V
    of g heads per layer (GQA), or MLA's latent and rotary key; window layers hold at most w tokens."""
    if config.is_mla:
        return f.kv_cache_bytes_per_token_mla, f.kv_cache_bytes_mla
    if config.compressed is not None:  # DeepSeek V4: the pooled entries per token; windows, entries, buffers
        return f.kv_cache_bytes_per_token_compressed, f.kv_cache_bytes_compressed
    if config.general_gqa:
        return f.kv_cache_bytes_per_token_dv, f.kv_cache_bytes_dv
    if config.split_attention:  # Gemma 4: each kind of layer its own K/V shape, shared layers none
        return f.kv_cache_bytes_per_token_split, f.kv_cache_bytes_split
    return f.kv_cache_bytes_per_token, f.kv_cache_bytes


def per_token_bytes(expr: Expr, config: Config, **extra: int) -> int | Rational:
    """KV cache bytes per token: an int, or the exact Rational where DeepSeek V4's pooled entries (an entry
    of d_k every m tokens) do not make a whole number."""
    env = values(config)
    env.update({getattr(f, name): value for name, value in extra.items()})
    result = evaluate_layers(expr, env, config)
    if result.is_Integer:
        return int(result)
    if config.compressed is None:
        raise ValueError(f"{expr} is not a whole number for {config.name}: {result}")
    return result


def state_formula(config: Config) -> Expr:
    """Bytes of the fixed-size state one sequence keeps in the linear-attention and Mamba layers (0 for
    a model of attention layers only), at b bytes a value."""
    expr: Expr = Integer(0)
    if config.n_linear_layers:
        expr += f.L_lin * f.deltanet_state
    if config.n_mamba_layers:
        expr += f.L_m * (f.mamba2_state if config.mamba2 is not None else f.mamba_state)
    return expr * f.b


def kv_cache(config: Config, seqs: Sequence[int], dtype: str) -> dict[str, Any]:
    """KV cache bytes per token (GQA: 2·L·g·d_k·b; MLA: L·(r_kv + d_r)·b), and the bytes held for the
    full context and at each n, sliding-window layers holding at most their window."""
    size = DTYPE_BYTES[dtype]
    per_token_expr, held = kv_cache_formulas(config)
    per_token = per_token_bytes(per_token_expr, config, b=size)
    return {
        "dtype": dtype,
        "bytes_per_value": size,
        "bytes_per_token": per_token,
        "n_ctx": config.n_ctx,
        "bytes_per_context": _at(held, config, n=config.n_ctx, b=size),
        "state_bytes_per_sequence": _at(state_formula(config), config, b=size),
        "rows": [{"n_tokens": n, "bytes": _at(held, config, n=n, b=size)} for n in seqs],
    }


def roofline(
    config: Config, seqs: Sequence[int], dtype: str, *, peak_tflops: float, bandwidth_gbs: float
) -> dict[str, Any]:
    """Modelled time of attention's n² part of one forward pass (batch 1, whole model): each of the
    naive and tiled kernels takes max(FLOPs / peak, bytes moved / bandwidth)."""
    size = DTYPE_BYTES[dtype]
    rows = []
    for n in seqs:
        work = _at(f.attention_flops_per_model, config, n=n)
        compute_s = work / (peak_tflops * 1e12)
        row: dict[str, Any] = {"n_tokens": n, "flops": work, "compute_s": compute_s}
        for kernel, expr in (("naive", f.naive_bytes_per_model), ("tiled", f.tiled_bytes_per_model)):
            moved = _at(expr, config, n=n, b=size)
            memory_s = moved / (bandwidth_gbs * 1e9)
            row[f"{kernel}_bytes"] = moved
            row[f"{kernel}_s"] = max(compute_s, memory_s)
            row[f"{kernel}_bound"] = "compute" if compute_s >= memory_s else "memory"
        rows.append(row)
    return {"dtype": dtype, "peak_tflops": peak_tflops, "bandwidth_gbs": bandwidth_gbs, "rows": rows}
