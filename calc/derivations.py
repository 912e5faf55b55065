"""``python -m calc formulas``: every formula, its multi-head form, and the two derivations."""

from __future__ import annotations

from sympy import Expr, Integer, Symbol, simplify

from calc import formulas as f
from calc.kinds import KINDS, METRIC_TEXT, METRICS


def _checkpoint(name: str) -> Expr:
    """The whole checkpoint formula of a preset's layout (calc.ledger assembles it)."""
    from calc.ledger import checkpoint_formulas
    from calc.presets import PRESETS

    return sum(checkpoint_formulas(PRESETS[name]).values(), Integer(0))


FORMULAS: tuple[tuple[str, Expr | str], ...] = (
    ("attention per head", f.attention_per_head),
    ("attention per layer", f.attention_per_layer),
    ("attention", f.attention),
    ("mlp, dense (gpt)", f.mlp_dense),
    ("mlp, gated (llama)", f.mlp_gated),
    ("embedding", f.embedding),
    ("unembedding", f.unembedding),
    ("checkpoint, gpt (tied)", "gpt2"),
    ("checkpoint, llama (untied)", "llama2-7b"),
    ("checkpoint, gpt-neox (untied)", "pythia-1.4b"),
    ("fused QKV (Phi-3, GPT-NeoX, Falcon): same as Q, K, V", f.fused_qkv),
    ("parallel block, partial rotary, NoPE: no parameters", Integer(0)),
    ("position table (OPT: 2 extra rows)", f.position_embedding(2)),
    ("norms, RMSNorm (2 a layer)", f.norms(2, bias=False)),
    ("norms, LayerNorm with bias (2 a layer)", f.norms(2, bias=True)),
    ("QKV bias (Qwen2, StableLM)", f.qkv_bias),
    ("output bias (GPT-2, gpt-oss, StarCoder2)", f.o_bias),
    ("q/k norms, shared by heads (Qwen3, Gemma 3)", f.qk_norms),
    ("q/k norms, per head (OLMo 2, Cohere, StableLM)", f.qk_norms_per_head),
    ("attention sinks (gpt-oss)", f.attention_sinks),
    ("output gate per layer (Qwen3-Next)", f.attention_output_gate),
    ("attention per layer, values of d_v (MiMo-V2-Flash)", f.attention_per_layer_dv),
    ("windowed layers' own K/V heads, their Q, K, V biases (MiMo-V2-Flash)",
     f.window_kv_heads + f.qkv_bias_dv),
    ("attention sinks on the windowed layers (MiMo-V2-Flash)", f.window_sinks),
    ("attention, full layers of d_kf and g_f, the L_x reusing K/V (Gemma 4)", f.attention_split),
    ("the same, a full layer's values its keys (Gemma 4's attention_k_eq_v)", f.attention_split_kv),
    ("q/k norms, each layer at its head width, no k norm on the L_x (Gemma 4)", f.qk_norms_split),
    ("the L_x layers' MLP twice as wide (Gemma 4)", f.shared_mlp_double),
    ("per-layer embedding table (Gemma 4)", f.per_layer_embedding),
    ("per-layer inputs: projections and their norm (Gemma 4)", f.per_layer_inputs),
    ("a saved scalar per layer (Gemma 4)", f.layer_scalars),
    ("attention: query LoRA, one key that is the value, grouped output (DeepSeek V4)", f.v4_attention),
    ("its query-latent and key norms (DeepSeek V4)", f.v4_attention_norms),
    ("HCA layers' compressors (DeepSeek V4)", f.v4_hca_compressors),
    ("CSA layers' compressors (DeepSeek V4)", f.v4_csa_compressors),
    ("CSA layers' indexers (DeepSeek V4)", f.v4_csa_indexers),
    ("hyper-connections, in each layer and before the head (DeepSeek V4)", f.v4_hyper_connections),
    ("score correction on the learned-routing layers (DeepSeek V4)", f.v4_router_bias),
    ("token → experts tables of the hash-routed layers (DeepSeek V4)", f.v4_hash_tables),
    ("MLP biases, dense", f.mlp_dense_bias),
    ("MLP biases, gated", f.mlp_gated_bias),
    ("MLP biases of an MoE model's dense layers and shared experts, dense", f.moe_mlp_dense_bias),
    ("unembedding bias (Phi-2)", f.lm_head_bias),
    ("MoE routed experts", f.moe_experts),
    ("MoE shared experts", f.moe_shared_experts),
    ("MoE shared-expert gate (Qwen2-MoE, Qwen3-Next)", f.moe_shared_expert_gate),
    ("MoE router", f.moe_router),
    ("MoE router bias (gpt-oss, DeepSeek-V3)", f.moe_router_bias),
    ("MoE router rows and score corrections of zero experts (LongCat-Flash)", f.moe_zero_experts),
    ("MoE expert biases (gpt-oss)", f.moe_expert_biases),
    ("MoE dense layers", f.mlp_dense_layers),
    ("MoE inactive per token (total − active)", f.moe_inactive),
    ("MoE experts, shared experts, dense layers without a gate (Nemotron-H)",
     f.moe_experts_ungated + f.moe_shared_experts_ungated + f.mlp_dense_layers_ungated),
    ("MLA queries (down, up)", f.mla_q),
    ("MLA queries, no LoRA (DeepSeek-V2-Lite)", f.mla_q_full),
    ("MLA keys, values (latent, rotary key, up)", f.mla_kv),
    ("MLA output", f.mla_o),
    ("MLA latent norms", f.mla_norms),
    ("DSA indexer per sparse layer (DeepSeek V3.2)", f.indexer_per_layer),
    ("Gated DeltaNet layer (Qwen3-Next)", f.deltanet_per_layer),
    ("Gated DeltaNet state per sequence", f.deltanet_state),
    ("Mamba layer (Jamba)", f.mamba_per_layer),
    ("Mamba conv bias, projection biases, inner norms",
     f.mamba_conv_bias + f.mamba_proj_bias + f.mamba_inner_norms),
    ("Mamba state per sequence", f.mamba_state),
    ("Mamba-2 layer (Nemotron-H)", f.mamba2_per_layer),
    ("Mamba-2 conv bias, projection biases", f.mamba2_conv_bias + f.mamba2_proj_bias),
    ("Mamba-2 state per sequence", f.mamba2_state),
    ("pattern entries per head", f.entries_per_head),
    ("windowed entries per head", f.windowed_entries_per_head),
    ("chunked entries per head (Llama 4)", f.chunked_entries_per_head),
    ("sparse (top-k) entries per head (DeepSeek V3.2)", f.sparse_entries_per_head),
    ("keys a token sees, over layers", f.keys_seen),
    ("token·layers the KV cache holds", f.keys_cached),
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
    ("KV cache bytes at n (windows, chunks)", f.kv_cache_bytes),
    ("KV cache bytes per token, values of d_v, g_w heads on windowed layers", f.kv_cache_bytes_per_token_dv),
    ("KV cache bytes at n, values of d_v, g_w heads on windowed layers", f.kv_cache_bytes_dv),
    ("KV cache bytes per token, full layers of d_kf and g_f, none on the L_x (Gemma 4)",
     f.kv_cache_bytes_per_token_split),
    ("KV cache bytes at n, full layers of d_kf and g_f, none on the L_x (Gemma 4)", f.kv_cache_bytes_split),
    ("KV cache bytes per token, the pooled entries once every window is full (DeepSeek V4)",
     f.kv_cache_bytes_per_token_compressed),
    ("KV cache bytes at n as DeepseekV4HCACache and DeepseekV4CSACache hold it (DeepSeek V4)",
     f.kv_cache_bytes_compressed),
    ("MLA cache bytes per token", f.kv_cache_bytes_per_token_mla),
    ("MLA cache bytes at n", f.kv_cache_bytes_mla),
    ("naive bytes moved per model", f.naive_bytes_per_model),
    ("tiled bytes moved per model", f.tiled_bytes_per_model),
    *((f"ZeRO stage {stage}, model states per device (Rajbhandari et al. §5)", total)
      for stage, total in f.zero_model_states_total.items()),
    *((f"  mixed-precision Adam (b_w = b_g = 2, b_o = K = 12), stage {stage}", total.subs(f.MIXED_PRECISION))
      for stage, total in f.zero_model_states_total.items()),
    ("training activations per layer, no parallelism (Korthikanti)", f.activations_per_layer),
    ("  of which the n² term", f.activations_quadratic),
    ("  tensor parallelism", f.activations_tp),
    ("  tensor and sequence parallelism", f.activations_tp_sp),
    ("  selective recomputation, tensor parallelism", f.activations_selective_tp),
    ("  selective recomputation, tensor and sequence parallelism", f.activations_selective_tp_sp),
    ("  FlashAttention, tensor parallelism", f.activations_flash_tp),
    ("  FlashAttention, tensor and sequence parallelism", f.activations_flash_tp_sp),
    ("  full recomputation", f.activations_full_recompute),
    ("activations kept per layer kind (calc.activations), RMSNorm of d (Llama)", f.rms_norm_saved(f.d)),
    ("  LayerNorm of d", f.layer_norm_saved(f.d)),
    ("  a norm's output, the projections' input", f.projection_input),
    ("  eager attention: Q, K and V at h heads, the output", f.attention_eager_linear),
    ("  eager softmax in fp32, cast back (Llama)", f.softmax_fp32_saved),
    ("  eager softmax in b (GPT-2)", f.softmax_saved),
    ("  FlashAttention-style attention (SDPA)", f.attention_flash_saved),
    ("  q/k norms (Qwen3)", f.qk_norm_saved),
    ("  dense MLP", f.mlp_dense_saved),
    ("  gated MLP", f.mlp_gated_saved),
    ("  MoE router", f.moe_router_saved),
    ("  MoE router's renormalized weights (Mixtral)", f.moe_router_renormalized),
    ("  MoE routed experts", f.moe_experts_saved),
    ("  Mamba mixer (Jamba, PyTorch path)", f.mamba_saved),
    ("serving: prefill FLOPs of b_m sequences of n tokens", f.prefill_flops),
    ("serving: decode step FLOPs at context n", f.decode_flops),
    ("serving: routed experts t_r tokens touch in a layer (uniform routing)", f.experts_touched),
    ("serving: weight bytes a step reads", f.step_weight_bytes),
    *((f"per layer kind, {kind.name}: {METRIC_TEXT[metric]}", kind.formula(metric))
      for kind in KINDS.values() for metric in METRICS),
)


