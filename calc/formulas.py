"""The formulas, as SymPy expressions in the dimension letters of `impl.attention`.

    d     model width            h     query heads          d_k   head width (query/key/value)
    g     key/value heads        d_ff  MLP hidden width     L     layers
    V     vocabulary size        n     tokens               n_ctx learned positions
    b     bytes per value        B     tile side of a tiled (FlashAttention) kernel
    d_v   value head width       w     sliding window       L_w   layers with a sliding window
    E     routed experts         k_E   experts per token    S     shared experts
    d_e   expert MLP width       L_d   dense layers of an MoE model (DeepSeek's first layers)
    r_q   query latent rank      r_kv  key/value latent rank  d_r  rotary head width (MLA)
    d_s   shared expert width    C     attention chunk      L_c   chunked-attention layers
    m_C   ⌊n/C⌋ whole chunks     r_C   n mod C, the tokens of the last chunk (values given with n)
    L_lin linear-attention layers (h_lk, h_lv heads of d_lk, d_lv; convolution of K taps)
    L_m   Mamba layers (inner width d_in, state d_st, step rank r_dt, convolution of K taps; Mamba-2:
          h_m heads, G groups sharing B and C)
    L_0   layers without an MLP (Nemotron-H: a block holds one mixer or one MLP)
    g_w   key/value heads of a windowed layer where they are not g (MiMo-V2-Flash)
    Z     zero experts a router scores, which hold no weights (LongCat-Flash)
    d_kf  head width of a full-attention layer, g_f its key/value heads (Gemma 4: 512, and g)
    L_x   layers that reuse an earlier layer's keys and values (L_xw of them windowed; Gemma 4)
    d_p   per-layer input width, V_p its vocabulary (Gemma 4's per-layer embeddings)
    L_csa, L_hca  compressed sparse and heavily compressed attention layers pooling m_c, m_h tokens an
          entry (DeepSeek V4; G_o output groups of rank r_o, n_hc hyper-connection streams, L_hash layers
          routed by a token's hash)
    b_m   micro-batch            t     tensor-parallel degree   N_d  data-parallel devices   P  parameters
    b_w, b_g, b_o  bytes a parameter of weights, gradients and optimizer states (ZeRO's K)

Every ledger and cost in `calc` is one of these expressions evaluated for a configuration, so
the printed numbers and the printed formulas cannot drift apart. Multiply-adds count as 2 FLOPs.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping

from sympy import Expr, Integer, Min, Mod, Rational, Symbol, ceiling, floor, summation, symbols, sympify

d, h, d_k, g, d_ff, L, V, n, n_ctx, b, B = symbols(
    "d h d_k g d_ff L V n n_ctx b B", positive=True, integer=True
)
# L_w and L_d may be 0 (no windowed layers, no dense layers): evaluation substitutes exact integers.
d_v, w, L_w, E, k_E, S, d_e, L_d, r_q, r_kv, d_r = symbols(
    "d_v w L_w E k_E S d_e L_d r_q r_kv d_r", positive=True, integer=True
)
d_s, C, L_a, L_c, L_lin, L_m, h_lk, h_lv, d_lk, d_lv, K, d_in, d_st, r_dt = symbols(
    "d_s C L_a L_c L_lin L_m h_lk h_lv d_lk d_lv K d_in d_st r_dt", positive=True, integer=True
)
# n = m_C·C + r_C with 0 ≤ r_C < C: whole chunks and the rest (symbols of their own rather than floor and
# Mod, which SymPy builds slowly; whoever substitutes n substitutes them, see chunk_values).
m_C, r_C = symbols("m_C r_C", nonnegative=True, integer=True)
# DeepSeek Sparse Attention: L_s layers whose queries attend to the k_I keys an indexer of h_I heads of width
# d_I scores highest.
L_s, k_I, h_I, d_I = symbols("L_s k_I h_I d_I", positive=True, integer=True)
# Mamba-2: h_m heads, G groups that share B and C; L_0 layers without an MLP (may be 0).
h_m, G = symbols("h_m G", positive=True, integer=True)
# MiMo-V2-Flash: its windowed layers have g_w key/value heads (g elsewhere).
g_w = Symbol("g_w", positive=True, integer=True)
# LongCat-Flash: Z zero experts, which its router scores and which hold no weights.
Z = Symbol("Z", positive=True, integer=True)
L_0 = Symbol("L_0", nonnegative=True, integer=True)
# Gemma 4: full-attention layers with heads of d_kf and g_f key/value heads; the last L_x layers (L_xw of them
# windowed) reuse an earlier layer's keys and values; per-layer inputs of d_p from a table of V_p rows.
d_kf, g_f, d_p, V_p = symbols("d_kf g_f d_p V_p", positive=True, integer=True)
L_x, L_xw = symbols("L_x L_xw", nonnegative=True, integer=True)
# DeepSeek V4: L_csa compressed sparse and L_hca heavily compressed attention layers (the rest of its L are
# windowed, L_w), pooling m_c and m_h tokens into an entry; an output projection of G_o groups of rank r_o;
# hyper-connections of n_hc streams; the first L_hash layers routed by a saved token → experts table.
L_csa, L_hca, L_hash = symbols("L_csa L_hca L_hash", nonnegative=True, integer=True)
m_c, m_h, G_o, r_o, n_hc = symbols("m_c m_h G_o r_o n_hc", positive=True, integer=True)
# Layers by kind: L_a = L − L_lin − L_m have softmax attention (linear-attention and Mamba layers hold a
# fixed-size state and no KV cache); of those, L_w are windowed, L_c chunked and L_s sparse (top-k), and the
# rest see every key.
L_full = L_a - L_w - L_c - L_s - L_csa - L_hca

# --- Source ledger: weight matrices only, embedding and unembedding both counted --------------------
# Query and output projections are h·d_k wide; key and value projections g·d_k (grouped-query
# attention; g = h is multi-head attention). One query head owns its Q and O columns and a 1/(h/g)
# share of the K and V it reads, so per head × h = per layer exactly.
attention_per_head = 2 * d * d_k + 2 * d * d_k * g / h
attention_per_layer = 2 * d * h * d_k + 2 * d * g * d_k
attention = L_a * attention_per_layer
mlp_dense = L * 2 * d * d_ff  # up and down projections (GPT)
mlp_gated = L * 3 * d * d_ff  # gate, up and down projections (SwiGLU: Llama, Mistral)
embedding = V * d
unembedding = V * d

# Values narrower than queries and keys (MiMo-V2-Flash: d_k 192, d_v 128): Q and K of d_k, V and O of d_v; a
# windowed layer with g_w key/value heads has (g_w − g)·(d_k + d_v) more columns of K and V than a full one.
attention_per_layer_dv = d * h * d_k + d * g * d_k + d * g * d_v + h * d_v * d
window_kv_heads = L_w * (g_w - g) * d * (d_k + d_v)

# Gemma 4 (Gemma4TextAttention): a windowed layer's Q, K, V, O of d_k and g heads; a full layer's of d_kf and
# g_f, its V absent where its values are its keys (attention_k_eq_v: one K of g_f·d_kf serves both); the last
# L_x layers (L_xw windowed, L_xf = L_x − L_xw full) reuse an earlier layer's keys and values: Q and O only.
L_xf = L_x - L_xw
attention_q_o_split = 2 * d * h * (L_w * d_k + L_full * d_kf)
attention_split = (attention_q_o_split + (L_w - L_xw) * 2 * d * g * d_k
                   + (L_full - L_xf) * 2 * d * g_f * d_kf)
attention_split_kv = (attention_q_o_split + (L_w - L_xw) * 2 * d * g * d_k
                      + (L_full - L_xf) * d * g_f * d_kf)
# Their norms: one over each query head vector on every layer, one over each key head vector where the layer
# computes keys (the value norm has no weight), of the layer's head width.
qk_norms_split = L_w * d_k + L_full * d_kf + (L_w - L_xw) * d_k + (L_full - L_xf) * d_kf
# Gemma 4's use_double_wide_mlp: the L_x layers' gated MLP is 2·d_ff wide, 3·d·d_ff more each.
shared_mlp_double = L_x * 3 * d * d_ff
# Per-layer embeddings (Gemma 4, Gemma 3n): a table of V_p rows of L·d_p (a lookup, like the token embedding),
# a projection of the embedded token d → L·d_p with an RMSNorm of d_p, and in each layer a gate d → d_p and a
# projection d_p → d (its norm after them is one of the layer's norms).
per_layer_embedding = V_p * L * d_p
per_layer_matrices = d * L * d_p + L * 2 * d * d_p
per_layer_inputs = per_layer_matrices + d_p
layer_scalars = L  # Gemma 4: one saved scalar per layer

# --- Checkpoint: everything a real checkpoint stores ----------------------------------------------
# Its parts beside the weight matrices (calc.ledger assembles a model's checkpoint from them, as its
# layout says). GPT-2 (Radford et al. 2019): learned positions, biases on every projection, LayerNorm
# (weight and bias) before attention, before the MLP and at the end. Llama (Touvron et al. 2023): rotary
# positions (no parameters), no biases, RMSNorm (a weight only). GPT-NeoX: GPT-2's parts with rotary
# positions. OPT keeps 2 extra rows in its position table.
token_embedding = V * d
lm_head_bias = V  # Phi-2's unembedding has a bias


def position_embedding(extra_rows: int = 0) -> Expr:
    """A learned position table: n_ctx (+ OPT's 2 extra) rows of d."""
    return (n_ctx + extra_rows) * d


def norms(per_layer: int, *, bias: bool) -> Expr:
    """``per_layer`` norms in each layer and a final one, of d weights (RMSNorm) or 2·d (LayerNorm)."""
    return (L * per_layer + 1) * d * (2 if bias else 1)


# --- Components of the architectures of 2023–25 ------------------------------------------------------
# Biases of the attention projections: Q, K, V (Qwen2, GPT-2, StableLM 2) and O (GPT-2, gpt-oss).
qkv_bias = L_a * (h + 2 * g) * d_k
o_bias = L_a * d
attention_bias = qkv_bias + o_bias
# The same with values of d_v and the windowed layers' g_w heads (MiMo-V2-Flash: Q, K, V biases, O none).
qkv_bias_dv = L_a * (h * d_k + g * (d_k + d_v)) + L_w * (g_w - g) * (d_k + d_v)
# Qwen3, Gemma 3: an RMSNorm over each query and key head vector, one weight of d_k each, shared by heads.
qk_norms = L_a * 2 * d_k
# OLMo 2 (over the whole width h·d_k and g·d_k), Cohere and StableLM (one norm per head): h·d_k + g·d_k.
qk_norms_per_head = L_a * (h + g) * d_k
# gpt-oss: one learned sink logit per query head (it joins each row's softmax denominator, no value).
attention_sinks = L_a * h
window_sinks = L_w * h  # MiMo-V2-Flash: sinks on its windowed layers only
# Qwen3-Next: the query projection is 2·h·d_k wide; half of it gates the attention output per channel.
attention_output_gate = d * h * d_k
# Phi-3, GPT-NeoX: Q, K and V as one fused matrix, d × (h + 2g)·d_k: the same count as three separate
# ones (and Phi-3's fused gate_up is 2·d·d_ff, the same as gate and up). Fusing changes no count.
fused_qkv = d * (h + 2 * g) * d_k
# GPT-NeoX (Pythia), Phi-2, Falcon, Cohere: attention and MLP read the same input in parallel
# (x + attn(ln1 x) + mlp(ln2 x), or one shared norm), and rotary embeddings may turn only a fraction of
# each head's dimensions (partial rotary). Rotary has no parameters and a parallel block changes only
# how many norms a layer has, so neither needs a formula of its own.

# Mixture of experts (Mixtral; DeepSeek-V3). Each of the L − L_d MoE layers has E routed experts, each
# a gated MLP of width d_e, S shared experts every token uses, and a router d → E (DeepSeek-V3 adds a
# per-expert score-correction bias). A token runs k_E routed experts, so per token
# active = total − (L − L_d)·(E − k_E)·3·d·d_e: attention, norms, router, shared experts and both
# embedding tables count as active (the convention of Mixtral's 12.9 B of 46.7 B).
expert = 3 * d * d_e
moe_experts = (L - L_d) * E * expert
# S shared experts of width d_s every token runs (d_s = d_e for DeepSeek; Qwen2-MoE's one is wider).
moe_shared_experts = (L - L_d) * S * 3 * d * d_s
moe_router = (L - L_d) * E * d
moe_router_bias = (L - L_d) * E
# LongCat-Flash's Z zero experts (a token routed there is passed on unchanged): Z more rows of the router and
# of its score-correction bias.
moe_zero_experts = (L - L_d) * Z * (d + 1)
mlp_dense_layers = L_d * 3 * d * d_ff  # DeepSeek-V3's first L_d layers keep a dense gated MLP
# The sigmoid gate d → 1 that Qwen2-MoE and Qwen3-Next put on the shared expert.
moe_shared_expert_gate = (L - L_d) * d
# gpt-oss: each expert has biases on its gate/up (2·d_e) and down (d) projections.
expert_bias = 2 * d_e + d
moe_expert_biases = (L - L_d) * E * expert_bias
moe_inactive = (L - L_d) * (E - k_E) * expert
moe_inactive_biases = (L - L_d) * (E - k_E) * expert_bias
# Experts, shared experts and dense layers without a gate (Nemotron-H: up and down, a squared ReLU between).
expert_ungated = 2 * d * d_e
moe_experts_ungated = (L - L_d) * E * expert_ungated
moe_shared_experts_ungated = (L - L_d) * S * 2 * d * d_s
mlp_dense_layers_ungated = L_d * 2 * d * d_ff
moe_inactive_ungated = (L - L_d) * (E - k_E) * expert_ungated
# Biases of a dense MLP: up and down (GPT), or gate, up and down (a gated MLP with biases).
mlp_dense_bias = L * (d_ff + d)
mlp_gated_bias = L * (2 * d_ff + d)
# In an MoE model, those of its dense layers and shared experts (Nemotron-H's mlp_bias; routed experts
# keep none there).
moe_mlp_dense_bias = L_d * (d_ff + d) + (L - L_d) * S * (d_s + d)
moe_mlp_gated_bias = L_d * (2 * d_ff + d) + (L - L_d) * S * (2 * d_s + d)

# Multi-head latent attention (DeepSeek-V2/V3). Queries go down to rank r_q, are normed, and go up to h
# heads of d_k = d_nope + d_r; keys and values share one latent of rank r_kv (normed) plus one rotary key
# of d_r shared by all heads; the latent goes up to h heads of no-rotary key (d_k − d_r) and value d_v.
mla_q = d * r_q + r_q * h * d_k
mla_q_full = d * h * d_k  # no query compression (DeepSeek-V2-Lite: q_lora_rank null)
mla_kv = d * (r_kv + d_r) + r_kv * h * (d_k - d_r + d_v)
mla_o = h * d_v * d
mla_norms = L_a * (r_q + r_kv)

# DeepSeek V3.2's indexer (DeepseekV32Indexer, per sparse layer): its queries from the query latent
# (r_q → h_I·d_I), one key per token (d → d_I) with a LayerNorm (weight and bias, 2·d_I), and the weight of
# each of its heads per token (d → h_I).
indexer_per_layer = r_q * h_I * d_I + d * d_I + 2 * d_I + d * h_I

# DeepSeek V4 (DeepseekV4Attention, per layer): queries down to r_q (normed) and up to h heads of d_k; one key
# of d_k that is also the value (normed); the output grouped: G_o groups of h/G_o heads each down to r_o
# (r_o·h·d_k in all), then G_o·r_o → d. Sinks are attention_sinks (L_a·h).
v4_attention = L_a * (d * r_q + r_q * h * d_k + d * g * d_k + r_o * h * d_k + G_o * r_o * d)
v4_attention_norms = L_a * (r_q + g * d_k)
# An HCA layer's compressor: a key and a gate d → d_k, a position bias of m_h × d_k, a norm of d_k. A CSA
# layer's: the same at 2·d_k (two overlapping series), its norm d_k; and its indexer: the same at d_I, its
# queries from the query latent (r_q → h_I·d_I) and its heads' weights (d → h_I).
v4_hca_compressors = L_hca * (2 * d * d_k + m_h * d_k + d_k)
v4_csa_compressors = L_csa * (4 * d * d_k + 2 * m_c * d_k + d_k)
v4_csa_indexers = L_csa * (4 * d * d_I + 2 * m_c * d_I + d_I + r_q * h_I * d_I + d * h_I)
# Hyper-connections (DeepseekV4HyperConnection): before attention and before the MLP, a projection of the n_hc
# streams (n_hc·d) to (2 + n_hc)·n_hc mixing weights, their bias and 3 scales; the head's: n_hc·d → n_hc, its
# bias and 1 scale.
v4_hyper_connections = (2 * L * ((2 + n_hc) * n_hc * (n_hc * d + 1) + 3) + n_hc * (n_hc * d + 1) + 1)
# The router's score correction (a saved buffer) on the learned-routing layers only; the L_hash layers instead
# save a table of each token's k_E experts (V × k_E, int64 in the checkpoint, counted as entries).
v4_router_bias = (L - L_hash) * E
v4_hash_tables = L_hash * V * k_E

# Gated DeltaNet (Qwen3-Next's linear attention, per layer): the fused input projection to q, k (h_lk heads
# of d_lk), v and the output gate z (h_lv heads of d_lv); the projection to the per-head decay a and
# write strength b; a depthwise causal convolution of K taps over q, k and v (no bias); per-head decay
# parameters A_log and dt_bias; a gated RMSNorm of d_lv; the output projection.
deltanet_conv_width = 2 * h_lk * d_lk + h_lv * d_lv
deltanet_per_layer = (d * (2 * h_lk * d_lk + 2 * h_lv * d_lv) + d * 2 * h_lv + deltanet_conv_width * K
                      + 2 * h_lv + d_lv + h_lv * d_lv * d)
# Its state, per sequence and layer: h_lv matrices d_lk × d_lv, and the last K − 1 inputs of the convolution.
deltanet_state = h_lv * d_lk * d_lv + (K - 1) * deltanet_conv_width
# Mamba (Gu & Dao 2023; Jamba's layer): in_proj d → 2·d_in (x and the gate), a depthwise convolution of K
# taps, x_proj d_in → r_dt + 2·d_st (step, B, C), dt_proj r_dt → d_in with a bias, A_log d_in × d_st, D d_in,
# out_proj d_in → d. Optional: the convolution's bias d_in, in/out projection biases 2·d_in + d, and
# Jamba's RMSNorms on the step, B and C (r_dt + 2·d_st).
mamba_per_layer = (d * 2 * d_in + d_in * K + d_in * (r_dt + 2 * d_st) + r_dt * d_in + d_in + d_in * d_st
                   + d_in + d_in * d)
mamba_conv_bias = d_in
mamba_proj_bias = 2 * d_in + d
mamba_inner_norms = r_dt + 2 * d_st
# Its state, per sequence and layer: the SSM state d_in × d_st and the last K − 1 inputs of the convolution.
mamba_state = d_in * d_st + (K - 1) * d_in
# Mamba-2 (Dao & Gu 2024; Nemotron-H's layer, NemotronHMamba2Mixer): in_proj d → 2·d_in + 2·G·d_st + h_m (x,
# the gate z, B and C of G groups, a step per head), a depthwise convolution of K taps over x, B and C,
# per-head dt_bias, A_log and D, a gated RMSNorm of d_in, out_proj d_in → d. Optional: the convolution's
# bias, and in/out projection biases.
mamba2_conv_width = d_in + 2 * G * d_st
mamba2_per_layer = (d * (2 * d_in + 2 * G * d_st + h_m) + mamba2_conv_width * K + 3 * h_m + d_in
                    + d_in * d)
mamba2_conv_bias = mamba2_conv_width
mamba2_proj_bias = 2 * d_in + 2 * G * d_st + h_m + d
# Its state, per sequence and layer: h_m heads of (d_in/h_m) × d_st, and the last K − 1 inputs of the
# convolution (x, B and C).
mamba2_state = d_in * d_st + (K - 1) * mamba2_conv_width

# --- Attention pattern: memory and FLOPs ----------------------------------------------------------
entries_per_head = n**2
# A query of a sliding-window layer sees at most w keys (Mistral; Gemma 2/3's local layers).
windowed_entries_per_head = n * Min(n, w)
# A query of a chunked layer sees only its own chunk of C tokens (Llama 4): the pattern is block-diagonal,
# m_C = ⌊n/C⌋ full C×C blocks and one of r_C² (r_C = n mod C).
chunked_entries_per_head = C**2 * m_C + r_C**2
# A query of a sparse layer attends to the k_I keys its indexer selects (all of them while n ≤ k_I).
sparse_entries_per_head = n * Min(n, k_I)
# Keys a new token attends to, summed over layers; a chunked layer's cache holds at most C tokens (the chunk
# in progress). Linear-attention and Mamba layers attend to no keys. The KV cache holds keys_cached
# token·layers: the same, except that a sparse layer keeps every token (its indexer scores them all) and
# attends to k_I.
# DeepSeek V4: a CSA or HCA layer sees its window and the entries pooled so far, ⌊n/m⌋ (a CSA layer the k_I
# of them its indexer selects) and caches those entries (a CSA layer its indexer's too: calc.costs).
csa_entries = floor(n / m_c)
hca_entries = floor(n / m_h)
keys_seen = (L_full * n + L_w * Min(n, w) + L_c * Min(n, C) + L_s * Min(n, k_I)
             + L_csa * (Min(n, w) + Min(csa_entries, k_I)) + L_hca * (Min(n, w) + hca_entries))
keys_cached = (L_full * n + L_w * Min(n, w) + L_c * Min(n, C) + L_s * n
               + L_csa * (Min(n, w) + csa_entries) + L_hca * (Min(n, w) + hca_entries))
# One head's pattern, summed over the attention layers.
layer_entries = (L_full * n**2 + L_w * n * Min(n, w) + L_c * chunked_entries_per_head
                 + L_s * sparse_entries_per_head + L_csa * n * (Min(n, w) + Min(csa_entries, k_I))
                 + L_hca * n * (Min(n, w) + hca_entries))
entries_per_model = h * layer_entries
# A tiled kernel holds one B×B tile of scores plus each row's running max and sum (2 values per
# query) for the head it is working on, never the n×n pattern (Dao et al. 2022, Algorithm 1).
tiled_entries_per_head = B**2 + 2 * n

qk_flops_per_head = 2 * n**2 * d_k  # S = Q Kᵀ: n² dot products of length d_k
av_flops_per_head = 2 * n**2 * d_k  # O = A V: n² weights times d_v = d_k values
attention_flops_per_head = qk_flops_per_head + av_flops_per_head
attention_flops_per_layer = h * attention_flops_per_head
# QKᵀ over d_k and AV over d_v (d_v = d_k except in MLA), for every entry of every pattern.
attention_flops_per_model = h * (2 * d_k + 2 * d_v) * layer_entries
# Top-left causal: query i sees i + 1 keys, n(n + 1)/2 visible entries instead of n².
causal_flops_per_head = attention_flops_per_head * (n * (n + 1) / 2) / n**2
# With a window, query i sees min(i + 1, w) keys: m(m + 1)/2 + (n − m)·w entries, m = min(n, w).
windowed_causal_entries = Min(n, w) * (Min(n, w) + 1) / 2 + (n - Min(n, w)) * w
# In a chunk, query i sees the i + 1 keys of its chunk so far: m_C·C(C + 1)/2 + r_C(r_C + 1)/2.
chunked_causal_entries = m_C * C * (C + 1) / 2 + r_C * (r_C + 1) / 2
# Top-k: query i attends to min(i + 1, k_I) keys, the window's count with k_I for w.
sparse_causal_entries = Min(n, k_I) * (Min(n, k_I) + 1) / 2 + (n - Min(n, k_I)) * k_I


def pooled_causal_entries(rate: Expr, cap: Expr | None = None) -> Expr:
    """Entries a causal pass reads of pooled keys (DeepSeek V4): query i sees the ⌊(i + 1)/m⌋ entries whose
    windows have closed (at most ``cap``, the top-k a CSA layer keeps). With c = min(⌊n/m⌋, cap), queries
    j·m − 1 … (j + 1)·m − 2 see j each for j < c, and the n − c·m + 1 from c·m − 1 on see c: m·c(c − 1)/2 +
    c·(n − c·m + 1)."""
    c = floor(n / rate) if cap is None else Min(floor(n / rate), cap)
    return rate * c * (c - 1) / 2 + c * (n - c * rate + 1)


csa_causal_entries = windowed_causal_entries + pooled_causal_entries(m_c, k_I)
hca_causal_entries = windowed_causal_entries + pooled_causal_entries(m_h)
causal_flops_per_model = h * (2 * d_k + 2 * d_v) * (
    L_full * n * (n + 1) / 2 + L_w * windowed_causal_entries + L_c * chunked_causal_entries
    + L_s * sparse_causal_entries + L_csa * csa_causal_entries + L_hca * hca_causal_entries
)

# Forward FLOPs per token with N non-embedding parameters (a symbol of its own, since N is itself
# a ledger). Kaplan et al. 2020, Table 1: C_forward ≈ 2N + 2·n_layer·n_ctx·d_attn.
# PaLM (Chowdhery et al. 2022, Appendix B): 6N + 12·L·H·Q·T per token for training, forward and
# backward; the forward pass is a third of it. The attention terms differ by 2×.
N = Symbol("N", positive=True, integer=True)
# Both written with keys_seen (= L·n without windows), so a window caps the keys a token attends to.
# For mixture-of-experts models N is the active non-embedding count: a token runs k_E experts, not E.
forward_flops_per_token_kaplan = 2 * N + 2 * h * d_k * keys_seen
forward_flops_per_token_palm = 2 * N + 2 * h * (d_k + d_v) * keys_seen

# --- KV cache -------------------------------------------------------------------------------------
kv_cache_bytes_per_token = 2 * L_a * g * d_k * b  # one key and one value vector per layer and kv head
# A sliding-window layer keeps at most w tokens (a rolling cache): bytes held at n tokens.
kv_cache_bytes = 2 * g * d_k * b * keys_cached
# With values of d_v and g_w heads on the windowed layers (MiMo-V2-Flash): K and V of g·(d_k + d_v) a token,
# g_w·(d_k + d_v) on a windowed layer.
kv_cache_bytes_per_token_dv = ((L_a - L_w) * g + L_w * g_w) * (d_k + d_v) * b
kv_cache_bytes_dv = (g * (keys_cached - L_w * Min(n, w)) + g_w * L_w * Min(n, w)) * (d_k + d_v) * b
# Gemma 4: K and V of g heads of d_k on a windowed layer, of g_f heads of d_kf on a full one (where the values
# are the keys, transformers still caches both: the keys normed and rotated, the values normed), none on the
# L_x layers that reuse another layer's.
kv_cache_bytes_per_token_split = ((L_w - L_xw) * 2 * g * d_k + (L_full - L_xf) * 2 * g_f * d_kf) * b
kv_cache_bytes_split = ((L_w - L_xw) * 2 * g * d_k * Min(n, w) + (L_full - L_xf) * 2 * g_f * d_kf * n) * b
# DeepSeek V4 as transformers caches it (DeepseekV4HCACache, DeepseekV4CSACache): a windowed layer keeps its
# last w − 1 keys and values (2·d_k a token, one head); a CSA or HCA layer its last w − 1 keys, which are its
# values (one tensor, d_k a token), the entries pooled so far (d_k each; a CSA layer also its indexer's, d_I),
# the n mod m tokens of the window in progress (a key and a gate each: 2·d_k an HCA layer, 2·2·d_k and 2·2·d_I
# a CSA layer) and, once a window closed, a CSA layer's overlap with the next: m_c keys at b bytes and m_c
# gates in fp32 (the gates plus the fp32 position bias), of d_k and of d_I.
v4_window_cached = Min(n, w - 1)
hca_layer_cache = b * d_k * (v4_window_cached + hca_entries + 2 * Mod(n, m_h))
csa_layer_cache = (b * (d_k * v4_window_cached + (d_k + d_I) * (csa_entries + 4 * Mod(n, m_c)))
                   + m_c * (d_k + d_I) * (b + 4) * Min(csa_entries, 1))
kv_cache_bytes_compressed = (L_w * 2 * d_k * v4_window_cached * b + L_hca * hca_layer_cache
                             + L_csa * csa_layer_cache)
# Per token, once every window is full: the pooled entries, d_k every m_h tokens an HCA layer, d_k + d_I every
# m_c tokens a CSA layer (a Rational where m does not divide them).
kv_cache_bytes_per_token_compressed = (L_hca * d_k / m_h + L_csa * (d_k + d_I) / m_c) * b
# MLA caches one latent of r_kv and one shared rotary key of d_r per layer and token, not K and V per
# head: the up-projections are applied to the cache (or absorbed into W_Q and W_O) at attention time. A sparse
# layer also caches its indexer's key, d_I a token (transformers' DynamicIndexedLayer).
kv_cache_bytes_per_token_mla = (L_a * (r_kv + d_r) + L_s * d_I) * b
kv_cache_bytes_mla = ((r_kv + d_r) * keys_cached + L_s * d_I * n) * b

# --- Roofline: attention's n² part of one forward pass, batch 1 -----------------------------------
# Naive: read Q, K, V, write O (4·n·d_k per head) and write then read back the n×n pattern.
# Tiled: the ideal kernel moves only Q, K, V and O (FlashAttention's re-reads of K and V ignored).
naive_bytes_per_model = h * (L_a * n * (2 * d_k + 2 * d_v) + 2 * layer_entries) * b
tiled_bytes_per_model = L_a * h * n * (2 * d_k + 2 * d_v) * b

# --- Training memory ----------------------------------------------------------------------------------
# Model states per device (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
# Parameter Models", §3.1 and §5). P parameters (a tensor-parallel rank's share, ⌈Ψ/t⌉ of the model's Ψ)
# at b_w bytes of weights, b_g of gradients and b_o of optimizer states a parameter (the paper's K):
# mixed-precision Adam keeps fp16/bf16 weights and gradients, b_w = b_g = 2, and fp32 master weights,
# momentum and variance, K = 12. ZeRO partitions them over N_d data-parallel devices: stage 1 (P_os) the
# optimizer states, stage 2 (P_os+g) also the gradients, stage 3 (P_os+g+p) also the weights. A partition
# is padded to equal size, ⌈P/N_d⌉ parameters a device: the paper's Ψ/N_d wherever N_d divides Ψ.
b_m, t, N_d, P = symbols("b_m t N_d P", positive=True, integer=True)
b_w, b_g, b_o = symbols("b_w b_g b_o", positive=True, integer=True)
P_shard = ceiling(P / N_d)
# stage → (weights, gradients, optimizer states) one device holds, in bytes
zero_model_states: dict[int, tuple[Expr, Expr, Expr]] = {
    0: (b_w * P, b_g * P, b_o * P),  # (2 + 2 + K)·Ψ
    1: (b_w * P, b_g * P, b_o * P_shard),  # 2Ψ + 2Ψ + K·Ψ/N_d
    2: (b_w * P, b_g * P_shard, b_o * P_shard),  # 2Ψ + (2 + K)·Ψ/N_d
    3: (b_w * P_shard, b_g * P_shard, b_o * P_shard),  # (2 + 2 + K)·Ψ/N_d
}
# their sum, grouped as §5 writes it
zero_model_states_total: dict[int, Expr] = {
    0: (b_w + b_g + b_o) * P,
    1: (b_w + b_g) * P + b_o * P_shard,
    2: b_w * P + (b_g + b_o) * P_shard,
    3: (b_w + b_g + b_o) * P_shard,
}
MIXED_PRECISION = {b_w: 2, b_g: 2, b_o: 12}  # ZeRO §3.1: 16 bytes a parameter, K = 12

# Activations one transformer layer stores for its backward pass, in bytes, for n tokens, a micro-batch
# of b_m, width d and h heads (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
# Transformer Models", §4.1, eq. 1 and Table 2; their s, b, h, a are n, b_m, d, h here): 16-bit activations,
# 1-byte dropout masks, a GPT layer (MLP 4d, LayerNorm, dropout). 34·n·b_m·d grow with n: attention 11 (its
# inputs, Q, K, V, the output projection's input, a dropout mask), MLP 19, the two LayerNorms 4. The rest,
# 5·h·n²·b_m, is the n² term: each head's softmax output (2 bytes), its dropout mask (1) and the
# dropped-out weights (2).
activations_linear = 34 * n * b_m * d
activations_quadratic = 5 * h * n**2 * b_m
# Table 2, no parallelism: sbh(34 + 5as/h)
activations_per_layer = n * b_m * d * (34 + 5 * h * n / d)  # = activations_linear + activations_quadratic
# Table 2, tensor parallelism over t devices (Megatron-LM): the 24·n·b_m·d inside attention and the MLP, and
# the n² term (by heads), split t ways; 10·n·b_m·d stay whole on every device: the two LayerNorms' inputs
# (4), the inputs of attention and of the MLP (4) and the two dropout masks after them (2).
# sbh(10 + 24/t + 5as/(ht))
activations_tp = n * b_m * d * (10 + 24 / t + 5 * h * n / (d * t))
# Table 2, tensor and sequence parallelism: those 10 split along n too, so every term t ways.
# sbh/t·(34 + 5as/h)
activations_tp_sp = n * b_m * d / t * (34 + 5 * h * n / d)
# Selective recomputation (ibid. §4.2, Table 2): the n² term is recomputed in the backward pass, not
# stored. Tensor parallelism: sbh(10 + 24/t); with sequence parallelism: 34sbh/t.
activations_selective_tp = n * b_m * d * (10 + 24 / t)
activations_selective_tp_sp = 34 * n * b_m * d / t
# FlashAttention (Dao et al. 2022; FlashAttention-2, Dao 2023): the n² term is never written; the
# backward recomputes it from Q, K, V, the output and each row's logsumexp (fp32, 4·h·n·b_m bytes, split
# by heads).
activations_flash_tp = activations_selective_tp + 4 * h * n * b_m / t
activations_flash_tp_sp = activations_selective_tp_sp + 4 * h * n * b_m / t
# Full recomputation (Table 2): only each layer's input is kept, 2sbh.
activations_full_recompute = 2 * n * b_m * d

# --- Activation memory per layer kind: the tensors a layer keeps for its backward pass ---------------------
# Derived op by op from what PyTorch's autograd saves for each operation of transformers' layers (a linear
# layer keeps its input, SiLU its input, softmax its output, a product of two tensors both, an addition
# nothing), each distinct tensor counted once, for b_m sequences of n tokens in one dtype of b bytes a value,
# without dropout; calc.activations assembles a layer from these blocks, calc.measure checks every block
# against the bytes PyTorch saves (torch.autograd.graph.saved_tensors_hooks). c_up is 1 where b < 4: a cast
# to or from fp32 is then a copy of its own (at b = 4 it is the same tensor, c_up = 0). Tensors: T = b_m·n.
c_up = Symbol("c_up", nonnegative=True, integer=True)
c_f = Symbol("c_f", positive=True)  # capacity factor: tokens the experts process over n·k_E (1: dropless)
k_a = Symbol("k_a", nonnegative=True, integer=True)  # tensors the MLP's activation keeps (SiLU 1: its input)
# s_1 is 1 for a micro-batch of one sequence: a reshape that merges the batch dimension is then a view of a
# tensor kept anyway instead of a copy of its own (0 for b_m ≥ 2).
s_1 = Symbol("s_1", nonnegative=True, integer=True)
tokens = b_m * n


def rms_norm_saved(width: Expr) -> Expr:
    """RMSNorm (Llama's, upcast to fp32): its input in fp32 (pow and the product keep it), 1/rms per token
    (fp32), and the normalized values cast back to b (the product with the weight keeps them)."""
    return (4 + b) * tokens * width + 4 * tokens


def layer_norm_saved(width: Expr) -> Expr:
    """LayerNorm: its input, and each token's mean and 1/std, in the input's dtype (as PyTorch's CPU kernel
    keeps them; its CUDA kernel keeps the two statistics in fp32)."""
    return b * tokens * width + 2 * b * tokens


projection_input = b * tokens * d  # a norm's output, kept by the projections that read it
# Eager attention: Q; K and V at h heads (repeat_kv copies them where g < h) for the two matmuls; the softmax
# output (in fp32, and its cast back to b, where the model computes softmax in fp32); the output made
# contiguous for W_O. The n² term is the softmax.
attention_eager_linear = b * tokens * h * (2 * d_k + 2 * d_v)
softmax_saved = b_m * h * n**2 * b
softmax_fp32_saved = b_m * h * n**2 * (4 + c_up * b)
# FlashAttention-style (SDPA's flash kernel): Q, K and V at their own heads, the output, and each row's
# logsumexp in fp32; no n² term.
attention_flash_saved = b * tokens * (h * d_k + g * d_k + g * d_v + h * d_v) + 4 * b_m * h * n
# A norm over each query and key head (Qwen3): RMSNorm over d_k, h + g times a token.
qk_norm_saved = (4 + b) * tokens * (h + g) * d_k + 4 * tokens * (h + g)
# MLPs: a dense one keeps its activation's k_a tensors and the activation's output (the down projection's
# input); a gated one also the up projection's output and the product.
mlp_dense_saved = b * tokens * d_ff * (k_a + 1)
mlp_gated_saved = b * tokens * d_ff * (k_a + 3)
# A mixture of experts routes each token to k_E experts (c_f·n·k_E tokens in all; c_f = 1 without dropped or
# padded tokens). The router keeps its softmax (fp32) and the top-k indices (int64); each routed token keeps
# its two int64 indices (token and slot), its copy of the input, its gated expert's tensors, the expert's
# output, that output weighted, and the weight (w_b bytes).
w_b = Symbol("w_b", positive=True, integer=True)
moe_router_saved = tokens * (4 * E + 8 * k_E)
moe_router_renormalized = tokens * (4 * k_E + 4)  # Mixtral: the top-k weights divided by their sum, and it
moe_experts_saved = c_f * tokens * k_E * (b * (3 * d + (k_a + 3) * d_e) + 16 + w_b)
# Mamba (Jamba's layer, its PyTorch path): in_proj's output (x and the gate, 2·d_in), A = −exp(A_log)
# and its exp (fp32), the causal convolution's output (n + K − 1 long), x_proj's input (a view of the
# convolution's output where s_1 = 1), the RMSNorms of the
# step, B and C, dt_proj's input, softplus's input and output, discretized A and B (fp32, n·d_in·d_st each),
# B and the convolution's output in fp32, the state at each step (fp32, with its cast) and C, the skip D,
# the output before the gate (fp32), silu(gate), and out_proj's input.
mamba_saved = (2 * b * tokens * d_in + 8 * d_in * d_st + b * b_m * d_in * (n + K - 1)
               + (1 - s_1) * b * tokens * d_in + (4 + b) * tokens * (r_dt + 2 * d_st) + 12 * tokens
               + b * tokens * r_dt
               + 2 * b * tokens * d_in + 8 * tokens * d_in * d_st + 4 * tokens * d_st
               + (4 + c_up * b) * tokens * d_in
               + b_m * d_in * d_st * (2 * b + (n - 1) * (4 + c_up * b)) + b * tokens * d_st + 4 * c_up * d_in
               + 4 * tokens * d_in + 2 * b * tokens * d_in)

# --- Serving time: prefill and decode on one device, each step a roofline ---------------------------------
# N_mm: the parameters a token is multiplied by (the active ones less the embedding tables, which are looked
# up; a tied head multiplies by the embedding matrix, so it counts). Prefill runs n tokens of b_m sequences at
# once, causal attention included; a decode step runs one token of each sequence against the keys it sees.
N_mm = Symbol("N_mm", positive=True, integer=True)
prefill_flops = b_m * 2 * N_mm * n + b_m * causal_flops_per_model
decode_flops = b_m * (2 * N_mm + 2 * h * (d_k + d_v) * keys_seen)
# Bytes a step reads: every weight a token multiplies by, once per step whatever the batch (P_s of them
# outside the routed experts, at b_w bytes), the distinct routed experts of its tokens (p_e parameters each),
# and each sequence's KV cache at n tokens and fixed state. t_r tokens routed independently and uniformly to
# k_E of E experts touch E·(1 − (1 − k_E/E)^t_r) of them in a layer in expectation: k_E for one token, nearly
# E for a prefill.
P_s, p_e, t_r = symbols("P_s p_e t_r", positive=True, integer=True)
experts_touched = E * (1 - (1 - k_E / E) ** t_r)
step_weight_bytes = b_w * (P_s + (L - L_d) * experts_touched * p_e)

# MHA, d = h·d_k, one kind (and one head width, no layer reusing another's keys and values)
GPT_SHAPE = {g: h, d_k: d / h, d_v: d / h, L_a: L, L_w: 0, L_c: 0, L_s: 0,
             d_kf: d / h, g_f: h, L_x: 0, L_xw: 0, L_csa: 0, L_hca: 0}


def chunk_values(n_tokens: int, chunk: int) -> dict[Symbol, int]:
    """m_C and r_C for n tokens in chunks of C: n = m_C·C + r_C."""
    whole, rest = divmod(n_tokens, chunk)
    return {m_C: whole, r_C: rest}


def evaluate(expr: Expr, values: Mapping[Symbol, int | Rational]) -> Rational:
    """``expr`` at integer (or exact Rational) ``values``: an exact SymPy number (int() it for a count)."""
    result = expr.xreplace({symbol: value if isinstance(value, Rational) else Integer(value)
                            for symbol, value in values.items()})
    if not result.is_Rational:
        raise ValueError(f"{expr} still has free symbols {sorted(map(str, result.free_symbols))}")
    return result


def evaluate_count(expr: Expr, values: Mapping[Symbol, int]) -> int:
    """``expr`` at ``values`` as an int; a count that comes out fractional is an error, never rounded."""
    result = evaluate(expr, values)
    if not result.is_Integer:
        raise ValueError(f"{expr} is not a whole number at {dict(values)}: {result}")
    return int(result)


def score_variance(mean: Expr | int = 0, var: Expr | int = 1) -> tuple[Expr, Expr]:
    """Var(q·k) and Var(q·k / √d_k) when every q_m, k_m is independent with this mean and variance.

    Var(q_m k_m) = E[q_m²]·E[k_m²] − (E[q_m]·E[k_m])² by independence, with E[x²] = var + mean²;
    the d_k terms of the dot product are independent, so their variances add. For unit-variance,
    zero-mean components this gives Var(q·k) = d_k, and the 1/√d_k scale (Var(c·X) = c²·Var(X))
    restores unit variance whatever d_k is.
    """
    m = Symbol("m", positive=True, integer=True)
    mean, var = sympify(mean), sympify(var)
    second_moment = var + mean**2
    var_term = second_moment * second_moment - (mean * mean) ** 2
    var_score = summation(var_term, (m, 1, d_k)).expand()
    return var_score, (var_score / d_k).expand()


def recall_cases(n_values: int = 8, n_pairs: int = 3) -> dict[tuple[int, ...], tuple[Rational, Rational]]:
    """P(pattern) and P(right | pattern) of "guess the most repeated value", by exact enumeration.

    ``n_pairs`` values are drawn uniformly (with replacement) from ``n_values``; the question asks
    for the value of one pair chosen uniformly; the guess is a value of highest multiplicity, ties
    broken uniformly. A pattern is the sorted multiplicities (e.g. (2, 1): two values equal).
    """
    for name, value in (("n_values", n_values), ("n_pairs", n_pairs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if n_values**n_pairs > 10**6:
        raise ValueError(f"{n_values}**{n_pairs} draws are too many to enumerate (at most 10**6)")
    count: Counter[tuple[int, ...]] = Counter()
    for draw in itertools.product(range(n_values), repeat=n_pairs):
        count[tuple(sorted(Counter(draw).values(), reverse=True))] += 1
    total = n_values**n_pairs
    cases = {}
    for pattern, hits in sorted(count.items(), reverse=True):
        top = pattern[0]
        # Each of the tied most-repeated values is guessed with probability 1/(number tied) and is
        # the answer to `top` of the n_pairs equally likely questions: the tie-break cancels.
        right = Rational(top, n_pairs)
        cases[pattern] = (Rational(hits, total), right)
    return cases


def recall_ceiling(n_values: int = 8, n_pairs: int = 3) -> Rational:
    """Exact accuracy of "guess the most repeated value" in associative recall (29/64 for 8 and 3).

    This is the ceiling of a model that sees which values occur but not which key each belongs to,
    as attention with W_Q = W_K = 0 (uniform weights) does.
    """
    return sum((p * right for p, right in recall_cases(n_values, n_pairs).values()), Rational(0))
