"""The causal-mask experiment of the article "How an LLM Works, Part 6: Attention", generalised.

Random tokens go through one random attention head twice, the second time with the vector at one
position changed. With the causal mask every output before that position must be bit-for-bit the
same (information flows only forward); without it the earlier outputs move.
"""

from __future__ import annotations

import numpy as np

from impl.layers import self_attention


def leak_experiment(
    *, n_tokens: int = 16, changed: int = 10, d: int = 32, d_k: int = 8, causal: bool, seed: int = 0
) -> np.ndarray:  # -> [n_tokens]
    """Max |output change| at each position after changing the token at ``changed``."""
    if not 0 <= changed < n_tokens:
        raise ValueError(f"changed must lie in [0, n_tokens={n_tokens}), got {changed}")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_tokens, d))
    wq, wk, wv = (rng.standard_normal((d, d_k)) / np.sqrt(d) for _ in range(3))
    x_changed = x.copy()
    x_changed[changed] = rng.standard_normal(d)
    before, _ = self_attention(x, wq, wk, wv, causal=causal)
    after, _ = self_attention(x_changed, wq, wk, wv, causal=causal)
    return np.max(np.abs(after - before), axis=-1)
