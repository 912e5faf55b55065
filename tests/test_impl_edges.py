"""impl's argument checks at their edges, written to kill the mutants of impl/masks.py that the
suite and tests/test_impl_masks.py left alive (tools/mutation): each case is the first value past a
boundary that a mutated comparison or boolean would let through."""

import numpy as np
import pytest

from impl.masks import causal_mask, packed_mask, padding_mask, sliding_window_mask


@pytest.mark.parametrize("bad", [-1, True, 2.0])
def test_sizes_must_be_non_negative_integers(bad):
    with pytest.raises(ValueError, match="n_q"):
        causal_mask(bad)
    with pytest.raises(ValueError, match="n_k"):
        causal_mask(2, bad)
    with pytest.raises(ValueError, match="n_k"):
        sliding_window_mask(2, bad, window=(1, 0))


def test_align_is_keyword_only_and_sizes_positional():
    with pytest.raises(TypeError):
        causal_mask(2, 3, "bottom_right")  # type: ignore[misc]
    assert causal_mask(2, 3, align="bottom_right").shape == (2, 3)


@pytest.mark.parametrize("lengths", [[-1], [4], [0, 4], [-1, 3]])
def test_key_lengths_outside_0_to_n_k_are_refused(lengths):
    with pytest.raises(ValueError, match="key_lengths"):
        padding_mask(lengths, 3)


@pytest.mark.parametrize("lengths", [[0], [3], [0, 3]])
def test_key_lengths_at_the_ends_are_accepted(lengths):
    got = padding_mask(lengths, 3)
    assert got.shape == (len(lengths), 1, 3) and got.sum() == sum(lengths)


def test_packed_sequences_must_pair_up():
    with pytest.raises(ValueError):
        packed_mask(np.array([0, 1, 2]), np.array([0, 2]))
    with pytest.raises(ValueError):
        packed_mask(np.array([0, 2]), np.array([0, 1, 2]))


@pytest.mark.parametrize("block", [0, (0, 4), (4, 0), -1, (2, 2, 2), True, 2.0])
def test_flash_block_must_be_positive_integers(block):
    from impl import flash_attention

    x = np.ones((3, 2))
    with pytest.raises(ValueError, match="block"):
        flash_attention(x, x, x, block=block)


# --- impl.attention: the survivors of its argument checks and keyword paths (tools/mutation) ------

def _qkv(*lead: int, n_q: int = 5, n_k: int = 6, d: int = 3, kv_heads: int | None = None):
    rng = np.random.default_rng(sum(lead) + n_q + n_k)
    kv_lead = (*lead[:-1], kv_heads) if kv_heads else lead
    return (rng.standard_normal((*lead, n_q, d)), rng.standard_normal((*kv_lead, n_k, d)),
            rng.standard_normal((*kv_lead, n_k, d + 1)))


def _golden(q, k, v, **kw):
    from spec import oracle
    from spec.inputs import Inputs

    return oracle.golden_of(Inputs(q, k, v, keywords=kw))[0]


def test_softmax_defaults_to_the_last_axis():
    from impl.attention import softmax

    got = softmax(np.arange(24.0).reshape(2, 3, 4))
    np.testing.assert_allclose(got.sum(axis=-1), 1.0)


@pytest.mark.parametrize(("lead", "kv_heads", "n_q"), [((4,), 2, 5), ((2, 6), 3, 7), ((2, 4), 2, 4)])
def test_grouped_kv_heads_equal_repeated_heads(lead, kv_heads, n_q):
    from impl import attention

    q, k, v = _qkv(*lead, n_q=n_q, kv_heads=kv_heads)
    rep = lead[-1] // kv_heads
    want = attention(q, np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3))
    np.testing.assert_allclose(attention(q, k, v), want, rtol=1e-12, atol=1e-12)


def test_grouped_heads_must_agree_between_k_and_v():
    from impl import attention

    q, k, _ = _qkv(4, kv_heads=2)
    with pytest.raises(ValueError):
        attention(q, k, np.ones((4, 6, 3)))


def test_sinks_join_the_denominator_per_head():
    from impl import attention

    q, k, v = _qkv(3)
    sinks = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(attention(q, k, v, sinks=sinks), _golden(q, k, v, sinks=sinks), rtol=1e-10)


def test_softcap_is_accepted_and_applied():
    from impl import attention

    q, k, v = _qkv(2)
    np.testing.assert_allclose(attention(q, k, v, softcap=1.5), _golden(q, k, v, softcap=1.5), rtol=1e-10)


def test_bias_must_be_floats():
    from impl import attention

    q, k, v = _qkv(2)
    with pytest.raises(TypeError, match="bias"):
        attention(q, k, v, bias=np.ones((5, 6), dtype=np.int64))
    np.testing.assert_allclose(attention(q, k, v, bias=np.zeros((5, 6))), attention(q, k, v))


