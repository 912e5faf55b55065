"""The bytes PyTorch keeps for the backward pass of a transformers model, layer by layer (needs ``torch`` and
``transformers``; used by ``python -m calc.verify --activations``).

The model is built from a config.json dict with random weights on the CPU, in one dtype, in training mode
(dropout is whatever the config says: the configs measured set it to 0), and run forward on random tokens
with its labels, so the loss is part of the graph. ``torch.autograd.graph.saved_tensors_hooks`` sees every
tensor autograd saves; each storage is counted once, at the first save, and parameters and buffers (model
states, not activations) never. A storage first saved inside decoder layer i belongs to layer i, except what
the model hands every layer (rotary tables, masks), which belongs with the rest of the model: the embedding,
the final norm, the head and the loss.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# One small config.json per model type of calc.activations.LAYOUTS, random weights: shapes chosen so that no
# two terms coincide (h ≠ g, d_k ≠ n, d_ff ≠ d), dropout 0, and for the hybrid both kinds of mixer and MLP.
_SMALL = {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 160,
          "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 64}
SPECS: dict[str, dict[str, Any]] = {
    "gpt2": {"model_type": "gpt2", "n_embd": 96, "n_head": 6, "n_layer": 2, "n_positions": 64,
             "vocab_size": 256, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0,
             "eos_token_id": 0},
    "llama": {"model_type": "llama", **_SMALL},
    "mistral": {"model_type": "mistral", **_SMALL, "sliding_window": None},
    "qwen2": {"model_type": "qwen2", **_SMALL},
    "qwen3": {"model_type": "qwen3", **_SMALL, "head_dim": 16},
    "mixtral": {"model_type": "mixtral", **_SMALL, "num_local_experts": 4, "num_experts_per_tok": 2},
    "gpt_neox": {"model_type": "gpt_neox", **{k: v for k, v in _SMALL.items() if k != "num_key_value_heads"},
                 "rotary_pct": 0.25, "use_parallel_residual": True, "hidden_dropout": 0.0,
                 "attention_dropout": 0.0},
    # its Mamba layers take transformers' PyTorch path (the one without mamba-ssm and causal-conv1d installed)
    "jamba": {"model_type": "jamba", **_SMALL, "num_hidden_layers": 4, "num_experts": 4,
              "num_experts_per_tok": 2, "attn_layer_period": 2, "attn_layer_offset": 1,
              "expert_layer_period": 2, "expert_layer_offset": 1, "mamba_d_state": 8, "mamba_d_conv": 4,
              "mamba_expand": 2, "mamba_dt_rank": 12},
}
SHAPES = ((40, 2), (17, 1))  # (n, micro-batch): a micro-batch of one turns some copies into views
ATTENTIONS = {"eager": "eager", "flash": "sdpa"}  # calc's names → transformers' attn_implementation


@dataclass(frozen=True)
class Measured:
    """Bytes saved for the backward pass: each decoder layer's (with its kind, ``mixer+mlp``) and the
    rest of the model's."""

    layers: tuple[tuple[str, int], ...]
    head: int


def _tensors(value: Any) -> Iterator[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)


def layer_kind(layer: Any) -> str:
    """``mixer+mlp`` of a decoder layer, from its modules: ``attention`` or ``mamba``; ``moe`` where its MLP
    has experts, else ``dense``."""
    mixer = "mamba" if hasattr(layer, "mamba") else "attention"
    mlp = next((getattr(layer, name) for name in ("mlp", "feed_forward") if hasattr(layer, name)), None)
    return f"{mixer}+{'moe' if hasattr(mlp, 'experts') else 'dense'}"


def decoder_layers(model: Any) -> Any:
    base = model.base_model
    for name in ("layers", "h"):
        if hasattr(base, name):
            return getattr(base, name)
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


