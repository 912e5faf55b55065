"""spec — the laws of scaled dot-product attention as Hypothesis properties, runnable against any
implementation."""

from spec.target import BUILTIN, Target, TargetError, as_target, load_target

__all__ = ["BUILTIN", "Target", "TargetError", "as_target", "load_target"]
