"""``calc.from_config``: a Hugging Face ``config.json`` (as a dict) read into a [Config][calc.Config].

Each supported ``model_type`` is one record of ``TYPES``: the reader of the keys every decoder has (its
body), the features its architecture fixes, the defaults transformers' config class gives the keys a file
may leave out, and the readers of its optional parts (windows, experts, latent attention, hybrid layers).
Every error is a ``ConfigError`` naming the config.json key that is missing or wrong (never a KeyError); a
key whose value calc does not model (a RoPE scaling it does not know, a kind of layer it cannot count) is
refused rather than guessed, and so is a key the type neither reads nor knows to carry no parameters
(``IGNORED``, ``ModelType.ignored``). A key that no transformers model reads at all (export tooling, another
runtime's setting, a default value: ``INERT``, one record per key with its reason) is accepted with one
warning naming it (``InertKeyWarning``, and the report's ``warnings``). An unsupported ``model_type`` is
answered with the supported type whose reader places most of the file's keys, and the keys it could not
place. Each layer's kind (`layer_types`) follows the rule of the type's transformers config or model.
Nothing is downloaded: the dict is what the caller read from disk.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from calc.config import CompressedAttention, Config, ConfigError, GatedDeltaNet, Mamba, Mamba2
from calc.vision import vision_tower

_MISSING = object()
Fields = dict[str, Any]

# calc's field → the config.json key of the llama family, so that Config's own checks name the key.
LLAMA_KEYS = {
    "n_layers": "num_hidden_layers", "d_model": "hidden_size", "n_heads": "num_attention_heads",
    "d_head": "head_dim", "n_kv_heads": "num_key_value_heads", "d_ff": "intermediate_size",
    "vocab_size": "vocab_size", "n_ctx": "max_position_embeddings", "tied_embeddings": "tie_word_embeddings",
    "sliding_window": "sliding_window", "n_window_layers": "layer_types", "n_chunked_layers": "layer_types",
    "n_linear_layers": "layer_types", "attention_chunk": "attention_chunk_size",
}
# Keys that carry no parameters and change no figure calc gives, in any model type: token ids, epsilons,
# dropout, initialisation, activations, RoPE's base and scaling (checked by check_rope), numerics, and the
# attributes every transformers config has (PreTrainedConfig's, and generation settings that older versions
# saved). A known type reads or refuses every other key; an unsupported type's closest match never counts
# these as unplaced.
IGNORED = frozenset({
    # what every config.json carries
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
    "auto_map", "tokenizer_class", "prefix", "task_specific_params", "quantization_config", "use_cache",
    "output_attentions", "output_hidden_states", "return_dict", "torchscript", "use_bfloat16",
    "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "add_cross_attention", "id2label",
    "label2id", "_num_labels", "problem_type", "finetuning_task", "tf_legacy_loss", "gradient_checkpointing",
    "attn_implementation", "_attn_implementation",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "cache_implementation",
    # generation settings saved by transformers 4.x
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens",
    # initialisation, epsilons, dropout, activations
    "initializer_range", "init_std", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon",
    "attention_dropout", "hidden_dropout", "embd_pdrop", "resid_pdrop", "attn_pdrop", "dropout",
    "activation_dropout", "embedding_dropout", "residual_dropout", "attention_probs_dropout_prob",
    "hidden_dropout_prob", "classifier_dropout", "layerdrop", "hidden_act",
    "hidden_activation", "activation_function", "activation",
    # RoPE: its base and scaling (check_rope refuses a scaling it does not know; none adds parameters)
    "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "rotary_pct",
    "rotary_emb_base", "original_max_position_embeddings", "rope_local_base_freq",
    # numerics and scalars of the forward pass: logit caps and scales, softmax precision
    "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "logit_scale",
    "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32", "scale_attn_weights",
    # training-time settings: the router's loss and noise, tensor-parallel slicing, logits kept
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "pretraining_tp",
    "num_logits_to_keep",
    # how a router picks and weighs its experts: no parameters
    "norm_topk_prob", "routed_scaling_factor", "scoring_func", "topk_method", "n_group", "topk_group",
    "aux_loss_alpha", "seq_aux", "ep_size", "swiglu_limit", "swiglu_alpha",
})
class InertKeyWarning(UserWarning):
    """A config.json carries keys of ``INERT``: accepted, and named, since calc ignores them."""


@dataclass(frozen=True)
class Inert:
    """A config.json key that no transformers config class or model reads (checked against
    transformers' source by tests/calc/test_calc_models.py where transformers is installed), that
    adds no weight and changes no figure calc gives: what writes it and why it changes nothing.
    ``values``: the values it is inert at (a
    default: the architecture transformers implements); None: any value."""

    kind: str  # one of INERT_KINDS
    reason: str
    values: tuple[Any, ...] | None = None

    def accepts(self, value: Any) -> bool:
        # bools are ints in Python: False must not stand for 0, nor 0 for False
        return self.values is None or any(type(value) is type(v) and value == v for v in self.values)


INERT_KINDS = ("runtime", "export tooling", "a default value")
# Keys seen in published config.json files that calc once refused for not knowing them. Every one is absent
# from transformers (no config class defines it, no model reads it), so a checkpoint loads into the same
# model whatever it says; the reason says where the key comes from.
INERT: dict[str, Inert] = {
    "output_past": Inert("runtime", "transformers 2.x's switch for returning the key/value cache, renamed "
                         "use_cache in 3.0; only ever read at run time"),
    "runner_max_sequence_length": Inert("runtime", "a sequence-length limit for BigCode's inference runner, "
                                        "saved in the GPTBigCode files (SantaCoder); transformers never "
                                        "reads it"),
    "transformers.js_config": Inert("export tooling", "Transformers.js's settings for the ONNX files beside "
                                    "the checkpoint (their dtype, KV-cache dtype, external data)"),
    "is_llama_config": Inert("export tooling", "nanotron's marker on the Llama configs it exports "
                             "(SmolLM, SmolLM2)"),
    "rope_interleaved": Inert("a default value", "nanotron's pairing of rotary dimensions; false is the "
                              "rotate-half pairing transformers' Llama implements (rotary has no parameters)",
                              (False,)),
    "use_mrope": Inert("a default value", "Qwen2-VL's multimodal rotary sections; false is the plain RoPE of "
                       "the text model transformers' Qwen2 builds", (False,)),
    "n_special": Inert("a default value", "OpenAI GPT's count of extra special-token rows in its embedding; "
                       "GPT-2's files carry 0, the table transformers' GPT-2 builds", (0,)),
    "predict_special_tokens": Inert("export tooling", "an option of OpenAI GPT's original head that GPT-2's "
                                    "files carry over"),
}


def inert_warning(name: str, keys: Sequence[str]) -> str:
    """The one warning for the ``INERT`` keys the config of model ``name`` carried (calc.report puts it in
    ``warnings``)."""
    named = ", ".join(f"{key} ({INERT[key].kind})" for key in keys)
    one = len(keys) == 1
    return (f"{name}: ignored {named}: no transformers model reads {'it' if one else 'them'}, and "
            f"{'it changes' if one else 'they change'} no weight and no cost (calc.hf.INERT says why)")


# RoPE scalings transformers implements (modeling_rope_utils); none adds parameters. "su" is Phi-3's old
# name for longrope.
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional", "su")
SLIDING_OR_FULL = ("sliding_attention", "full_attention")


class Reader:
    """Typed reads of one config.json object, with its type's defaults; each error names the key, and
    every key read is remembered (the keys a known type left unread are refused; an unsupported config is
    answered with the type that would place most of its keys).

    A ``lenient`` reader never stops at a missing or invalid value: it notes the error in ``problems`` and
    reads on with a stand-in (1, 0, the default), so that it learns every key a type would read."""

    def __init__(self, raw: Mapping[str, Any], defaults: Mapping[str, Any] | None = None, *,
                 lenient: bool = False) -> None:
        self.raw = raw
        self.defaults = defaults or {}
        self.used: set[str] = set()
        self.lenient = lenient
        self.problems: list[ConfigError] = []
        self.kinds: list[str] | None = None  # each layer's kind, where a rule or layer_types gave them

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        if key in self.raw:
            return self.raw[key]
        return self.defaults.get(key, default)

    def known(self, *keys: str) -> None:
        """Keys this reader understands that change nothing in this config (a window left off)."""
        self.used.update(keys)

    def invalid(self, key: str, message: str, stand_in: Any) -> Any:
        """Raise ConfigError(key, message); a lenient reader notes it and goes on with ``stand_in``."""
        if not self.lenient:
            raise ConfigError(key, message)
        self.problems.append(ConfigError(key, message))
        return stand_in

    def integer(self, key: str, default: Any = _MISSING) -> int:
        value = self.get(key, default)
        if value is _MISSING:
            return int(self.invalid(key, "missing", 1))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return int(self.invalid(key, f"must be a positive integer, got {value!r}", 1))
        return value

    def optional_int(self, key: str) -> int | None:
        """A positive integer, or None where the key is absent or null."""
        return None if self.get(key) is None else self.integer(key)

    def count(self, key: str) -> int:
        """A non-negative integer, 0 where absent."""
        value = self.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return int(self.invalid(key, f"must be a non-negative integer, got {value!r}", 0))
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            return bool(self.invalid(key, f"must be true or false, got {value!r}", default))
        return value

    def int_list(self, key: str, n_layers: int) -> list[int] | None:
        """A list of layer indices or 0/1 flags, or None where absent or empty."""
        value = self.get(key)
        if value is None or value == []:
            return None
        whole = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        if not whole:
            self.invalid(key, f"must be a list of integers, got {value!r}", None)
            return None
        return value

    def whole_heads(self, d: int, n_heads: int, width_key: str = "hidden_size",
                    heads_key: str = "num_attention_heads", why: str = "") -> int:
        """d/h, where h divides d (every layout's head width without a head_dim key); the error names
        the heads' key."""
        if d % n_heads:
            message = f"{width_key} {d} is not divisible by {n_heads} heads{why}"
            return int(self.invalid(heads_key, message, 1))
        return d // n_heads

    def head_dim(self, d_model: int, n_heads: int) -> int:
        """``head_dim`` where given (Gemma, Qwen3, Mistral-Nemo), else d/h, which must divide."""
        if self.get("head_dim") is not None:
            return self.integer("head_dim")
        return self.whole_heads(d_model, n_heads, why=" and no head_dim is given")

    def refuse(self, key: str, unsupported: object, what: str) -> None:
        if key in self.raw and self.get(key) == unsupported:
            self.invalid(key, f"{unsupported!r} is not supported ({what})", None)

    def layer_kinds(self, n_layers: int, allowed: Sequence[str], default: Callable[[int], str], *,
                    listed: bool = True) -> Counter[str]:
        """How many layers of each kind: counted from ``layer_types`` where the config lists them (and
        ``listed``: the type's transformers config has that key), else by the model's rule (``default(i)``
        for layer i, as transformers' config class or model builds it). A kind outside ``allowed`` is
        refused: calc would not know what such a layer stores or costs. Each layer's kind is kept in
        ``kinds``."""
        types = self.get("layer_types") if listed else None
        rule = [default(i) for i in range(n_layers)]
        if types is None:
            self.kinds = rule
        elif not isinstance(types, list) or len(types) != n_layers:
            self.kinds = self.invalid("layer_types", f"must list {n_layers} layer kinds, got {types!r}", rule)
        elif unknown := sorted({str(t) for t in types} - set(allowed)):
            self.kinds = self.invalid("layer_types", f"layer kind {unknown[0]!r} is not one calc models for "
                                      f"this model_type ({', '.join(allowed)})", rule)
        else:
            self.kinds = list(types)
        return Counter(self.kinds)


def noted(fields: Fields, *notes: str) -> Fields:
    """``fields`` with ``notes`` added to those already there."""
    return {**fields, "notes": (*fields.get("notes", ()), *notes)}


# --- bodies: the keys every decoder has -----------------------------------------------------------------
def llama_body(r: Reader) -> Fields:
    """The llama family's keys (most model types since 2023)."""
    d, n_heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    return {
        "arch": "llama", "n_layers": r.integer("num_hidden_layers"), "d_model": d, "n_heads": n_heads,
        "d_head": r.head_dim(d, n_heads), "n_kv_heads": r.integer("num_key_value_heads", n_heads),
        "d_ff": r.integer("intermediate_size"), "vocab_size": r.integer("vocab_size"),
        "n_ctx": r.integer("max_position_embeddings"),
        "tied_embeddings": r.boolean("tie_word_embeddings", False),
    }


def experts_only_body(r: Reader) -> Fields:
    """The llama family's keys for a model with experts on every layer and no intermediate_size (Qwen3.5-MoE):
    no layer has a dense MLP, so d_ff, which no count then reads, is the experts' width."""
    if "intermediate_size" not in r.raw:
        r.defaults = {**r.defaults, "intermediate_size": r.raw.get("moe_intermediate_size")}
    return llama_body(r)


def gpt2_body(r: Reader) -> Fields:
    """GPT-2's keys (also GPTBigCode's)."""
    d, n_heads = r.integer("n_embd"), r.integer("n_head")
    return {
        "arch": "gpt", "n_layers": r.integer("n_layer"), "d_model": d, "n_heads": n_heads,
        "d_head": r.whole_heads(d, n_heads, "n_embd", "n_head"), "n_kv_heads": n_heads,
        "d_ff": r.optional_int("n_inner") or 4 * d,
        "vocab_size": r.integer("vocab_size"), "n_ctx": r.integer("n_positions"),
        "tied_embeddings": r.boolean("tie_word_embeddings", True),
    }


def neox_body(r: Reader) -> Fields:
    d, n_heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    return {
        "arch": "neox", "n_layers": r.integer("num_hidden_layers"), "d_model": d, "n_heads": n_heads,
        "d_head": r.whole_heads(d, n_heads), "n_kv_heads": n_heads, "d_ff": r.integer("intermediate_size"),
        "vocab_size": r.integer("vocab_size"), "n_ctx": r.integer("max_position_embeddings"),
        "tied_embeddings": r.boolean("tie_word_embeddings", False),
    }


def opt_body(r: Reader) -> Fields:
    """OPT (Zhang et al. 2022): GPT-2's layout, with its own key names and 2 extra position rows."""
    d, n_heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    if r.get("word_embed_proj_dim", d) != d:
        r.invalid("word_embed_proj_dim", f"{r.get('word_embed_proj_dim')!r} ≠ hidden_size {d}: the "
                  "projections between a narrower embedding and the layers are not modelled", None)
    r.refuse("do_layer_norm_before", False, "post-LayerNorm OPT-350m has no final norm; not modelled")
    r.refuse("_remove_final_layer_norm", True, "OPT without its final LayerNorm is not modelled")
    for key in ("enable_bias", "layer_norm_elementwise_affine"):
        r.refuse(key, False, "OPT without biases or norm weights is not modelled")
    return {
        "arch": "gpt", "n_layers": r.integer("num_hidden_layers"), "d_model": d, "n_heads": n_heads,
        "d_head": r.whole_heads(d, n_heads), "n_kv_heads": n_heads, "d_ff": r.integer("ffn_dim"),
        "vocab_size": r.integer("vocab_size"), "n_ctx": r.integer("max_position_embeddings"),
        "tied_embeddings": r.boolean("tie_word_embeddings", True), "position_offset": 2,
    }


def falcon_body(r: Reader) -> Fields:
    """Falcon (Almazrouei et al. 2023): a fused QKV, multi-query (7B) or grouped (new_decoder_architecture,
    40B/180B), parallel attention and MLP, LayerNorm with a bias, a 4d dense MLP, optional linear biases."""
    d, n_heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    r.refuse("alibi", True, "ALiBi Falcon (RW-1B) is not modelled")
    new = r.boolean("new_decoder_architecture", False)
    parallel = r.boolean("parallel_attn", True)
    multi_query = r.boolean("multi_query", True)
    # FalconAttention sizes its fused QKV by num_kv_heads only in the new architecture; the old one is
    # multi-query (one K, V head) or 3·d wide, whatever num_kv_heads (which FalconConfig always carries) says
    n_kv = (r.optional_int("num_kv_heads") or n_heads) if new else 1 if multi_query else n_heads
    if not new:
        r.known("num_kv_heads")
    # FalconDecoderLayer: sequential blocks have two norms; parallel ones two where num_ln_in_parallel_attn is
    # 2 (its default in the new architecture, None in the old), else one shared
    if parallel:
        n_ln = r.optional_int("num_ln_in_parallel_attn") or (2 if new else 1)
        if n_ln not in (1, 2):
            n_ln = int(r.invalid("num_ln_in_parallel_attn", f"must be 1, 2 or null, got {n_ln!r}", 1))
        norms = n_ln
    else:
        r.known("num_ln_in_parallel_attn")
        norms = 2
    bias = r.boolean("bias", False)
    return {
        "arch": "neox", "n_layers": r.integer("num_hidden_layers"), "d_model": d, "n_heads": n_heads,
        "d_head": r.whole_heads(d, n_heads), "n_kv_heads": n_kv,
        "d_ff": r.optional_int("ffn_hidden_size") or 4 * d, "vocab_size": r.integer("vocab_size"),
        "n_ctx": r.integer("max_position_embeddings"),
        "tied_embeddings": r.boolean("tie_word_embeddings", True),
        "qkv_bias": bias, "o_bias": bias, "mlp_bias": bias, "norms_per_layer": norms,
        "parallel_block": parallel,
        "notes": (("parallel attention and MLP" if parallel else "sequential blocks")
                  + f"; Q, K, V fused in one matrix; {norms} LayerNorm(s) per layer",),
    }


# --- parts: optional features, each a reader of its keys --------------------------------------------
Part = Callable[[Reader, Fields], Fields]


def no_extra_biases(r: Reader, fields: Fields) -> Fields:
    for key, what in (("attention_bias", "biases on Q, K, V and O"), ("mlp_bias", "biases in the MLP")):
        r.refuse(key, True, what)
    return fields


def window_on_every_layer(r: Reader, fields: Fields) -> Fields:
    """Mistral, Mixtral, Phi-3, StarCoder2: ``sliding_window`` (or null) applies to every layer."""
    window = r.optional_int("sliding_window")
    kinds = r.layer_kinds(fields["n_layers"], SLIDING_OR_FULL,
                          lambda i: "sliding_attention" if window else "full_attention", listed=False)
    return {**fields, "sliding_window": window, "n_window_layers": kinds["sliding_attention"]}


def _windowed(r: Reader, fields: Fields, kinds: Counter[str], default_window: int | None = None) -> Fields:
    n_window = kinds["sliding_attention"]
    window = r.integer("sliding_window", default_window if default_window else _MISSING) if n_window else None
    return {**fields, "sliding_window": window, "n_window_layers": n_window}


def _qwen_windowed(r: Reader, fields: Fields, windowed: Callable[[int], bool], *,
                   listed: bool = True) -> Fields:
    """The Qwen family's windows: ``sliding_window`` (transformers' default 4,096; null: none) counts only
    with ``use_sliding_window``; ``windowed(i)`` is the type's rule for layer i, ``layer_types`` (where the
    type's config has the key) overrides it."""
    kinds = r.layer_kinds(fields["n_layers"], SLIDING_OR_FULL,
                          lambda i: "sliding_attention" if windowed(i) else "full_attention", listed=listed)
    if not kinds["sliding_attention"]:
        r.known("sliding_window")
        return fields
    if not r.boolean("use_sliding_window", False):
        r.invalid("layer_types", f"lists {kinds['sliding_attention']} sliding layers, but use_sliding_window "
                  "is false (transformers then has no window to give them)", None)
    return _windowed(r, fields, kinds)


def _qwen_window_size(r: Reader) -> int | None:
    """The window transformers' Qwen configs keep: ``sliding_window`` with ``use_sliding_window``, else
    None."""
    return r.optional_int("sliding_window") if r.boolean("use_sliding_window", False) else None


def qwen_window(r: Reader, fields: Fields) -> Fields:
    """Qwen2, Qwen3 (Qwen2Config, Qwen3Config): with a window, layer i has it where i ≥ ``max_window_layers``
    (default 28)."""
    if _qwen_window_size(r) is None:
        r.known("max_window_layers")
        return _qwen_windowed(r, fields, lambda i: False)
    first = r.count("max_window_layers")
    return _qwen_windowed(r, fields, lambda i: i >= first)


def qwen2_moe_window(r: Reader, fields: Fields) -> Fields:
    """Qwen2-MoE (Qwen2MoeConfig): with ``use_sliding_window``, layer i has the window where i is even and
    i < ``max_window_layers`` (default 28)."""
    if not r.boolean("use_sliding_window", False):
        r.known("max_window_layers")
        return _qwen_windowed(r, fields, lambda i: False)
    below = r.count("max_window_layers")
    return _qwen_windowed(r, fields, lambda i: (i + 1) % 2 == 1 and i < below)


def qwen3_moe_window(r: Reader, fields: Fields) -> Fields:
    """Qwen3-MoE (Qwen3MoeConfig, Qwen3MoeAttention): the window, where there is one, is on every layer.
    Its config has no ``layer_types``, and ``max_window_layers`` (which its checkpoints' files carry) is not
    read by transformers."""
    r.known("max_window_layers")
    windowed = _qwen_window_size(r) is not None
    return _qwen_windowed(r, fields, lambda i: windowed, listed=False)


def gemma_window(pattern_key: str | None) -> Part:
    """Gemma 2 (local and global alternate, the first local) and Gemma 3 (``sliding_window_pattern`` − 1
    local layers, then a global one): 4 norms per layer."""
    def part(r: Reader, fields: Fields) -> Fields:
        pattern = r.integer(pattern_key, 6) if pattern_key else 2
        kinds = r.layer_kinds(fields["n_layers"], SLIDING_OR_FULL,
                              lambda i: "sliding_attention" if (i + 1) % pattern else "full_attention")
        return {**_windowed(r, fields, kinds, 4096), "norms_per_layer": 4}
    return part


def rope_flags(r: Reader, n_layers: int) -> list[int]:
    """SmolLM3, Llama 4: ``no_rope_layers[i]`` is 1 where layer i uses RoPE and 0 where it has no position
    encoding (NoPE); by default every ``no_rope_layer_interval``-th layer is NoPE."""
    flags = r.int_list("no_rope_layers", n_layers)
    if flags is None:
        interval = r.integer("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(n_layers)]
    else:
        r.known("no_rope_layer_interval")  # transformers builds the flags from it only where none are listed
    if len(flags) != n_layers or set(flags) - {0, 1}:
        r.invalid("no_rope_layers", f"must be {n_layers} flags of 0 or 1, got {flags!r}", None)
        flags = [1] * n_layers
    return flags


def with_nope(fields: Fields, flags: list[int]) -> Fields:
    """The NoPE layers named (they have no parameters and change no cost)."""
    nope = flags.count(0)
    note = f"{nope} of {len(flags)} layers have no rotary positions (NoPE; no parameters, the same costs)"
    return {**noted(fields, note), "n_nope_layers": nope}


def smollm3_layers(r: Reader, fields: Fields) -> Fields:
    """SmolLM3: a NoPE layer every 4; with ``use_sliding_window``, transformers windows the NoPE layers."""
    flags = rope_flags(r, fields["n_layers"])
    r.known("sliding_window")  # read below where a layer has the window; without one, it changes nothing
    windowed = r.boolean("use_sliding_window", False) and r.get("sliding_window") is not None
    kinds = r.layer_kinds(fields["n_layers"], SLIDING_OR_FULL,
                          lambda i: "sliding_attention" if windowed and not flags[i] else "full_attention")
    return _windowed(r, with_nope(fields, flags), kinds)


def llama4_layers(r: Reader, fields: Fields) -> Fields:
    """Llama 4: RoPE layers attend within chunks of ``attention_chunk_size``; NoPE layers see every key."""
    flags = rope_flags(r, fields["n_layers"])
    chunk = r.optional_int("attention_chunk_size")
    kinds = r.layer_kinds(fields["n_layers"], ("chunked_attention", "full_attention"),
                          lambda i: "chunked_attention" if flags[i] and chunk else "full_attention")
    n_chunked = kinds["chunked_attention"]
    if n_chunked and chunk is None:
        chunk = r.invalid("attention_chunk_size", f"missing, but {n_chunked} layers are chunked", 1)
    return {**with_nope(fields, flags), "n_chunked_layers": n_chunked,
            "attention_chunk": chunk if n_chunked else None}


def qwen3_next_layers(r: Reader, fields: Fields) -> Fields:
    """Qwen3-Next: three Gated DeltaNet layers to one gated full-attention layer
    (``full_attention_interval``)."""
    interval = r.integer("full_attention_interval", 4)
    kinds = r.layer_kinds(fields["n_layers"], ("linear_attention", "full_attention"),
                          lambda i: "linear_attention" if (i + 1) % interval else "full_attention")
    shape = GatedDeltaNet(
        key_heads=r.integer("linear_num_key_heads"), value_heads=r.integer("linear_num_value_heads"),
        d_key=r.integer("linear_key_head_dim"), d_value=r.integer("linear_value_head_dim"),
        conv_kernel=r.integer("linear_conv_kernel_dim"))
    return {**fields, "n_linear_layers": kinds["linear_attention"], "linear_attention": shape}


def jamba_layers(r: Reader, fields: Fields) -> Fields:
    """Jamba: attention where i % ``attn_layer_period`` = ``attn_layer_offset``, Mamba elsewhere; experts
    where i % ``expert_layer_period`` = ``expert_layer_offset``, a dense MLP elsewhere."""
    n_layers = fields["n_layers"]
    period, offset = r.integer("attn_layer_period"), r.count("attn_layer_offset")
    kinds = r.layer_kinds(n_layers, ("full_attention", "mamba"),
                          lambda i: "full_attention" if i % period == offset else "mamba", listed=False)
    d = fields["d_model"]
    expand = r.integer("mamba_expand")
    shape = Mamba(d_inner=expand * d, d_state=r.integer("mamba_d_state"),
                  dt_rank=r.integer("mamba_dt_rank"),
                  conv_kernel=r.integer("mamba_d_conv"), conv_bias=r.boolean("mamba_conv_bias", True),
                  proj_bias=r.boolean("mamba_proj_bias", False), inner_norms=True)
    e_period, e_offset = r.integer("expert_layer_period"), r.count("expert_layer_offset")
    n_moe = sum(i % e_period == e_offset for i in range(n_layers))
    experts = r.integer("num_experts")
    fields = {**fields, "n_mamba_layers": kinds["mamba"], "mamba": shape}
    if experts == 1 or not n_moe:
        r.known("num_experts_per_tok")  # a dense model: no router to pick experts
        return fields
    return {**fields, "n_experts": experts, "experts_per_token": r.integer("num_experts_per_tok"),
            "d_expert": fields["d_ff"], "n_dense_layers": n_layers - n_moe}


def aliased(r: Reader, alias: str, key: str) -> None:
    """Read ``key`` from ``alias`` where the file gives it: a config class's attribute alias
    (``attribute_map``), which it may save in place of the key; where both are given they must agree."""
    value = r.get(alias)
    if value is None:
        return
    if r.raw.get(key, value) != value:
        r.invalid(alias, f"{value!r} is not {key} {r.raw[key]!r}, which it stands for", None)
    r.defaults = {**r.defaults, key: value}


NEMOTRON_H_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
# NemotronHConfig's older names of its Mamba keys: where a file gives one, it wins over the new name
NEMOTRON_H_LEGACY = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv",
                     "use_conv_bias": "mamba_conv_bias"}


# keys that size nothing where no block is of their kind
NEMOTRON_H_MAMBA_KEYS = ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel",
                         "use_conv_bias", "use_bias", *NEMOTRON_H_LEGACY.values())
NEMOTRON_H_EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts_per_tok",
                          "moe_intermediate_size", "moe_shared_expert_intermediate_size")


