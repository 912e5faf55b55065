"""A model configuration: the dataclass every ledger and table is evaluated for, and its checks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

Arch = Literal["gpt", "llama", "neox"]
ARCHS: tuple[Arch, ...] = ("gpt", "llama", "neox")

# What each layout stores beside its weight matrices, where a Config leaves the field None. "gpt": GPT-2
# (learned positions, biases on every projection, LayerNorm with a bias, dense MLP); "neox": GPT-NeoX,
# the same with rotary positions; "llama": rotary positions, no biases, RMSNorm (a weight only), gated MLP.
LAYOUTS: dict[str, dict[str, bool]] = {
    "gpt": {"learned_positions": True, "norm_bias": True, "qkv_bias": True, "o_bias": True,
            "mlp_gated": False,
            "mlp_bias": True},
    "neox": {"learned_positions": False, "norm_bias": True, "qkv_bias": True, "o_bias": True,
             "mlp_gated": False, "mlp_bias": True},
    "llama": {"learned_positions": False, "norm_bias": False, "qkv_bias": False, "o_bias": False,
              "mlp_gated": True, "mlp_bias": False},
}


class ConfigError(ValueError):
    """A configuration value is missing, not a positive integer, or inconsistent with another."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, f"must be a positive integer, got {value!r}")


def check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(name, f"must be a non-negative integer, got {value!r}")


@dataclass(frozen=True)
class GatedDeltaNet:
    """A linear-attention layer of Qwen3-Next (Yang et al. 2024, "Gated Delta Networks"): it keeps a state
    of h_v heads × d_lk × d_lv whatever the context, and no KV cache."""

    key_heads: int  # h_lk
    value_heads: int  # h_lv
    d_key: int  # d_lk
    d_value: int  # d_lv
    conv_kernel: int  # K, the causal convolution over q, k and v

    def __post_init__(self) -> None:
        for f in fields(self):
            check_positive(f"linear_attention.{f.name}", getattr(self, f.name))


@dataclass(frozen=True)
class Mamba:
    """A Mamba layer (Gu & Dao 2023) as Jamba uses it: it keeps a state of d_in × d_state and the last K − 1
    inputs of its convolution whatever the context, and no KV cache."""

    d_inner: int  # d_in = expand·d
    d_state: int  # d_st, the SSM state per channel
    dt_rank: int  # r_dt, the rank of the step-size projection
    conv_kernel: int  # K
    conv_bias: bool
    proj_bias: bool  # biases on in_proj and out_proj
    inner_norms: bool  # Jamba's RMSNorms on dt, B and C (r_dt + 2·d_st weights)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise ConfigError(f"mamba.{f.name}", f"must be True or False, got {value!r}")
            else:
                check_positive(f"mamba.{f.name}", value)


@dataclass(frozen=True)
class Mamba2:
    """A Mamba-2 layer (Dao & Gu 2024) as Nemotron-H uses it: h_m heads of d_in/h_m channels share one step
    size and decay per head, and B, C are shared by the heads of each of G groups; it keeps a state of
    d_in × d_st and the last K − 1 inputs of its convolution whatever the context, and no KV cache."""

    d_inner: int  # d_in = h_m · head width
    heads: int  # h_m
    groups: int  # G, the groups that share B and C
    d_state: int  # d_st
    conv_kernel: int  # K
    conv_bias: bool
    proj_bias: bool  # biases on in_proj and out_proj

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise ConfigError(f"mamba2.{f.name}", f"must be True or False, got {value!r}")
            else:
                check_positive(f"mamba2.{f.name}", value)


@dataclass(frozen=True)
class CompressedAttention:
    """DeepSeek V4's attention (DeepseekV4Attention): every layer attends to its last w tokens through one
    key that is also the value (a head of d_k, normed, projected from d), queries through a LoRA of rank r_q,
    and a grouped output projection (G_o groups of h/G_o heads down to r_o each, then G_o·r_o → d). Beside the
    window, a layer may read compressed entries: a heavily compressed one (HCA) pools each m_h tokens into one
    entry of d_k and attends to every entry; a compressed sparse one (CSA) pools 2·m_c tokens at a stride of
    m_c and attends to the k_I entries its indexer (h_I heads of d_I, its own pooled keys) scores highest.
    Around attention and the MLP, hyper-connections keep n_hc streams of d; the first L_hash layers route by a
    saved token → experts table instead of a learned top-k."""

    csa_layers: int  # L_csa
    hca_layers: int  # L_hca
    csa_rate: int  # m_c (4)
    hca_rate: int  # m_h (128)
    out_groups: int  # G_o
    out_rank: int  # r_o
    hc_mult: int  # n_hc
    hash_layers: int  # L_hash

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("csa_layers", "hca_layers", "hash_layers"):
                check_count(f"compressed.{f.name}", value)
            else:
                check_positive(f"compressed.{f.name}", value)


