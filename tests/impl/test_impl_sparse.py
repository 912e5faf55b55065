"""Top-k sparse attention, block-sparse selection and MLA (``qv=``, the shared latent ``d_v=``) in the
reference: each mask against a loop written from its definition, each keyword against the call it
abbreviates (a boolean mask, concatenated queries and keys, explicit values), gradients included."""

import numpy as np
import pytest

from impl import attention, attention_backward, gradcheck
from impl.masks import topk_block_mask, topk_mask

RNG = np.random.default_rng


def topk_loop(indices, n_k, length=None):  # [..., n_q, topk] -> [..., n_q, n_k], from the definition
    seen = np.zeros((*indices.shape[:-1], n_k), dtype=bool)
    for row in np.ndindex(*indices.shape[:-1]):
        count = indices.shape[-1] if length is None else length[row]
        for t in range(count):
            j = indices[row][t]
            if 0 <= j < n_k:
                seen[row][j] = True
    return seen


def block_loop(blocks, block_size, n_k):  # [..., n_q, n_blocks] -> [..., n_q, n_k]
    n_blocks = -(-n_k // block_size)
    seen = np.zeros((*blocks.shape[:-1], n_k), dtype=bool)
    for row in np.ndindex(*blocks.shape[:-1]):
        for j in range(n_k):
            seen[row][j] = any(b == j // block_size and 0 <= b < n_blocks for b in blocks[row])
    return seen


@pytest.mark.parametrize("seed", range(6))
def test_topk_mask_is_the_set_of_listed_keys(seed):
    rng = RNG(seed)
    n_k, topk = int(rng.integers(0, 9)), int(rng.integers(0, 6))
    indices = rng.integers(-3, n_k + 3, (2, 5, topk))  # invalid entries and duplicates included
    length = rng.integers(0, topk + 1, (2, 5))
    np.testing.assert_array_equal(topk_mask(indices, n_k), topk_loop(indices, n_k))
    np.testing.assert_array_equal(topk_mask(indices, n_k, length), topk_loop(indices, n_k, length))


@pytest.mark.parametrize("seed", range(6))
def test_topk_block_mask_is_the_keys_of_the_listed_blocks(seed):
    rng = RNG(seed)
    n_k, size = int(rng.integers(1, 12)), int(rng.integers(1, 5))
    blocks = rng.integers(-2, -(-n_k // size) + 2, (3, 4, 3))
    np.testing.assert_array_equal(topk_block_mask(blocks, size, n_k), block_loop(blocks, size, n_k))


def problem(rng, *, lead=(2, 4), g=2, n_q=6, n_k=9, d_k=5, d_v=3):
    """q [*lead, n_q, d_k]; k, v with g K/V heads (grouped-query attention) on the heads axis."""
    kv_lead = (*lead[:-1], g) if lead else ()
    q = rng.standard_normal((*lead, n_q, d_k))
    return q, rng.standard_normal((*kv_lead, n_k, d_k)), rng.standard_normal((*kv_lead, n_k, d_v))


def per_query_head(mask, h):  # [..., g, n_q, n_k] -> [..., h, n_q, n_k]: head i reads K/V head i // (h/g)
    return np.repeat(mask, h // mask.shape[-3], axis=-3) if mask.ndim > 2 else mask


@pytest.mark.parametrize(("lead", "g"), [((2, 4), 2), ((2, 4), 4), ((4,), 1), ((), None)])
@pytest.mark.parametrize("causal", [False, True])
def test_topk_indices_equal_the_boolean_mask_they_list(lead, g, causal):
    rng = RNG(len(lead) + 3 * bool(causal))
    q, k, v = problem(rng, lead=lead, g=g)
    n_q, n_k = q.shape[-2], k.shape[-2]
    shape = (*lead[:-1], g, n_q) if lead else (n_q,)
    indices = rng.integers(-2, n_k + 2, (*shape, 4)).astype(np.int32)
    length = rng.integers(0, 5, (*lead[:-1], n_q) if len(lead) > 1 else (n_q,)).astype(np.int32)
    per_head = length[..., None, :] if len(lead) > 1 else length
    listed = topk_loop(indices, n_k, np.broadcast_to(per_head, shape))
    mask = per_query_head(listed, q.shape[-3] if lead else 1)
    got, lse = attention(q, k, v, causal=causal, topk_indices=indices, topk_length=length, return_lse=True)
    want, want_lse = attention(q, k, v, causal=causal, mask=mask, return_lse=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(lse, want_lse)


def test_a_row_with_no_valid_key_is_empty():
    q, k, v = problem(RNG(0), lead=())
    indices = np.full((q.shape[0], 2), -1)
    indices[1] = [3, k.shape[0]]  # row 1 keeps key 3 alone
    out, lse = attention(q, k, v, topk_indices=indices, return_lse=True)
    assert not out[0].any() and np.isneginf(lse[0])
    np.testing.assert_allclose(out[1], v[3])


def test_topk_blocks_equal_the_boolean_mask_of_their_keys():
    rng = RNG(1)
    q, k, v = problem(rng)
    blocks = rng.integers(-1, 5, (2, 2, 6, 2))
    mask = per_query_head(block_loop(blocks, 3, 9), 4)
    got = attention(q, k, v, causal=True, topk_blocks=blocks, topk_block_size=3)
    np.testing.assert_array_equal(got, attention(q, k, v, causal=True, mask=mask))


@pytest.mark.parametrize(("keywords", "error", "words"), [
    ({"topk_indices": np.zeros((2, 2, 6, 3))}, TypeError, "topk_indices must be an integer"),
    ({"topk_indices": np.zeros((2, 4, 6, 3), int)}, ValueError, r"topk_indices must have shape \(2, 2, 6"),
    ({"topk_indices": np.zeros((2, 2, 6), int)}, ValueError, "topk_indices must have shape"),
    ({"topk_length": np.zeros((2, 6), int)}, ValueError, "topk_length is given only with topk_indices"),
    ({"topk_indices": np.zeros((2, 2, 6, 3), int), "topk_length": np.full((2, 6), 4)}, ValueError,
     r"topk_length must lie in \[0, topk=3\]"),
    ({"topk_indices": np.zeros((2, 2, 6, 3), int), "topk_length": np.full((2, 6), -1)}, ValueError,
     "topk_length must lie in"),
    ({"topk_indices": np.zeros((2, 2, 6, 3), int), "topk_length": np.zeros((2, 2, 6), int)}, ValueError,
     r"topk_length must have shape \(2, 6\)"),
    ({"topk_indices": np.zeros((2, 2, 6, 3), int), "topk_length": np.zeros((2, 6))}, TypeError,
     "topk_length must be an integer"),
    ({"topk_blocks": np.zeros((2, 2, 6, 3), int)}, ValueError, "topk_block_size"),
    ({"topk_blocks": np.zeros((2, 2, 6, 3), int), "topk_block_size": 0}, ValueError, "topk_block_size"),
    ({"topk_blocks": np.zeros((2, 2, 6, 3), int), "topk_block_size": 2.0}, TypeError, "topk_block_size"),
    ({"qv": np.zeros((2, 4, 6, 5))}, ValueError, "qv must have shape"),
    ({"qv": np.zeros((2, 4, 6, 3), np.float32)}, TypeError, "qv must have q's dtype"),
])
def test_bad_selection_and_qv_are_refused_naming_the_argument(keywords, error, words):
    q, k, v = problem(RNG(0))
    with pytest.raises(error, match=words):
        attention(q, k, v, **keywords)
    with pytest.raises(error, match=words):
        attention_backward(q, k, v, np.zeros((2, 4, 6, 3)), **keywords)


@pytest.mark.parametrize(("v_given", "d_v", "words"), [(True, 3, "d_v is given only with v=None"),
                                                       (False, None, "d_v= must give"),
                                                       (False, 6, r"d_v must lie in \[1, d_k=5\]"),
                                                       (False, 0, "d_v must lie in")])
def test_bad_latent_width_is_refused(v_given, d_v, words):
    q, k, v = problem(RNG(0))
    with pytest.raises((TypeError, ValueError), match=words):
        attention(q, k, v if v_given else None, d_v=d_v)


def test_qv_is_attention_over_concatenated_queries_and_keys():
    rng = RNG(2)
    q, k, v = problem(rng)
    qv = rng.standard_normal((*q.shape[:-1], v.shape[-1]))
    joined_q, joined_k = np.concatenate([q, qv], -1), np.concatenate([k, v], -1)
    kw = {"scale": 0.4, "causal": True, "softcap": 3.0}
    np.testing.assert_allclose(attention(q, k, v, qv=qv, **kw), attention(joined_q, joined_k, v, **kw),
                               rtol=1e-12, atol=1e-12)
    d_out = rng.standard_normal((*q.shape[:-1], v.shape[-1]))
    dq, dk, dv, extras = attention_backward(q, k, v, d_out, qv=qv, return_extras=True, **kw)
    djq, djk, djv = attention_backward(joined_q, joined_k, v, d_out, **kw)
    d_k = q.shape[-1]
    for got, want in [(dq, djq[..., :d_k]), (extras["dqv"], djq[..., d_k:]), (dk, djk[..., :d_k]),
                      (dv, djv + djk[..., d_k:])]:  # v is both the values and qv's keys
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_qv_gradients_match_central_differences():
    rng = RNG(3)
    q, k, v = problem(rng, n_q=4, n_k=5)
    qv = rng.standard_normal((*q.shape[:-1], v.shape[-1]))
    d_out = rng.standard_normal((*q.shape[:-1], v.shape[-1]))
    kw = {"scale": 0.5, "causal": True, "topk_indices": rng.integers(-1, 6, (2, 2, 4, 3))}
    dq, dk, dv, extras = attention_backward(q, k, v, d_out, qv=qv, return_extras=True, **kw)

    def loss(p):
        return float(np.sum(attention(p["q"], p["k"], p["v"], qv=p["qv"], **kw) * d_out))

    grads = {"q": dq, "k": dk, "v": dv, "qv": extras["dqv"]}
    check = gradcheck(loss, {"q": q, "k": k, "v": v, "qv": qv}, grads, n_samples=None)
    assert check.max_rel_diff < 1e-6


def test_the_shared_latent_reads_the_values_from_the_keys_and_folds_their_gradient_back():
    rng = RNG(4)
    q, k, _ = problem(rng, d_k=7)
    d_v = 3
    kw = {"causal": True, "topk_indices": rng.integers(0, 9, (2, 2, 6, 4))}
    np.testing.assert_array_equal(attention(q, k, None, d_v=d_v, **kw), attention(q, k, k[..., :d_v], **kw))
    d_out = rng.standard_normal((*q.shape[:-1], d_v))
    dq, dk, dv = attention_backward(q, k, None, d_out, d_v=d_v, **kw)
    want_dq, want_dk, want_dv = attention_backward(q, k, k[..., :d_v], d_out, **kw)
    assert dv is None
    np.testing.assert_array_equal(dq, want_dq)
    np.testing.assert_allclose(dk, want_dk + np.pad(want_dv, [(0, 0)] * 3 + [(0, 4)]), rtol=1e-14, atol=0)

    def loss(p):
        return float(np.sum(attention(p["q"], p["k"], None, d_v=d_v, **kw) * d_out))

    assert gradcheck(loss, {"q": q, "k": k}, {"q": dq, "k": dk}, n_samples=60).max_rel_diff < 1e-6


def test_topk_gradients_equal_those_of_the_boolean_mask():
    rng = RNG(5)
    q, k, v = problem(rng)
    indices = rng.integers(-1, 10, (2, 2, 6, 4))
    d_out = rng.standard_normal((*q.shape[:-1], v.shape[-1]))
    mask = per_query_head(topk_loop(indices, 9), 4)
    for got, want in zip(attention_backward(q, k, v, d_out, topk_indices=indices, window=(2, 1)),
                         attention_backward(q, k, v, d_out, mask=mask, window=(2, 1)), strict=True):
        np.testing.assert_array_equal(got, want)