def nemotron_h_blocks(r: Reader) -> list[str]:
    """Nemotron-H's blocks in order: ``layers_block_type`` (or its alias ``layer_types``), else
    ``hybrid_override_pattern`` (M Mamba-2, * attention, - MLP, E experts), else NemotronHConfig's default;
    ``num_hidden_layers`` is not read (transformers derives it from the list)."""
    r.known("num_hidden_layers")
    for key in ("layers_block_type", "layer_types"):
        if r.get(key) is not None:
            r.known("hybrid_override_pattern")
            blocks = r.get(key)
            kinds = NEMOTRON_H_PATTERN.values()
            if not isinstance(blocks, list) or not blocks or not set(blocks) <= set(kinds):
                return list(r.invalid(key, f"must list each block as one of {', '.join(kinds)}, got "
                                      f"{blocks!r}", ["full_attention"]))
            return blocks
    pattern = r.get("hybrid_override_pattern")
    if pattern is None:
        return ["linear_attention", "moe", "full_attention", "mlp"]
    if not isinstance(pattern, str) or not pattern or not set(pattern) <= set(NEMOTRON_H_PATTERN):
        return list(r.invalid("hybrid_override_pattern", "must be a string of "
                              f"{''.join(NEMOTRON_H_PATTERN)}, got {pattern!r}", ["full_attention"]))
    return [NEMOTRON_H_PATTERN[c] for c in pattern]