def test_kv_lengths_accepted_in_range_and_refused_outside():
    from impl import attention

    q, k, v = _qkv(1, 2)
    out = attention(q, k, v, kv_lengths=np.array([4]))
    np.testing.assert_allclose(out, attention(q, k[..., :4, :], v[..., :4, :]), rtol=1e-12)
    for bad in ([-1], [7]):
        with pytest.raises(ValueError, match="kv_lengths"):
            attention(q, k, v, kv_lengths=np.array(bad))


def test_packed_sequences_valid_and_invalid_offsets():
    from impl import attention

    q, k, v = _qkv(2, n_q=3, n_k=5)
    out = attention(q, k, v, cu_seqlens_q=np.array([0, 1, 3]), cu_seqlens_k=np.array([0, 2, 5]))
    np.testing.assert_allclose(out[:, :1], attention(q[:, :1], k[:, :2], v[:, :2]), rtol=1e-12)
    with pytest.raises(ValueError, match="same sequences, got lengths 2 and 3"):
        attention(q, k, v, cu_seqlens_q=np.array([0, 3]), cu_seqlens_k=np.array([0, 2, 5]))
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        attention(q, k, v, cu_seqlens_q=np.array([0, 1, 2]), cu_seqlens_k=np.array([0, 2, 5]))


def test_mask_that_does_not_broadcast_is_named():
    from impl import attention

    q, k, v = _qkv(2)
    with pytest.raises(ValueError, match="does not broadcast"):
        attention(q, k, v, mask=np.ones((4, 6), dtype=bool))


