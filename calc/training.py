"""Training memory per device: model states (weights, gradients, Adam) and activations, where n² lives.

Model states follow Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", §3.1 and §5; `calc.formulas.zero_model_states`): mixed-precision Adam keeps 2 bytes of
weights and 2 of gradients per parameter in fp16/bf16 and K = 12 bytes of fp32 master weights, momentum
and variance, 16 in all. ZeRO partitions them over N_d data-parallel devices: stage 1 the optimizer states,
stage 2 also the gradients, stage 3 also the weights. Tensor parallelism over t devices splits every weight
matrix (Megatron-LM's column and row parallel layers, the vocabulary too); each device then holds ⌈P/t⌉ of
the P parameters, and ZeRO a ⌈·/N_d⌉ part of those (partitions padded to equal size).

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models"), Table 2: n·b_m·d·(10 + 24/t + 5·h·n/(d·t)) bytes per layer with tensor parallelism over t,
n·b_m·d·(34 + 5·h·n/d)/t with sequence parallelism as well (see calc.formulas); the n² part, 5·h·n²·b_m/t,
is the softmax output, its dropout mask and the dropped-out weights. Selective recomputation drops it;
FlashAttention never writes it and keeps each row's logsumexp instead; full recomputation keeps only each
layer's input, 2·n·b_m·d.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from sympy import Expr, Rational

from calc import formulas as f
from calc.config import Config
from calc.ledger import checkpoint, values

# Bytes per parameter of (weights, gradients, optimizer states) under Adam: b_w, b_g, b_o (ZeRO's K).
PRECISIONS: dict[str, tuple[int, int, int]] = {
    # fp16/bf16 weights and gradients; fp32 master weights, momentum and variance (ZeRO §3.1)
    "mixed": (2, 2, 12),
    "bf16": (2, 2, 4),  # everything in bf16: weights, gradients, momentum, variance
    "fp32": (4, 4, 8),  # everything in fp32
}
ZERO_STAGES = tuple(f.zero_model_states)


class Activations(NamedTuple):
    """One parallelism's rows of Korthikanti et al.'s Table 2: per layer and device, in bytes."""

    stored: Expr  # every activation kept for the backward pass
    selective: Expr  # the n² term recomputed
    flash: Expr  # the n² term never written, a logsumexp per row kept


# sequence parallelism on (True) or off: Table 2's "tensor + sequence parallel" and "tensor parallel" rows
ACTIVATIONS = {
    True: Activations(f.activations_tp_sp, f.activations_selective_tp_sp, f.activations_flash_tp_sp),
    False: Activations(f.activations_tp, f.activations_selective_tp, f.activations_flash_tp),
}


def model_states(params: int, *, precision: str = "mixed", zero: int = 0, dp: int = 1,
                 tp: int = 1) -> dict[str, int]:
    """Bytes of weights, gradients and optimizer states one device holds, and their ``total``: ZeRO's
    formulas (`calc.formulas.zero_model_states`) at P = ⌈params/tp⌉, exactly.

    ``zero`` is the ZeRO stage (0: none; 1: optimizer states, 2: and gradients, 3: and weights
    partitioned over ``dp`` devices). ZeRO's Figure 1 (P = 7.5 B, N_d = 64, mixed precision): 120 GB,
    31.4 GB, 16.6 GB, 1.9 GB for stages 0 to 3 (GB = 10^9 bytes).
    """
    for name, value in (("params", params), ("dp", dp), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if zero not in ZERO_STAGES:
        raise ValueError(f"zero must be one of 0, 1, 2, 3, got {zero!r}")
    weight, grad, optimizer = PRECISIONS[precision]
    env = {f.P: math.ceil(params / tp), f.N_d: dp, f.b_w: weight, f.b_g: grad, f.b_o: optimizer}
    names = ("weights", "gradients", "optimizer")
    states = {name: f.evaluate_count(expr, env)
              for name, expr in zip(names, f.zero_model_states[zero], strict=True)}
    return {**states, "total": sum(states.values())}


def _bytes(expr: Expr, env: dict[Any, int]) -> int:
    """Whole bytes of ``expr`` (rounded up where a split over t devices is not exact)."""
    value = f.evaluate(expr, env)
    return -(-int(value.p) // int(value.q))


def activation_rows(config: Config, seqs: Sequence[int], *, micro_batch: int = 1, tp: int = 1,
                    sequence_parallel: bool = True) -> list[dict]:
    """Activation bytes per device at each n (Korthikanti et al.'s Table 2 for tensor parallelism over
    ``tp``, with or without sequence parallelism): one layer and all L layers, stored whole, with selective
    recomputation, with FlashAttention and with full recomputation, and the n² term's exact share."""
    env = values(config)
    env.update({f.b_m: micro_batch, f.t: tp})
    rule = ACTIVATIONS[sequence_parallel]
    rows = []
    for n in seqs:
        env[f.n] = n
        per_layer = _bytes(rule.stored, env)
        rows.append({
            "n_tokens": n,
            "activations_per_layer": per_layer,
            "quadratic_per_layer": _bytes(f.activations_quadratic / f.t, env),
            # with sequence parallelism 5·h·n / (34·d + 5·h·n), whatever b_m and t
            "quadratic_share": Rational(f.evaluate(f.activations_quadratic / f.t / rule.stored, env)),
            "activations": config.n_layers * per_layer,
            "selective": config.n_layers * _bytes(rule.selective, env),
            "flash": config.n_layers * _bytes(rule.flash, env),
            "full_recompute": config.n_layers * _bytes(f.activations_full_recompute, env),
        })
    return rows