def nemotron_h_body(r: Reader) -> Fields:
    """Nemotron-H (NemotronHConfig): blocks of one norm and one mixer each, a Mamba-2 layer, attention
    (Q, K, V, O without biases), a dense MLP (up and down, no gate) or experts. calc counts a layer per
    Mamba-2 or attention block and gives the MLP and expert blocks to as many of them (the same weights and
    costs in another order); the blocks left over have no MLP."""
    blocks = nemotron_h_blocks(r)
    mixers = [b for b in blocks if b in ("linear_attention", "full_attention")]
    n_mlp = len(blocks) - len(mixers)
    if n_mlp > len(mixers):
        r.invalid("layers_block_type", f"{n_mlp} MLP and expert blocks to {len(mixers)} Mamba-2 and "
                  "attention blocks: calc pairs each MLP block with a mixer, and cannot pair more", None)
    r.kinds = ["mamba" if b == "linear_attention" else "full_attention" for b in mixers]
    d, n_heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    n_layers = max(len(mixers), 1)
    n = Counter(blocks)
    notes = [f"{len(blocks)} blocks of one mixer or one MLP each: {n['linear_attention']} Mamba-2, "
             f"{n['full_attention']} attention, {n['mlp']} MLP, {n['moe']} experts; calc counts a layer per "
             "Mamba-2 or attention block and gives it one of the MLP blocks while they last"]
    if r.boolean("tie_word_embeddings", False):  # NemotronHForCausalLM ties no weights
        notes.append("tie_word_embeddings is true, but transformers' Nemotron-H ties no weights: its head is "
                     "counted apart from the embedding")
    if r.get("num_nextn_predict_layers"):
        r.invalid("num_nextn_predict_layers", "multi-token-prediction blocks, which transformers' Nemotron-H "
                  "does not build, are not modelled", None)
    r.known("mtp_layers_block_type", "mtp_hybrid_override_pattern")
    return {
        "arch": "llama", "n_layers": n_layers, "d_model": d, "n_heads": n_heads,
        "d_head": r.head_dim(d, n_heads), "n_kv_heads": r.integer("num_key_value_heads", n_heads),
        "d_ff": r.integer("intermediate_size"), "vocab_size": r.integer("vocab_size"),
        "n_ctx": r.integer("max_position_embeddings"), "tied_embeddings": False, "mlp_gated": False,
        "mlp_bias": r.boolean("mlp_bias", False), "n_mlp_free_layers": max(n_layers - n_mlp, 0),
        "notes": tuple(notes), **nemotron_h_mamba2(r, blocks.count("linear_attention")),
        **nemotron_h_experts(r, blocks.count("moe"), blocks.count("mlp")),
    }


def nemotron_h_mamba2(r: Reader, n_mamba: int) -> Fields:
    """The shape of Nemotron-H's ``n_mamba`` Mamba-2 blocks (none: their keys size nothing); where a file
    gives a legacy name (``mamba_n_groups``), NemotronHConfig takes its value over the new one."""
    def named(key: str) -> str:
        legacy = NEMOTRON_H_LEGACY[key]
        r.known(key, legacy)
        return legacy if legacy in r.raw else key

    if not n_mamba:
        r.known(*NEMOTRON_H_MAMBA_KEYS)
        return {}
    heads = r.integer("mamba_num_heads")
    return {"n_mamba_layers": n_mamba, "mamba2": Mamba2(
        d_inner=heads * r.integer("mamba_head_dim"), heads=heads, groups=r.integer(named("n_groups")),
        d_state=r.integer("ssm_state_size"), conv_kernel=r.integer(named("conv_kernel")),
        conv_bias=r.boolean(named("use_conv_bias"), True), proj_bias=r.boolean("use_bias", False))}


def nemotron_h_experts(r: Reader, n_moe: int, n_mlp: int) -> Fields:
    """Nemotron-H's ``n_moe`` expert blocks (NemotronHMoE): routed experts without a gate, one shared MLP of
    ``moe_shared_expert_intermediate_size`` whatever ``n_shared_experts`` says, a sigmoid router with a
    score-correction bias per expert (a saved buffer); its ``n_mlp`` MLP blocks are the dense layers."""
    if r.get("moe_latent_size") is not None:
        r.invalid("moe_latent_size", "the experts' latent projections (d → moe_latent_size → d) are not "
                  "modelled", None)
    if not n_moe:
        r.known(*NEMOTRON_H_EXPERT_KEYS)
        return {}
    aliased(r, "num_local_experts", "n_routed_experts")
    return {"n_experts": r.integer("n_routed_experts"), "experts_per_token": r.integer("num_experts_per_tok"),
            "d_expert": r.integer("moe_intermediate_size"), "n_shared_experts": 1,
            "d_shared_expert": r.integer("moe_shared_expert_intermediate_size"), "n_dense_layers": n_mlp,
            "router_bias": True}