def test_inputs_need_two_dims_and_a_positive_width():
    from impl import attention

    with pytest.raises(ValueError, match="2 dims"):
        attention(np.ones(3), np.ones((4, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="d_k"):
        attention(np.ones((2, 0)), np.ones((4, 0)), np.ones((4, 2)))


def test_flash_accepts_one_by_one_tiles():
    from impl import attention, flash_attention

    q, k, v = _qkv(2, n_q=3, n_k=4)
    got = flash_attention(q, k, v, causal=True, block=1)
    np.testing.assert_allclose(got, attention(q, k, v, causal=True), rtol=1e-12, atol=1e-12)


def test_grouped_heads_still_need_broadcasting_batches():
    from impl import attention

    with pytest.raises(ValueError, match="must broadcast"):
        attention(np.ones((2, 4, 5, 3)), np.ones((3, 2, 6, 3)), np.ones((2, 2, 6, 4)))
    with pytest.raises(ValueError, match="must broadcast"):  # v's batch too, not only k's
        attention(np.ones((2, 4, 5, 3)), np.ones((2, 2, 6, 3)), np.ones((3, 2, 6, 4)))


def test_empty_packed_offsets_are_refused():
    from impl import attention

    q, k, v = _qkv(2, n_q=5, n_k=6)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        attention(q, k, v, cu_seqlens_q=np.array([], dtype=np.int64), cu_seqlens_k=np.array([0, 6]))


@pytest.mark.parametrize(("q_shape", "k_shape"), [((3, 5, 3), (2, 6, 3)), ((1, 3, 5, 3), (1, 2, 6, 3))])
def test_indivisible_heads_are_explained(q_shape, k_shape):
    from impl import attention

    with pytest.raises(ValueError, match=r"divisible by k's and v's \(g = 2\)"):
        attention(np.ones(q_shape), np.ones(k_shape), np.ones(k_shape))


def test_dropout_scales_kept_weights_by_one_over_keep_probability():
    from impl import attention

    q, k, v = _qkv(2, n_q=8, n_k=9)
    _, plain_w = attention(q, k, v, return_weights=True)
    _, w = attention(q, k, v, dropout_p=0.25, seed=0, return_weights=True)
    kept = w != 0
    assert kept.any() and not kept.all()
    np.testing.assert_allclose(w[kept], plain_w[kept] / 0.75, rtol=1e-12)
    with pytest.raises(ValueError, match="seed"):
        attention(q, k, v, dropout_p=0.25, seed=-1)


@pytest.mark.parametrize("lead", [(), (2,), (1, 2)])
def test_no_queries_give_an_empty_output(lead):
    from impl import attention, flash_attention

    q, k, v = np.ones((*lead, 0, 3)), np.ones((*lead, 4, 3)), np.ones((*lead, 4, 2))
    for fn in (attention, flash_attention):
        for causal in (False, True):
            assert fn(q, k, v, causal=causal).shape == (*lead, 0, 2)


def test_no_query_heads_over_grouped_kv_heads_give_an_empty_output():
    from impl import attention

    # h = 0 query heads is divisible by g = 2 K/V heads: grouped, not a broadcasting error
    assert attention(np.ones((0, 5, 3)), np.ones((2, 6, 3)), np.ones((2, 6, 4))).shape == (0, 5, 4)


@pytest.mark.parametrize(("h", "g"), [(2, 0), (3, 0), (4, 0)])
def test_no_kv_heads_under_several_query_heads_are_refused_as_unbroadcastable(h, g):
    from impl import attention

    # g = 0 K/V heads serve no query head: a ValueError naming the shapes, never a division by zero.
    with pytest.raises(ValueError, match=rf"leading dims of q, k and v must broadcast.*q \({h}, 5, 3\)"):
        attention(np.ones((h, 5, 3)), np.ones((g, 6, 3)), np.ones((g, 6, 4)))
    assert attention(np.ones((1, 5, 3)), np.ones((0, 6, 3)), np.ones((0, 6, 4))).shape == (0, 5, 4)
    assert attention(np.ones((0, 5, 3)), np.ones((0, 6, 3)), np.ones((0, 6, 4))).shape == (0, 5, 4)


def test_flags_are_keyword_only():
    from impl import attention, flash_attention, flash_attention_backward

    x = np.ones((3, 2))
    for fn in (attention, flash_attention):
        with pytest.raises(TypeError):
            fn(x, x, x, True)  # type: ignore[call-overload]
    out, lse = flash_attention(x, x, x, return_lse=True)
    with pytest.raises(TypeError):
        flash_attention_backward(x, x, x, out, lse, x, True)  # type: ignore[misc]


def test_softmax_lse_without_sinks_and_softmax_on_any_axis():
    from impl.attention import softmax, softmax_lse

    x = np.array([[0.0, np.log(3.0)], [1.0, 1.0]])
    weights, lse = softmax_lse(x)
    np.testing.assert_allclose(weights, [[0.25, 0.75], [0.5, 0.5]])
    np.testing.assert_allclose(lse[:, 0], np.log(np.exp(x).sum(axis=-1)))
    np.testing.assert_allclose(softmax(x, axis=0).sum(axis=0), 1.0)


def test_lse_is_the_log_of_the_denominator():
    from impl import attention
    from spec import golden

    q, k, v = _qkv(2)
    _, lse = attention(q, k, v, return_lse=True)
    vis = np.ones((2, 5, 6), dtype=bool)
    np.testing.assert_allclose(lse, golden.forward(q, k, v, visible=vis, scale=1 / np.sqrt(3))[2], rtol=1e-12)


@pytest.mark.parametrize("cap", [0.0, -1.0, np.inf, np.nan])
def test_softcap_must_be_positive_and_finite(cap):
    from impl import attention

    q, k, v = _qkv(2)
    with pytest.raises(ValueError, match="softcap"):
        attention(q, k, v, softcap=cap)


def test_packed_offsets_come_in_pairs_and_start_at_zero():
    from impl import attention

    q, k, v = _qkv(2, n_q=3, n_k=5)
    with pytest.raises(ValueError, match="together"):
        attention(q, k, v, cu_seqlens_q=np.array([0, 3]))
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        attention(q, k, v, cu_seqlens_q=np.array([1, 2, 3]), cu_seqlens_k=np.array([0, 2, 5]))


def test_the_grouped_query_hint_only_for_grouped_calls():
    from impl import attention, flash_attention

    with pytest.raises(ValueError) as raised:
        flash_attention(np.ones((3, 5, 3)), np.ones((2, 6, 3)), np.ones((2, 6, 3)))
    assert "grouped-query" not in str(raised.value)
    with pytest.raises(ValueError, match="must broadcast") as raised:  # k without a head axis: no hint
        attention(np.ones((2, 4, 5, 3)), np.ones((6, 3)), np.ones((3, 6, 4)))
    assert "grouped-query" not in str(raised.value)


def test_bias_that_does_not_broadcast_is_named():
    from impl import attention

    q, k, v = _qkv(2)
    with pytest.raises(ValueError, match="bias of shape"):
        attention(q, k, v, bias=np.zeros((4, 6)))


@pytest.mark.parametrize("window", [(3, 0), (0, 2), (2, 5)])
def test_flash_window_across_key_tiles(window):
    from impl import attention, flash_attention

    q, k, v = _qkv(2, n_q=19, n_k=21)
    got = flash_attention(q, k, v, window=window, block=(4, 8))
    np.testing.assert_allclose(got, attention(q, k, v, window=window), rtol=1e-12, atol=1e-12)


def test_flash_lse_of_a_row_that_sees_nothing_is_minus_infinity():
    from impl import attention, flash_attention

    q, k, v = _qkv(2, n_q=6, n_k=4)
    _, lse = flash_attention(q, k, v, window=(0, 0), return_lse=True)
    _, want = attention(q, k, v, window=(0, 0), return_lse=True)
    assert np.all(np.isneginf(lse[:, 4:]))
    np.testing.assert_allclose(lse, want, rtol=1e-12)


def test_flash_backward_is_not_causal_by_default():
    from impl import flash_attention
    from impl.flash import flash_attention_backward
    from impl.grad import attention_backward

    q, k, v = _qkv(2, n_q=4, n_k=4)
    d_out = np.ones((2, 4, 4))
    out, lse = flash_attention(q, k, v, return_lse=True)
    got = flash_attention_backward(q, k, v, out, lse, d_out)
    for g, w in zip(got, attention_backward(q, k, v, d_out), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)
