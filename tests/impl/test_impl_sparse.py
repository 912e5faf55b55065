"""Top-k sparse attention, block-sparse selection and MLA (``qv=``, the shared latent ``d_v=``) in the
reference: each mask against a loop written from its definition, each keyword against the call it
abbreviates (a boolean mask, concatenated queries and keys, explicit values), gradients included."""

import tracemalloc

import numpy as np
import pytest

from impl import attention, attention_backward, flash_attention, flash_attention_backward, gradcheck
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


# --- flash_attention's sparse path: a gather ------------------------------------------------------

FLASH_KEYWORDS = [
    {},
    {"causal": True},
    {"causal": True, "window": (4, 0), "softcap": 2.5},
    {"window": (3, 5), "attention_chunk": 7, "scale": 0.7},
    {"causal": True, "alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625])},
]


def distinct_lists(rng, shape, n_k, topk):  # [*shape, topk]: each row distinct keys, some entries invalid
    rows = np.argsort(rng.random((*shape, n_k)), axis=-1)[..., :topk]
    return np.where(rng.random(rows.shape) < 0.2, rng.choice([-1, n_k, n_k + 3]), rows)


@pytest.mark.parametrize("keywords", FLASH_KEYWORDS, ids=lambda kw: "-".join(kw) or "plain")
@pytest.mark.parametrize("block", [(5, 3), (256, 2048)])
def test_flash_sparse_equals_the_reference_when_no_row_lists_a_key_twice(keywords, block):
    rng = RNG(6)
    q, k, v = problem(rng, n_q=23, n_k=19)
    indices = distinct_lists(rng, (2, 2, 23), 19, 7)
    length = rng.integers(0, 8, (2, 23))
    kw = {"topk_indices": indices, "topk_length": length, **keywords}
    want, want_lse = attention(q, k, v, return_lse=True, **kw)
    got, lse = flash_attention(q, k, v, return_lse=True, block=block, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    np.testing.assert_allclose(lse[np.isfinite(lse)], want_lse[np.isfinite(want_lse)], rtol=1e-12)
    d_out = rng.standard_normal(want.shape)
    grads = flash_attention_backward(q, k, v, got, lse, d_out, block=block, **kw)
    for g, w in zip(grads, attention_backward(q, k, v, d_out, **kw), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def gather_golden(q, k, v, indices, *, causal=False):  # 2-D; each entry counts each time it is listed
    n_k = k.shape[0]
    out = np.zeros((q.shape[0], v.shape[1]))
    for i, row in enumerate(indices):
        picked = [j for j in row if 0 <= j < n_k and (not causal or j <= i)]
        if picked:
            scores = np.array([q[i] @ k[j] for j in picked]) / np.sqrt(q.shape[1])
            weights = np.exp(scores - scores.max())
            out[i] = (weights / weights.sum()) @ v[picked]
    return out


def test_flash_sparse_counts_a_key_listed_twice_twice():
    rng = RNG(7)
    q, k, v = problem(rng, lead=(), n_q=9, n_k=6)
    indices = rng.integers(-1, 7, (9, 5))
    indices[:, 0] = indices[:, 1] = 2  # every row lists key 2 at least twice
    got = flash_attention(q, k, v, topk_indices=indices, causal=True, block=(4, 2))
    np.testing.assert_allclose(got, gather_golden(q, k, v, indices, causal=True), rtol=1e-12, atol=1e-13)
    assert not np.allclose(got[3:], attention(q, k, v, topk_indices=indices, causal=True)[3:])


def test_flash_sparse_gradients_accumulate_over_every_query_and_entry_that_picked_a_key():
    rng = RNG(8)
    q, k, v = problem(rng, lead=(1, 2), g=1, n_q=7, n_k=5)  # two query heads share one K/V head
    indices = np.tile(np.array([0, 3, 3, 1]), (1, 1, 7, 1))  # every query picks keys 0 and 1, key 3 twice
    d_out = rng.standard_normal((1, 2, 7, v.shape[-1]))
    kw = {"topk_indices": indices, "softcap": 3.0}
    out, lse = flash_attention(q, k, v, return_lse=True, block=(3, 2), **kw)
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, d_out, block=(3, 2), **kw)

    def loss(p):
        return float(np.sum(flash_attention(p["q"], p["k"], p["v"], block=(3, 2), **kw) * d_out))

    check = gradcheck(loss, {"q": q, "k": k, "v": v}, {"q": dq, "k": dk, "v": dv}, n_samples=None)
    assert check.max_rel_diff < 1e-6
    assert not dk[..., [2, 4], :].any() and not dv[..., [2, 4], :].any()  # keys no query picked


def test_flash_topk_blocks_equal_the_reference_a_block_listed_twice_counting_once():
    rng = RNG(9)
    q, k, v = problem(rng, n_q=13, n_k=11)
    blocks = rng.integers(-1, 5, (2, 2, 13, 3))
    blocks[..., 1] = blocks[..., 0]  # every row lists its first block twice
    kw = {"topk_blocks": blocks, "topk_block_size": 3, "causal": True}
    want = attention(q, k, v, **kw)
    got, lse = flash_attention(q, k, v, return_lse=True, block=(4, 5), **kw)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
    d_out = rng.standard_normal(want.shape)
    for g, w in zip(flash_attention_backward(q, k, v, got, lse, d_out, block=(4, 5), **kw),
                    attention_backward(q, k, v, d_out, **kw), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("keywords", "error", "words"), [
    ({"topk_indices": np.zeros((2, 2, 6, 3), int), "topk_blocks": np.zeros((2, 2, 6, 3), int),
      "topk_block_size": 2}, ValueError, "topk_indices or topk_blocks, not both"),
    ({"topk_indices": np.zeros((2, 2, 6, 3), np.float32)}, TypeError, "topk_indices must be an integer"),
    ({"topk_length": np.zeros((2, 6), int)}, ValueError, "topk_length is given only with topk_indices"),
    ({"topk_indices": np.zeros((2, 2, 6, 3), int), "topk_length": np.full((2, 6), 4)}, ValueError,
     "topk_length must lie in"),
    ({"topk_indices": np.zeros((2, 2, 6, 3), int), "block_table": np.zeros((2, 1), np.int32)}, ValueError,
     "block_table"),
    ({"topk_indices": np.zeros((2, 2, 6, 3), int), "kv_lengths": np.full(2, 9)}, ValueError, "kv_lengths"),
])
def test_flash_refuses_a_bad_selection_naming_the_argument(keywords, error, words):
    q, k, v = problem(RNG(0))
    with pytest.raises(error, match=words):
        flash_attention(q, k, v, **keywords)


def test_flash_sparse_memory_grows_with_the_list_not_with_n_q_times_n_k():
    rng = RNG(10)
    n, topk, d = 4096, 8, 8
    q, k, v = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(3))
    indices = rng.integers(0, n, (n, topk)).astype(np.int32)
    tracemalloc.start()
    try:
        flash_attention(q, k, v, topk_indices=indices, causal=True, threads=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < n * n // 4, f"{peak} bytes: a dense n × n mask alone is {n * n}"


@pytest.mark.parametrize(("lead", "g"), [((4,), 1), ((4,), 4), ((), None)])
def test_flash_sparse_takes_3d_and_2d_inputs_as_the_reference(lead, g):
    rng = RNG(11)
    q, k, v = problem(rng, lead=lead, g=g, n_q=10, n_k=8)
    shape = (g, 10) if lead else (10,)
    indices = distinct_lists(rng, shape, 8, 5)
    length = rng.integers(0, 6, 10)
    kw = {"topk_indices": indices, "topk_length": length, "causal": True}
    np.testing.assert_allclose(flash_attention(q, k, v, block=(3, 2), **kw), attention(q, k, v, **kw),
                               rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(("n_q", "n_k"), [(0, 5), (4, 0)])
def test_flash_sparse_with_no_queries_or_no_keys_gives_the_empty_or_zero_result(n_q, n_k):
    q, k, v = problem(RNG(12), lead=(), n_q=n_q, n_k=n_k)
    indices = np.zeros((n_q, 3), np.int32)
    out, lse = flash_attention(q, k, v, topk_indices=indices, return_lse=True)
    assert out.shape == (n_q, 3) and not out.any() and np.isneginf(lse).all()
    np.testing.assert_array_equal(out, attention(q, k, v, topk_indices=indices))


@pytest.mark.parametrize("sparse", [False, True])
def test_flash_takes_qv_and_the_shared_latent_as_the_reference_does(sparse):
    rng = RNG(13)
    q, k, v = problem(rng, g=4, n_q=13, n_k=11, d_k=6)
    qv = rng.standard_normal((*q.shape[:-1], v.shape[-1]))
    kw = {"causal": True, **({"topk_indices": distinct_lists(rng, (2, 4, 13), 11, 5)} if sparse else {})}
    np.testing.assert_allclose(flash_attention(q, k, v, qv=qv, scale=0.3, block=(4, 3), **kw),
                               attention(q, k, v, qv=qv, scale=0.3, **kw), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(flash_attention(q, k, v, qv=qv, **kw),  # the default scale: 1/√d_k of q's own
                               attention(q, k, v, qv=qv, scale=6 ** -0.5, **kw), rtol=1e-12, atol=1e-13)
    out, lse = flash_attention(q, k, None, d_v=3, return_lse=True, block=(4, 3), **kw)
    np.testing.assert_allclose(out, attention(q, k, None, d_v=3, **kw), rtol=1e-12, atol=1e-13)
    d_out = rng.standard_normal(out.shape)
    dq, dk, dv = flash_attention_backward(q, k, None, out, lse, d_out, d_v=3, block=(4, 3), **kw)
    want_dq, want_dk, _ = attention_backward(q, k, None, d_out, d_v=3, **kw)
    assert dv is None
    np.testing.assert_allclose(dq, want_dq, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dk, want_dk, rtol=1e-10, atol=1e-12)


def test_flash_refuses_qv_with_a_paged_cache():
    q, k, v = problem(RNG(0), g=4)
    with pytest.raises(ValueError, match="not with block_table"):
        flash_attention(q, k, v, qv=np.zeros((2, 4, 6, 3)), block_table=np.zeros((2, 1), np.int32))