@dataclass(frozen=True)
class Config:
    """One decoder-only transformer; field names are the JSON keys of ``config``."""

    # "gpt": learned positions, biases, LayerNorm, dense MLP; "llama": RoPE, RMSNorm, gated MLP, no
    # biases (Mistral, Qwen, Gemma, Phi-3, DeepSeek with the features below); "neox": GPT-NeoX/Pythia,
    # GPT's biases, LayerNorms and dense MLP with rotary positions and an untied unembedding
    arch: Arch
    n_layers: int  # L
    d_model: int  # d
    n_heads: int  # h, query heads
    d_head: int  # d_k; h·d_k = d except in GPT-3's XL and 13B rows
    n_kv_heads: int  # g; g = h is multi-head attention, g < h grouped-query, g = 1 multi-query
    d_ff: int  # MLP hidden width
    vocab_size: int  # V
    n_ctx: int  # context length the model was trained for
    tied_embeddings: bool  # unembedding = embedding transposed (GPT-2) or a matrix of its own (Llama)
    # --- architecture features (defaults: a plain GPT-2 / Llama layout) ---
    model_type: str | None = None  # the Hugging Face model_type (for calc.verify and the header)
    # --- what the layout stores beside its matrices; None = the arch's layout (LAYOUTS) ---
    learned_positions: bool | None = None  # a learned position table (GPT-2, OPT) instead of rotary
    position_offset: int = 0  # extra rows of that table (OPT: 2)
    norm_bias: bool | None = None  # LayerNorm with a bias (GPT, StableLM) or a weight only (RMSNorm, Cohere)
    qkv_bias: bool | None = None  # biases on Q, K, V (Qwen2, GPT-2)
    o_bias: bool | None = None  # a bias on the output projection (GPT-2, gpt-oss)
    mlp_gated: bool | None = None  # gate, up, down (SwiGLU/GeGLU) or up, down (GPT)
    mlp_bias: bool | None = None  # biases on the MLP's projections
    lm_head_bias: bool = False  # a bias on the unembedding (Phi-2)
    qk_norm: bool = False  # a norm on each query and key head vector (Qwen3, Gemma 3, OLMo 2, Cohere)
    qk_norm_per_head: bool = False  # its weights: one d_k vector shared by heads, or one per head (h·d_k)
    attention_sinks: bool = False  # one learned sink logit per query head and layer (gpt-oss)
    attention_output_gate: bool = False  # Q projected twice as wide, half gating the output (Qwen3-Next)
    norms_per_layer: int = 2  # norms per layer (Gemma 2/3: 4, before and after attention and MLP; Phi-2: 1)
    d_rotary: int | None = None  # rotary dimensions of a head where not all of d_k (partial rotary)
    parallel_block: bool = False  # attention and MLP read the same input (GPT-NeoX, Phi-2, Falcon, Cohere)
    activation: str | None = None  # the MLP's activation (an ACT2FN name of transformers); None: the default
    sliding_window: int | None = None  # w: keys a query of a windowed layer sees at most
    n_window_layers: int = 0  # L_w: layers with the sliding window (all for Mistral-7B, half for Gemma 2)
    n_kv_heads_window: int = 0  # g_w: a windowed layer's key/value heads where not g (MiMo-V2-Flash: 2g)
    window_sinks: bool = False  # attention sinks on the windowed layers only (MiMo-V2-Flash)
    # Gemma 4: full-attention layers with heads of their own width and key/value heads, values that are their
    # keys, and layers that read another layer's keys and values (no K/V weights, no cache of their own)
    d_head_full: int = 0  # d_kf: a full-attention layer's head width where not d_k (Gemma 4: 512)
    n_kv_heads_full: int = 0  # g_f: a full-attention layer's key/value heads where not g
    full_values_are_keys: bool = False  # a full-attention layer has no V projection: its values are its keys
    n_kv_shared_layers: int = 0  # L_x: the last layers, which reuse the keys and values of an earlier one
    n_kv_shared_window_layers: int = 0  # L_xw: of those, the windowed ones
    shared_mlp_double: bool = False  # the L_x layers' MLP is 2·d_ff wide (Gemma 4's use_double_wide_mlp)
    # Gemma 4's per-layer embeddings: a table of V_p rows of L·d_p (a d_p slice per layer), a projection of
    # the hidden state to L·d_p and its norm, and in each layer a gate d → d_p and a projection d_p → d
    per_layer_input: int = 0  # d_p
    per_layer_vocab: int = 0  # V_p
    layer_scalar: bool = False  # one saved scalar per layer that scales its output (Gemma 4)
    attention_chunk: int | None = None  # C: chunked attention, a query sees only its own chunk of C tokens
    n_chunked_layers: int = 0  # L_c: layers with chunked attention (Llama 4: three of every four)
    n_nope_layers: int = 0  # attention layers without rotary positions (no parameters, no cost change)
    linear_attention: GatedDeltaNet | None = None  # the shape of its linear-attention layers
    n_linear_layers: int = 0  # L_lin: linear-attention layers (no KV cache)
    mamba: Mamba | None = None  # the shape of its Mamba layers
    mamba2: Mamba2 | None = None  # or of its Mamba-2 layers (Nemotron-H)
    n_mamba_layers: int = 0  # L_m: Mamba or Mamba-2 layers (no KV cache)
    compressed: CompressedAttention | None = None  # DeepSeek V4's windowed, compressed and sparse attention
    # L_0: layers without an MLP. Nemotron-H's blocks hold one mixer or one MLP each: calc counts a layer per
    # mixer (attention or Mamba-2) and gives its MLP blocks to as many of them, the same weights and costs
    n_mlp_free_layers: int = 0
    # DeepSeek Sparse Attention (DeepSeek V3.2): each query of a sparse layer attends to the k_I keys its
    # indexer scores highest; the indexer scores every earlier key at h_I heads of width d_I
    n_sparse_layers: int = 0  # L_s: attention layers with top-k selection
    index_topk: int = 0  # k_I
    index_heads: int = 0  # h_I
    index_head_dim: int = 0  # d_I
    n_experts: int = 0  # E routed experts per MoE layer; 0 = a dense model
    experts_per_token: int = 0  # k_E
    n_shared_experts: int = 0  # S
    d_expert: int = 0  # d_e, each expert's MLP width
    d_shared_expert: int = 0  # d_s, each shared expert's width; 0 = d_e
    shared_expert_gate: bool = False  # a sigmoid gate d → 1 on the shared expert (Qwen2-MoE, Qwen3-Next)
    n_dense_layers: int = 0  # L_d: layers with a dense MLP in an MoE model (DeepSeek-V3: the first 3)
    router_bias: bool = False  # a per-expert router bias (gpt-oss) or score correction (DeepSeek-V3)
    n_zero_experts: int = 0  # Z: experts that pass a token on unchanged, scored by the router (LongCat-Flash)
    expert_bias: bool = False  # biases inside each expert (gpt-oss: 2·d_e + d)
    kv_lora_rank: int = 0  # r_kv; > 0 means multi-head latent attention (d_head is then d_nope + d_rope)
    q_lora_rank: int = 0  # r_q; 0 = an uncompressed query projection
    d_rope: int = 0  # d_r, the rotary part of an MLA head
    d_value: int = 0  # d_v when it differs from d_head (MLA); 0 = d_head
    n_mtp_layers: int = 0  # multi-token-prediction modules stored beside the model (DeepSeek-V3: 1), apart
    vision_parameters: int = 0  # a multimodal checkpoint's vision tower (calc.vision), apart from every total
    name: str = "custom"
    source: str = "a custom configuration"
    published: int | None = None  # exact parameter count of the released checkpoint
    paper_size: float | None = None  # the rounded size the paper prints, where nothing was released
    notes: tuple[str, ...] = field(default=())
    # keys of calc.hf.INERT the config.json carried: ignored, and named in the report's warnings
    ignored_keys: tuple[str, ...] = field(default=())
    hf_config: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)  # for calc.verify

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ConfigError("arch", f"must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        for name, default in LAYOUTS[self.arch].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)  # frozen: resolved once, here
        for name in ("n_layers", "d_model", "n_heads", "d_head", "n_kv_heads", "d_ff", "vocab_size", "n_ctx",
                     "norms_per_layer"):
            check_positive(name, getattr(self, name))
        if self.d_rotary is not None:
            check_positive("d_rotary", self.d_rotary)
        for name in ("n_window_layers", "n_experts", "experts_per_token", "n_shared_experts", "d_expert",
                     "d_shared_expert", "n_dense_layers", "kv_lora_rank", "q_lora_rank", "d_rope", "d_value",
                     "n_mtp_layers", "position_offset", "n_chunked_layers", "n_nope_layers",
                     "n_linear_layers",
                     "n_mamba_layers", "n_sparse_layers", "index_topk", "index_heads", "index_head_dim",
                     "n_mlp_free_layers", "vision_parameters", "n_kv_heads_window", "n_zero_experts",
                     "d_head_full", "n_kv_heads_full", "n_kv_shared_layers", "n_kv_shared_window_layers",
                     "per_layer_input", "per_layer_vocab"):
            check_count(name, getattr(self, name))
        for name in ("tied_embeddings", "router_bias", "expert_bias", "shared_expert_gate", "lm_head_bias",
                     "qk_norm", "qk_norm_per_head", "attention_sinks", "attention_output_gate",
                     "window_sinks", "parallel_block", "full_values_are_keys", "shared_mlp_double",
                     "layer_scalar", *LAYOUTS[self.arch]):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be True or False, got {getattr(self, name)!r}")
        if self.activation is not None and not isinstance(self.activation, str):
            raise ConfigError("activation", f"must be a name such as 'silu', got {self.activation!r}")
        self._check_window()
        self._check_layer_kinds()
        self._check_split()
        self._check_experts()
        self._check_compressed()
        if self.kv_lora_rank and not 0 < self.d_rope < self.d_head:
            raise ConfigError("d_rope", f"must be between 1 and d_head - 1 = {self.d_head - 1} for MLA, "
                              f"got {self.d_rope}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                "n_kv_heads",
                f"{self.n_heads} query heads cannot share {self.n_kv_heads} key/value heads "
                "(n_heads must be a multiple of n_kv_heads)",
            )

    def _check_window(self) -> None:
        if self.sliding_window is not None:
            check_positive("sliding_window", self.sliding_window)
        if self.n_window_layers > self.n_layers:
            raise ConfigError("n_window_layers", f"{self.n_window_layers} exceeds the {self.n_layers} layers")
        if self.n_window_layers and self.sliding_window is None:
            raise ConfigError("sliding_window", f"missing, but {self.n_window_layers} layers have a window")
        for name in ("n_kv_heads_window", "window_sinks"):
            if getattr(self, name) and not self.n_window_layers:
                raise ConfigError(name, "is set, but no layer has a window")
        if self.n_kv_heads_window and (self.is_mla or self.n_heads % self.n_kv_heads_window):
            raise ConfigError("n_kv_heads_window", f"{self.n_heads} query heads cannot share "
                              f"{self.n_kv_heads_window} key/value heads of a windowed layer (nor can MLA's)")
        if self.window_sinks and self.attention_sinks:
            raise ConfigError("window_sinks", "is set beside attention_sinks (sinks on every layer)")

    def _check_layer_kinds(self) -> None:
        if self.attention_chunk is not None:
            check_positive("attention_chunk", self.attention_chunk)
        if self.n_chunked_layers and self.attention_chunk is None:
            raise ConfigError("attention_chunk", f"missing, but {self.n_chunked_layers} layers are chunked")
        if self.n_linear_layers and self.linear_attention is None:
            raise ConfigError("linear_attention", f"missing, but n_linear_layers is {self.n_linear_layers}")
        if self.mamba is not None and self.mamba2 is not None:
            raise ConfigError("mamba2", "is set beside mamba: a model's Mamba layers are of one kind")
        if self.n_mamba_layers and self.mamba is None and self.mamba2 is None:
            raise ConfigError("mamba", f"missing, but n_mamba_layers is {self.n_mamba_layers}")
        if self.n_mlp_free_layers >= self.n_layers:
            raise ConfigError("n_mlp_free_layers", f"{self.n_mlp_free_layers} leaves no MLP in the "
                              f"{self.n_layers} layers")
        if self.n_sparse_layers:
            for name in ("index_topk", "index_heads", "index_head_dim"):
                check_positive(name, getattr(self, name))
            if not self.q_lora_rank:
                raise ConfigError("q_lora_rank", "missing, but the sparse layers' indexer projects its "
                                  "queries from the query latent (an MLA with a query LoRA)")
        kinds = (self.n_window_layers + self.n_chunked_layers + self.n_linear_layers + self.n_mamba_layers
                 + self.n_sparse_layers)
        if kinds > self.n_layers or self.n_linear_layers + self.n_mamba_layers == self.n_layers:
            raise ConfigError("n_layers",
                              f"{self.n_layers} layers cannot hold {self.n_window_layers} windowed, "
                              f"{self.n_chunked_layers} chunked, {self.n_sparse_layers} sparse, "
                              f"{self.n_linear_layers} linear-attention and "
                              f"{self.n_mamba_layers} Mamba layers with at least one attention layer")
        if self.n_nope_layers > self.n_attention_layers:
            raise ConfigError("n_nope_layers", f"{self.n_nope_layers} exceeds the {self.n_attention_layers} "
                              "attention layers")

    def _check_split(self) -> None:
        """Gemma 4's fields: full layers of their own head width and K/V heads, shared K/V, per-layer
        inputs."""
        if self.n_kv_heads_full and self.n_heads % self.n_kv_heads_full:
            raise ConfigError("n_kv_heads_full", f"{self.n_heads} query heads cannot share "
                              f"{self.n_kv_heads_full} key/value heads of a full-attention layer")
        if self.split_attention and (self.is_mla or self.d_value or self.n_kv_heads_window
                                     or self.n_chunked_layers or self.n_sparse_layers
                                     or self.attention_output_gate):
            raise ConfigError("d_head_full", "full-attention layers of their own shape or shared keys and "
                              "values are modelled beside windowed and full layers of grouped-query "
                              "attention only")
        if self.n_kv_shared_layers > self.n_attention_layers:
            raise ConfigError("n_kv_shared_layers", f"{self.n_kv_shared_layers} exceeds the "
                              f"{self.n_attention_layers} attention layers")
        if self.n_kv_shared_window_layers > min(self.n_kv_shared_layers, self.n_window_layers):
            raise ConfigError("n_kv_shared_window_layers", f"{self.n_kv_shared_window_layers} exceeds the "
                              f"{self.n_kv_shared_layers} shared or the {self.n_window_layers} windowed "
                              "layers")
        if self.n_kv_shared_layers - self.n_kv_shared_window_layers > self.n_full_layers:
            shared_full = self.n_kv_shared_layers - self.n_kv_shared_window_layers
            raise ConfigError("n_kv_shared_layers", f"{shared_full} "
                              f"shared full-attention layers exceed the {self.n_full_layers} full ones")
        if self.shared_mlp_double and not self.n_kv_shared_layers:
            raise ConfigError("shared_mlp_double", "is set, but no layer shares another's keys and values")
        if bool(self.per_layer_input) != bool(self.per_layer_vocab):
            raise ConfigError("per_layer_vocab" if self.per_layer_input else "per_layer_input",
                              "per-layer embeddings need both their width and their vocabulary")

    def _check_experts(self) -> None:
        if not self.n_experts:
            for name in ("experts_per_token", "n_shared_experts", "d_expert", "d_shared_expert",
                         "n_dense_layers",
                         "shared_expert_gate", "expert_bias", "router_bias", "n_zero_experts"):
                if getattr(self, name):
                    raise ConfigError(name, "is set, but n_experts is 0 (a dense model)")
            return
        if not 0 < self.experts_per_token <= self.n_experts:
            raise ConfigError("experts_per_token", f"must be between 1 and n_experts = {self.n_experts}, "
                              f"got {self.experts_per_token}")
        check_positive("d_expert", self.d_expert)
        if self.n_zero_experts and not self.router_bias:
            raise ConfigError("n_zero_experts", "is set without router_bias: the zero experts' rows are "
                              "modelled beside a score correction for every expert")
        if self.shared_expert_gate and not self.n_shared_experts:
            raise ConfigError("shared_expert_gate", "is set, but there is no shared expert")
        if self.n_dense_layers >= self.n_mlp_layers:
            raise ConfigError("n_dense_layers", f"{self.n_dense_layers} leaves no MoE layer of the "
                              f"{self.n_mlp_layers} with an MLP")

    def _check_compressed(self) -> None:
        """DeepSeek V4: its windowed layers and its CSA and HCA layers are all its layers; one key/value head
        (the key is the value); a query LoRA (the indexer reads it); experts on every layer."""
        c = self.compressed
        if c is None:
            return
        if self.n_window_layers + c.csa_layers + c.hca_layers != self.n_layers:
            raise ConfigError("compressed", f"{self.n_window_layers} windowed, {c.csa_layers} CSA and "
                              f"{c.hca_layers} HCA layers are not the {self.n_layers} layers")
        if self.sliding_window is None:
            raise ConfigError("sliding_window", "missing: every layer of compressed attention has a window")
        if self.n_kv_heads != 1:
            raise ConfigError("n_kv_heads", "compressed attention has one key/value head, got "
                              f"{self.n_kv_heads}")
        if not self.q_lora_rank or self.is_mla:
            raise ConfigError("q_lora_rank", "compressed attention projects its queries through a LoRA "
                              "(and is not MLA)")
        if (self.n_heads * self.d_head) % c.out_groups or self.n_heads % c.out_groups:
            raise ConfigError("compressed.out_groups", f"{c.out_groups} groups do not split the "
                              f"{self.n_heads} heads")
        if c.csa_layers:
            for name in ("index_topk", "index_heads", "index_head_dim"):
                check_positive(name, getattr(self, name))
        if not self.is_moe or self.n_dense_layers or c.hash_layers > self.n_layers:
            raise ConfigError("compressed.hash_layers", f"{c.hash_layers} hash-routed layers of "
                              f"{self.n_layers}, with experts on every layer, are what is modelled")
        if self.n_chunked_layers or self.n_sparse_layers or self.n_linear_layers or self.n_mamba_layers \
                or self.split_attention or self.general_gqa:
            raise ConfigError("compressed", "is modelled beside windowed layers only")

    @property
    def attention_width(self) -> int:
        """h·d_k, the width of the concatenated heads (= d_model for every preset but two)."""
        return self.n_heads * self.d_head

    @property
    def d_v(self) -> int:
        """Value head width: d_head except in multi-head latent attention."""
        return self.d_value or self.d_head

    @property
    def n_attention_layers(self) -> int:
        """Layers with softmax attention (and a KV cache): all but the linear-attention and Mamba ones."""
        return self.n_layers - self.n_linear_layers - self.n_mamba_layers

    @property
    def n_full_layers(self) -> int:
        """Attention layers that see every earlier key: neither windowed, chunked, sparse nor compressed."""
        return (self.n_attention_layers - self.n_window_layers - self.n_chunked_layers - self.n_sparse_layers
                - self.n_csa_layers - self.n_hca_layers)

    @property
    def n_csa_layers(self) -> int:
        """DeepSeek V4's compressed sparse attention layers (L_csa)."""
        return self.compressed.csa_layers if self.compressed is not None else 0

    @property
    def n_hca_layers(self) -> int:
        """DeepSeek V4's heavily compressed attention layers (L_hca)."""
        return self.compressed.hca_layers if self.compressed is not None else 0

    @property
    def general_gqa(self) -> bool:
        """Grouped-query attention whose values are not d_k wide, or whose windowed layers have their own
        number of key/value heads: counted and cached by the formulas with d_v and g_w."""
        return not self.is_mla and (self.d_v != self.d_head or bool(self.n_kv_heads_window))

    @property
    def split_attention(self) -> bool:
        """Full-attention layers of their own head width or K/V heads, values that are their keys, or layers
        sharing another's keys and values (Gemma 4): counted and cached by the formulas with d_kf, g_f and
        L_x."""
        return bool(self.d_head_full or self.n_kv_heads_full or self.full_values_are_keys
                    or self.n_kv_shared_layers)

    @property
    def n_mlp_layers(self) -> int:
        """Layers with an MLP (dense or experts): all but the MLP-free ones."""
        return self.n_layers - self.n_mlp_free_layers

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0
