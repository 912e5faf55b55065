"""Parameter ledgers of a configuration: the source ledger, the checkpoint count, the active count.

The source ledger counts weight matrices only, with the embedding and the unembedding counted
separately even when a checkpoint ties them (the accounting of 3Blue1Brown's video and of
"How an LLM Works, Part 6: Attention": GPT-3 = 175,181,291,520). The checkpoint count is what a
released checkpoint of the architecture stores: biases, norms, learned positions, one copy of tied
embeddings, every expert. The active count is what one token uses: a mixture-of-experts model runs
k_E of its E experts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sympy import Expr, Integer, Rational, Symbol

from calc import formulas as f
from calc.config import Config


def values(config: Config) -> dict[Symbol, int]:
    """The formula symbols' values for ``config`` (0 for the features it does not have)."""
    env = {
        f.d: config.d_model, f.h: config.n_heads, f.d_k: config.d_head, f.g: config.n_kv_heads,
        f.d_ff: config.d_ff, f.L: config.n_layers, f.V: config.vocab_size, f.n_ctx: config.n_ctx,
        f.d_v: config.d_v, f.w: config.sliding_window or config.n_ctx, f.L_w: config.n_window_layers,
        f.g_w: config.n_kv_heads_window or config.n_kv_heads, f.Z: config.n_zero_experts or 1,
        f.E: config.n_experts, f.k_E: config.experts_per_token, f.S: config.n_shared_experts,
        f.d_e: config.d_expert, f.d_s: config.d_shared_expert or config.d_expert,
           f.L_d: config.n_dense_layers,
        f.r_q: config.q_lora_rank, f.r_kv: config.kv_lora_rank, f.d_r: config.d_rope,
        f.L_a: config.n_attention_layers, f.L_c: config.n_chunked_layers,
           f.C: config.attention_chunk or config.n_ctx,
        f.L_lin: config.n_linear_layers, f.L_m: config.n_mamba_layers,
        f.L_s: config.n_sparse_layers, f.k_I: config.index_topk or config.n_ctx,
        f.h_I: config.index_heads or 1, f.d_I: config.index_head_dim or 1, f.L_0: config.n_mlp_free_layers,
        f.d_kf: config.d_head_full or config.d_head, f.g_f: config.n_kv_heads_full or config.n_kv_heads,
        f.L_x: config.n_kv_shared_layers, f.L_xw: config.n_kv_shared_window_layers,
        f.d_p: config.per_layer_input or 1, f.V_p: config.per_layer_vocab or 1,
        f.L_csa: config.n_csa_layers, f.L_hca: config.n_hca_layers,
    }
    if config.compressed is not None:
        c = config.compressed
        env.update({f.m_c: c.csa_rate, f.m_h: c.hca_rate, f.G_o: c.out_groups, f.r_o: c.out_rank,
                    f.n_hc: c.hc_mult, f.L_hash: c.hash_layers})
    if config.linear_attention is not None:
        la = config.linear_attention
        env.update({f.h_lk: la.key_heads, f.h_lv: la.value_heads, f.d_lk: la.d_key, f.d_lv: la.d_value,
                    f.K: la.conv_kernel})
    if config.mamba is not None:
        m = config.mamba
        env.update({f.d_in: m.d_inner, f.d_st: m.d_state, f.r_dt: m.dt_rank, f.K: m.conv_kernel})
    if config.mamba2 is not None:
        m2 = config.mamba2
        env.update({f.d_in: m2.d_inner, f.d_st: m2.d_state, f.h_m: m2.heads, f.G: m2.groups,
                    f.K: m2.conv_kernel})
    return env


SPLIT_SYMBOLS = frozenset({f.d_kf, f.g_f, f.L_x, f.L_xw})


