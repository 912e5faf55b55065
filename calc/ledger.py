"""Parameter ledgers of a configuration: the source ledger, the checkpoint count, the active count.

The source ledger counts weight matrices only, with the embedding and the unembedding counted
separately even when a checkpoint ties them (the accounting of 3Blue1Brown's video and of the
source article: GPT-3 = 175,181,291,520). The checkpoint count is what a released checkpoint of the
architecture stores: biases, norms, learned positions, one copy of tied embeddings, every expert.
The active count is what one token uses: a mixture-of-experts model runs k_E of its E experts.
"""

from __future__ import annotations

import dataclasses

from sympy import Expr, Integer, Rational, Symbol

from calc import formulas as f
from calc.config import Config


def values(config: Config) -> dict[Symbol, int]:
    """The formula symbols' values for ``config`` (0 for the features it does not have)."""
    return {
        f.d: config.d_model, f.h: config.n_heads, f.d_k: config.d_head, f.g: config.n_kv_heads,
        f.d_ff: config.d_ff, f.L: config.n_layers, f.V: config.vocab_size, f.n_ctx: config.n_ctx,
        f.d_v: config.d_v, f.w: config.sliding_window or config.n_ctx, f.L_w: config.n_window_layers,
        f.E: config.n_experts, f.k_E: config.experts_per_token, f.S: config.n_shared_experts,
        f.d_e: config.d_expert, f.L_d: config.n_dense_layers, f.r_q: config.q_lora_rank,
        f.r_kv: config.kv_lora_rank, f.d_r: config.d_rope,
    }


def _count(expr: Expr, config: Config) -> int:
    return f.evaluate_count(expr, values(config))


def attention_per_layer_formula(config: Config) -> Expr:
    """One layer's attention weight matrices: Q, K, V, O (GQA) or MLA's down and up projections."""
    if not config.is_mla:
        return f.attention_per_layer
    return (f.mla_q if config.q_lora_rank else f.mla_q_full) + f.mla_kv + f.mla_o


def mlp_formulas(config: Config) -> dict[str, Expr]:
    """The MLP's weight matrices by component: one dense or gated MLP per layer, or MoE's parts."""
    if config.arch in ("gpt", "neox"):
        return {"mlp": f.mlp_dense}
    if not config.is_moe:
        return {"mlp": f.mlp_gated}
    parts = {"experts": f.moe_experts, "router": f.moe_router}
    if config.n_shared_experts:
        parts["shared_experts"] = f.moe_shared_experts
    if config.n_dense_layers:
        parts["dense_mlp"] = f.mlp_dense_layers
    return parts


def source_ledger(config: Config) -> dict[str, int | Rational]:
    """Weight matrices by component, with ``total`` and the exact ``attention_share`` (a Rational).

    ``attention_per_head`` is a layer's attention over h: exact for the presets; a custom config
    whose h/g does not divide 2·d·d_k gets a Rational there.
    """
    per_layer = attention_per_layer_formula(config)
    mlp = sum(mlp_formulas(config).values(), Integer(0))
    ledger: dict[str, int | Rational] = {
        "attention_per_head": f.evaluate(per_layer / f.h, values(config)),
        "attention_per_layer": _count(per_layer, config),
        "attention": _count(f.L * per_layer, config),
        "mlp": _count(mlp, config),
        "embedding": _count(f.embedding, config),
        "unembedding": _count(f.unembedding, config),
    }
    if ledger["attention_per_head"].is_Integer:  # type: ignore[union-attr]
        ledger["attention_per_head"] = int(ledger["attention_per_head"])
    total = sum(int(ledger[k]) for k in ("attention", "mlp", "embedding", "unembedding"))
    ledger["total"] = total
    ledger["attention_share"] = Rational(int(ledger["attention"]), total)
    return ledger


def checkpoint_formulas(config: Config) -> dict[str, Expr]:
    """The checkpoint's components as formulas, with the unembedding only when it is not tied."""
    if config.arch == "gpt":
        parts = dict(f.gpt_checkpoint)
    elif config.arch == "neox":
        parts = dict(f.neox_checkpoint)
    else:
        parts = {"token_embedding": f.V * f.d, "attention": f.L * attention_per_layer_formula(config)}
        if config.qkv_bias:
            parts["qkv_bias"] = f.qkv_bias
        if config.qk_norm:
            parts["qk_norms"] = f.qk_norms
        if config.is_mla:
            parts["latent_norms"] = f.mla_norms if config.q_lora_rank else f.L * f.r_kv
        parts.update(mlp_formulas(config))
        if config.is_moe and config.router_bias:
            parts["router_bias"] = f.moe_router_bias
        parts["norms"] = f.L * config.norms_per_layer * f.d + f.d
    if not config.tied_embeddings:
        parts["unembedding"] = f.unembedding
    return parts


def checkpoint(config: Config) -> dict[str, int]:
    """Parameters a checkpoint of ``config`` stores, by component, with ``total``: exact integers."""
    parts = {name: _count(expr, config) for name, expr in checkpoint_formulas(config).items()}
    parts["total"] = sum(parts.values())
    return parts


def active(config: Config) -> int:
    """Parameters one token uses: the checkpoint less the routed experts it skips (f.moe_inactive).

    Both embedding tables count, as in Mixtral's "12.9 B active of 46.7 B"; a dense model's active
    count is its total.
    """
    total = checkpoint(config)["total"]
    return total - _count(f.moe_inactive, config) if config.is_moe else total


def non_embedding(config: Config, *, per_token: bool = False) -> int:
    """N of Kaplan et al. 2020: checkpoint parameters less the token and position embeddings.

    An untied unembedding is kept (it is a matmul per token); a tied one is the embedding, excluded.
    ``per_token``: of the active parameters (a mixture-of-experts token runs k_E experts).
    """
    parts = checkpoint(config)
    whole = active(config) if per_token else parts["total"]
    return whole - parts["token_embedding"] - parts.get("position_embedding", 0)


def mtp_module(config: Config) -> int:
    """Parameters of DeepSeek-V3's multi-token-prediction modules, stored beside the main model.

    Each (paper §2.2) is one MoE decoder layer, two RMSNorms of d on its inputs, a projection of the
    two concatenated (2d → d), a final RMSNorm, and its own copies of the embedding and output head in
    the released checkpoint: (one MoE layer's parameters) + 2d + 2d·d + d + 2·V·d per module.
    """
    if not config.n_mtp_layers:
        return 0
    one = dataclasses.replace(config, n_layers=1, n_dense_layers=0, n_mtp_layers=0, tied_embeddings=True)
    layer = checkpoint(one)["total"] - _count(f.V * f.d + f.d, one)  # one layer, no embedding, no final norm
    extra = f.evaluate_count(2 * f.d + 2 * f.d**2 + f.d + 2 * f.V * f.d, values(config))
    return config.n_mtp_layers * (layer + extra)

