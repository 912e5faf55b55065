"""Serving memory per device: the weights, the KV cache, and the largest batch and context that fit.

For each tensor-parallel degree t, a device holds ⌈P/t⌉ parameters and its share of the cache: K and V of
⌈g/t⌉ key/value heads (heads are replicated where t > g, as vLLM does), MLA's latent whole (it has no
heads to split), and ⌈·/t⌉ of a linear-attention or Mamba layer's state. What is left of the device's
memory after the weights holds the cache; activations, the CUDA context and fragmentation are not
counted, so real engines fit somewhat less (vLLM reserves 10 % by default).

Serving time (`serving_time`): a prefill of n tokens and one decode step at context n, each a roofline on one
device, max(FLOPs / peak, bytes / bandwidth), the FLOPs from the parameters a token is multiplied by and its
attention, the bytes from every weight read once a step (a mixture's routed experts as many as the step's
tokens touch) and the KV cache the step writes or reads.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

from calc import costs
from calc import formulas as f
from calc.config import Config, ConfigError
from calc.ledger import active, checkpoint, evaluate_layers, mlp_layers, non_embedding, values


class Device(NamedTuple):
    """One accelerator as its datasheet prints it: memory (GB = 10^9 bytes, read as SI; the driver shows a
    little more on HBM parts and a little less on GDDR ones; pass --gpu-memory for yours), dense BF16
    tensor throughput (half the figure NVIDIA prints with 2:4 sparsity) and memory bandwidth (GB/s = 10^9
    bytes a second)."""

    label: str
    memory: int
    peak_tflops: float
    bandwidth_gbs: float


GPUS: dict[str, Device] = {
    "h100": Device("NVIDIA H100 SXM5, 80 GB HBM3", 80 * 10**9, 989.0, 3350.0),
    "h200": Device("NVIDIA H200 SXM, 141 GB HBM3e", 141 * 10**9, 989.0, 4800.0),
    "a100-80gb": Device("NVIDIA A100 80GB SXM, 80 GB HBM2e", 80 * 10**9, 312.0, 2039.0),
    "a100-40gb": Device("NVIDIA A100 40GB SXM, 40 GB HBM2", 40 * 10**9, 312.0, 1555.0),
    "l40s": Device("NVIDIA L40S, 48 GB GDDR6", 48 * 10**9, 362.05, 864.0),
    "mi300x": Device("AMD Instinct MI300X, 192 GB HBM3", 192 * 10**9, 1307.4, 5300.0),
}
TP_DEGREES = (1, 2, 4, 8)
UNITS = {"": None, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
# Contexts past this many tokens are reported as unbounded (every layer's cache is capped).
CONTEXT_LIMIT = 2**40


def parse_size(text: str) -> int:
    """Bytes of a size such as ``80GiB``, ``141 GB`` or ``81920MiB`` (GB = 10^9, GiB = 2^30 bytes)."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = UNITS.get(found[2].lower(), 0) if found else 0
    if not found or unit is None or not unit:
        raise ValueError(f"must be a size with a unit, such as 80GiB or 141GB, got {text!r}")
    value = math.floor(float(found[1]) * unit)
    if value < 1:
        raise ValueError(f"must be a positive size, got {text!r}")
    return value


def _split(config: Config, tp: int) -> dict[Any, int]:
    """The formula symbols for one device of ``tp``: its key/value heads and state channels."""
    env = values(config)
    env[f.g] = math.ceil(config.n_kv_heads / tp)  # g_w, a windowed layer's, below
    for symbol in (f.h_lk, f.h_lv, f.d_in, f.G, f.g_w):
        if symbol in env:
            env[symbol] = math.ceil(env[symbol] / tp)
    return env


def sequence_bytes(config: Config, n: int, kv_bytes: int, tp: int = 1) -> int:
    """Bytes one sequence of n tokens keeps on one of ``tp`` devices: its KV cache and its state."""
    env = _split(config, tp)
    env.update({f.n: n, f.b: kv_bytes})
    held = costs.kv_cache_formulas(config)[1]
    return f.evaluate_count(held + costs.state_formula(config), env)


