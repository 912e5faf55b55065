"""``calc.from_config``: a Hugging Face ``config.json`` (as a dict) read into a :class:`Config`.

One reader per ``model_type`` maps the published keys to calc's fields; every error is a
:class:`ConfigError` naming the config.json key that is missing or wrong (never a KeyError). Nothing
is downloaded: the dict is what the caller read from disk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from calc.config import Config, ConfigError

_MISSING = object()
Fields = dict[str, Any]

# calc's field → the config.json key of the llama family, so that Config's own checks name the key.
LLAMA_KEYS = {
    "n_layers": "num_hidden_layers", "d_model": "hidden_size", "n_heads": "num_attention_heads",
    "d_head": "head_dim", "n_kv_heads": "num_key_value_heads", "d_ff": "intermediate_size",
    "vocab_size": "vocab_size", "n_ctx": "max_position_embeddings", "tied_embeddings": "tie_word_embeddings",
    "sliding_window": "sliding_window", "n_window_layers": "layer_types",
}


class Reader:
    """Typed reads of one config.json object; each error names the key."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw

    def integer(self, key: str, default: Any = _MISSING) -> int:
        value = self.raw.get(key, default)
        if value is _MISSING:
            raise ConfigError(key, "missing")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(key, f"must be a positive integer, got {value!r}")
        return value

    def optional_int(self, key: str) -> int | None:
        """A positive integer, or None where the key is absent or null."""
        return None if self.raw.get(key) is None else self.integer(key)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(key, f"must be true or false, got {value!r}")
        return value

    def head_dim(self, d_model: int, n_heads: int) -> int:
        """``head_dim`` where given (Gemma, Qwen3, Mistral-Nemo), else d/h, which must divide."""
        if self.raw.get("head_dim") is not None:
            return self.integer("head_dim")
        if d_model % n_heads:
            message = f"hidden_size {d_model} is not divisible by {n_heads} heads and no head_dim is given"
            raise ConfigError("num_attention_heads", message)
        return d_model // n_heads

    def refuse(self, key: str, unsupported: object, what: str) -> None:
        if self.raw.get(key) == unsupported:
            raise ConfigError(key, f"{unsupported!r} is not supported ({what})")

    def window_layers(self, n_layers: int, default_sliding: Callable[[int], bool]) -> int:
        """Layers with a sliding window: counted from ``layer_types`` where the config lists them, else
        by the model's rule (``default_sliding(i)`` for layer i)."""
        types = self.raw.get("layer_types")
        if types is None:
            return sum(default_sliding(i) for i in range(n_layers))
        kinds = {"sliding_attention", "full_attention"}
        if not isinstance(types, list) or len(types) != n_layers or not set(types) <= kinds:
            raise ConfigError("layer_types", f"must list {n_layers} of {sorted(kinds)}, got {types!r}")
        return types.count("sliding_attention")


def _llama_family(r: Reader, *, tied: bool = False) -> Fields:
    d, n_heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    for key, what in (("attention_bias", "biases on Q, K, V and O"), ("mlp_bias", "biases in the MLP")):
        r.refuse(key, True, what)
    return {
        "arch": "llama", "n_layers": r.integer("num_hidden_layers"), "d_model": d, "n_heads": n_heads,
        "d_head": r.head_dim(d, n_heads), "n_kv_heads": r.integer("num_key_value_heads", n_heads),
        "d_ff": r.integer("intermediate_size"), "vocab_size": r.integer("vocab_size"),
        "n_ctx": r.integer("max_position_embeddings"),
        "tied_embeddings": r.boolean("tie_word_embeddings", tied),
    }


def _every_layer_windowed(r: Reader, fields: Fields) -> Fields:
    """Mistral, Mixtral, Phi-3: ``sliding_window`` (or null) applies to every layer."""
    window = r.optional_int("sliding_window")
    return {**fields, "sliding_window": window, "n_window_layers": fields["n_layers"] if window else 0}


def llama(r: Reader) -> Fields:
    return _llama_family(r)


def mistral(r: Reader) -> Fields:
    return _every_layer_windowed(r, _llama_family(r))


def mixtral(r: Reader) -> Fields:
    fields = _every_layer_windowed(r, _llama_family(r))
    return {**fields, "n_experts": r.integer("num_local_experts"),
            "experts_per_token": r.integer("num_experts_per_tok"), "d_expert": fields["d_ff"]}


def phi3(r: Reader) -> Fields:
    fields = _every_layer_windowed(r, _llama_family(r))
    factor = r.raw.get("partial_rotary_factor")
    partial = f"rotary on a fraction {factor} of each head (no parameters)"
    notes = [] if factor in (None, 1, 1.0) else [partial]
    return {**fields, "notes": ("Q, K, V fused in one matrix and gate, up in another: the same count as "
                                "separate ones.", *notes)}