def evaluate_layers(expr: Expr, env: dict[Symbol, Any], config: Config) -> Rational:
    """``expr`` at ``env`` with each attention layer at its own shape: for Gemma 4's split attention (windowed
    layers of d_k and g heads, full ones of d_kf and g_f), a figure summed over layers (a formula of L_a and
    L_w, affine in each) is the windowed layers' (L_full = 0) plus the full layers' (L_w = 0, heads of d_kf
    and g_f) less its part that counts no layer; one that counts no layer (a head's) is the largest layer's, a
    full one. A formula written for split attention (of d_kf, g_f, L_x) is evaluated as it stands."""
    if not config.split_attention or expr.free_symbols & SPLIT_SYMBOLS:
        return f.evaluate(expr, env)
    full = {**env, f.d_k: env[f.d_kf], f.d_v: env[f.d_kf], f.g: env[f.g_f]}
    if not expr.free_symbols & {f.L_a, f.L_w}:
        return f.evaluate(expr, full)
    n_full = env[f.L_a] - env[f.L_w]  # split attention has no chunked or sparse layers (Config's check)
    windowed = f.evaluate(expr, {**env, f.L_a: env[f.L_w]})
    fulls = f.evaluate(expr, {**full, f.L_a: n_full, f.L_w: 0})
    neither = f.evaluate(expr, {**full, f.L_a: 0, f.L_w: 0})
    return windowed + fulls - neither


def _count(expr: Expr, config: Config) -> int:
    return f.evaluate_count(expr, values(config))


def attention_per_layer_formula(config: Config) -> Expr:
    """One attention layer's weight matrices: Q, K, V, O (GQA; Q twice as wide with an output gate) or
    MLA's down and up projections."""
    if config.is_mla:
        return (f.mla_q if config.q_lora_rank else f.mla_q_full) + f.mla_kv + f.mla_o
    if config.compressed is not None:
        return f.v4_attention / f.L_a
    if config.attention_output_gate:
        return f.attention_per_layer + f.attention_output_gate
    return f.attention_per_layer_dv if config.general_gqa else f.attention_per_layer


def attention_formula(config: Config) -> Expr:
    """The attention layers' weight matrices: L_a layers, a windowed layer's own K/V heads added (or Gemma 4's
    windowed and full layers each of their own shape, the shared ones without K and V)."""
    if config.split_attention:
        return f.attention_split_kv if config.full_values_are_keys else f.attention_split
    if config.compressed is not None:
        return f.v4_attention
    extra = f.window_kv_heads if config.n_kv_heads_window else Integer(0)
    return f.L_a * attention_per_layer_formula(config) + extra


def mlp_layers(config: Config, expr: Expr) -> Expr:
    """``expr``, a count over layers with an MLP, for ``config``: L becomes L − L_0 where L_0 layers have no
    MLP (Nemotron-H's mixer blocks beyond its MLP blocks)."""
    return expr.subs(f.L, f.L - f.L_0) if config.n_mlp_free_layers else expr


def mlp_formulas(config: Config) -> dict[str, Expr]:
    """The MLP's weight matrices by component: one dense or gated MLP per layer, or MoE's parts (experts,
    shared experts and dense layers gated or not, as the model's MLP is)."""
    if not config.is_moe:
        return {"mlp": mlp_layers(config, f.mlp_gated if config.mlp_gated else f.mlp_dense)}
    gated = config.mlp_gated
    parts = {"experts": f.moe_experts if gated else f.moe_experts_ungated, "router": f.moe_router}
    if config.n_shared_experts:
        parts["shared_experts"] = f.moe_shared_experts if gated else f.moe_shared_experts_ungated
    if config.n_dense_layers:
        parts["dense_mlp"] = f.mlp_dense_layers if gated else f.mlp_dense_layers_ungated
    return {name: mlp_layers(config, expr) for name, expr in parts.items()}


def state_layer_formulas(config: Config) -> dict[str, Expr]:
    """The weight matrices of the layers that are not softmax attention (linear attention, Mamba)."""
    parts = {}
    if config.n_linear_layers:
        parts["linear_attention"] = f.L_lin * f.deltanet_per_layer
    if config.n_mamba_layers:
        parts["mamba"] = f.L_m * (f.mamba2_per_layer if config.mamba2 is not None else f.mamba_per_layer)
    return parts