def show(expr: Expr) -> str:
    """SymPy's one-line form with · for products and ^ for powers."""
    return str(expr).replace("**", "^").replace("*", "·")


def multi_head(expr: Expr) -> Expr:
    """``expr`` with g = h and d_k = d/h (multi-head attention with h·d_k = d), simplified."""
    return simplify(expr.subs(f.GPT_SHAPE))


SYMBOLS = (
    "Symbols: d model width, h query heads, d_k head width, g key/value heads, d_ff MLP width, L layers, "
    "V vocabulary, n tokens, n_ctx learned positions, b bytes per value, B tile side, N non-embedding "
    "parameters (active ones for MoE); d_v value head width, w sliding window, L_w windowed layers; E "
    "routed experts, k_E per token, S shared, d_e expert width, d_s shared expert width, L_d dense layers; "
    "MLA: r_q, r_kv query and key/value latent ranks, d_r rotary head width. Layers by kind: L_a of the L "
    "have softmax attention (L − L_lin linear-attention − L_m Mamba layers), L_w of them windowed (w) and "
    "L_c chunked (chunks of C; n = m_C·C + r_C) and L_s sparse (each query attends to the k_I keys an "
    "indexer of h_I heads of d_I scores highest). Linear attention: h_lk, h_lv heads of d_lk, d_lv, a "
    "convolution of K taps; Mamba: inner width d_in, state d_st, step rank r_dt (Mamba-2: h_m heads, G "
    "groups sharing B and C); L_0 layers without an MLP (Nemotron-H); g_w key/value heads of a windowed "
    "layer (MiMo-V2-Flash); Z zero experts (LongCat-Flash); full-attention layers of heads of d_kf with g_f "
    "key/value heads, L_x layers (L_xw windowed, L_xf = L_x − L_xw full) reusing an earlier layer's keys "
    "and values, per-layer inputs of d_p from a table of V_p rows (Gemma 4); L_csa compressed sparse and "
    "L_hca heavily compressed attention layers pooling m_c and m_h tokens an entry, an output in G_o groups "
    "of rank r_o, n_hc hyper-connection streams, L_hash routed by hash (DeepSeek V4). Training: micro-batch "
    "b_m, tensor-parallel degree t, N_d data-parallel devices, P parameters a tensor-parallel rank holds at "
    "b_w, b_g, b_o bytes each of weights, gradients and optimizer states (ZeRO's K). Activations kept: "
    "b bytes a value, c_up 1 where b < 4 (casts to fp32 are then copies), s_1 1 for a micro-batch of one, "
    "k_a tensors the MLP's activation keeps, c_f the capacity factor (1: dropless), w_b bytes of a routing "
    "weight. Serving: N_mm parameters a token is multiplied by, P_s weights outside the routed experts, p_e "
    "an expert's parameters, t_r tokens of a step. Per layer kind (calc.kinds), one sequence: b_I bytes a "
    "value of the indexer's scores; a dense, sliding or chunked layer of an MLA model caches r_kv + d_r a "
    "token in place of 2·g·d_k. "
    "Rotary embeddings (full or partial, GPT-NeoX's 25 %), NoPE layers and "
    "parallel blocks add no parameters; fused QKV or gate-up matrices hold exactly what the separate ones do."
)


