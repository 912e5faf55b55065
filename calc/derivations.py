"""``python -m calc formulas``: every formula, its multi-head form, and the two derivations."""

from __future__ import annotations

from sympy import Expr, Integer, Symbol, simplify

from calc import formulas as f

FORMULAS: tuple[tuple[str, Expr], ...] = (
    ("attention per head", f.attention_per_head),
    ("attention per layer", f.attention_per_layer),
    ("attention", f.attention),
    ("mlp, dense (gpt)", f.mlp_dense),
    ("mlp, gated (llama)", f.mlp_gated),
    ("embedding", f.embedding),
    ("unembedding", f.unembedding),
    ("checkpoint, gpt (tied)", sum(f.gpt_checkpoint.values(), Integer(0))),
    ("checkpoint, llama (untied)", sum(f.llama_checkpoint.values(), Integer(0)) + f.unembedding),
    ("checkpoint, gpt-neox (untied)", sum(f.neox_checkpoint.values(), Integer(0)) + f.unembedding),
    ("fused QKV (Phi-3, GPT-NeoX): same as Q, K, V", f.fused_qkv),
    ("parallel block, partial rotary: no parameters", Integer(0)),
    ("QKV bias (Qwen2)", f.qkv_bias),
    ("q/k norms (Qwen3, Gemma 3)", f.qk_norms),
    ("MoE routed experts", f.moe_experts),
    ("MoE shared experts", f.moe_shared_experts),
    ("MoE router", f.moe_router),
    ("MoE dense layers (DeepSeek)", f.mlp_dense_layers),
    ("MoE inactive per token (total − active)", f.moe_inactive),
    ("MLA queries (down, up)", f.mla_q),
    ("MLA keys, values (latent, rotary key, up)", f.mla_kv),
    ("MLA output", f.mla_o),
    ("MLA latent norms", f.mla_norms),
    ("pattern entries per head", f.entries_per_head),
    ("windowed entries per head", f.windowed_entries_per_head),
    ("keys a token sees, over layers", f.keys_seen),
    ("pattern entries per model", f.entries_per_model),
    ("tiled entries per head", f.tiled_entries_per_head),
    ("QKᵀ FLOPs per head", f.qk_flops_per_head),
    ("AV FLOPs per head", f.av_flops_per_head),
    ("attention FLOPs per model", f.attention_flops_per_model),
    ("causal FLOPs per head", f.causal_flops_per_head),
    ("causal FLOPs per model", f.causal_flops_per_model),
    ("forward FLOPs per token, Kaplan", f.forward_flops_per_token_kaplan),
    ("forward FLOPs per token, PaLM", f.forward_flops_per_token_palm),
    ("KV cache bytes per token", f.kv_cache_bytes_per_token),
    ("KV cache bytes at n (windows)", f.kv_cache_bytes),
    ("MLA cache bytes per token", f.kv_cache_bytes_per_token_mla),
    ("MLA cache bytes at n", f.kv_cache_bytes_mla),
    ("naive bytes moved per model", f.naive_bytes_per_model),
    ("tiled bytes moved per model", f.tiled_bytes_per_model),
)


def show(expr: Expr) -> str:
    """SymPy's one-line form with · for products and ^ for powers."""
    return str(expr).replace("**", "^").replace("*", "·")


def multi_head(expr: Expr) -> Expr:
    """``expr`` with g = h and d_k = d/h (multi-head attention with h·d_k = d), simplified."""
    return simplify(expr.subs(f.GPT_SHAPE))


def formulas_text() -> str:
    from tabulate import tabulate

    rows = [(name, show(expr), show(multi_head(expr))) for name, expr in FORMULAS]
    table = tabulate(rows, headers=("quantity", "formula", "with g = h, d = h·d_k"), tablefmt="simple")
    mean, sigma = Symbol("μ", real=True), Symbol("σ", positive=True)
    general, general_scaled = f.score_variance(mean, sigma**2)
    unit, unit_scaled = f.score_variance()
    cases = f.recall_cases()
    recall = tabulate(
        [(" + ".join(map(str, pattern)), str(p), str(right), str(p * right))
         for pattern, (p, right) in cases.items()],
        headers=("multiplicities", "P(draw)", "P(right | draw)", "product"),
        tablefmt="simple",
    )
    ceiling = f.recall_ceiling()
    return "\n".join([
        "Symbols: d model width, h query heads, d_k head width, g key/value heads, d_ff MLP width,",
        "L layers, V vocabulary, n tokens, n_ctx learned positions, b bytes per value, B tile side,",
        "N non-embedding parameters (active ones for MoE); d_v value head width, w sliding window,",
        "L_w windowed layers; E routed experts, k_E per token, S shared, d_e expert width, L_d dense",
        "layers; MLA: r_q, r_kv query and key/value latent ranks, d_r rotary head width.",
        "Rotary embeddings (full or partial, GPT-NeoX's 25 %) and parallel blocks add no parameters;",
        "fused QKV or gate-up matrices hold exactly what the separate ones do.",
        "",
        table,
        "",
        "Why 1/√d_k: q, k with independent components of mean μ and variance σ²",
        f"  Var(q·k) = Σ_m (E[q_m²]E[k_m²] − E[q_m]²E[k_m]²) = {show(general)}",
        f"  Var(q·k / √d_k) = {show(general_scaled)}",
        f"  μ = 0, σ² = 1:  Var(q·k) = {show(unit)},  Var(q·k / √d_k) = {show(unit_scaled)}",
        "",
        "Associative-recall ceiling: 3 values drawn uniformly from 8, guess the most repeated (ties uniform)",
        recall,
        f"  P(right) = {ceiling} = {float(ceiling) * 100:g} %",
    ])
