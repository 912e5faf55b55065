"""The formulas, as SymPy expressions in the dimension letters of :mod:`impl.attention`.

    d     model width            h     query heads          d_k   head width (query/key/value)
    g     key/value heads        d_ff  MLP hidden width     L     layers
    V     vocabulary size        n     tokens               n_ctx learned positions
    b     bytes per value        B     tile side of a tiled (FlashAttention) kernel
    d_v   value head width       w     sliding window       L_w   layers with a sliding window
    E     routed experts         k_E   experts per token    S     shared experts
    d_e   expert MLP width       L_d   dense layers of an MoE model (DeepSeek's first layers)
    r_q   query latent rank      r_kv  key/value latent rank  d_r  rotary head width (MLA)

Every ledger and cost in :mod:`calc` is one of these expressions evaluated for a configuration, so
the printed numbers and the printed formulas cannot drift apart. Multiply-adds count as 2 FLOPs.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping

from sympy import Expr, Integer, Min, Rational, Symbol, summation, symbols, sympify

d, h, d_k, g, d_ff, L, V, n, n_ctx, b, B = symbols(
    "d h d_k g d_ff L V n n_ctx b B", positive=True, integer=True
)
# L_w and L_d may be 0 (no windowed layers, no dense layers): evaluation substitutes exact integers.
d_v, w, L_w, E, k_E, S, d_e, L_d, r_q, r_kv, d_r = symbols(
    "d_v w L_w E k_E S d_e L_d r_q r_kv d_r", positive=True, integer=True
)

# --- Source ledger: weight matrices only, embedding and unembedding both counted --------------------
# Query and output projections are h·d_k wide; key and value projections g·d_k (grouped-query
# attention; g = h is multi-head attention). One query head owns its Q and O columns and a 1/(h/g)
# share of the K and V it reads, so per head × h = per layer exactly.
attention_per_head = 2 * d * d_k + 2 * d * d_k * g / h
attention_per_layer = 2 * d * h * d_k + 2 * d * g * d_k
attention = L * attention_per_layer
mlp_dense = L * 2 * d * d_ff  # up and down projections (GPT)
mlp_gated = L * 3 * d * d_ff  # gate, up and down projections (SwiGLU: Llama, Mistral)
embedding = V * d
unembedding = V * d

# --- Checkpoint: everything a real checkpoint stores ----------------------------------------------
# GPT-2 layout (Radford et al. 2019; Hugging Face GPT2Model): learned positions, biases on every
# projection, LayerNorm with weight and bias before attention, before the MLP and at the end.
gpt_checkpoint: dict[str, Expr] = {
    "token_embedding": V * d,
    "position_embedding": n_ctx * d,
    "attention": L * attention_per_layer,
    "attention_bias": L * ((h + 2 * g) * d_k + d),
    "mlp": mlp_dense,
    "mlp_bias": L * (d_ff + d),
    "norms": L * 2 * (2 * d) + 2 * d,
}
# Llama layout (Touvron et al. 2023; Hugging Face LlamaModel, also Mistral): rotary positions (no
# parameters), no biases, RMSNorm (weight only) before attention, before the MLP and at the end.
llama_checkpoint: dict[str, Expr] = {
    "token_embedding": V * d,
    "attention": L * attention_per_layer,
    "mlp": mlp_gated,
    "norms": L * 2 * d + d,
}

# --- Components of the architectures of 2023–25 ------------------------------------------------------
# Qwen2: biases on the Q, K and V projections only (none on O).
qkv_bias = L * (h + 2 * g) * d_k
# Qwen3, Gemma 3: an RMSNorm over each query and key head vector, one weight of d_k each, shared by heads.
qk_norms = L * 2 * d_k
# Phi-3, GPT-NeoX: Q, K and V as one fused matrix, d × (h + 2g)·d_k: the same count as three separate
# ones (and Phi-3's fused gate_up is 2·d·d_ff, the same as gate and up). Fusing changes no count.
fused_qkv = d * (h + 2 * g) * d_k
# GPT-NeoX (Pythia): attention and MLP read the same input in parallel (x + attn(ln1 x) + mlp(ln2 x)),
# and rotary embeddings turn only a fraction of each head's dimensions. Rotary has no parameters and
# the parallel block keeps both LayerNorms, so neither changes the count: the GPT layout less its
# learned positions, with an untied unembedding.
neox_checkpoint: dict[str, Expr] = {
    "token_embedding": V * d,
    "attention": L * attention_per_layer,
    "attention_bias": L * ((h + 2 * g) * d_k + d),
    "mlp": mlp_dense,
    "mlp_bias": L * (d_ff + d),
    "norms": L * 2 * (2 * d) + 2 * d,
}

# Mixture of experts (Mixtral; DeepSeek-V3). Each of the L − L_d MoE layers has E routed experts, each
# a gated MLP of width d_e, S shared experts every token uses, and a router d → E (DeepSeek-V3 adds a
# per-expert score-correction bias). A token runs k_E routed experts, so per token
# active = total − (L − L_d)·(E − k_E)·3·d·d_e: attention, norms, router, shared experts and both
# embedding tables count as active (the convention of Mixtral's 12.9 B of 46.7 B).
expert = 3 * d * d_e
moe_experts = (L - L_d) * E * expert
moe_shared_experts = (L - L_d) * S * expert
moe_router = (L - L_d) * E * d
moe_router_bias = (L - L_d) * E
mlp_dense_layers = L_d * 3 * d * d_ff  # DeepSeek-V3's first L_d layers keep a dense gated MLP
moe_inactive = (L - L_d) * (E - k_E) * expert

# Multi-head latent attention (DeepSeek-V2/V3). Queries go down to rank r_q, are normed, and go up to h
# heads of d_k = d_nope + d_r; keys and values share one latent of rank r_kv (normed) plus one rotary key
# of d_r shared by all heads; the latent goes up to h heads of no-rotary key (d_k − d_r) and value d_v.
mla_q = d * r_q + r_q * h * d_k
mla_q_full = d * h * d_k  # no query compression (DeepSeek-V2-Lite: q_lora_rank null)
mla_kv = d * (r_kv + d_r) + r_kv * h * (d_k - d_r + d_v)
mla_o = h * d_v * d
mla_per_layer = mla_q + mla_kv + mla_o
mla_norms = L * (r_q + r_kv)

# --- Attention pattern: memory and FLOPs ----------------------------------------------------------
entries_per_head = n**2
entries_per_layer = h * n**2
# A query of a sliding-window layer sees at most w keys (Mistral; Gemma 2/3's local layers).
windowed_entries_per_head = n * Min(n, w)
# Keys a new token attends to, summed over layers = token·layers the KV cache holds at n tokens.
keys_seen = (L - L_w) * n + L_w * Min(n, w)
# One head's n×n (or n×min(n, w)) pattern, summed over layers.
layer_entries = (L - L_w) * n**2 + L_w * n * Min(n, w)
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
causal_flops_per_model = h * (2 * d_k + 2 * d_v) * (
    (L - L_w) * n * (n + 1) / 2 + L_w * windowed_causal_entries
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
kv_cache_bytes_per_token = 2 * L * g * d_k * b  # one key and one value vector per layer and kv head
# A sliding-window layer keeps at most w tokens (a rolling cache): bytes held at n tokens.
kv_cache_bytes = 2 * g * d_k * b * keys_seen
# MLA caches one latent of r_kv and one shared rotary key of d_r per layer and token, not K and V per
# head: the up-projections are applied to the cache (or absorbed into W_Q and W_O) at attention time.
kv_cache_bytes_per_token_mla = L * (r_kv + d_r) * b
kv_cache_bytes_mla = (r_kv + d_r) * b * keys_seen

# --- Roofline: attention's n² part of one forward pass, batch 1 -----------------------------------
# Naive: read Q, K, V, write O (4·n·d_k per head) and write then read back the n×n pattern.
# Tiled: the ideal kernel moves only Q, K, V and O (FlashAttention's re-reads of K and V ignored).
naive_bytes_per_model = h * (L * n * (2 * d_k + 2 * d_v) + 2 * layer_entries) * b
tiled_bytes_per_model = L * h * n * (2 * d_k + 2 * d_v) * b

GPT_SHAPE = {g: h, d_k: d / h, d_v: d / h, L_w: 0}  # multi-head attention with d = h·d_k, no windows


def evaluate(expr: Expr, values: Mapping[Symbol, int]) -> Rational:
    """``expr`` at integer ``values`` (an exact SymPy number; ``int()`` of it when a count)."""
    result = expr.xreplace({symbol: Integer(value) for symbol, value in values.items()})
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
