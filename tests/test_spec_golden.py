"""The float64 oracle (spec.golden, composed by spec.oracle from the keywords' declarations) on
hand-worked numbers, and against a loop written from the definition: every keyword the forward
golden takes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spec import golden, oracle
from spec.inputs import Inputs
from spec.laws.softcap import capped, capped_derivative


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


def test_window_alignment_by_hand():
    """n_q = 2, n_k = 4, window (1, 0): top-left diag = i, bottom-right diag = i + 2."""
    q, k, v = np.zeros((2, 1)), np.zeros((4, 1)), np.zeros((4, 1))
    inputs = Inputs(q, k, v, keywords={"window": (1, 0)})
    top = oracle.visibility("top_left", inputs).astype(int)
    bottom = oracle.visibility("bottom_right", inputs).astype(int)
    np.testing.assert_array_equal(top, [[1, 0, 0, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(bottom, [[0, 1, 1, 0], [0, 0, 1, 1]])
    causal = golden.causal_visible(2, 4, "bottom_right").astype(int)
    np.testing.assert_array_equal(causal, [[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="window"):
        oracle.visibility("top_left", inputs.replace(window=(-1, 0)))


def test_kv_lengths_hide_the_tail_of_each_batch_row():
    q, k, v = np.zeros((2, 1, 1, 1)), np.zeros((2, 1, 3, 1)), np.zeros((2, 1, 3, 1))
    vis = oracle.visibility("top_left", Inputs(q, k, v, keywords={"kv_lengths": np.array([1, 3])}))
    np.testing.assert_array_equal(vis.astype(int)[:, 0, 0], [[1, 0, 0], [1, 1, 1]])
    with pytest.raises(ValueError, match="kv_lengths"):
        oracle.visibility("top_left", Inputs(q, k, v, keywords={"kv_lengths": np.array([1.5, 2.0])}))


def test_packed_sequences_see_only_themselves_causal_per_sequence():
    """Two sequences of 2 queries over 3 and 1 keys, causal per sequence. Bottom-right: the first
    sequence's queries see its keys ≤ 1 and ≤ 2; in the second (1 key for 2 queries) the first
    query's diagonal is before its only key, the second sees it. Top-left: each sequence's first
    query sees its first key."""
    q, k, v = np.zeros((1, 4, 1)), np.zeros((1, 4, 1)), np.zeros((1, 4, 1))
    packed = Inputs(q, k, v, causal=True,
                    keywords={"cu_seqlens_q": np.array([0, 2, 4]), "cu_seqlens_k": np.array([0, 3, 4])})
    vis = oracle.visibility("bottom_right", packed).astype(int)[0]
    np.testing.assert_array_equal(vis, [[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1]])
    top = oracle.visibility("top_left", packed).astype(int)[0]
    np.testing.assert_array_equal(top, [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 1]])


def test_each_row_that_sees_nothing_is_given_its_first_cause():
    """Causes are checked in CAUSES order, cumulatively: a row emptied by causal alone is causal's
    even if the mask empties it too; one emptied only by the mask on top of a window is the mask's."""
    q, k, v = np.zeros((3, 1)), np.zeros((2, 1)), np.zeros((2, 1))
    mask = np.array([[True, True], [True, False], [False, False]])
    inputs = Inputs(q, k, v, causal=True, mask=mask, keywords={"window": (0, 0)})
    # top-left: row 0 sees key 0; row 1's window keeps key 1, which the mask hides; row 2's window
    # (key 2) is past the keys, so the window empties it before the mask does
    assert oracle.causes("top_left", inputs).tolist() == ["", "mask", "window"]
    # bottom-right, n_q = 3 > n_k = 2: row 0's diagonal is -1, so causal alone empties it
    assert oracle.causes("bottom_right", inputs.replace(mask=np.zeros((3, 2), bool))).tolist() == \
        ["causal", "mask", "mask"]


def test_a_row_that_sees_nothing_gives_zeros_and_minus_inf_lse():
    q, k, v = np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 2))
    vis = np.array([[True] * 4, [False] * 4])
    out, w, lse = golden.forward(q, k, v, visible=vis, scale=1.0)
    np.testing.assert_array_equal(out[1], [0.0, 0.0])
    np.testing.assert_array_equal(w[1], np.zeros(4))
    assert lse[1] == -np.inf and np.isfinite(lse[0])


def loop_forward(q, k, v, vis, scale, bias, softcap, sinks):  # 3-D (heads, n, d), plain Python
    """The definition, one row at a time with the math module."""
    h, n_q, _ = q.shape
    n_k, d_v = v.shape[-2:]
    out, lse = np.zeros((h, n_q, d_v)), np.zeros((h, n_q))
    for a in range(h):
        for i in range(n_q):
            logits = []
            for j in range(n_k):
                s = scale * sum(q[a, i, t] * k[a, j, t] for t in range(q.shape[-1]))
                s = softcap * math.tanh(s / softcap) + bias[a, i, j]
                logits.append(s if vis[a, i, j] else -math.inf)
            z = sum(math.exp(s) for s in logits) + math.exp(sinks[a])
            lse[a, i] = math.log(z)
            for c in range(d_v):
                out[a, i, c] = sum(math.exp(s) / z * v[a, j, c] for j, s in enumerate(logits))
    return out, lse


def test_every_keyword_agrees_with_a_loop_over_the_definition():
    rng = np.random.default_rng(7)
    h, n_q, n_k, d = 2, 3, 5, 4
    q, k, v = (rng.standard_normal((h, n, w)) for n, w in ((n_q, d), (n_k, d), (n_k, 3)))
    mask = rng.random((h, n_q, n_k)) < 0.8
    bias, sink = rng.standard_normal((h, n_q, n_k)), rng.standard_normal(h)
    inputs = Inputs(q, k, v, causal=True, mask=mask, scale=0.7,
                    keywords={"window": (2, 0), "bias": bias, "softcap": 1.5, "sinks": sink})
    out, _, lse = oracle.golden_of(inputs, "bottom_right")
    vis = oracle.visibility("bottom_right", inputs)
    want_out, want_lse = loop_forward(q, k, v, vis, 0.7, bias, 1.5, sink)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)


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


def test_the_baseline_takes_the_same_keywords_in_the_same_order():
    """float64 baseline == golden (both exact to rounding) with bias, softcap and sinks; a float32
    baseline is within float32 rounding of it."""
    from spec import tolerance

    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, n, 4)) for n in (3, 5, 5))
    inputs = Inputs(q, k, v, scale=0.5, keywords={"window": (1, 1), "bias": rng.standard_normal((2, 3, 5)),
                                                  "softcap": 1.2, "sinks": np.array([0.3, -1.0])})
    geo = oracle.geometry("top_left", inputs)
    vis = oracle.visibility("top_left", inputs)
    gold = oracle.golden_of(inputs)[0]
    base = tolerance.baseline(q, k, v, visible=vis, scale=0.5, terms=oracle.terms(inputs, geo, q.dtype))
    np.testing.assert_allclose(base, gold, rtol=1e-12)
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    base32 = tolerance.baseline(*f32, visible=vis, scale=0.5, terms=oracle.terms(inputs, geo,
                                                                                 np.dtype(np.float32)))
    np.testing.assert_allclose(base32, gold, rtol=1e-5, atol=1e-6)
    plain = tolerance.baseline(q, k, v, visible=vis, scale=0.5)
    assert np.max(np.abs(plain - gold)) > 1e-2  # the keywords change the result: the test can fail