def source_ledger(config: Config) -> dict[str, int | Rational]:
    """Weight matrices by component, with ``total`` and the exact ``attention_share`` (a Rational).

    ``attention_per_head`` is a layer's attention over h: exact for the presets; a custom config
    whose h/g does not divide 2·d·d_k gets a Rational there. A hybrid's linear-attention or Mamba
    layers are a component of their own, beside attention (which counts the attention layers only).
    """
    per_layer = attention_per_layer_formula(config)
    mlp = sum(mlp_formulas(config).values(), Integer(0))
    if config.shared_mlp_double:
        mlp += f.shared_mlp_double
    ledger: dict[str, int | Rational] = {
        "attention_per_head": f.evaluate(per_layer / f.h, values(config)),
        "attention_per_layer": _count(per_layer, config),
        "attention": _count(attention_formula(config), config),
        **{name: _count(expr, config) for name, expr in state_layer_formulas(config).items()},
        "mlp": _count(mlp, config),
        **({"per_layer_embedding": _count(f.per_layer_embedding, config),
            "per_layer_inputs": _count(f.per_layer_matrices, config)} if config.per_layer_input else {}),
        "embedding": _count(f.embedding, config),
        "unembedding": _count(f.unembedding, config),
    }
    if ledger["attention_per_head"].is_Integer:  # type: ignore[union-attr]
        ledger["attention_per_head"] = int(ledger["attention_per_head"])
    total = sum(int(v) for k, v in ledger.items() if not k.startswith("attention_per"))
    ledger["total"] = total
    ledger["attention_share"] = Rational(int(ledger["attention"]), total)
    return ledger


def checkpoint_formulas(config: Config) -> dict[str, Expr]:
    """The checkpoint's components as formulas: its matrices and what its layout stores beside them
    (positions, biases, norms, sinks, gates), with the unembedding only when it is not tied."""
    parts: dict[str, Expr] = {"token_embedding": f.token_embedding}
    if config.learned_positions:
        parts["position_embedding"] = f.position_embedding(config.position_offset)
    parts["attention"] = attention_formula(config)
    qkv_bias = f.qkv_bias_dv if config.general_gqa else f.qkv_bias
    biases = {(True, True): ("attention_bias", qkv_bias + f.o_bias), (True, False): ("qkv_bias", qkv_bias),
              (False, True): ("o_bias", f.o_bias)}.get((bool(config.qkv_bias), bool(config.o_bias)))
    if biases:
        parts[biases[0]] = biases[1]
    if config.attention_sinks or config.window_sinks:
        parts["attention_sinks"] = f.attention_sinks if config.attention_sinks else f.window_sinks
    if config.qk_norm:
        parts["qk_norms"] = (f.qk_norms_split if config.split_attention
                             else f.qk_norms_per_head if config.qk_norm_per_head else f.qk_norms)
    if config.is_mla:
        parts["latent_norms"] = f.mla_norms if config.q_lora_rank else f.L_a * f.r_kv
    if config.n_sparse_layers:
        parts["indexer"] = f.L_s * f.indexer_per_layer
    if config.compressed is not None:
        parts["latent_norms"] = f.v4_attention_norms
        parts.update({"hca_compressors": f.v4_hca_compressors, "csa_compressors": f.v4_csa_compressors,
                      "csa_indexers": f.v4_csa_indexers, "hyper_connections": f.v4_hyper_connections,
                      "hash_tables": f.v4_hash_tables})
    parts.update(state_layer_formulas(config))
    if config.mamba is not None:
        extra = ((config.mamba.conv_bias, f.mamba_conv_bias), (config.mamba.proj_bias, f.mamba_proj_bias),
                 (config.mamba.inner_norms, f.mamba_inner_norms))
        if any(on for on, _ in extra):
            parts["mamba_biases_norms"] = f.L_m * sum((expr for on, expr in extra if on), Integer(0))
    if config.mamba2 is not None:
        m2 = config.mamba2
        extra2 = ((m2.conv_bias, f.mamba2_conv_bias), (m2.proj_bias, f.mamba2_proj_bias))
        if any(on for on, _ in extra2):
            parts["mamba_biases"] = f.L_m * sum((expr for on, expr in extra2 if on), Integer(0))
    parts.update(mlp_formulas(config))
    if config.shared_mlp_double:
        parts["shared_layers_mlp"] = f.shared_mlp_double
    if config.per_layer_input:
        parts["per_layer_embedding"] = f.per_layer_embedding
        parts["per_layer_inputs"] = f.per_layer_inputs
    if config.layer_scalar:
        parts["layer_scalars"] = f.layer_scalars
    if config.mlp_bias:
        biases = ((f.moe_mlp_gated_bias, f.moe_mlp_dense_bias) if config.is_moe
                  else (f.mlp_gated_bias, f.mlp_dense_bias))
        parts["mlp_bias"] = mlp_layers(config, biases[0] if config.mlp_gated else biases[1])
    router_bias = f.v4_router_bias if config.compressed is not None else f.moe_router_bias
    for on, name, expr in ((config.router_bias, "router_bias", router_bias),
                           (bool(config.n_zero_experts), "zero_experts_router", f.moe_zero_experts),
                           (config.expert_bias, "expert_biases", f.moe_expert_biases),
                           (config.shared_expert_gate, "shared_expert_gate", f.moe_shared_expert_gate)):
        if on:
            parts[name] = mlp_layers(config, expr)
    norms = f.norms(config.norms_per_layer, bias=bool(config.norm_bias))
    if config.n_mlp_free_layers:  # a layer without an MLP has no norm before one
        norms -= f.L_0 * f.d * (2 if config.norm_bias else 1)
    parts["norms"] = norms
    if not config.tied_embeddings:
        parts["unembedding"] = f.unembedding
    if config.lm_head_bias:
        parts["lm_head_bias"] = f.lm_head_bias
    return parts


