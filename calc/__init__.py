"""calc — SymPy parameter ledgers and n² memory / FLOP / time tables for real model configurations.

    >>> from calc import preset, source_ledger
    >>> source_ledger(preset("gpt3"))["attention_per_layer"]
    603979776
"""

from calc.formulas import recall_ceiling, score_variance
from calc.ledger import checkpoint, non_embedding, source_ledger
from calc.presets import PRESETS, Config, ConfigError, UnknownModel, custom, preset
from calc.report import build, render

__all__ = [
    "PRESETS",
    "Config",
    "ConfigError",
    "UnknownModel",
    "build",
    "checkpoint",
    "custom",
    "non_embedding",
    "preset",
    "recall_ceiling",
    "render",
    "score_variance",
    "source_ledger",
]
