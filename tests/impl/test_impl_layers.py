"""impl.layers: self-attention and multi-head attention (grouped K/V heads included) against
attention of their projections, one head at a time, and their refusals."""

import numpy as np
import pytest

from impl import (
    attention,
    multi_head_attention,
    self_attention,
)


def test_self_attention_is_attention_of_projections():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 10))
    wq, wk, wv = (rng.standard_normal((10, 4)) for _ in range(3))
    out, pattern = self_attention(x, wq, wk, wv)
    np.testing.assert_array_equal(out, attention(x @ wq, x @ wk, x @ wv, causal=True))
    assert pattern.shape == (6, 6) and (np.triu(pattern, 1) == 0).all()


def mha_by_loops(x, wq, wk, wv, wo, h, g, causal):
    """Multi-head attention the slow, obvious way: one head at a time, K/V head i // (h/g)."""
    d_k, d_v = wq.shape[1] // h, wv.shape[1] // g
    heads = []
    for i in range(h):
        j = i // (h // g)
        q = x @ wq[:, i * d_k : (i + 1) * d_k]
        k = x @ wk[:, j * d_k : (j + 1) * d_k]
        v = x @ wv[:, j * d_v : (j + 1) * d_v]
        heads.append(attention(q, k, v, causal=causal))
    return np.concatenate(heads, axis=-1) @ wo


@pytest.mark.parametrize(("h", "g"), [(4, 4), (4, 2), (4, 1), (6, 3)])
@pytest.mark.parametrize("causal", [True, False])
def test_multi_head_matches_per_head_loop(h, g, causal):
    rng = np.random.default_rng(8)
    d, d_k, n = 12, 3, 7
    x = rng.standard_normal((2, n, d))
    wq = rng.standard_normal((d, h * d_k))
    wk = rng.standard_normal((d, g * d_k))
    wv = rng.standard_normal((d, g * d_k))
    wo = rng.standard_normal((h * d_k, d))
    out = multi_head_attention(x, wq, wk, wv, wo, n_heads=h, n_kv_heads=g, causal=causal)
    for b in range(2):
        np.testing.assert_allclose(out[b], mha_by_loops(x[b], wq, wk, wv, wo, h, g, causal), rtol=1e-12)


@pytest.mark.parametrize("g", [1, 2])
def test_grouped_query_equals_mha_with_repeated_kv(g):
    rng = np.random.default_rng(9)
    h, d, d_k, n = 4, 8, 2, 5
    x = rng.standard_normal((n, d))
    wq = rng.standard_normal((d, h * d_k))
    wk, wv = rng.standard_normal((d, g * d_k)), rng.standard_normal((d, g * d_k))
    wo = rng.standard_normal((h * d_k, d))
    # Repeat each K/V head's columns h/g times: K/V head j serves query heads j·(h/g) ... .
    repeat = np.repeat(np.arange(g), h // g)
    cols = (repeat[:, None] * d_k + np.arange(d_k)).ravel()
    gqa = multi_head_attention(x, wq, wk, wv, wo, n_heads=h, n_kv_heads=g)
    mha = multi_head_attention(x, wq, wk[:, cols], wv[:, cols], wo, n_heads=h)
    np.testing.assert_allclose(gqa, mha, rtol=1e-12)


def test_bad_layer_arguments_are_refused():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 8))
    w = rng.standard_normal((8, 8))
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be divisible by n_kv_heads \(3\)"):
        multi_head_attention(x, w, w, w, w, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        multi_head_attention(x, w, w, w, w, n_heads=0)
    with pytest.raises(ValueError, match="wq width 8 is not divisible by n_heads"):
        multi_head_attention(x, w, w, w, w, n_heads=3)
    with pytest.raises(ValueError, match=r"wk must have shape"):
        multi_head_attention(x, w, w[:, :4], w, w, n_heads=4)
    with pytest.raises(ValueError, match=r"wo must have shape \(8, width\)"):
        multi_head_attention(x, w, w, w, w[:4], n_heads=4)
    with pytest.raises(ValueError, match=r"wq must have shape \(8, width\)"):
        self_attention(x, w[:4], w, w)
    with pytest.raises(ValueError, match="x must have shape"):
        self_attention(x[0], w, w, w)
