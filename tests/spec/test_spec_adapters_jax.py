"""spec.adapters.jax: the built-in jax target takes the suite's keywords in JAX's own spelling."""

from __future__ import annotations

import numpy as np
import pytest

from spec import oracle
from spec.inputs import Inputs


def test_jax_target_keywords_are_jaxs_own():
    pytest.importorskip("jax")
    from spec.adapters.jax import jax_attention

    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 3, n, 4)).astype(np.float32) for n in (5, 7, 7))
    lengths = np.array([3, 7])
    out, lse = jax_attention(q, k, v, kv_lengths=lengths, window=(2, 1), causal=True, return_lse=True)
    inputs = Inputs(q, k, v, causal=True, keywords={"kv_lengths": lengths, "window": (2, 1)})
    want, _, want_lse = oracle.golden_of(inputs, "top_left")
    np.testing.assert_allclose(out, want, atol=1e-5)
    np.testing.assert_allclose(lse, want_lse, atol=1e-5)
