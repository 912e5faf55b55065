"""calc — SymPy parameter ledgers and n² memory / FLOP / time tables for real model configurations."""