# The dtype the activations are kept in under each precision: mixed precision and bf16 compute in bf16
ACTIVATION_DTYPE = {"mixed": "bf16", "bf16": "bf16", "fp32": "fp32"}


def derived_coverage(config: Config, tp: int) -> str | None:
    """Why the training table gives no activation figure derived per layer kind (None: it does)."""
    from calc import activations

    if tp != 1:
        return "derived for one device; with tensor parallelism only Korthikanti et al.'s formula splits"
    return activations.coverage(config)


def training(config: Config, seqs: Sequence[int], *, precision: str = "mixed", zero: int = 0, dp: int = 1,
             tp: int = 1, micro_batch: int = 1, sequence_parallel: bool = True) -> dict[str, Any]:
    """Model states and activations per device over ``seqs``, with the totals of each strategy: Korthikanti
    et al.'s GPT-layer formula, and (one device, the model types calc.activations covers) every layer's and
    the head's bytes derived per layer kind, eager and FlashAttention-style (``derived_eager``,
    ``derived_flash``; None where not derived, ``derived.reason`` says why)."""
    from calc import activations

    params = checkpoint(config)["total"]
    states = model_states(params, precision=precision, zero=zero, dp=dp, tp=tp)
    rows = activation_rows(config, seqs, micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel)
    reason = derived_coverage(config, tp)
    dtype = ACTIVATION_DTYPE[precision]
    for row in rows:
        for kind in ("activations", "selective", "flash"):
            row[f"total_{kind}"] = states["total"] + row[kind]
        for attention in activations.ATTENTIONS:
            derived = None if reason else activations.model_bytes(
                config, row["n_tokens"], attention=attention, micro_batch=micro_batch, dtype=dtype)
            row[f"derived_{attention}"] = derived
            row[f"total_derived_{attention}"] = None if derived is None else states["total"] + derived
    per_param = dict(zip(("weights", "gradients", "optimizer"), PRECISIONS[precision], strict=True))
    return {"precision": precision, "bytes_per_param": per_param,
            "zero": zero, "dp": dp, "tp": tp, "sequence_parallel": sequence_parallel,
            "micro_batch": micro_batch, "params": params, "model_states": states,
            "derived": {"dtype": dtype, "reason": reason}, "rows": rows}