def measure(raw: Mapping[str, Any], *, n: int, micro_batch: int, dtype: str, attention: str,
            seed: int = 0) -> Measured:
    """Bytes saved for backward by the transformers model of ``raw`` (a config.json dict) on
    ``micro_batch`` random sequences of ``n`` tokens, with their labels, in ``dtype`` (fp32, bf16, fp16),
    with ``attention`` ``eager`` or ``flash`` (transformers' sdpa)."""
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()  # its notes on small random configs and kernel fallbacks
    config = dict(raw)
    hf = tf.AutoConfig.for_model(config.pop("model_type"), **config)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(hf, attn_implementation=ATTENTIONS[attention],
                                                experts_implementation="eager")
    model = model.to(getattr(torch, TORCH_DTYPES[dtype])).train()
    states = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    shared: set[int] = set()  # what the model hands every layer besides its hidden states
    current: list[int | None] = [None]
    layers = decoder_layers(model)

    def enter(index: int, args: tuple, kwargs: dict) -> None:
        current[0] = index
        given = {key: value for key, value in kwargs.items() if key != "hidden_states"}
        rest = args[1:] if args else ()  # the hidden states belong to the layer: its norm keeps them
        shared.update(t.untyped_storage().data_ptr() for t in (*_tensors(rest), *_tensors(given)))

    handles = []
    for index, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(
            lambda module, args, kwargs, index=index: enter(index, args, kwargs), with_kwargs=True))
        handles.append(layer.register_forward_hook(lambda module, args, out: current.__setitem__(0, None)))
    owner: dict[int, tuple[int | None, int]] = {}

    def pack(tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in states and pointer not in owner:
            owner[pointer] = (None if pointer in shared else current[0], storage.nbytes())
        return tensor

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, hf.vocab_size, (micro_batch, n), generator=generator)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(input_ids=ids, labels=ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    per_layer = [0] * len(layers)
    head = 0
    for layer_index, size in owner.values():
        if layer_index is None:
            head += size
        else:
            per_layer[layer_index] += size
    return Measured(tuple((layer_kind(layer), per_layer[i]) for i, layer in enumerate(layers)), head)


@dataclass(frozen=True)
class Check:
    """One layer kind of one measured model: calc's bytes and PyTorch's."""

    model_type: str
    attention: str
    dtype: str
    n: int
    micro_batch: int
    kind: str  # mixer+mlp of a decoder layer, or "head" (everything outside the layers)
    layers: int  # how many layers of the model are of this kind
    predicted: int
    measured: tuple[int, ...]  # each such layer's

    @property
    def exact(self) -> bool:
        return all(size == self.predicted for size in self.measured)


def check(names: tuple[str, ...] | None = None, *, shapes: tuple[tuple[int, int], ...] = SHAPES,
          dtypes: tuple[str, ...] = ("fp32", "bf16"),
          attentions: tuple[str, ...] = ("eager", "flash")) -> list[Check]:
    """calc.activations' bytes against ``measure``'s for the ``SPECS`` named (all), per layer kind."""
    import warnings

    from calc import activations
    from calc.hf import from_config

    rows = []
    for name in names or tuple(SPECS):
        config = from_config(SPECS[name], name=name)
        cases = ((shape, dtype, kind) for shape in shapes for dtype in dtypes for kind in attentions)
        for (n, micro_batch), dtype, attention in cases:
            predicted = activations.per_layer(config, n, attention=attention, micro_batch=micro_batch,
                                              dtype=dtype)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # transformers' notes on the small configs
                measured = measure(SPECS[name], n=n, micro_batch=micro_batch, dtype=dtype,
                                   attention=attention)
            kinds: dict[str, list[int]] = {}
            for kind, size in measured.layers:
                kinds.setdefault(kind, []).append(size)
            kinds["head"] = [measured.head]
            for kind, sizes in kinds.items():
                parts = kind.split("+")
                rows.append(Check(name, attention, dtype, n, micro_batch, kind, len(sizes),
                                  sum(predicted[part] for part in parts), tuple(sizes)))
    return rows