def mimo_v2_layers(r: Reader, fields: Fields) -> Fields:
    """MiMo-V2-Flash (MiMoV2FlashConfig): full attention on layer 0 and every sixth, a window elsewhere
    (``layer_types`` lists them); a windowed layer has twice the key/value heads and a sink per query
    head; values of ``v_head_dim`` beside queries and keys of ``head_dim``; biases on Q, K, V
    (``attention_bias``)."""
    kinds = r.layer_kinds(fields["n_layers"], SLIDING_OR_FULL,
                          lambda i: "full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention")
    r.known("sliding_window", "sliding_window_size")
    window = bool(kinds["sliding_attention"])
    if window and r.get("sliding_window_size") is not None:
        # the hub files' key, the keys before the query: MiMoV2FlashConfig's window is one more, whatever
        # sliding_window says
        fields = {**fields, "sliding_window": r.integer("sliding_window_size") + 1,
                  "n_window_layers": kinds["sliding_attention"]}
    else:
        fields = _windowed(r, fields, kinds, 129)
    return {**fields, "d_value": r.integer("v_head_dim"), "qkv_bias": r.boolean("attention_bias", False),
            "n_kv_heads_window": 2 * fields["n_kv_heads"] if window else 0, "window_sinks": window}


def mimo_v2_experts(r: Reader, fields: Fields) -> Fields:
    """MiMo-V2-Flash: experts where ``mlp_layer_types`` says "sparse" (by default every layer but the first),
    a dense MLP elsewhere; a sigmoid router with a score-correction bias per expert (a saved buffer)."""
    n = fields["n_layers"]
    types = r.get("mlp_layer_types")
    if types is None:
        types = ["dense"] + ["sparse"] * (n - 1)
    elif not isinstance(types, list) or len(types) != n or not set(types) <= {"dense", "sparse"}:
        types = r.invalid("mlp_layer_types", f"must list {n} layers as dense or sparse, got {types!r}",
                          ["dense"] * n)
    if "sparse" not in types:
        r.known("n_routed_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size")
        return fields
    aliased(r, "num_local_experts", "n_routed_experts")
    return {**fields, "n_experts": r.integer("n_routed_experts"),
            "experts_per_token": r.integer("num_experts_per_tok"),
            "d_expert": r.integer("moe_intermediate_size"), "n_dense_layers": types.count("dense"),
            "router_bias": True}


# LongcatFlashConfig's attribute_map: names a file may give in place of its keys
LONGCAT_ALIASES = {"intermediate_size": "ffn_hidden_size", "num_local_experts": "n_routed_experts",
                   "num_experts_per_tok": "moe_topk", "moe_intermediate_size": "expert_ffn_hidden_size"}


def longcat_body(r: Reader) -> Fields:
    """LongCat-Flash (LongcatFlashConfig): ``num_layers`` layers of two MLA sublayers, two dense MLPs of
    ``ffn_hidden_size`` and one MoE beside them. calc counts two layers per LongCat layer, each an MLA and a
    dense MLP with its two norms; the second holds the MoE, its dense MLP counted as a shared expert (always
    run, no gate): the same weights and costs. Aliases of its config class (``intermediate_size``,
    ``num_local_experts``...) are read where a file gives them."""
    for alias, key in LONGCAT_ALIASES.items():
        aliased(r, alias, key)
    pairs = r.integer("num_layers")
    if r.get("num_hidden_layers") not in (None, 2 * pairs):
        r.invalid("num_hidden_layers", f"{r.get('num_hidden_layers')!r} is not 2 × num_layers = {2 * pairs}, "
                  "which LongcatFlashConfig derives it as", None)
    d, n_heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    d_ff = r.integer("ffn_hidden_size")
    r.refuse("router_bias", True, "a bias on the router's classifier beside its score correction")
    return {
        "arch": "llama", "n_layers": 2 * pairs, "d_model": d, "n_heads": n_heads, "d_head": 1,
        "n_kv_heads": r.integer("num_key_value_heads", n_heads), "d_ff": d_ff,
        "vocab_size": r.integer("vocab_size"), "n_ctx": r.integer("max_position_embeddings"),
        "tied_embeddings": r.boolean("tie_word_embeddings", False),
        "n_experts": r.integer("n_routed_experts"), "experts_per_token": r.integer("moe_topk"),
        "d_expert": r.integer("expert_ffn_hidden_size"), "n_shared_experts": 1, "d_shared_expert": d_ff,
        "n_dense_layers": pairs, "router_bias": True, "n_zero_experts": r.count("zero_expert_num"),
        "notes": (f"{pairs} layers of two MLA sublayers, two dense MLPs and one MoE each: calc counts "
                  f"{2 * pairs} layers of one MLA and one dense MLP, the second of each pair with the MoE "
                  "(its dense MLP a shared expert)",
                  "active: a token's moe_topk experts all real; zero experts, which run nothing, make "
                  "LongCat-Flash's average lower"),
    }


def no_mtp(r: Reader, fields: Fields) -> Fields:
    if fields.get("n_mtp_layers"):
        r.invalid("num_nextn_predict_layers", "multi-token-prediction layers, which transformers' model of "
                  "this type does not build, are not modelled", None)
    return fields


def mixtral_experts(r: Reader, fields: Fields) -> Fields:
    return {**fields, "n_experts": r.integer("num_local_experts"),
            "experts_per_token": r.integer("num_experts_per_tok"), "d_expert": fields["d_ff"]}


def qwen_experts(r: Reader, fields: Fields) -> Fields:
    """Qwen2-MoE, Qwen3-MoE, Qwen3-Next: experts where (i + 1) % ``decoder_sparse_step`` = 0 and i is not in
    ``mlp_only_layers``; a gated shared expert of ``shared_expert_intermediate_size`` where given."""
    n_layers = fields["n_layers"]
    step = r.integer("decoder_sparse_step", 1)
    dense_only = set(r.int_list("mlp_only_layers", n_layers) or ())
    n_moe = sum(i not in dense_only and (i + 1) % step == 0 for i in range(n_layers))
    shared = r.count("shared_expert_intermediate_size")
    fields = {**fields, "n_experts": r.integer("num_experts"),
              "experts_per_token": r.integer("num_experts_per_tok"),
              "d_expert": r.integer("moe_intermediate_size"), "n_dense_layers": n_layers - n_moe}
    if shared:
        fields.update(n_shared_experts=1, d_shared_expert=shared, shared_expert_gate=True)
    return fields


def local_experts_alias(r: Reader, fields: Fields) -> Fields:
    """Qwen3-VL-MoE: ``num_local_experts`` is what its config class saves for ``num_experts``."""
    aliased(r, "num_local_experts", "num_experts")
    return fields


def deepseek_experts(r: Reader, fields: Fields) -> Fields:
    if r.get("moe_layer_freq", 1) != 1:
        r.invalid("moe_layer_freq", f"only 1 (every layer after the dense ones) is supported, "
                  f"got {r.get('moe_layer_freq')!r}", None)
    return {**fields, "n_experts": r.integer("n_routed_experts"),
            "experts_per_token": r.integer("num_experts_per_tok"),
            "n_shared_experts": r.count("n_shared_experts"),
            "d_expert": r.integer("moe_intermediate_size"),
            "n_dense_layers": r.count("first_k_dense_replace")}


def llama4_experts(r: Reader, fields: Fields) -> Fields:
    """Llama 4: MoE layers every ``interleave_moe_layer_step`` (or listed in ``moe_layers``), each with one
    shared expert of ``intermediate_size``; dense layers are ``intermediate_size_mlp`` wide."""
    n_layers = fields["n_layers"]
    moe_layers = r.int_list("moe_layers", n_layers)
    if moe_layers is None:
        step = r.integer("interleave_moe_layer_step", 1)
        moe_layers = list(range(step - 1, n_layers, step))
    else:  # Llama4TextConfig derives moe_layers from the step only where none are listed
        r.known("interleave_moe_layer_step")
    d_e = fields["d_ff"]
    return {**fields, "d_ff": r.integer("intermediate_size_mlp"), "n_experts": r.integer("num_local_experts"),
            "experts_per_token": r.integer("num_experts_per_tok"), "d_expert": d_e, "n_shared_experts": 1,
            "n_dense_layers": n_layers - len(set(moe_layers) & set(range(n_layers)))}


def mla(r: Reader, fields: Fields) -> Fields:
    """Multi-head latent attention (DeepSeek-V2/V3); ``q_lora_rank`` null means an uncompressed query."""
    r.refuse("attention_bias", True, "biases in MLA's projections")
    d_rope = r.integer("qk_rope_head_dim")
    return {**fields, "d_head": r.integer("qk_nope_head_dim") + d_rope,
            "kv_lora_rank": r.integer("kv_lora_rank"),
            "q_lora_rank": r.optional_int("q_lora_rank") or 0, "d_rope": d_rope,
            "d_value": r.integer("v_head_dim"),
            "n_mtp_layers": r.count("num_nextn_predict_layers")}


def dsa_indexer(r: Reader, fields: Fields) -> Fields:
    """DeepSeek Sparse Attention (DeepSeek V3.2): every layer's queries attend to the ``index_topk`` keys its
    indexer (``index_n_heads`` heads of ``index_head_dim``) scores highest; DeepseekV32Config names every
    layer ``indexed_attention``."""
    kinds = r.layer_kinds(fields["n_layers"], ("indexed_attention",), lambda i: "indexed_attention")
    return {**fields, "n_sparse_layers": kinds["indexed_attention"], "index_topk": r.integer("index_topk"),
            "index_heads": r.integer("index_n_heads"), "index_head_dim": r.integer("index_head_dim")}


def mla_derived(r: Reader, fields: Fields) -> Fields:
    """What transformers' DeepSeek V3.2 and GLM-5 configs derive and save beside their keys: ``qk_head_dim``
    (the no-rotary and rotary widths' sum), ``head_dim`` (the rotary width), ``mlp_layer_types`` (dense for
    the first ``first_k_dense_replace`` layers, then sparse). Accepted where they say what the keys say."""
    n, d_rope = fields["n_layers"], fields.get("d_rope", 0)
    for key, derived in (("qk_head_dim", fields["d_head"]), ("head_dim", d_rope)):
        if r.get(key) is not None and r.get(key) != derived:
            r.invalid(key, f"{r.get(key)!r} is not {derived}, what the other MLA widths make it", None)
    dense = fields.get("n_dense_layers", 0)
    types = r.get("mlp_layer_types")
    if types is not None and types != ["dense"] * dense + ["sparse"] * (n - dense):
        r.invalid("mlp_layer_types", f"only the first first_k_dense_replace = {dense} layers dense, then "
                  f"experts, is modelled; got {types!r}", None)
    r.refuse("mlp_bias", True, "biases in the MLP")
    return fields


def glm_indexers(r: Reader, fields: Fields) -> Fields:
    """GLM-5: ``indexer_types`` says which layers run their own indexer ("full"); a layer that reuses the one
    before it ("shared") has none, which calc does not model."""
    types = r.get("indexer_types")
    if types is not None and types != ["full"] * fields["n_layers"]:
        r.invalid("indexer_types", "only an indexer in every layer ('full') is modelled; a layer sharing "
                  "another's selection ('shared') is not", None)
    return fields


def gpt_oss_parts(r: Reader, fields: Fields) -> Fields:
    """gpt-oss: sinks, biases on Q, K, V, O, alternating sliding/full layers, experts with biases."""
    kinds = r.layer_kinds(fields["n_layers"], SLIDING_OR_FULL,
                          lambda i: "sliding_attention" if i % 2 == 0 else "full_attention")
    bias = r.boolean("attention_bias", True)
    return {**_windowed(r, fields, kinds), "qkv_bias": bias, "o_bias": bias, "attention_sinks": True,
            "n_experts": r.integer("num_local_experts"),
            "experts_per_token": r.integer("num_experts_per_tok"),
            "d_expert": fields["d_ff"], "router_bias": True, "expert_bias": True}