def formula_lines(name: str, expr: Expr, width: int | None) -> list[str]:
    """``name = formula``, wrapped at ``width`` with continuation lines indented, and its multi-head form
    (g = h, d = h·d_k, one kind of layer) on a line of its own where it differs."""
    from calc.report import wrap

    lines = wrap(f"{name} = {show(expr)}", width, " " * 6)
    simple = multi_head(expr)
    if (simple - expr).expand() != 0:
        lines += wrap(f"    (g = h, d = h·d_k) = {show(simple)}", width, " " * 8)
    return lines


def formulas_text(width: int | None = None) -> str:
    """Every formula and the two derivations, in lines of at most ``width`` columns (None: unwrapped)."""
    from tabulate import tabulate

    formulas = [line for name, expr in FORMULAS
                for line in formula_lines(name, _checkpoint(expr) if isinstance(expr, str) else expr, width)]
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
    from calc.report import wrap

    lines = [
        (SYMBOLS, ""), ("", ""), *((line, " " * 6) for line in formulas), ("", ""),
        ("Why 1/√d_k: q, k with independent components of mean μ and variance σ²", ""),
        (f"  Var(q·k) = Σ_m (E[q_m²]E[k_m²] − E[q_m]²E[k_m]²) = {show(general)}", " " * 4),
        (f"  Var(q·k / √d_k) = {show(general_scaled)}", " " * 4),
        (f"  μ = 0, σ² = 1:  Var(q·k) = {show(unit)},  Var(q·k / √d_k) = {show(unit_scaled)}", " " * 4),
        ("", ""),
        ("Associative-recall ceiling: 3 values drawn uniformly from 8, guess the most repeated "
         "(ties uniform)", ""),
    ]
    text = [out for line, indent in lines
            for out in ([line] if line in formulas or not line else wrap(line, width, indent))]
    return "\n".join([*text, recall, f"  P(right) = {ceiling} = {float(ceiling) * 100:g} %"])
