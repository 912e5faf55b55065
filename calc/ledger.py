"""Parameter ledgers of a configuration: the source ledger and the checkpoint count.

The source ledger counts weight matrices only, with the embedding and the unembedding counted
separately even when a checkpoint ties them (the accounting of 3Blue1Brown's video and of the
source article: GPT-3 = 175,181,291,520). The checkpoint count is what a released checkpoint of the
architecture stores: biases, norms, learned positions, one copy of tied embeddings.
"""

from __future__ import annotations

from sympy import Expr, Rational, Symbol

from calc import formulas as f
from calc.presets import Config


def values(config: Config) -> dict[Symbol, int]:
    """The formula symbols' values for ``config``."""
    return {
        f.d: config.d_model, f.h: config.n_heads, f.d_k: config.d_head, f.g: config.n_kv_heads,
        f.d_ff: config.d_ff, f.L: config.n_layers, f.V: config.vocab_size, f.n_ctx: config.n_ctx,
    }


def _count(expr: Expr, config: Config) -> int:
    return f.evaluate_count(expr, values(config))


def source_ledger(config: Config) -> dict[str, int | Rational]:
    """Weight matrices by component, with ``total`` and the exact ``attention_share`` (a Rational).

    ``attention_per_head`` is exact for the presets; a custom config whose h/g does not divide
    2·d·d_k gets a Rational there.
    """
    mlp = f.mlp_dense if config.arch == "gpt" else f.mlp_gated
    ledger: dict[str, int | Rational] = {
        "attention_per_head": f.evaluate(f.attention_per_head, values(config)),
        "attention_per_layer": _count(f.attention_per_layer, config),
        "attention": _count(f.attention, config),
        "mlp": _count(mlp, config),
        "embedding": _count(f.embedding, config),
        "unembedding": _count(f.unembedding, config),
    }
    if ledger["attention_per_head"].is_Integer:  # type: ignore[union-attr]
        ledger["attention_per_head"] = int(ledger["attention_per_head"])
    total = sum(int(ledger[k]) for k in ("attention", "mlp", "embedding", "unembedding"))
    ledger["total"] = total
    ledger["attention_share"] = Rational(int(ledger["attention"]), total)
    return ledger


def checkpoint_formulas(config: Config) -> dict[str, Expr]:
    """The checkpoint's components as formulas, with the unembedding only when it is not tied."""
    parts = dict(f.gpt_checkpoint if config.arch == "gpt" else f.llama_checkpoint)
    if not config.tied_embeddings:
        parts["unembedding"] = f.unembedding
    return parts


def checkpoint(config: Config) -> dict[str, int]:
    """Parameters a checkpoint of ``config`` stores, by component, with ``total``: exact integers."""
    parts = {name: _count(expr, config) for name, expr in checkpoint_formulas(config).items()}
    parts["total"] = sum(parts.values())
    return parts


def non_embedding(config: Config) -> int:
    """N of Kaplan et al. 2020: checkpoint parameters less the token and position embeddings.

    An untied unembedding is kept (it is a matmul per token); a tied one is the embedding, excluded.
    """
    parts = checkpoint(config)
    return parts["total"] - parts["token_embedding"] - parts.get("position_embedding", 0)