def ernie_bias(r: Reader, fields: Fields) -> Fields:
    bias = r.boolean("use_bias", False)
    return {**fields, "qkv_bias": bias, "o_bias": bias, "mlp_bias": bias}


def ernie_experts(r: Reader, fields: Fields) -> Fields:
    """ERNIE 4.5 MoE (Ernie4_5_MoeDecoderLayer): experts where (i + 1) % ``moe_layer_interval`` = 0 and
    ``moe_layer_start_index`` ≤ i ≤ ``moe_layer_end_index``, a dense MLP elsewhere; ``moe_num_shared_experts``
    shared experts of ``moe_intermediate_size`` (one MLP as wide as all of them: the same count); a router
    with a score-correction bias per expert."""
    n = fields["n_layers"]
    r.refuse("use_bias", True, "biases in an ERNIE 4.5 MoE model")
    if r.get("num_nextn_predict_layers"):
        r.invalid("num_nextn_predict_layers", "multi-token-prediction layers transformers' ERNIE 4.5 MoE "
                  "does not build are not modelled", None)
    interval = r.integer("moe_layer_interval", 1)
    start, end = r.count("moe_layer_start_index"), r.count("moe_layer_end_index")
    n_moe = sum((i + 1) % interval == 0 and start <= i <= end for i in range(n))
    return {**fields, "n_experts": r.integer("moe_num_experts"), "experts_per_token": r.integer("moe_k"),
            "d_expert": r.integer("moe_intermediate_size"),
            "n_shared_experts": r.count("moe_num_shared_experts"), "n_dense_layers": n - n_moe,
            "router_bias": True}


def olmo3_window(r: Reader, fields: Fields) -> Fields:
    kinds = r.layer_kinds(fields["n_layers"], SLIDING_OR_FULL,
                          lambda i: "sliding_attention" if (i + 1) % 4 else "full_attention")
    return _windowed(r, fields, kinds, 4096)


def gemma4_layers(r: Reader, fields: Fields) -> Fields:
    """Gemma 4's text model (Gemma4TextConfig, Gemma4TextModel): five windowed layers to one full by default,
    the last always full (transformers makes it so, with a warning); a full layer's heads of
    ``global_head_dim`` and, where its values are its keys (``attention_k_eq_v``: no V projection),
    ``num_global_key_value_heads`` key/value heads; a saved file lists them per layer (``per_layer_config``)
    instead. The last ``num_kv_shared_layers`` layers reuse the keys and values of the last earlier layer of
    their kind (no K, V or key norm; no cache), with a gated MLP twice as wide where ``use_double_wide_mlp``;
    per-layer embeddings where ``hidden_size_per_layer_input`` is not 0; q and k norms, four norms a layer and
    a saved scalar per layer."""
    n = fields["n_layers"]
    kinds = r.layer_kinds(n, SLIDING_OR_FULL,
                          lambda i: "sliding_attention" if (i + 1) % 6 else "full_attention")
    notes: list[str] = []
    if r.kinds and r.kinds[-1] != "full_attention":  # Gemma4TextConfig forces the last layer full
        r.kinds = [*r.kinds[:-1], "full_attention"]
        kinds = Counter(r.kinds)
        notes.append("layer_types: the last layer is full attention, as Gemma4TextConfig makes it")
    fields = _windowed(r, fields, kinds, 512)
    bidirectional = r.get("use_bidirectional_attention")
    if bidirectional == "all":
        r.invalid("use_bidirectional_attention", "'all' (every token sees every other, a window of w/2 + 1 "
                  "each way) is not modelled: calc's costs are causal", None)
    elif bidirectional not in (None, "vision"):  # "vision": image tokens only, no text figure changes
        r.invalid("use_bidirectional_attention", f"must be null, 'vision' or 'all', got {bidirectional!r}",
                  None)
    values_are_keys = r.boolean("attention_k_eq_v", False)
    full = _gemma4_full_layers(r, fields, values_are_keys)
    shared = r.count("num_kv_shared_layers")
    if shared >= n:
        shared = int(r.invalid("num_kv_shared_layers", f"{shared} leaves none of the {n} layers to compute "
                               "the keys and values the others reuse", 0))
    kept = set((r.kinds or [])[:n - shared])
    if shared and kept != set(r.kinds or []):
        r.invalid("num_kv_shared_layers", f"the last {shared} layers reuse keys and values of a kind "
                  "(sliding or full) that no earlier layer computes", None)
    shared_window = (r.kinds or [])[n - shared:].count("sliding_attention") if shared else 0
    double = r.boolean("use_double_wide_mlp", False) and shared > 0
    ple = r.get("hidden_size_per_layer_input") or 0
    if ple:
        ple = r.integer("hidden_size_per_layer_input")
        vocab = r.integer("vocab_size_per_layer_input")
    else:
        r.known("vocab_size_per_layer_input")
        vocab = 0
    return noted({**fields, **full, "full_values_are_keys": values_are_keys, "n_kv_shared_layers": shared,
                  "n_kv_shared_window_layers": shared_window, "shared_mlp_double": double,
                  "per_layer_input": ple, "per_layer_vocab": vocab,
                  "norms_per_layer": 4 + (1 if ple else 0)}, *notes)


def _gemma4_full_layers(r: Reader, fields: Fields, values_are_keys: bool) -> Fields:
    """A full-attention layer's head width and key/value heads (d_kf, g_f): from ``per_layer_config`` where
    the file lists them (what Gemma4TextConfig saves: each full layer's ``head_dim`` and, with
    ``attention_k_eq_v``, ``num_key_value_heads``), else from ``global_head_dim`` (default 512) and
    ``num_global_key_value_heads``, which Gemma4TextConfig reads only where the values are the keys. Every
    full layer must have one shape, and no windowed layer one of its own."""
    d_k, g = fields["d_head"], fields["n_kv_heads"]
    listed = r.get("per_layer_config")
    kinds = r.kinds or []
    if listed is None:
        d_kf = r.integer("global_head_dim", 512)
        g_f = r.optional_int("num_global_key_value_heads") if values_are_keys else None
        if not values_are_keys:
            r.known("num_global_key_value_heads")
        return {"d_head_full": d_kf, "n_kv_heads_full": g_f or g}
    r.known("global_head_dim", "num_global_key_value_heads")  # popped, unread where the layers are listed
    if not isinstance(listed, Mapping):
        r.invalid("per_layer_config", f"must map layer indices to overrides, got {listed!r}", None)
        return {}
    shapes: dict[str, set[tuple[int, int]]] = {"sliding_attention": set(), "full_attention": set()}
    overrides: dict[int, Mapping[str, Any]] = {}
    for key, value in listed.items():
        index = int(key) if isinstance(key, str) and key.isdigit() else None
        if index is None or index >= len(kinds) or not isinstance(value, Mapping):
            r.invalid("per_layer_config", f"{key!r}: must be a layer index below {len(kinds)} with an object "
                      "of overrides", None)
            continue
        if unknown := sorted(set(value) - {"head_dim", "num_key_value_heads"}):
            r.invalid("per_layer_config", f"layer {key}: overrides {', '.join(unknown)}, which calc does not "
                      "model per layer (only head_dim and num_key_value_heads)", None)
        overrides[index] = value
    for i, kind in enumerate(kinds):
        one = overrides.get(i, {})
        shapes[kind].add((one.get("head_dim", d_k), one.get("num_key_value_heads", g)))
    if shapes["sliding_attention"] - {(d_k, g)}:
        r.invalid("per_layer_config", "gives a windowed layer a head width or key/value heads of its own, "
                  "which calc does not model", None)
    if len(shapes["full_attention"]) > 1:
        r.invalid("per_layer_config", f"gives the full-attention layers {len(shapes['full_attention'])} "
                  "shapes; calc models one", None)
    d_kf, g_f = next(iter(shapes["full_attention"]), (d_k, g))
    for name, value in (("head_dim", d_kf), ("num_key_value_heads", g_f)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            r.invalid("per_layer_config", f"{name} must be a positive integer, got {value!r}", None)
    return {"d_head_full": d_kf, "n_kv_heads_full": g_f}


def gemma4_experts(r: Reader, fields: Fields) -> Fields:
    """Gemma 4's MoE block (``enable_moe_block``): beside each layer's dense MLP (counted as one shared expert
    of d_ff: the same weights, run by every token), ``num_experts`` experts of ``moe_intermediate_size``, of
    which ``top_k_experts`` run; a router d → E with a scale of d after its RMSNorm (counted as a norm) and a
    scale per expert (counted as router_bias: E a layer); three more norms a layer."""
    if not r.boolean("enable_moe_block", False):
        r.known("num_experts", "top_k_experts", "moe_intermediate_size")
        return fields
    extra = {"n_shared_experts": 1, "d_shared_expert": fields["d_ff"], "router_bias": True,
             "norms_per_layer": fields["norms_per_layer"] + 4}
    note = ("each layer's dense MLP runs beside its experts (a shared expert of d_ff); the router's scale of "
            "d is one of its norms, its per-expert scale its router_bias")
    return noted({**fields, "n_experts": r.integer("num_experts"),
                  "experts_per_token": r.integer("top_k_experts"),
                  "d_expert": r.integer("moe_intermediate_size"), **extra}, note)


V4_KINDS = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")
V4_LEGACY_RATES = {0: "sliding_attention", 4: "compressed_sparse_attention",
                   128: "heavily_compressed_attention"}


def deepseek_v4_body(r: Reader) -> Fields:
    """DeepSeek V4 (DeepseekV4Config): one key/value head of ``head_dim`` (the key is the value), a query LoRA
    of ``q_lora_rank``, ``n_routed_experts`` experts and ``n_shared_experts`` shared ones of
    ``moe_intermediate_size`` on every layer (a router with a score correction, saved), sinks on every
    layer."""
    d, n_heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    d_e = r.integer("moe_intermediate_size")
    return {
        "arch": "llama", "n_layers": r.integer("num_hidden_layers"), "d_model": d, "n_heads": n_heads,
        "d_head": r.integer("head_dim"), "n_kv_heads": r.integer("num_key_value_heads"), "d_ff": d_e,
        "vocab_size": r.integer("vocab_size"), "n_ctx": r.integer("max_position_embeddings"),
        "tied_embeddings": r.boolean("tie_word_embeddings", False), "q_lora_rank": r.integer("q_lora_rank"),
        "n_experts": r.integer("n_routed_experts"), "experts_per_token": r.integer("num_experts_per_tok"),
        "n_shared_experts": _v4_shared_experts(r), "d_expert": d_e, "router_bias": True,
        "attention_sinks": True, "qkv_bias": False, "o_bias": False, "mlp_bias": r.boolean("mlp_bias", False),
    }


def _v4_shared_experts(r: Reader) -> int:
    """DeepseekV4SparseMoeBlock builds one shared expert of ``moe_intermediate_size`` whatever
    ``n_shared_experts`` says: any other count is refused rather than read as transformers does not."""
    shared = r.count("n_shared_experts") if r.get("n_shared_experts") is not None else 1
    if shared != 1:
        r.invalid("n_shared_experts", f"{shared} is not modelled: DeepseekV4SparseMoeBlock builds one shared "
                  "expert whatever this says", None)
    return 1


def _v4_rates(r: Reader) -> dict[str, int]:
    """``compress_rates`` (each compressed kind's tokens an entry), or the legacy ``compress_rate_csa`` and
    ``compress_rate_hca`` DeepseekV4Config folds into it."""
    rates = dict(r.get("compress_rates") or {})
    if not isinstance(r.get("compress_rates") or {}, Mapping):
        r.invalid("compress_rates", f"must map layer kinds to rates, got {r.get('compress_rates')!r}", None)
        rates = {}
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128, **rates}
    for kind, legacy in (("compressed_sparse_attention", "compress_rate_csa"),
                         ("heavily_compressed_attention", "compress_rate_hca")):
        if r.get(legacy) is not None:
            rates[kind] = r.integer(legacy)
    if unknown := sorted(set(rates) - set(V4_KINDS[1:])):
        r.invalid("compress_rates", f"names {', '.join(unknown)}: only {', '.join(V4_KINDS[1:])} pool", None)
    for kind in V4_KINDS[1:]:
        value = rates[kind]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            rates[kind] = int(r.invalid("compress_rates", f"{kind} must be a positive integer, got {value!r}",
                                        1))
    return rates


