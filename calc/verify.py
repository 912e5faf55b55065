"""``python -m calc.verify``: each preset's checkpoint count against a real model definition.

Builds the Hugging Face ``transformers`` model of every preset from its config on PyTorch's meta
device (shapes only: no weights, no download) and compares ``sum(p.numel())`` (tied weights once)
with :func:`calc.ledger.checkpoint`, and with the count recorded in the preset. Needs ``torch`` and
``transformers``; exit 0 when every buildable preset agrees, 1 otherwise.

GPT-3's XL and 13B rows (h·d_k ≠ d) cannot be built: transformers' GPT-2 ties the head width to
d/h. They are counted by the same formula as the rows that are built.
"""

from __future__ import annotations

import sys
from typing import Any

from calc.ledger import checkpoint
from calc.presets import PRESETS, Config


def build_model(config: Config) -> Any:
    """The transformers causal-LM of ``config`` on the meta device (None if it cannot be built)."""
    import torch
    import transformers as tf

    if config.arch == "gpt":
        if config.attention_width != config.d_model or config.n_kv_heads != config.n_heads:
            return None
        hf_config: Any = tf.GPT2Config(
            vocab_size=config.vocab_size, n_positions=config.n_ctx, n_embd=config.d_model,
            n_layer=config.n_layers, n_head=config.n_heads, n_inner=config.d_ff,
            tie_word_embeddings=config.tied_embeddings,
        )
        model_class: Any = tf.GPT2LMHeadModel
    else:
        kwargs: dict[str, Any] = dict(
            vocab_size=config.vocab_size, hidden_size=config.d_model, intermediate_size=config.d_ff,
            num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
            num_key_value_heads=config.n_kv_heads, max_position_embeddings=config.n_ctx,
            tie_word_embeddings=config.tied_embeddings,
        )
        mistral = config.name.startswith("mistral")
        config_class = tf.MistralConfig if mistral else tf.LlamaConfig
        hf_config = config_class(head_dim=config.d_head, **kwargs)
        model_class = tf.MistralForCausalLM if mistral else tf.LlamaForCausalLM
    with torch.device("meta"):
        return model_class(hf_config)


def verify() -> list[tuple[str, int, int | None, int | None]]:
    """(name, calc's count, the model's count or None, the recorded count) for every preset."""
    rows = []
    for name, config in PRESETS.items():
        model = build_model(config)
        built = None if model is None else sum(p.numel() for p in model.parameters())
        rows.append((name, checkpoint(config)["total"], built, config.published))
    return rows


def main() -> int:
    import transformers

    print(f"transformers {transformers.__version__}, models built on the meta device")
    ok = True
    for name, counted, built, published in verify():
        agree = (built is None or built == counted) and (published is None or published == counted)
        ok &= agree
        verdict = "MISMATCH" if not agree else "formula only" if built is None and published is None else "ok"
        model = "not buildable" if built is None else f"{built:,}"
        recorded = "-" if published is None else f"{published:,}"
        print(f"{name:12} calc {counted:>16,}  model {model:>16}  recorded {recorded:>16}  {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
