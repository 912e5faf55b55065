"""A model configuration: the dataclass every ledger and table is evaluated for, and its checks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Arch = Literal["gpt", "llama", "neox"]
ARCHS: tuple[Arch, ...] = ("gpt", "llama", "neox")


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
    qkv_bias: bool = False  # biases on Q, K, V only (Qwen2); the gpt and neox layouts have all biases
    qk_norm: bool = False  # an RMSNorm of d_k on each query and key head (Qwen3, Gemma 3)
    norms_per_layer: int = 2  # RMSNorms per layer (Gemma 2/3: 4, before and after attention and MLP)
    sliding_window: int | None = None  # w: keys a query of a windowed layer sees at most
    n_window_layers: int = 0  # L_w: layers with the sliding window (all for Mistral-7B, half for Gemma 2)
    n_experts: int = 0  # E routed experts per MoE layer; 0 = a dense model
    experts_per_token: int = 0  # k_E
    n_shared_experts: int = 0  # S
    d_expert: int = 0  # d_e, each expert's MLP width
    n_dense_layers: int = 0  # L_d: first layers with a dense MLP in an MoE model (DeepSeek-V3: 3)
    router_bias: bool = False  # DeepSeek-V3's per-expert score-correction bias
    kv_lora_rank: int = 0  # r_kv; > 0 means multi-head latent attention (d_head is then d_nope + d_rope)
    q_lora_rank: int = 0  # r_q; 0 = an uncompressed query projection
    d_rope: int = 0  # d_r, the rotary part of an MLA head
    d_value: int = 0  # d_v when it differs from d_head (MLA); 0 = d_head
    n_mtp_layers: int = 0  # multi-token-prediction modules stored beside the model (DeepSeek-V3: 1), apart
    name: str = "custom"
    source: str = "a custom configuration"
    published: int | None = None  # exact parameter count of the released checkpoint
    paper_size: float | None = None  # the rounded size the paper prints, where nothing was released
    notes: tuple[str, ...] = field(default=())
    hf_config: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)  # for calc.verify

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ConfigError("arch", f"must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        for name in ("n_layers", "d_model", "n_heads", "d_head", "n_kv_heads", "d_ff", "vocab_size", "n_ctx",
                     "norms_per_layer"):
            check_positive(name, getattr(self, name))
        for name in ("n_window_layers", "n_experts", "experts_per_token", "n_shared_experts", "d_expert",
                     "n_dense_layers", "kv_lora_rank", "q_lora_rank", "d_rope", "d_value", "n_mtp_layers"):
            check_count(name, getattr(self, name))
        for name in ("tied_embeddings", "qkv_bias", "qk_norm", "router_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be True or False, got {getattr(self, name)!r}")
        self._check_window()
        self._check_experts()
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

    def _check_experts(self) -> None:
        if not self.n_experts:
            for name in ("experts_per_token", "n_shared_experts", "d_expert", "n_dense_layers"):
                if getattr(self, name):
                    raise ConfigError(name, "is set, but n_experts is 0 (a dense model)")
            return
        if not 0 < self.experts_per_token <= self.n_experts:
            raise ConfigError("experts_per_token", f"must be between 1 and n_experts = {self.n_experts}, "
                              f"got {self.experts_per_token}")
        check_positive("d_expert", self.d_expert)
        if self.n_dense_layers >= self.n_layers:
            raise ConfigError("n_dense_layers",
                              f"{self.n_dense_layers} leaves no MoE layer of {self.n_layers}")

    @property
    def attention_width(self) -> int:
        """h·d_k, the width of the concatenated heads (= d_model for every preset but two)."""
        return self.n_heads * self.d_head

    @property
    def d_v(self) -> int:
        """Value head width: d_head except in multi-head latent attention."""
        return self.d_value or self.d_head

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0