def deepseek_v4_layers(r: Reader, fields: Fields) -> Fields:
    """DeepSeek V4's layers (DeepseekV4Config, DeepseekV4DecoderLayer): ``layer_types`` (or the legacy
    ``compress_ratios``, 0/4/128 a layer; by default two HCA layers, then CSA and HCA in turn) says which pool
    their keys (CSA: every ``compress_rates`` tokens into an entry, its indexer of ``index_n_heads`` heads of
    ``index_head_dim`` keeping ``index_topk``; HCA: every 128 into one, all read); every layer also sees its
    last ``sliding_window`` tokens. ``o_groups`` and ``o_lora_rank`` shape the grouped output projection,
    ``hc_mult`` the hyper-connections; ``mlp_layer_types`` (or the legacy ``num_hash_layers``, by default 3)
    says which layers route by a saved token → experts table (``hash_moe``). The multi-token-prediction layer
    (``num_nextn_predict_layers``) is not in transformers' model: calc counts none."""
    n = fields["n_layers"]
    legacy = r.int_list("compress_ratios", n) if r.get("layer_types") is None else None
    if legacy is not None:
        if len(legacy) < n or any(v not in V4_LEGACY_RATES for v in legacy):
            r.invalid("compress_ratios", f"must give each of the {n} layers 0, 4 or 128, got {legacy!r}",
                      None)
            legacy = None
    else:
        r.known("compress_ratios")
    # DeepseekV4Config's rule: two HCA layers, then CSA and HCA in turn (or the legacy rates, cut to n)
    rule = ([V4_LEGACY_RATES[v] for v in legacy[:n]] if legacy is not None else
            ["heavily_compressed_attention" if i < 2 or (i - 2) % 2 == 0 else "compressed_sparse_attention"
             for i in range(n)])
    kinds = r.layer_kinds(n, V4_KINDS, rule.__getitem__)
    rates = _v4_rates(r)
    hash_layers = _v4_hash_layers(r, n)
    r.refuse("attention_bias", True, "DeepseekV4Attention's projections have no bias whatever it says")
    r.known("hc_sinkhorn_iters", "hc_eps", "compress_rope_theta", "qk_rope_head_dim",
            "num_nextn_predict_layers")
    notes = ["the key is the value: one head of head_dim, projected once, cached once on the compressed "
             "layers"]
    if r.get("num_nextn_predict_layers"):
        notes.append(f"num_nextn_predict_layers = {r.get('num_nextn_predict_layers')}: transformers builds "
                     "no multi-token-prediction layer (its checkpoint weights are skipped), so calc counts "
                     "none")
    if hash_layers:
        notes.append(f"{hash_layers} hash-routed layers: a token runs the k_E experts its row of the saved "
                     "token → experts table names (V × k_E entries, counted in the total and, like an "
                     "embedding table, in the active count), so active counts k_E experts there as elsewhere")
    csa = kinds["compressed_sparse_attention"]
    fields = {**fields, "sliding_window": r.integer("sliding_window"),
              "n_window_layers": kinds["sliding_attention"],
              "compressed": CompressedAttention(
                  csa_layers=csa, hca_layers=kinds["heavily_compressed_attention"],
                  csa_rate=rates["compressed_sparse_attention"],
                  hca_rate=rates["heavily_compressed_attention"],
                  out_groups=r.integer("o_groups"), out_rank=r.integer("o_lora_rank"),
                  hc_mult=r.integer("hc_mult"), hash_layers=hash_layers)}
    if csa:
        fields.update(index_topk=r.integer("index_topk"), index_heads=r.integer("index_n_heads"),
                      index_head_dim=r.integer("index_head_dim"))
    else:
        r.known("index_topk", "index_n_heads", "index_head_dim")
    return noted(fields, *notes)


def _v4_hash_layers(r: Reader, n: int) -> int:
    """Layers routed by the token → experts table: ``hash_moe`` entries of ``mlp_layer_types``, else the first
    ``num_hash_layers`` (3)."""
    types = r.get("mlp_layer_types")
    if types is None:
        return min(n, r.count("num_hash_layers") if r.get("num_hash_layers") is not None else 3)
    r.known("num_hash_layers")
    if not isinstance(types, list) or len(types) != n or set(types) - {"hash_moe", "moe"}:
        return int(r.invalid("mlp_layer_types", f"must list {n} of 'hash_moe' or 'moe', got {types!r}", 0))
    return types.count("hash_moe")


def qwen2_bias(r: Reader, fields: Fields) -> Fields:
    # Qwen2Attention: q, k, v projections with a bias, o without; attention_bias is not a Qwen2 key.
    return {**fields, "qkv_bias": r.boolean("qkv_bias", True)}


def cohere_parts(r: Reader, fields: Fields) -> Fields:
    """Cohere: one LayerNorm (a weight, no bias) per layer before parallel attention and MLP; with
    ``use_qk_norm`` (Command R+), a norm per query and key head."""
    fields = no_extra_biases(r, fields)
    return {**noted(fields, "parallel attention and MLP behind one shared norm"), "parallel_block": True,
            "qk_norm": r.boolean("use_qk_norm", False), "qk_norm_per_head": True}


def stablelm_parts(r: Reader, fields: Fields) -> Fields:
    """StableLM: LayerNorms with a bias, optional Q, K, V biases, optional per-head q/k norms (a weight
    each), and with ``use_parallel_residual`` one norm per layer instead of two."""
    parallel = r.boolean("use_parallel_residual", False)
    return {**fields, "qkv_bias": r.boolean("use_qkv_bias", False),
            "qk_norm": r.boolean("qk_layernorm", False),
            "qk_norm_per_head": True, "norms_per_layer": 1 if parallel else 2, "parallel_block": parallel}


def starcoder2_parts(r: Reader, fields: Fields) -> Fields:
    """StarCoder2: GQA with biases on Q, K, V, O and the dense MLP (``use_bias``), LayerNorm with a bias."""
    bias = r.boolean("use_bias", True)
    return window_on_every_layer(r, {**fields, "qkv_bias": bias, "o_bias": bias, "mlp_bias": bias})


def phi_parts(r: Reader, fields: Fields) -> Fields:
    """Phi-1/1.5/2: one LayerNorm per layer before parallel attention and MLP, biases everywhere, a biased
    unembedding."""
    r.refuse("qk_layernorm", True, "Phi's LayerNorms on queries and keys")
    return {**noted(fields, "parallel attention and MLP behind one shared LayerNorm"), "parallel_block": True}


def gpt_bigcode_parts(r: Reader, fields: Fields) -> Fields:
    """GPTBigCode (SantaCoder, StarCoder): GPT-2 with one key/value head (``multi_query``)."""
    return {**fields, "n_kv_heads": 1 if r.boolean("multi_query", True) else fields["n_heads"]}


def neox_parts(r: Reader, fields: Fields) -> Fields:
    r.refuse("attention_bias", False, "the GPT-NeoX layout has biases on every projection")
    parallel = r.boolean("use_parallel_residual", True)
    block = "parallel attention and MLP (x + attn(ln1 x) + mlp(ln2 x))" if parallel else "sequential blocks"
    return {**noted(fields, f"{block}; the count is the same either way"), "parallel_block": parallel}


def phi3_parts(r: Reader, fields: Fields) -> Fields:
    fields = window_on_every_layer(r, no_extra_biases(r, fields))
    return noted(fields,
                 "Q, K, V fused in one matrix and gate, up in another: the same count as separate ones.")


@dataclass(frozen=True)
class ModelType:
    """How one ``model_type``'s config.json maps onto [Config][calc.Config]."""

    body: Callable[[Reader], Fields] = llama_body
    parts: tuple[Part, ...] = (no_extra_biases,)
    features: Mapping[str, Any] = field(default_factory=dict)  # fixed by the architecture
    # transformers' defaults of keys a file may omit
    defaults: Mapping[str, Any] = field(default_factory=dict)
    keys: Mapping[str, str] = field(default_factory=lambda: LLAMA_KEYS)  # calc field → config.json key
    # keys of this type beside IGNORED that carry no parameters and change no figure: transformers reads
    # them only at run time, or not at all (an old alias its config class dropped)
    ignored: frozenset[str] = frozenset()

    def read(self, r: Reader) -> Fields:
        """Config fields from ``r``; with a lenient ``r``, every part is read whatever an earlier one met
        (the keys it would read are in ``r.used``, its errors in ``r.problems``)."""
        fields: Fields = {}
        for part in (lambda r, _: {**self.body(r), **self.features}, *self.parts):  # the body, then each part
            try:
                fields = part(r, fields)
            except (ConfigError, TypeError, ValueError, KeyError) as err:
                if not r.lenient:
                    raise
                r.problems.append(err if isinstance(err, ConfigError) else ConfigError("config", repr(err)))
        return fields

    def unread(self, r: Reader) -> list[str]:
        """The keys of ``r.raw`` that this type neither read nor ignores (sorted)."""
        return sorted(set(r.raw) - r.used - IGNORED - self.ignored)


GPT2_KEYS = {"n_layers": "n_layer", "d_model": "n_embd", "n_heads": "n_head", "n_ctx": "n_positions",
             "d_ff": "n_inner", "tied_embeddings": "tie_word_embeddings"}
DEEPSEEK_KEYS = {
    **LLAMA_KEYS, "d_head": "qk_nope_head_dim", "d_rope": "qk_rope_head_dim", "d_value": "v_head_dim",
    "n_experts": "n_routed_experts", "experts_per_token": "num_experts_per_tok",
                 "d_expert": "moe_intermediate_size",
    "n_dense_layers": "first_k_dense_replace"}