def _qwen(r: Reader, fields: Fields) -> Fields:
    """Qwen2/3: with ``use_sliding_window``, layers from ``max_window_layers`` on have the window."""
    n_layers = fields["n_layers"]
    if not r.boolean("use_sliding_window", False):
        return fields
    first = r.raw.get("max_window_layers", n_layers)
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise ConfigError("max_window_layers", f"must be a non-negative integer, got {first!r}")
    n_window = r.window_layers(n_layers, lambda i: i >= first)
    window = r.integer("sliding_window") if n_window else None
    return {**fields, "sliding_window": window, "n_window_layers": n_window}


def qwen2(r: Reader) -> Fields:
    # Qwen2Attention: q, k, v projections with bias, o without; attention_bias is not a key of Qwen2.
    raw = {k: v for k, v in r.raw.items() if k != "attention_bias"}
    return {**_qwen(r, _llama_family(Reader(raw))), "qkv_bias": True}


def qwen3(r: Reader) -> Fields:
    return {**_qwen(r, _llama_family(r)), "qk_norm": True}


def _gemma(r: Reader, fields: Fields, default_sliding: Callable[[int], bool], window: int) -> Fields:
    n_window = r.window_layers(fields["n_layers"], default_sliding)
    held = r.integer("sliding_window", window) if n_window else None
    return {**fields, "norms_per_layer": 4, "sliding_window": held, "n_window_layers": n_window}


def gemma2(r: Reader) -> Fields:
    # Gemma2Config: layer i is sliding when (i + 1) % 2, so the first of each pair is local.
    return _gemma(r, _llama_family(r, tied=True), lambda i: bool((i + 1) % 2), 4096)


def gemma3_text(r: Reader) -> Fields:
    pattern = r.integer("sliding_window_pattern", 6)  # five local layers, then a global one
    fields = _gemma(r, _llama_family(r, tied=True), lambda i: bool((i + 1) % pattern), 4096)
    return {**fields, "qk_norm": True}


def gpt2(r: Reader) -> Fields:
    d, n_heads = r.integer("n_embd"), r.integer("n_head")
    if d % n_heads:
        raise ConfigError("n_head", f"n_embd {d} is not divisible by {n_heads} heads")
    return {
        "arch": "gpt", "n_layers": r.integer("n_layer"), "d_model": d, "n_heads": n_heads,
        "d_head": d // n_heads, "n_kv_heads": n_heads, "d_ff": r.optional_int("n_inner") or 4 * d,
        "vocab_size": r.integer("vocab_size"), "n_ctx": r.integer("n_positions"),
        "tied_embeddings": r.boolean("tie_word_embeddings", True),
    }


def gpt_neox(r: Reader) -> Fields:
    d, n_heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    r.refuse("attention_bias", False, "the GPT-NeoX layout has biases on every projection")
    if d % n_heads:
        raise ConfigError("num_attention_heads", f"hidden_size {d} is not divisible by {n_heads} heads")
    rotary = r.raw.get("rotary_pct", r.raw.get("partial_rotary_factor", 0.25))
    parallel = r.boolean("use_parallel_residual", True)
    block = "parallel attention and MLP (x + attn(ln1 x) + mlp(ln2 x))" if parallel else "sequential blocks"
    notes = (f"rotary on a fraction {rotary} of each head's dimensions (rotary has no parameters)",
             f"{block}; the count is the same either way")
    return {
        "arch": "neox", "n_layers": r.integer("num_hidden_layers"), "d_model": d, "n_heads": n_heads,
        "d_head": d // n_heads, "n_kv_heads": n_heads, "d_ff": r.integer("intermediate_size"),
        "vocab_size": r.integer("vocab_size"), "n_ctx": r.integer("max_position_embeddings"),
        "tied_embeddings": r.boolean("tie_word_embeddings", False), "notes": notes,
    }


