"""The named presets and their sources (the dataclass is `calc.config.Config`).

Every preset carries where its numbers come from. ``published`` is the parameter count of the
released checkpoint (``sum(p.numel())`` over the Hugging Face ``transformers`` model built from the
config on the meta device, tied weights counted once, as ``python -m calc.verify`` recomputes it);
GPT-3 was never released, so its rows have the paper's rounded size instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from typing import Any

from calc.config import ARCHS, Arch, Config, ConfigError, check_positive
from calc.hf import from_config

__all__ = ["ARCHS", "PRESETS", "Arch", "Config", "ConfigError", "UnknownModel", "custom", "preset"]

def llama_d_ff(d_model: int, multiple_of: int = 256) -> int:
    """Llama's MLP width: 2/3 of 4d (SwiGLU keeps the parameter count of a 4d dense MLP), rounded
    up to a multiple of 256 (Meta's llama/model.py). 4096 → 11008."""
    return multiple_of * math.ceil(2 * 4 * d_model / 3 / multiple_of)


def custom(
    *,
    d_model: int,
    n_heads: int,
    n_layers: int,
    d_head: int | None = None,
    n_kv_heads: int | None = None,
    d_ff: int | None = None,
    vocab_size: int | None = None,
    n_ctx: int | None = None,
    arch: Arch = "gpt",
    tied_embeddings: bool | None = None,
) -> Config:
    """A configuration with the defaults of its architecture: d_k = d/h, g = h, d_ff = 4d (gpt, neox) or
    Llama's 8d/3 rounded up to 256 (llama), V = 50,257 / 32,000, n_ctx = 1,024 / 4,096, tied / untied."""
    for name, value in (("d_model", d_model), ("n_heads", n_heads)):
        check_positive(name, value)
    if d_head is None and d_model % n_heads:
        raise ConfigError("n_heads", f"d_model {d_model} is not divisible by {n_heads} heads; give d_head")
    gpt = arch == "gpt"
    dense = arch in ("gpt", "neox")  # GPT-2 and GPT-NeoX: a 4d dense MLP
    return Config(
        arch=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        d_head=d_model // n_heads if d_head is None else d_head,
        n_kv_heads=n_heads if n_kv_heads is None else n_kv_heads,
        d_ff=d_ff if d_ff is not None else (4 * d_model if dense else llama_d_ff(d_model)),
        vocab_size=vocab_size if vocab_size is not None else (50257 if gpt else 32000),
        n_ctx=n_ctx if n_ctx is not None else (1024 if gpt else 4096),
        tied_embeddings=gpt if tied_embeddings is None else tied_embeddings,
    )


GPT2_SOURCE = "Radford et al. 2019 (GPT-2), Table 2; Hugging Face openai-community/{repo} config.json"
GPT3_SOURCE = "Brown et al. 2020 (GPT-3), Table 2.1 and §2.1"
GPT3_NOTES = (
    "GPT-3 uses GPT-2's architecture and BPE vocabulary (V = 50,257) with n_ctx = 2,048 and d_ff = 4·d "
    "(§2.1); no checkpoint was released, so the checkpoint count follows GPT-2's layout.",
    "GPT-3 alternates dense and locally banded sparse attention layers (§2.1); every table here "
    "treats all layers as dense, as the parameter count does not change.",
)
GPT3_MISMATCH = (
    "Table 2.1 prints d_head·n_heads = {width} ≠ d_model = {d}; kept as printed, so Q, K, V are {width} wide."
)


def _gpt2(name: str, repo: str, n_layers: int, d_model: int, n_heads: int, published: int) -> Config:
    return Config(
        arch="gpt", n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_model // n_heads,
        n_kv_heads=n_heads, d_ff=4 * d_model, vocab_size=50257, n_ctx=1024, tied_embeddings=True,
        model_type="gpt2", name=name, source=GPT2_SOURCE.format(repo=repo), published=published,
    )


def _gpt3(name: str, n_layers: int, d_model: int, n_heads: int, d_head: int, paper_size: float) -> Config:
    notes: tuple[str, ...] = GPT3_NOTES
    if n_heads * d_head != d_model:
        notes = (GPT3_MISMATCH.format(width=n_heads * d_head, d=d_model), *notes)
    return Config(
        arch="gpt", n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_head,
        n_kv_heads=n_heads, d_ff=4 * d_model, vocab_size=50257, n_ctx=2048, tied_embeddings=True,
        name=name, source=GPT3_SOURCE, paper_size=paper_size, notes=notes,
    )


def _llama(
    name: str, source: str, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int,
    vocab_size: int, n_ctx: int, published: int, notes: tuple[str, ...] = (), window: int | None = None,
) -> Config:
    return Config(
        arch="llama", n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_model // n_heads,
        n_kv_heads=n_kv_heads, d_ff=d_ff, vocab_size=vocab_size, n_ctx=n_ctx, tied_embeddings=False,
        model_type="mistral" if window else "llama", sliding_window=window,
        n_window_layers=n_layers if window else 0, name=name, source=source, published=published, notes=notes,
    )


def _hf(
    name: str, source: str, hf_config: Mapping[str, Any], published: int, notes: tuple[str, ...] = ()
) -> Config:
    """A preset read from its published config.json (the keys that matter to the counts, as published)."""
    config = from_config(hf_config, name=name, source=source)
    return dataclasses.replace(config, published=published, notes=(*config.notes, *notes))


LLAMA2 = "Touvron et al. 2023 (Llama 2), Table 1; Hugging Face meta-llama/{repo} config.json"
LLAMA3 = "Llama Team 2024 (Llama 3 Herd), Table 3; Hugging Face meta-llama/{repo} config.json"
MISTRAL = "Jiang et al. 2023 (Mistral 7B), Table 1; Hugging Face mistralai/Mistral-7B-v0.1 config.json"

# Presets of 2024–25, each read from its published config.json by calc.from_config: the keys below are
# copied from the file on the Hugging Face hub named in the source (tests/calc/configs/ holds the full files).
# Published counts: transformers' model built from that config on the meta device, parameters plus
# stored buffers (DeepSeek-V3's score-correction bias), as python -m calc.verify recomputes them.
HF = "Hugging Face {repo} config.json"
NEW_PRESETS = (
    _hf("mixtral-8x7b", "Jiang et al. 2024 (Mixtral of Experts), Table 1; "
        + HF.format(repo="mistralai/Mixtral-8x7B-v0.1"),
        {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
         "max_position_embeddings": 32768, "num_attention_heads": 32, "num_experts_per_tok": 2,
         "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "sliding_window": None,
         "tie_word_embeddings": False, "vocab_size": 32000},
        46_702_792_704),
    _hf("qwen2-7b", "Yang et al. 2024 (Qwen2 Technical Report), Table 1; " + HF.format(repo="Qwen/Qwen2-7B"),
        {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
         "max_position_embeddings": 131072, "max_window_layers": 28, "num_attention_heads": 28,
         "num_hidden_layers": 28, "num_key_value_heads": 4,
         "sliding_window": 131072, "tie_word_embeddings": False, "use_sliding_window": False,
         "vocab_size": 152064},
        7_615_616_512),
    _hf("qwen3-8b", "Qwen Team 2025 (Qwen3 Technical Report), Table 1; " + HF.format(repo="Qwen/Qwen3-8B"),
        {"model_type": "qwen3", "attention_bias": False, "head_dim": 128, "hidden_size": 4096,
         "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
         "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "sliding_window": None,
         "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936},
        8_190_735_360),
    _hf("gemma2-9b", "Gemma Team 2024 (Gemma 2), Table 1; " + HF.format(repo="google/gemma-2-9b"),
        {"model_type": "gemma2", "attention_bias": False, "head_dim": 256, "hidden_size": 3584,
         "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 16,
         "num_hidden_layers": 42, "num_key_value_heads": 8, "query_pre_attn_scalar": 256,
         "sliding_window": 4096, "vocab_size": 256000},
        9_241_705_984,
        ("Layers alternate local (sliding window 4,096) and global attention, the first local; "
         "4 RMSNorms per layer; embeddings tied.",)),
    _hf("gemma3-1b", "Gemma Team 2025 (Gemma 3), Table 1; " + HF.format(repo="google/gemma-3-1b-pt"),
        {"model_type": "gemma3_text", "attention_bias": False, "head_dim": 256, "hidden_size": 1152,
         "intermediate_size": 6912, "max_position_embeddings": 32768, "num_attention_heads": 4,
         "num_hidden_layers": 26, "num_key_value_heads": 1, "sliding_window": 512,
         "sliding_window_pattern": 6, "vocab_size": 262144},
        999_885_952,
        ("Five local layers (sliding window 512) to one global; q/k norms; 4 RMSNorms per layer.",)),
    _hf("llama3.2-1b", "Meta 2024 (Llama 3.2 model card); " + HF.format(repo="meta-llama/Llama-3.2-1B"),
        {"model_type": "llama", "attention_bias": False, "head_dim": 64, "hidden_size": 2048,
         "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
         "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
         "tie_word_embeddings": True, "vocab_size": 128256},
        1_235_814_400),
    _hf("mistral-nemo-12b", "Mistral AI 2024 (Mistral NeMo model card); "
        + HF.format(repo="mistralai/Mistral-Nemo-Base-2407"),
        {"model_type": "mistral", "head_dim": 128, "hidden_size": 5120, "intermediate_size": 14336,
         "max_position_embeddings": 1024000, "num_attention_heads": 32, "num_hidden_layers": 40,
         "num_key_value_heads": 8, "sliding_window": None, "tie_word_embeddings": False,
         "vocab_size": 131072},
        12_247_782_400,
        ("head_dim 128 with d_model 5,120 and 32 heads: h·d_k = 4,096 ≠ d.",)),
    _hf("phi3-mini", "Abdin et al. 2024 (Phi-3 Technical Report); "
        + HF.format(repo="microsoft/Phi-3-mini-4k-instruct"),
        {"model_type": "phi3", "attention_bias": False, "hidden_size": 3072, "intermediate_size": 8192,
         "max_position_embeddings": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
         "num_key_value_heads": 32, "sliding_window": 2047, "tie_word_embeddings": False,
         "vocab_size": 32064},
        3_821_079_552,
        ("The config.json sets sliding_window 2,047 on every layer, which transformers applies; the caches "
         "and patterns here honour it.",)),
    _hf("pythia-1.4b", "Biderman et al. 2023 (Pythia), Table 1; " + HF.format(repo="EleutherAI/pythia-1.4b"),
        {"model_type": "gpt_neox", "hidden_size": 2048, "intermediate_size": 8192,
         "max_position_embeddings": 2048, "num_attention_heads": 16, "num_hidden_layers": 24,
         "rotary_pct": 0.25, "tie_word_embeddings": False,
         "use_parallel_residual": True, "vocab_size": 50304},
        1_414_647_808),
    _hf("deepseek-v3", "DeepSeek-AI 2024 (DeepSeek-V3 Technical Report), §2 and §4.2; "
        + HF.format(repo="deepseek-ai/DeepSeek-V3"),
        {"model_type": "deepseek_v3", "attention_bias": False, "first_k_dense_replace": 3,
         "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
         "max_position_embeddings": 163840,
         "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
         "n_shared_experts": 1, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
         "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
         "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "tie_word_embeddings": False, "topk_group": 4,
         "v_head_dim": 128, "vocab_size": 129280},
        671_026_419_200,
        ("The 671 B main model; the multi-token-prediction module stored beside it in the checkpoint "
         "(its layer 61) is counted apart (see the checkpoint table), as the paper does (685 B in all).",
         "MLA caches one latent of 512 and one rotary key of 64 per layer and token (the paper's inference); "
         "transformers' reference code caches the decompressed K and V instead.")),
)

PRESETS: dict[str, Config] = {
    c.name: c
    for c in (
        # Published counts: sum(p.numel()) of transformers' GPT2LMHeadModel / LlamaForCausalLM /
        # MistralForCausalLM built from the config on the meta device (python -m calc.verify;
        # last run with transformers 5.24.0 and torch 2.13.0: all equal to calc's counts).
        _gpt2("gpt2", "gpt2", 12, 768, 12, 124_439_808),
        _gpt2("gpt2-medium", "gpt2-medium", 24, 1024, 16, 354_823_168),
        _gpt2("gpt2-large", "gpt2-large", 36, 1280, 20, 774_030_080),
        _gpt2("gpt2-xl", "gpt2-xl", 48, 1600, 25, 1_557_611_200),
        _gpt3("gpt3-small", 12, 768, 12, 64, 125e6),
        _gpt3("gpt3-medium", 24, 1024, 16, 64, 350e6),
        _gpt3("gpt3-large", 24, 1536, 16, 96, 760e6),
        _gpt3("gpt3-xl", 24, 2048, 24, 128, 1.3e9),
        _gpt3("gpt3-2.7b", 32, 2560, 32, 80, 2.7e9),
        _gpt3("gpt3-6.7b", 32, 4096, 32, 128, 6.7e9),
        _gpt3("gpt3-13b", 40, 5140, 40, 128, 13.0e9),
        _gpt3("gpt3", 96, 12288, 96, 128, 175.0e9),
        _llama("llama2-7b", LLAMA2.format(repo="Llama-2-7b-hf"), 32, 4096, 32, 32, 11008, 32000, 4096,
               6_738_415_616),
        _llama("llama2-13b", LLAMA2.format(repo="Llama-2-13b-hf"), 40, 5120, 40, 40, 13824, 32000, 4096,
               13_015_864_320),
        _llama("llama2-70b", LLAMA2.format(repo="Llama-2-70b-hf"), 80, 8192, 64, 8, 28672, 32000, 4096,
               68_976_648_192),
        _llama("llama3-8b", LLAMA3.format(repo="Meta-Llama-3-8B"), 32, 4096, 32, 8, 14336, 128256, 8192,
               8_030_261_248),
        _llama("llama3-70b", LLAMA3.format(repo="Meta-Llama-3-70B"), 80, 8192, 64, 8, 28672, 128256, 8192,
               70_553_706_496),
        _llama("mistral-7b", MISTRAL, 32, 4096, 32, 8, 14336, 32000, 8192, 7_241_732_096,
               ("Every layer attends within a sliding window of 4,096 tokens: a rolling KV cache holds at "
                "most 4,096 tokens, and a query sees at most 4,096 keys. n_ctx = 8,192 is the paper's "
                "context length; the config.json says max_position_embeddings 32,768.",), window=4096),
        *NEW_PRESETS,
    )
}
ALIASES = {"gpt3-175b": "gpt3"}


class UnknownModel(LookupError):
    """A model name that is neither a preset nor an alias; ``suggestion`` is the nearest name."""

    def __init__(self, name: str) -> None:
        close = difflib.get_close_matches(name.lower(), [*PRESETS, *ALIASES], n=1, cutoff=0.5)
        self.suggestion = close[0] if close else None
        hint = f"; did you mean {self.suggestion!r}?" if self.suggestion else "; see python -m calc --list"
        super().__init__(f"unknown model {name!r}{hint}")


def preset(name: str) -> Config:
    """The preset called ``name`` (case-insensitive; ``gpt3-175b`` is ``gpt3``)."""
    key = name.lower()
    key = ALIASES.get(key, key)
    if key not in PRESETS:
        raise UnknownModel(name)
    return PRESETS[key]