DSA_KEYS = {**DEEPSEEK_KEYS, "n_sparse_layers": "layer_types", "index_heads": "index_n_heads"}
QWEN_MOE_KEYS = {**LLAMA_KEYS, "n_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                 "d_expert": "moe_intermediate_size", "n_dense_layers": "mlp_only_layers"}
# GPT-2's n_ctx (the old name of n_positions, unread since transformers 4) and the summary head of
# GPT2DoubleHeadsModel, which a causal LM does not have.
GPT2_IGNORED = frozenset({"n_ctx", "summary_type", "summary_use_proj", "summary_activation",
                          "summary_proj_to_labels", "summary_first_dropout",
                          "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
# transformers' Qwen2/Qwen3 configs: a window of 4,096 from layer 28 on, where use_sliding_window is set
QWEN_WINDOW = {"sliding_window": 4096, "max_window_layers": 28}
TYPES: dict[str, ModelType] = {
    "gpt2": ModelType(gpt2_body, parts=(), keys=GPT2_KEYS, ignored=GPT2_IGNORED),
    "gpt_bigcode": ModelType(gpt2_body, parts=(gpt_bigcode_parts,), keys=GPT2_KEYS, ignored=GPT2_IGNORED),
    "opt": ModelType(opt_body, parts=(), keys={**LLAMA_KEYS, "d_ff": "ffn_dim"}),
    "gpt_neox": ModelType(neox_body, parts=(neox_parts,), defaults={"rotary_pct": 0.25}),
    "phi": ModelType(llama_body, parts=(phi_parts,),
                     features={"arch": "neox", "norms_per_layer": 1, "lm_head_bias": True}),
    # mlp_type and norm_type: keys of StarCoder2's original code; transformers' model is fixed (LayerNorm,
    # a dense MLP) and does not read them
    "starcoder2": ModelType(llama_body, parts=(starcoder2_parts,), features={"arch": "neox"},
                            defaults={"tie_word_embeddings": True},
                            ignored=frozenset({"mlp_type", "norm_type"})),
    # where the residual branches off (before or after the norm): the same weights; num_key_value_heads:
    # what FalconConfig derives from num_kv_heads and multi_query for the cache (it writes it, never reads it)
    "falcon": ModelType(falcon_body, parts=(), defaults={"max_position_embeddings": 2048},
                        ignored=frozenset({"apply_residual_connection_post_layernorm",
                                           "num_key_value_heads"})),
    "llama": ModelType(),
    "mistral": ModelType(parts=(no_extra_biases, window_on_every_layer)),
    "mixtral": ModelType(parts=(no_extra_biases, window_on_every_layer, mixtral_experts),
                         keys={**LLAMA_KEYS, "n_experts": "num_local_experts",
                               "experts_per_token": "num_experts_per_tok", "d_expert": "intermediate_size"}),
    "phi3": ModelType(parts=(phi3_parts,)),
    "gemma": ModelType(defaults={"tie_word_embeddings": True}),
    # sliding_window_size: an old alias of sliding_window, which Gemma2Config does not read
    "gemma2": ModelType(parts=(no_extra_biases, gemma_window(None)), defaults={"tie_word_embeddings": True},
                        ignored=frozenset({"sliding_window_size"})),
    "gemma3_text": ModelType(parts=(no_extra_biases, gemma_window("sliding_window_pattern")),
                             features={"qk_norm": True}, defaults={"tie_word_embeddings": True}),
    # Gemma 4's text model; final_logit_softcapping, use_bidirectional_attention "vision" (vision tokens only)
    # and the RoPE per layer kind add no weights
    "gemma4_text": ModelType(parts=(no_extra_biases, gemma4_layers, gemma4_experts),
                             features={"qk_norm": True, "layer_scalar": True},
                             defaults={"tie_word_embeddings": True, "head_dim": 256,
                                       "vocab_size_per_layer_input": 262_144},
                             keys={**LLAMA_KEYS, "d_head_full": "per_layer_config",
                                   "n_kv_heads_full": "per_layer_config",
                                   "n_kv_shared_layers": "num_kv_shared_layers",
                                   "per_layer_input": "hidden_size_per_layer_input",
                                   "per_layer_vocab": "vocab_size_per_layer_input",
                                   "n_experts": "num_experts", "experts_per_token": "top_k_experts",
                                   "d_expert": "moe_intermediate_size"}),
    "qwen2": ModelType(parts=(qwen2_bias, qwen_window), defaults=QWEN_WINDOW),
    "qwen2_moe": ModelType(parts=(qwen2_bias, qwen2_moe_window, qwen_experts), keys=QWEN_MOE_KEYS,
                           defaults=QWEN_WINDOW),
    "qwen3": ModelType(parts=(no_extra_biases, qwen_window), features={"qk_norm": True},
                       defaults=QWEN_WINDOW),
    "qwen3_moe": ModelType(parts=(no_extra_biases, qwen3_moe_window, qwen_experts),
                           features={"qk_norm": True}, keys=QWEN_MOE_KEYS, defaults={"sliding_window": 4096}),
    # Qwen3NextConfig has no window: files that carry Qwen3's window keys leave every attention layer full
    "qwen3_next": ModelType(parts=(no_extra_biases, qwen3_next_layers, qwen_experts),
                            features={"qk_norm": True, "attention_output_gate": True}, keys=QWEN_MOE_KEYS,
                            ignored=frozenset({"use_sliding_window", "sliding_window", "max_window_layers"})),
    # Qwen3.5 (the text model of Qwen3_5Config): Qwen3-Next's Gated DeltaNet and gated attention layers,
    # listed in layer_types, with a dense MLP or (qwen3_5_moe) experts and a gated shared expert on each layer
    "qwen3_5_text": ModelType(parts=(no_extra_biases, qwen3_next_layers),
                              features={"qk_norm": True, "attention_output_gate": True}),
    "qwen3_5_moe_text": ModelType(experts_only_body, parts=(no_extra_biases, qwen3_next_layers, qwen_experts),
                                  features={"qk_norm": True, "attention_output_gate": True},
                                  keys=QWEN_MOE_KEYS),
    # LongCat-Flash: MLA (the DeepSeek layout), dense MLPs and experts with zero experts
    "longcat_flash": ModelType(longcat_body, parts=(mla, mla_derived, no_mtp),
                               keys={**DEEPSEEK_KEYS, "n_layers": "num_layers", "d_ff": "ffn_hidden_size",
                                     "experts_per_token": "moe_topk", "d_expert": "expert_ffn_hidden_size",
                                     "n_dense_layers": "num_layers", "n_zero_experts": "zero_expert_num"},
                               defaults={"zero_expert_num": 256}),
    # MiMo-V2-Flash; attention_value_scale: a scalar on the values (no weight)
    "mimo_v2_flash": ModelType(parts=(mimo_v2_layers, mimo_v2_experts),
                               keys={**LLAMA_KEYS, "n_experts": "n_routed_experts",
                                     "experts_per_token": "num_experts_per_tok",
                                     "d_expert": "moe_intermediate_size", "n_dense_layers": "mlp_layer_types",
                                     "d_value": "v_head_dim", "n_kv_heads_window": "num_key_value_heads"},
                               defaults={"head_dim": 192, "v_head_dim": 128},
                               ignored=frozenset({"attention_value_scale"})),
    # Qwen3-VL's text model (Qwen3VLTextConfig): Qwen3's layers (q/k norms shared by the heads), no window;
    # its multimodal rotary sections (mrope_section in the RoPE parameters) add no parameters
    "qwen3_vl_text": ModelType(parts=(no_extra_biases,), features={"qk_norm": True}),
    # Qwen3VLMoeTextConfig saves num_experts as num_local_experts, and sets sliding_window to null whatever
    # the file says (no layer has a window)
    "qwen3_vl_moe_text": ModelType(parts=(no_extra_biases, local_experts_alias, qwen_experts),
                                   features={"qk_norm": True}, defaults={"tie_word_embeddings": True},
                                   keys=QWEN_MOE_KEYS, ignored=frozenset({"sliding_window"})),
    # Nemotron-H and Nemotron 3 (NemotronHConfig). Read by no weight: attention_bias and sliding_window (its
    # attention has neither), expand (the Mamba-2 width is heads × head width), mamba_proj_bias (use_bias
    # is), n_shared_experts (one shared MLP whatever), the Mamba step's initialisation and limits, the scan's
    # chunking and kernels, the cache's dtype, the residual's dtype and the initialisation's rescaling
    "nemotron_h": ModelType(nemotron_h_body, parts=(),
                            keys={**LLAMA_KEYS, "n_layers": "layers_block_type",
                                  "n_mamba_layers": "layers_block_type", "n_experts": "n_routed_experts",
                                  "experts_per_token": "num_experts_per_tok",
                                  "d_expert": "moe_intermediate_size", "n_dense_layers": "layers_block_type",
                                  "n_mlp_free_layers": "layers_block_type"},
                            defaults={"head_dim": 128},
                            ignored=frozenset({
                                "attention_bias", "sliding_window", "expand", "mamba_expand",
                                "mamba_proj_bias", "n_shared_experts", "moe_shared_expert_overlap",
                                "time_step_min", "time_step_max", "time_step_limit", "time_step_floor",
                                "mamba_dt_min",
                                "mamba_dt_max", "mamba_dt_limit", "mamba_dt_init_floor", "chunk_size",
                                "mamba_chunk_size", "use_mamba_kernels", "mamba_ssm_cache_dtype",
                                "residual_in_fp32", "rescale_prenorm_residual", "mamba_hidden_act",
                                "mlp_hidden_act"})),
    # SmolLM3Config has no max_window_layers (its windows follow the NoPE layers)
    "smollm3": ModelType(parts=(no_extra_biases, smollm3_layers), defaults={"tie_word_embeddings": True},
                         ignored=frozenset({"max_window_layers"})),
    "olmo2": ModelType(features={"qk_norm": True, "qk_norm_per_head": True}),
    "cohere": ModelType(parts=(cohere_parts,), features={"norms_per_layer": 1},
                        defaults={"tie_word_embeddings": True}),
    "stablelm": ModelType(parts=(stablelm_parts,), features={"norm_bias": True}),
    # use_qk_norm: an L2 norm without weights; floor_scale, attn_scale and attn_temperature_tuning: the
    # NoPE layers' temperature
    "llama4_text": ModelType(parts=(no_extra_biases, llama4_layers, llama4_experts),
                             keys={**LLAMA_KEYS, "d_ff": "intermediate_size_mlp",
                                   "d_expert": "intermediate_size",
                                   "n_experts": "num_local_experts",
                                   "experts_per_token": "num_experts_per_tok"},
                             ignored=frozenset({"use_qk_norm", "floor_scale", "attn_scale",
                                                "attn_temperature_tuning"})),
    # JambaConfig reads neither sliding_window nor use_mamba_kernels (deprecated: kernels as available);
    # use_mambapy and use_associative_scan: how the Mamba scan runs without its CUDA kernels (no weights)
    "jamba": ModelType(parts=(no_extra_biases, jamba_layers),
                       keys={**LLAMA_KEYS, "n_experts": "num_experts",
                             "experts_per_token": "num_experts_per_tok",
                             "n_mamba_layers": "attn_layer_period", "n_dense_layers": "expert_layer_period"},
                       ignored=frozenset({"sliding_window", "use_mamba_kernels", "use_mambapy",
                                          "use_associative_scan"})),
    # V3's sigmoid router keeps a score-correction bias per expert (a saved buffer); V2's softmax router none
    "deepseek_v2": ModelType(parts=(mla, deepseek_experts), keys=DEEPSEEK_KEYS),
    "deepseek_v3": ModelType(parts=(mla, deepseek_experts), features={"router_bias": True},
                             keys=DEEPSEEK_KEYS),
    # DeepseekV32Config fixes MLA's query LoRA and the router's score correction as V3's, and adds the indexer
    "deepseek_v32": ModelType(parts=(mla, deepseek_experts, dsa_indexer, mla_derived),
                              features={"router_bias": True}, keys=DSA_KEYS),
    # GLM-5 (GlmMoeDsaConfig): DeepSeek V3.2's layout with its own sizes
    "glm_moe_dsa": ModelType(parts=(mla, deepseek_experts, dsa_indexer, mla_derived, glm_indexers),
                             features={"router_bias": True}, keys=DSA_KEYS),
    # DeepSeek V4 (DeepseekV4Config): windowed, CSA and HCA layers, hyper-connections, hash-routed layers
    "deepseek_v4": ModelType(deepseek_v4_body, parts=(deepseek_v4_layers,),
                             keys={**LLAMA_KEYS, "d_ff": "moe_intermediate_size",
                                   "n_experts": "n_routed_experts",
                                   "experts_per_token": "num_experts_per_tok",
                                   "d_expert": "moe_intermediate_size", "q_lora_rank": "q_lora_rank",
                                   "compressed": "layer_types", "compressed.out_groups": "o_groups",
                                   "compressed.hash_layers": "mlp_layer_types",
                                   "index_topk": "index_topk", "index_heads": "index_n_heads",
                                   "index_head_dim": "index_head_dim"}),
    # OLMo 3: OLMo 2 with three sliding-window layers to one full (Olmo3Config's rule; layer_types lists them)
    "olmo3": ModelType(parts=(no_extra_biases, olmo3_window),
                       features={"qk_norm": True, "qk_norm_per_head": True}),
    # MiniMax M2: experts of intermediate_size on every layer, a sigmoid router with a score-correction bias
    # (a saved buffer), RMSNorms over the whole width of Q and K
    "minimax_m2": ModelType(parts=(no_extra_biases, mixtral_experts),
                            features={"qk_norm": True, "qk_norm_per_head": True, "router_bias": True},
                            keys={**LLAMA_KEYS, "n_experts": "num_local_experts",
                                  "experts_per_token": "num_experts_per_tok",
                                  "d_expert": "intermediate_size"}),
    # ERNIE 4.5 (dense): use_bias puts a bias on Q, K, V, O and the MLP's projections
    "ernie4_5": ModelType(parts=(ernie_bias,), defaults={"tie_word_embeddings": True}),
    # moe_norm_min: the floor of the router's renormalization (no parameters)
    "ernie4_5_moe": ModelType(parts=(ernie_experts,), defaults={"tie_word_embeddings": True},
                              keys={**LLAMA_KEYS, "n_experts": "moe_num_experts",
                                    "experts_per_token": "moe_k", "d_expert": "moe_intermediate_size",
                                    "n_dense_layers": "moe_layer_start_index"},
                              ignored=frozenset({"moe_norm_min"})),
    # experts_per_token: a copy of num_experts_per_tok that GptOssConfig does not read;
    # initial_context_length: the context before YaRN scaling
    "gpt_oss": ModelType(parts=(gpt_oss_parts,),
                         keys={**LLAMA_KEYS, "n_experts": "num_local_experts",
                               "experts_per_token": "num_experts_per_tok", "d_expert": "intermediate_size"},
                         ignored=frozenset({"experts_per_token", "initial_context_length"})),
}
# The key of each type's MLP activation where it is not hidden_act (what its transformers model passes to
# ACT2FN); it adds no parameters, but what the activation keeps for its backward is training memory.
ACTIVATION_KEYS = {"gpt2": "activation_function", "gpt_bigcode": "activation_function",
                   "opt": "activation_function", "falcon": "activation", "gemma2": "hidden_activation",
                   "gemma3_text": "hidden_activation", "gemma4_text": "hidden_activation",
                   "nemotron_h": "mlp_hidden_act"}
# Multimodal configs hold their language model in text_config.
OUTER = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "llama4": "llama4_text", "qwen3_5": "qwen3_5_text",
         "qwen3_5_moe": "qwen3_5_moe_text", "qwen3_vl": "qwen3_vl_text", "qwen3_vl_moe": "qwen3_vl_moe_text"}
SUPPORTED = (*TYPES, *OUTER)


def check_rope(r: Reader) -> tuple[list[str], Any]:
    """Refuse a RoPE scaling transformers does not implement (calc would not know what it changes); name the
    partial rotary fraction, which changes no count, and return it (None: rotary on every dimension, or
    none), the file's or the type's default."""
    notes = []
    fractions = []
    for key in ("rope_scaling", "rope_parameters"):
        value = r.raw.get(key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"must be an object or null, got {value!r}")
        # transformers ≥ 5 may nest one set per layer kind (Gemma 3: full_attention, sliding_attention)
        sets = [value] if not value or not all(isinstance(v, Mapping) for v in value.values()) else list(
            value.values())
        for params in sets:
            kind = params.get("rope_type", params.get("type", "default"))
            if kind not in ROPE_TYPES:
                raise ConfigError(key,
                                  f"RoPE scaling {kind!r} is not one calc knows ({', '.join(ROPE_TYPES)}); "
                                  "refusing rather than guessing what it changes")
            fractions.append(params.get("partial_rotary_factor"))
    for key in ("partial_rotary_factor", "rotary_pct"):
        fractions.append(r.raw.get(key, r.defaults.get(key)))
    factor = next((x for x in fractions if x not in (None, 1, 1.0)), None)
    if factor is not None:
        notes.append(f"rotary on a fraction {factor} of each head's dimensions (no parameters)")
    return notes, factor


def closest_type(raw: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The supported type whose reader places most of ``raw``'s keys (one that reads the whole file
    first), and the keys of ``raw`` it did not place (sorted; the keys in IGNORED and INERT never count).

    Each type's placement counts every key it would read, whatever it found missing or wrong on the way
    (a lenient Reader): a file that lacks one key a family reads first still finds that family."""
    best: tuple[tuple[bool, int], str, list[str]] | None = None
    keys = set(raw) - IGNORED - set(INERT)
    for name, kind in TYPES.items():
        r = Reader(raw, kind.defaults, lenient=True)
        kind.read(r)
        unplaced = [key for key in kind.unread(r) if key not in INERT]
        score = (not r.problems, len(keys) - len(unplaced))
        if best is None or score > best[0]:
            best = (score, name, unplaced)
    assert best is not None
    return best[1], best[2]


def read_config(raw: Mapping[str, Any]) -> tuple[str, Reader, Fields]:
    """The supported model_type of ``raw``, the Reader that read it, and the Config fields it read
    (errors as in `from_config`)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("config", f"must be a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type")
    tower = vision_tower(raw)
    if model_type in OUTER:
        text = raw.get("text_config")
        if not isinstance(text, Mapping):
            raise ConfigError("text_config",
                              f"missing (a {model_type} config holds the language model there)")
        # the multimodal model ties its head to the text embedding as its outer config says (Qwen3-VL-MoE's
        # text config keeps a default of its own that the multimodal model does not read)
        tie = {"tie_word_embeddings": raw["tie_word_embeddings"]} if "tie_word_embeddings" in raw else {}
        model_type = OUTER[model_type]
        raw = {**text, **tie, "model_type": model_type}
    if not isinstance(model_type, str) or model_type not in TYPES:
        if model_type is None:
            raise ConfigError("model_type", f"missing; supported: {', '.join(SUPPORTED)}")
        closest, unplaced = closest_type(raw)
        shown = ", ".join(unplaced[:8]) + (f" and {len(unplaced) - 8} more" if len(unplaced) > 8 else "")
        placed = f"which could not place {shown}" if unplaced else (
            "whose reader places every key of this file")
        raise ConfigError("model_type", f"{model_type!r} is not supported; the closest supported type is "
                          f"{closest!r}, {placed}; supported: {', '.join(SUPPORTED)}")
    kind = TYPES[model_type]
    r = Reader(raw, kind.defaults)
    rope_notes, fraction = check_rope(r)
    fields = noted(kind.read(r), *rope_notes)
    # Gemma 4's fraction is its full layers' (a head width of their own): no one d_rotary for every layer
    if (isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0 < fraction < 1
            and not fields.get("d_head_full")):
        fields["d_rotary"] = int(fields["d_head"] * fraction)  # as transformers rounds it (GPT-NeoX)
    act = raw.get(ACTIVATION_KEYS.get(model_type, "hidden_act"))
    if act is not None:  # a name, or absent: the type's default (calc.activations)
        fields["activation"] = act if isinstance(act, str) else r.invalid(
            ACTIVATION_KEYS.get(model_type, "hidden_act"), f"must be an activation's name, got {act!r}", None)
    unread = [key for key in kind.unread(r) if key not in INERT]
    if unread:
        more = f" (and {', '.join(unread[1:])})" if unread[1:] else ""
        raise ConfigError(unread[0], f"not a key calc models for model_type {model_type!r}{more}: it may add "
                          "weights or change a cost, so calc refuses rather than guessing")
    inert = sorted(set(r.raw) & set(INERT))
    for key in inert:
        if not INERT[key].accepts(r.raw[key]):
            shown = " or ".join(map(json.dumps, INERT[key].values or ()))
            raise ConfigError(key, f"{json.dumps(r.raw[key])} is not a value calc can ignore: "
                              f"{INERT[key].reason}; only {shown} changes nothing calc counts, so calc "
                              "refuses rather than guessing")
    if tower is not None:
        fields["vision_parameters"] = tower["total"]
    return model_type, r, {**fields, "ignored_keys": tuple(inert)} if inert else fields


def from_config(raw: Mapping[str, Any], *, name: str | None = None, source: str | None = None) -> Config:
    """The [Config][calc.Config] of a Hugging Face ``config.json`` given as a dict (no network).

    Keys of ``INERT`` are accepted with one ``InertKeyWarning`` naming them (and kept in
    ``Config.ignored_keys``). Raises ``ConfigError`` (a ValueError) naming the config.json key that is
    missing or invalid, or that the type's ledger does not model (a key it neither reads nor knows to
    change nothing: refused rather than guessed), or ``model_type`` when it is not one of ``SUPPORTED``
    (naming the closest supported type and the keys it could not place).
    """
    model_type, r, fields = read_config(raw)
    name = name or model_type
    if fields.get("ignored_keys"):
        warnings.warn(inert_warning(name, fields["ignored_keys"]), InertKeyWarning, stacklevel=2)
    try:
        source = source or f"a Hugging Face config.json (model_type {model_type})"
        return Config(**fields, model_type=model_type, name=name, source=source,
                      hf_config=dict(r.raw))
    except ConfigError as err:
        key = TYPES[model_type].keys.get(err.field, err.field)
        raise ConfigError(key, err.message) from None


def layer_types(raw: Mapping[str, Any]) -> list[str]:
    """Each layer's kind as calc reads ``raw``, in transformers' names (``full_attention``,
    ``sliding_attention``, ``chunked_attention``, ``linear_attention``) and ``mamba``: what the counts
    ``n_window_layers``, ``n_chunked_layers``, ``n_linear_layers`` and ``n_mamba_layers`` count."""
    _, r, fields = read_config(raw)
    return r.kinds if r.kinds is not None else ["full_attention"] * fields["n_layers"]


def load(path: str) -> Config:
    """[from_config][calc.from_config] of the config.json at ``path`` (read from disk; nothing is
    downloaded).

    The model is named after the file (``mixtral-8x7b.json``) or, for a file called config.json, its
    folder (``Mixtral-8x7B-v0.1/config.json``). Errors are ``ConfigError`` naming the key, or
    ``config`` when the file cannot be read or is not JSON.
    """
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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InertKeyWarning)
        config = from_config(raw, name=name, source=f"{path} (Hugging Face config.json)")
    for warning in caught:  # from load's caller, not from here
        warnings.warn(warning.message, warning.category, stacklevel=2)
    return config