def deepseek_v3(r: Reader) -> Fields:
    r.refuse("attention_bias", True, "biases in MLA's projections")
    if r.raw.get("moe_layer_freq", 1) != 1:
        raise ConfigError("moe_layer_freq", f"only 1 (every layer after the dense ones) is supported, "
                          f"got {r.raw.get('moe_layer_freq')!r}")
    n_heads = r.integer("num_attention_heads")
    d_rope = r.integer("qk_rope_head_dim")
    return {
        "arch": "llama", "n_layers": r.integer("num_hidden_layers"), "d_model": r.integer("hidden_size"),
        "n_heads": n_heads, "d_head": r.integer("qk_nope_head_dim") + d_rope,
        "n_kv_heads": r.integer("num_key_value_heads", n_heads), "d_ff": r.integer("intermediate_size"),
        "vocab_size": r.integer("vocab_size"), "n_ctx": r.integer("max_position_embeddings"),
        "tied_embeddings": r.boolean("tie_word_embeddings", False),
        "kv_lora_rank": r.integer("kv_lora_rank"), "q_lora_rank": r.optional_int("q_lora_rank") or 0,
        "d_rope": d_rope, "d_value": r.integer("v_head_dim"),
        "n_experts": r.integer("n_routed_experts"), "experts_per_token": r.integer("num_experts_per_tok"),
        "n_shared_experts": _count(r, "n_shared_experts"),
        "d_expert": r.integer("moe_intermediate_size"), "n_dense_layers": _count(r, "first_k_dense_replace"),
        "router_bias": True, "n_mtp_layers": _count(r, "num_nextn_predict_layers"),
    }


def _count(r: Reader, key: str) -> int:
    value = r.raw.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(key, f"must be a non-negative integer, got {value!r}")
    return value


READERS: dict[str, Callable[[Reader], Fields]] = {
    "gpt2": gpt2, "llama": llama, "mistral": mistral, "mixtral": mixtral, "qwen2": qwen2, "qwen3": qwen3,
    "gemma2": gemma2, "gemma3_text": gemma3_text, "phi3": phi3, "gpt_neox": gpt_neox,
    "deepseek_v3": deepseek_v3,
}
SUPPORTED = (*READERS, "gemma3")  # gemma3: the text_config of a Gemma 3 multimodal config
KEYS = {"gpt2": {"n_layers": "n_layer", "d_model": "n_embd", "n_heads": "n_head", "n_ctx": "n_positions",
                 "d_ff": "n_inner", "tied_embeddings": "tie_word_embeddings"},
        "deepseek_v3": {**LLAMA_KEYS, "d_head": "qk_nope_head_dim", "d_rope": "qk_rope_head_dim",
                        "d_value": "v_head_dim", "n_experts": "n_routed_experts",
                        "experts_per_token": "num_experts_per_tok", "d_expert": "moe_intermediate_size",
                        "n_dense_layers": "first_k_dense_replace"},
        "mixtral": {**LLAMA_KEYS, "n_experts": "num_local_experts",
                    "experts_per_token": "num_experts_per_tok", "d_expert": "intermediate_size"}}


def from_config(raw: Mapping[str, Any], *, name: str | None = None, source: str | None = None) -> Config:
    """The :class:`Config` of a Hugging Face ``config.json`` given as a dict (no network).

    Raises :class:`ConfigError` (a ValueError) naming the config.json key that is missing or invalid,
    or ``model_type`` when it is not one of :data:`SUPPORTED`.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError("config", f"must be a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type")
    if model_type == "gemma3":
        text = raw.get("text_config")
        if not isinstance(text, Mapping):
            raise ConfigError("text_config", "missing (a gemma3 config holds the language model there)")
        raw, model_type = {"model_type": "gemma3_text", **text}, "gemma3_text"
    if not isinstance(model_type, str) or model_type not in READERS:
        got = "missing" if model_type is None else f"{model_type!r} is not supported"
        raise ConfigError("model_type", f"{got}; supported: {', '.join(SUPPORTED)}")
    fields = READERS[model_type](Reader(raw))
    fields["notes"] = tuple(fields.get("notes", ()))
    try:
        source = source or f"a Hugging Face config.json (model_type {model_type})"
        return Config(**fields, model_type=model_type, name=name or model_type, source=source,
                      hf_config=dict(raw))
    except ConfigError as err:
        key = KEYS.get(model_type, LLAMA_KEYS).get(err.field, err.field)
        raise ConfigError(key, err.message) from None


def load(path: str) -> Config:
    """:func:`from_config` of the config.json at ``path`` (read from disk; nothing is downloaded).

    The model is named after the file (``mixtral-8x7b.json``) or, for a file called config.json, its
    folder (``Mixtral-8x7B-v0.1/config.json``). Errors are :class:`ConfigError` naming the key, or
    ``config`` when the file cannot be read or is not JSON.
    """
    import json
    from pathlib import Path

    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError("config", f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError("config", f"not JSON ({err.msg}, line {err.lineno})") from None
    name = file.parent.name if file.stem == "config" and file.parent.name else file.stem
    return from_config(raw, name=name, source=f"{path} (Hugging Face config.json)")
