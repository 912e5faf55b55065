"""spec — the laws of scaled dot-product attention as Hypothesis properties, runnable against any
implementation."""