def largest_context(config: Config, free: int, kv_bytes: int, tp: int) -> int | None:
    """The most tokens one sequence can hold in ``free`` bytes (None: unbounded, every cache capped)."""
    if sequence_bytes(config, 1, kv_bytes, tp) > free:
        return 0
    if sequence_bytes(config, CONTEXT_LIMIT, kv_bytes, tp) <= free:
        return None
    low, high = 1, CONTEXT_LIMIT  # bytes grow with n: sequence_bytes(low) ≤ free < sequence_bytes(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if sequence_bytes(config, mid, kv_bytes, tp) <= free else (low, mid)
    return _every_prefix_fits(config, free, kv_bytes, tp, low)


def _every_prefix_fits(config: Config, free: int, kv_bytes: int, tp: int, found: int) -> int:
    """``found`` (sequence_bytes(found) ≤ free < sequence_bytes(found + 1)), or less where an earlier
    prefix does not fit: DeepSeek V4's cache falls when a window closes (its tokens in progress, a key and a
    gate each, become one entry), so the bytes grow only between closes, and a sequence must fit at every
    length on its way. The tokens in progress and the overlap hold at most S bytes, and the entries grow by at
    least R bytes a period of P tokens (the rates' least common multiple): an earlier overflow lies within
    (⌈S/R⌉ + 1)·P tokens of ``found``, at the end of a stretch between closes, and the first one within its
    stretch is found by bisection, the bytes rising there."""
    c = config.compressed
    rates = [rate for layers, rate in ((config.n_csa_layers, c.csa_rate), (config.n_hca_layers, c.hca_rate))
             if layers] if c is not None else []
    if not rates:
        return found
    period = math.lcm(*rates)
    env = {**_split(config, tp), f.b: kv_bytes}
    growth = f.evaluate(f.kv_cache_bytes_per_token_compressed * period, env)
    held_most = f.evaluate(f.L_hca * 2 * f.d_k * (f.m_h - 1) * f.b + f.L_csa * (
        4 * (f.d_k + f.d_I) * (f.m_c - 1) * f.b + f.m_c * (f.d_k + f.d_I) * (f.b + 4)), env)
    start = max(1, found - (math.ceil(held_most / growth) + 1) * period)
    previous = start - 1
    for end in range(start, found + 1):  # each stretch ends where a window closes with the next token
        if all((end + 1) % rate for rate in rates):
            continue
        if sequence_bytes(config, end, kv_bytes, tp) > free:
            low, high = previous, end  # bytes(low) ≤ free (or low = start − 1), bytes(high) > free
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if sequence_bytes(config, mid, kv_bytes, tp) <= free else (low, mid)
            return low
        previous = end
    return found


def serving(config: Config, *, memory: int, device: str, kv_dtype: str = "bf16", weight_dtype: str = "bf16",
            n: int | None = None) -> dict[str, Any]:
    """Per tensor-parallel degree: weights and cache per device, and the largest batch at context n
    (default n_ctx) and the largest context at batch 1 that fit in ``memory`` bytes a device."""
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 1:
        raise ConfigError("gpu_memory", f"must be a positive number of bytes, got {memory!r}")
    n = n or config.n_ctx
    kv_bytes, weight_bytes = costs.DTYPE_BYTES[kv_dtype], costs.DTYPE_BYTES[weight_dtype]
    params = checkpoint(config)["total"]
    per_token = costs.kv_cache_formulas(config)[0]
    rows = []
    for tp in TP_DEGREES:
        row: dict[str, Any] = {"tp": tp}
        if config.n_heads % tp:
            rows.append({**row, "fits": False, "reason": f"{config.n_heads} heads do not split over {tp}"})
            continue
        env = _split(config, tp)
        env[f.b] = kv_bytes
        weights = math.ceil(params / tp) * weight_bytes
        free = memory - weights
        per_token_bytes = f.evaluate(per_token, env)  # DeepSeek V4's: a Rational where m does not divide
        row.update(weights=weights,
                   kv_bytes_per_token=int(per_token_bytes) if per_token_bytes.is_Integer else per_token_bytes,
                   state_bytes_per_sequence=f.evaluate_count(costs.state_formula(config), env),
                   free=max(free, 0))
        if free <= 0:
            rows.append({**row, "fits": False, "reason": "the weights alone exceed the memory"})
            continue
        per_sequence = sequence_bytes(config, n, kv_bytes, tp)
        rows.append({**row, "fits": True, "sequence_bytes": per_sequence, "batch": free // per_sequence,
                     "context": largest_context(config, free, kv_bytes, tp)})
    return {"device": device, "memory": memory, "kv_dtype": kv_dtype, "weight_dtype": weight_dtype,
            "params": params, "n_tokens": n, "rows": rows}


