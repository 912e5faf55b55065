"""The float64 engine (spec.golden), which knows no keyword by name, on hand-worked numbers: weights,
lse and output with sinks, a softcap before a bias, a -inf bias, rows that see nothing, grouped K/V
heads; and its backward against central differences of its forward."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spec import golden
from spec.keywords.softcap import capped, capped_derivative


def sinks(*logits: float) -> golden.Terms:
    """Sink logits per head, as rows of [heads, n_q] see them."""
    return golden.Terms(sinks=np.array(logits)[:, None] if len(logits) > 1 else np.array(logits))


def cap(c: float) -> tuple:
    return (lambda s: capped(s, c), lambda s: capped_derivative(s, c))

E = math.e


def test_two_keys_by_hand():
    """scores [0, 1] (scale 1): weights 1/(1+e), e/(1+e); lse = log(1 + e); V = I reads the weights."""
    q, k, v = np.array([[1.0]]), np.array([[0.0], [1.0]]), np.eye(2)
    out, w, lse = golden.forward(q, k, v, visible=np.ones((1, 2), bool), scale=1.0)
    want = [1 / (1 + E), E / (1 + E)]
    np.testing.assert_allclose(w, [want], rtol=1e-15)
    np.testing.assert_allclose(out, [want], rtol=1e-15)
    assert lse[0] == pytest.approx(math.log(1 + E), rel=1e-15)


def test_a_sink_takes_its_share_and_carries_no_value():
    """Two equal scores and a sink logit 0: each key gets 1/3, the sink the last third (no value)."""
    q, k, v = np.zeros((1, 1)), np.zeros((2, 1)), np.array([[3.0], [6.0]])
    out, w, lse = golden.forward(q, k, v, visible=np.ones((1, 2), bool), scale=1.0, terms=sinks(0.0))
    np.testing.assert_allclose(w, [[1 / 3, 1 / 3]], rtol=1e-15)
    assert out[0, 0] == pytest.approx(3.0, rel=1e-15)  # (3 + 6) / 3
    assert lse[0] == pytest.approx(math.log(3), rel=1e-15)


def test_each_head_uses_its_own_sink():
    q, k, v = np.zeros((2, 1, 1)), np.zeros((2, 1, 1)), np.ones((2, 1, 1))
    _, w, lse = golden.forward(q, k, v, visible=np.ones((2, 1, 1), bool), scale=1.0, terms=sinks(0.0,
                                                                                                 -np.inf))
    np.testing.assert_allclose(w[:, 0, 0], [0.5, 1.0], rtol=1e-15)
    np.testing.assert_allclose(lse[:, 0], [math.log(2), 0.0], atol=1e-15)


def test_softcap_bounds_the_scores_and_comes_before_the_bias():
    """s = [100, 0] capped at c = 2 is [2·tanh(50), 0] = [2, 0]; a bias [0, 1] is added after."""
    q, k, v = np.array([[10.0]]), np.array([[10.0], [0.0]]), np.eye(2)
    vis = np.ones((1, 2), bool)
    _, w, _ = golden.forward(q, k, v, visible=vis, scale=1.0, terms=golden.Terms(transforms=(cap(2.0),)))
    np.testing.assert_allclose(w, [[E**2 / (1 + E**2), 1 / (1 + E**2)]], rtol=1e-14)
    both = golden.Terms(transforms=(cap(2.0),), added=(np.array([[0.0, 1.0]]),))
    _, w, _ = golden.forward(q, k, v, visible=vis, scale=1.0, terms=both)
    np.testing.assert_allclose(w, [[E**2 / (E**2 + E), E / (E**2 + E)]], rtol=1e-14)


def test_minus_inf_bias_hides_a_key_like_a_mask():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    keep = np.array([True, False, True, True, False])
    vis = np.broadcast_to(keep, (3, 5))
    by_mask = golden.forward(q, k, v, visible=vis, scale=0.5)
    by_bias = golden.forward(q, k, v, visible=np.ones((3, 5), bool), scale=0.5,
                             terms=golden.Terms(added=(np.where(keep, 0.0, -np.inf),)))
    for a, b in zip(by_mask, by_bias, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_row_that_sees_nothing_gives_zeros_and_minus_inf_lse():
    q, k, v = np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 2))
    vis = np.array([[True] * 4, [False] * 4])
    out, w, lse = golden.forward(q, k, v, visible=vis, scale=1.0)
    np.testing.assert_array_equal(out[1], [0.0, 0.0])
    np.testing.assert_array_equal(w[1], np.zeros(4))
    assert lse[1] == -np.inf and np.isfinite(lse[0])


def test_grouped_kv_heads_are_repeated():
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((4, 2, 3)), rng.standard_normal((2, 3, 3)), rng.standard_normal((2, 3, 2))
    vis = np.ones((4, 2, 3), bool)
    got = golden.forward(q, k, v, visible=vis, scale=1.0)[0]
    want = golden.forward(q, np.repeat(k, 2, axis=0), np.repeat(v, 2, axis=0), visible=vis, scale=1.0)[0]
    np.testing.assert_array_equal(got, want)


def test_backward_matches_central_differences_of_the_forward():
    rng = np.random.default_rng(1)
    q, k, v, d_out = (rng.standard_normal(s) for s in ((3, 2), (4, 2), (4, 3), (3, 3)))
    vis = golden.causal_visible(3, 4, "bottom_right")
    got = golden.backward(q, k, v, d_out, visible=vis, scale=0.9)
    grads = got.dq, got.dk, got.dv

    def loss(q_, k_, v_):
        return float(np.sum(golden.forward(q_, k_, v_, visible=vis, scale=0.9)[0] * d_out))

    h = 1e-6
    for which, g in enumerate(grads):
        args = [q, k, v]
        x = args[which]
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus, minus = x.copy(), x.copy()
            plus[idx] += h
            minus[idx] -= h
            num[idx] = (loss(*[plus if a is x else a for a in args])
                        - loss(*[minus if a is x else a for a in args])) / (2 * h)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)