def checkpoint(config: Config) -> dict[str, int]:
    """Parameters a checkpoint of ``config`` stores, by component, with ``total``: exact integers."""
    parts = {name: _count(expr, config) for name, expr in checkpoint_formulas(config).items()}
    parts["total"] = sum(parts.values())
    return parts


def inactive_formula(config: Config) -> Expr:
    """Parameters of the routed experts a token skips (with their biases, where experts have them)."""
    inactive = f.moe_inactive if config.mlp_gated else f.moe_inactive_ungated
    return mlp_layers(config, inactive + (f.moe_inactive_biases if config.expert_bias else 0))


def active(config: Config) -> int:
    """Parameters one token uses: the checkpoint less the routed experts it skips (inactive_formula).

    Both embedding tables count, as in Mixtral's "12.9 B active of 46.7 B"; a dense model's active
    count is its total.
    """
    total = checkpoint(config)["total"]
    return total - _count(inactive_formula(config), config) if config.is_moe else total


def non_embedding(config: Config, *, per_token: bool = False) -> int:
    """N of Kaplan et al. 2020: checkpoint parameters less the token and position embeddings (and Gemma 4's
    per-layer embedding table, a lookup too).

    An untied unembedding is kept (it is a matmul per token); a tied one is the embedding, excluded.
    ``per_token``: of the active parameters (a mixture-of-experts token runs k_E experts).
    """
    parts = checkpoint(config)
    whole = active(config) if per_token else parts["total"]
    return (whole - parts["token_embedding"] - parts.get("position_embedding", 0)
            - parts.get("per_layer_embedding", 0))


def mtp_module(config: Config) -> int:
    """Parameters of DeepSeek-V3's multi-token-prediction modules, stored beside the main model.

    Each (paper §2.2) is one MoE decoder layer, two RMSNorms of d on its inputs, a projection of the
    two concatenated (2d → d), a final RMSNorm, and its own copies of the embedding and output head in
    the released checkpoint: (one MoE layer's parameters) + 2d + 2d·d + d + 2·V·d per module.
    """
    if not config.n_mtp_layers:
        return 0
    one = dataclasses.replace(config, n_layers=1, n_dense_layers=0, n_mtp_layers=0, tied_embeddings=True,
                              n_sparse_layers=min(config.n_sparse_layers, 1))  # V3.2's has its indexer
    layer = checkpoint(one)["total"] - _count(f.V * f.d + f.d, one)  # one layer, no embedding, no final norm
    extra = f.evaluate_count(2 * f.d + 2 * f.d**2 + f.d + 2 * f.V * f.d, values(config))
    return config.n_mtp_layers * (layer + extra)