def matmul_params(config: Config) -> int:
    """N_mm: the parameters a token is multiplied by: the active ones less the looked-up embedding tables,
    the tied head's matrix counted back (the head multiplies by it)."""
    return non_embedding(config, per_token=True) + (config.vocab_size * config.d_model
                                                    if config.tied_embeddings else 0)


def _expert_params(config: Config) -> int:
    """p_e: one routed expert's parameters (with its biases, where experts have them)."""
    expert = f.expert if config.mlp_gated else f.expert_ungated
    return f.evaluate_count(expert + (f.expert_bias if config.expert_bias else 0), values(config))


def step_bytes(config: Config, tokens: int, weight_bytes: int) -> int:
    """Weight bytes one step of ``tokens`` tokens reads (f.step_weight_bytes): every weight outside the routed
    experts once, the embedding rows the tokens look up, and the experts they touch in expectation (uniform,
    independent routing; rounded up to whole bytes)."""
    parts = checkpoint(config)
    shared = (parts["total"] - parts["token_embedding"] - parts.get("position_embedding", 0)
              + (config.vocab_size * config.d_model if config.tied_embeddings else 0)
              + tokens * config.d_model * (2 if config.learned_positions else 1)
              # Gemma 4's per-layer embedding table: the rows of L·d_p the tokens look up, as for the token's
              - parts.get("per_layer_embedding", 0) + tokens * config.n_layers * config.per_layer_input)
    env = {**values(config), f.b_w: weight_bytes, f.t_r: tokens}
    if not config.is_moe:
        return weight_bytes * shared
    p_e = _expert_params(config)
    routed = (config.n_mlp_layers - config.n_dense_layers) * config.n_experts * p_e
    env.update({f.P_s: shared - routed, f.p_e: p_e})
    value = f.evaluate(mlp_layers(config, f.step_weight_bytes), env)
    return -(-int(value.p) // int(value.q))


def serving_time(config: Config, seqs: list[int], *, peak_tflops: float, bandwidth_gbs: float, batch: int = 1,
                 kv_dtype: str = "bf16", weight_dtype: str = "bf16") -> dict[str, Any]:
    """Prefill of ``batch`` sequences of n tokens and one decode step at context n, each
    max(FLOPs / peak, bytes / bandwidth) on one device: FLOPs from f.prefill_flops and f.decode_flops, bytes
    the weights a step reads (step_bytes) and the KV cache and state it writes (prefill) or reads (decode)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError("batch", f"must be a positive integer, got {batch!r}")
    kv_bytes, weight_bytes = costs.DTYPE_BYTES[kv_dtype], costs.DTYPE_BYTES[weight_dtype]
    held = costs.kv_cache_formulas(config)[1] + costs.state_formula(config)
    n_mm = matmul_params(config)
    peak, bandwidth = peak_tflops * 1e12, bandwidth_gbs * 1e9
    rows = []
    for n in seqs:
        env = values(config)
        env.update({f.n: n, f.b: kv_bytes, f.b_m: batch, f.N_mm: n_mm, **f.chunk_values(n, env[f.C])})
        cache = batch * f.evaluate_count(held, env)
        prefill_flops = int(evaluate_layers(f.prefill_flops, env, config))  # each layer at its shape
        decode_flops = int(evaluate_layers(f.decode_flops, env, config))
        prefill_bytes = step_bytes(config, batch * n, weight_bytes) + cache
        decode_weights = step_bytes(config, batch, weight_bytes)
        row: dict[str, Any] = {"n_tokens": n, "prefill_flops": prefill_flops, "prefill_bytes": prefill_bytes,
                               "decode_flops": decode_flops, "decode_weight_bytes": decode_weights,
                               "decode_kv_bytes": cache, "decode_bytes": decode_weights + cache}
        for step in ("prefill", "decode"):
            compute, memory = row[f"{step}_flops"] / peak, row[f"{step}_bytes"] / bandwidth
            row[f"{step}_s"] = max(compute, memory)
            row[f"{step}_bound"] = "compute" if compute >= memory else "memory"
        row["tokens_per_s"] = batch / row["decode_s"]
        rows.append(row)
    return {"peak_tflops": peak_tflops, "bandwidth_gbs": bandwidth_gbs, "batch": batch, "kv_dtype": kv_dtype,
            "weight_dtype": weight_dtype, "matmul_params": n_mm, "active": active(config), "rows": rows}
