"""Model configurations: a dataclass, the named presets and their sources.

Every preset carries where its numbers come from. ``published`` is the parameter count of the
released checkpoint (``sum(p.numel())`` over the Hugging Face ``transformers`` model built from the
config on the meta device, tied weights counted once, as ``python -m calc.verify`` recomputes it);
GPT-3 was never released, so its rows have the paper's rounded size instead.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Literal

Arch = Literal["gpt", "llama"]
ARCHS: tuple[Arch, ...] = ("gpt", "llama")


class ConfigError(ValueError):
    """A configuration value is missing, not a positive integer, or inconsistent with another."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, f"must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Config:
    """One decoder-only transformer; field names are the JSON keys of ``config``."""

    arch: Arch  # "gpt": learned positions, biases, LayerNorm, dense MLP; "llama": RoPE, RMSNorm, SwiGLU
    n_layers: int  # L
    d_model: int  # d
    n_heads: int  # h, query heads
    d_head: int  # d_k; h·d_k = d except in GPT-3's XL and 13B rows
    n_kv_heads: int  # g; g = h is multi-head attention, g < h grouped-query, g = 1 multi-query
    d_ff: int  # MLP hidden width
    vocab_size: int  # V
    n_ctx: int  # context length the model was trained for
    tied_embeddings: bool  # unembedding = embedding transposed (GPT-2) or a matrix of its own (Llama)
    name: str = "custom"
    source: str = "a custom configuration"
    published: int | None = None  # exact parameter count of the released checkpoint
    paper_size: float | None = None  # the rounded size the paper prints, where nothing was released
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ConfigError("arch", f"must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        for name in ("n_layers", "d_model", "n_heads", "d_head", "n_kv_heads", "d_ff", "vocab_size", "n_ctx"):
            _check_positive(name, getattr(self, name))
        if not isinstance(self.tied_embeddings, bool):
            raise ConfigError("tied_embeddings", f"must be True or False, got {self.tied_embeddings!r}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                "n_kv_heads",
                f"{self.n_heads} query heads cannot share {self.n_kv_heads} key/value heads "
                "(n_heads must be a multiple of n_kv_heads)",
            )

    @property
    def attention_width(self) -> int:
        """h·d_k, the width of the concatenated heads (= d_model for every preset but two)."""
        return self.n_heads * self.d_head


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
    """A configuration with the defaults of its architecture: d_k = d/h, g = h, d_ff = 4d (gpt) or
    Llama's 8d/3 rounded up to 256 (llama), V = 50,257 / 32,000, n_ctx = 1,024 / 4,096, tied / untied."""
    for name, value in (("d_model", d_model), ("n_heads", n_heads)):
        _check_positive(name, value)
    if d_head is None and d_model % n_heads:
        raise ConfigError("n_heads", f"d_model {d_model} is not divisible by {n_heads} heads; give d_head")
    gpt = arch == "gpt"
    return Config(
        arch=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        d_head=d_model // n_heads if d_head is None else d_head,
        n_kv_heads=n_heads if n_kv_heads is None else n_kv_heads,
        d_ff=d_ff if d_ff is not None else (4 * d_model if gpt else llama_d_ff(d_model)),
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
        name=name, source=GPT2_SOURCE.format(repo=repo), published=published,
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
    vocab_size: int, n_ctx: int, published: int, notes: tuple[str, ...] = (),
) -> Config:
    return Config(
        arch="llama", n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_model // n_heads,
        n_kv_heads=n_kv_heads, d_ff=d_ff, vocab_size=vocab_size, n_ctx=n_ctx, tied_embeddings=False,
        name=name, source=source, published=published, notes=notes,
    )


LLAMA2 = "Touvron et al. 2023 (Llama 2), Table 1; Hugging Face meta-llama/{repo} config.json"
LLAMA3 = "Llama Team 2024 (Llama 3 Herd), Table 3; Hugging Face meta-llama/{repo} config.json"
MISTRAL = "Jiang et al. 2023 (Mistral 7B), Table 1; Hugging Face mistralai/Mistral-7B-v0.1 config.json"

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
               ("Mistral 7B attends within a sliding window of 4,096 tokens; the pattern tables show "
                "full n×n attention.",)),
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
