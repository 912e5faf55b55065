"""calc — SymPy parameter ledgers and n² memory / FLOP / time tables for real model configurations.

    >>> from calc import preset, source_ledger
    >>> source_ledger(preset("gpt3"))["attention_per_layer"]
    603979776

Any Hugging Face config.json, as a dict (``calc.from_config``) or a file (``calc.load``):

    >>> from calc import active, checkpoint, from_config
    >>> mixtral = from_config({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    ...     "max_position_embeddings": 32768, "num_attention_heads": 32, "num_experts_per_tok": 2,
    ...     "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "vocab_size": 32000})
    >>> checkpoint(mixtral)["total"], active(mixtral)
    (46702792704, 12879925248)
"""

from calc.formulas import recall_ceiling, score_variance
from calc.hf import SUPPORTED, from_config, load
from calc.ledger import active, checkpoint, non_embedding, source_ledger
from calc.presets import PRESETS, Config, ConfigError, UnknownModel, custom, preset
from calc.report import build, render

__all__ = [
    "PRESETS",
    "SUPPORTED",
    "Config",
    "ConfigError",
    "UnknownModel",
    "active",
    "build",
    "checkpoint",
    "custom",
    "from_config",
    "load",
    "non_embedding",
    "preset",
    "recall_ceiling",
    "render",
    "score_variance",
    "source_ledger",
]
