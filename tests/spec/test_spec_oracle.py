"""spec.oracle: what an Inputs means, composed from the keywords' declarations — its visibility and
the causes of rows that see nothing, its float64 golden and its baseline (by hand, and against loops
written from the definitions), a paged or float8 cache read by its ``Reads`` term — and its
gradients (``oracle.gradients``) under every keyword, against central differences of the golden
forward in float64, with their baseline and floors."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np
import pytest
from paged_caches import draw_seqs, lengths_of, paged

import spec
from impl import attention
from impl.grad import attention_backward
from spec import golden, oracle, tolerance
from spec.cases import Case
from spec.context import RunContext, running
from spec.inputs import Inputs
from spec.keywords import gradient_extras
from spec.target import Target

# --- visibility and the causes of empty rows, composed from the keywords --------------------------


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


# --- the forward golden and baseline under the keywords ------------------------------------------


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


def test_alibi_by_hand_measures_from_the_bottom_right_diagonal():
    """n_q = 2, n_k = 3, slope 0.5: query i's diagonal key is i + 1, so the added terms are
    −0.5·[1, 0, 1] and −0.5·[2, 1, 0], whatever the target's causal alignment."""
    q, k, v = np.zeros((2, 1)), np.zeros((3, 1)), np.eye(3)
    inputs = Inputs(q, k, v, keywords={"alibi_slopes": np.array([0.5], np.float32)})
    for align in ("top_left", "bottom_right"):
        _, w, _ = oracle.golden_of(inputs, align)
        logits = np.log(w) - np.log(w).max(axis=-1, keepdims=True)
        np.testing.assert_allclose(logits, [[-0.5, 0.0, -0.5], [-1.0, -0.5, 0.0]], atol=1e-15)


def test_every_keyword_argument_reaches_the_oracle_by_its_declaration():
    """The oracle knows no keyword by name: a call with every keyword that changes the maths
    matches a loop over the definition only through the declarations."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, n, 3)) for n in (3, 4, 4))
    slopes = np.array([0.25, 0.5], np.float32)
    bias = rng.standard_normal((2, 3, 4))
    inputs = Inputs(q, k, v, scale=0.5, keywords={"bias": bias, "alibi_slopes": slopes, "softcap": 2.0,
                                                   "sinks": np.array([0.1, -0.2])})
    out, _, _ = oracle.golden_of(inputs)
    want = np.zeros_like(out)
    for h in range(2):
        for i in range(3):
            s = [2.0 * math.tanh(0.5 * float(q[h, i] @ k[h, j]) / 2.0) + bias[h, i, j]
                 - slopes[h] * abs(i + 1 - j) for j in range(4)]
            z = sum(math.exp(x) for x in s) + math.exp([0.1, -0.2][h])
            want[h, i] = sum(math.exp(x) / z * v[h, j] for j, x in enumerate(s))
    np.testing.assert_allclose(out, want, rtol=1e-6)  # slopes are float32 in the golden too


# --- caches: read by their declaration (a Reads term), causal attention aligned per sequence ------


def _pages(rng, lengths, g=2, d=3, block_size=3):
    """A paged cache of standard-normal keys and values, NaN wherever no sequence's key is."""
    k_seqs, v_seqs = draw_seqs(rng, lengths, g, d), draw_seqs(rng, lengths, g, d)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, block_size, rng)
    return k_seqs, v_seqs, k_pool, v_pool, table


def _contiguous(seqs, n_k):  # per sequence [L_b, g, d] -> [batch, g, n_k, d], zeros past L_b
    out = np.zeros((len(seqs), seqs[0].shape[1], n_k, seqs[0].shape[2]))
    for b, s in enumerate(seqs):
        out[b, :, : len(s)] = np.swapaxes(s, 0, 1)
    return out


def test_the_golden_of_a_paged_cache_is_that_of_its_gathered_keys():
    """Through the table, with NaN in every unowned position: the golden equals the golden of the
    contiguous keys with kv_lengths, causal aligned per sequence (diag = i + L_b − n_q)."""
    rng = np.random.default_rng(0)
    lengths = [5, 2, 7]
    k_seqs, v_seqs, k_pool, v_pool, table = _pages(rng, lengths)
    q = rng.standard_normal((3, 4, 2, 3))
    given = Inputs(q, k_pool, v_pool, causal=True,
                   keywords={"block_table": table, "kv_lengths": lengths_of(k_seqs)})
    out, w, _ = oracle.golden_of(given, "top_left")  # a paged cache is per sequence in every alignment
    n_k = table.shape[1] * 3
    plain = Inputs(q, _contiguous(k_seqs, n_k), _contiguous(v_seqs, n_k), causal=True,
                   keywords={"kv_lengths": lengths_of(k_seqs)})
    want, want_w, _ = oracle.golden_of(plain, "kv_lengths")
    np.testing.assert_array_equal(out, want)
    assert np.isfinite(out).all()
    # row b, query i sees keys j <= i + L_b - n_q (n_q = 2): the last query sees the whole cache
    for b, n in enumerate(lengths):
        assert (w[b, :, -1, :n] > 0).all() and (w[b, :, -1, n:] == 0).all()
        assert (w[b, :, 0, n - 1] == 0).all() and (w[b, :, 0, : n - 1] > 0).all()
    np.testing.assert_array_equal(w, want_w)


def test_the_golden_reads_float8_codes_times_their_descales():
    FLOAT8 = pytest.importorskip("ml_dtypes").float8_e4m3fn
    rng = np.random.default_rng(1)
    codes = rng.standard_normal((2, 2, 4, 3)).astype(FLOAT8)
    values = rng.standard_normal((2, 2, 4, 3)).astype(FLOAT8)
    k_scale = np.array([[0.5, 4.0], [0.125, 2.0]], np.float32)
    v_scale = np.array([[3.0, 0.25], [1.5, 8.0]], np.float32)
    q = rng.standard_normal((2, 4, 2, 3)).astype(np.float32)  # 4 query heads read 2 K/V heads
    inputs = Inputs(q, codes, values, keywords={"k_descale": k_scale, "v_descale": v_scale})
    read = oracle.meaning(inputs)
    np.testing.assert_array_equal(read.k, codes.astype(np.float64) * k_scale[:, :, None, None])
    np.testing.assert_array_equal(read.v, values.astype(np.float64) * v_scale[:, :, None, None])
    assert oracle.meaning(read) is read and oracle.meaning(inputs) is read  # worked out once
    out, _, _ = oracle.golden_of(inputs)
    want = attention(q.astype(np.float64), read.k, read.v)
    np.testing.assert_allclose(out, want, rtol=1e-12)


def test_kv_lengths_alignment_puts_each_rows_diagonal_at_its_own_length():
    """n_q = 2, n_k = 4, lengths [3, 1]: row 0's queries see keys ≤ 1 and ≤ 2, row 1's see
    nothing and key 0; a top-left target's stay at ≤ 0 and ≤ 1 (cut by the lengths)."""
    q, k, v = np.zeros((2, 1, 2, 1)), np.zeros((2, 1, 4, 1)), np.zeros((2, 1, 4, 1))
    inputs = Inputs(q, k, v, causal=True, keywords={"kv_lengths": np.array([3, 1])})
    seen = oracle.visibility("kv_lengths", inputs)[:, 0].astype(int)
    assert seen.tolist() == [[[1, 1, 0, 0], [1, 1, 1, 0]], [[0, 0, 0, 0], [1, 0, 0, 0]]]
    top_left = oracle.visibility("top_left", inputs)[:, 0].astype(int)
    assert top_left.tolist() == [[[1, 0, 0, 0], [1, 1, 0, 0]], [[1, 0, 0, 0], [1, 0, 0, 0]]]


def test_alibi_over_a_paged_cache_measures_from_each_sequences_length():
    """Over a paged cache ALiBi measures from each sequence's own diagonal: its n_k is kv_lengths[b]."""
    rng = np.random.default_rng(2)
    k_seqs, _, k_pool, v_pool, table = _pages(rng, [4, 2], g=1, d=1, block_size=2)
    q = np.zeros((2, 1, 1, 1))
    inputs = Inputs(q, k_pool, np.ones_like(v_pool), keywords={
        "block_table": table, "kv_lengths": lengths_of(k_seqs), "alibi_slopes": np.array([1.0], np.float32)})
    geo = oracle.geometry("top_left", inputs)
    assert geo.bottom_right[:, 0, 0, 0].tolist() == [3, 1]


# --- the gradients: helpers -------------------------------------------------------------------------

Array = np.ndarray
STEP = 1e-6


def _target(**declared: Any) -> Target:
    return Target(attention, ndims=(2, 3, 4), grad_fn=lambda *a, **k: None, **declared)


def _numeric(loss: Any, x: Array) -> Array:
    """Central differences of ``loss()`` in each entry of ``x`` (changed in place, then restored)."""
    grad = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        keep = x[idx]
        x[idx] = keep + STEP
        up = loss()
        x[idx] = keep - STEP
        down = loss()
        x[idx] = keep
        grad[idx] = (up - down) / (2 * STEP)
    return grad


def _check_against_differences(
    inputs: Inputs, d_out: Array, *, align: str = "top_left", keep: Array | None = None,
    extras: tuple[str, ...] = (),
) -> oracle.ExpectedGradients:
    """Every gradient of the golden backward (q, k, v and ``extras``) against central differences of
    ``Σ golden_out ∘ d_out`` in float64; returns the expected gradients."""
    target = _target(causal_alignment=align)
    want = oracle.gradients(target, inputs, d_out, keep=keep)
    arrays = {"dq": inputs.q, "dk": inputs.k, "dv": inputs.v}
    arrays |= {name: inputs.get(gradient_extras()[name].passes[0]) for name in extras}
    for name, x in arrays.items():
        x = np.array(x, dtype=np.float64)  # a writable copy the loss reads

        def loss(name: str = name, x: Array = x) -> float:
            given = {name[1:]: x} if name in ("dq", "dk", "dv") else {gradient_extras()[name].passes[0]: x}
            call_inputs = inputs.replace(**given)
            geo = oracle.geometry(align, call_inputs)  # type: ignore[arg-type]
            terms = dataclasses.replace(oracle.terms(call_inputs, geo), keep=keep)
            q, k, v = call_inputs.q, call_inputs.k, call_inputs.v
            out, _, _ = golden.forward(q, k, v, visible=oracle.visibility(align, call_inputs),  # type: ignore[arg-type]
                                       scale=call_inputs.scale_value, terms=terms)
            return float(np.sum(out * d_out))

        np.testing.assert_allclose(want.golden[name], _numeric(loss, x), rtol=1e-6, atol=1e-8, err_msg=name)
    return want


def _arrays(lead: tuple[int, ...], n_q: int, n_k: int, d: int = 3, *, kv_lead: tuple[int, ...] | None = None,
            seed: int = 0) -> tuple[Array, Array, Array, Array]:
    rng = np.random.default_rng(seed)
    kv = lead if kv_lead is None else kv_lead
    return (rng.standard_normal((*lead, n_q, d)), rng.standard_normal((*kv, n_k, d)),
            rng.standard_normal((*kv, n_k, 2)), rng.standard_normal((*lead, n_q, 2)))


# --- the golden backward against central differences, keyword by keyword --------------------------


@pytest.mark.parametrize("shape", [(2, 1, 4, 5), (1, 3, 4, 5), (2, 3, 4, 5)],
                         ids=["over heads", "over batch", "full"])
def test_bias_and_its_dbias_summed_over_broadcast_axes(shape):
    q, k, v, d_out = _arrays((2, 3), 4, 5)
    bias = np.random.default_rng(1).standard_normal(shape)
    want = _check_against_differences(Inputs(q, k, v, causal=True, keywords={"bias": bias}), d_out,
                                      extras=("dbias",))
    assert want.golden["dbias"].shape == shape


def test_a_minus_inf_bias_entry_gets_no_gradient_and_hides_its_key():
    q, k, v, d_out = _arrays((2,), 3, 4)
    bias = np.random.default_rng(2).standard_normal((2, 3, 4))
    bias[:, :, 1] = -np.inf  # key 1 hidden from everyone
    bias[0, 2, :] = -np.inf  # head 0's last row sees nothing
    want = _check_against_differences(Inputs(q, k, v, keywords={"bias": bias}), d_out)
    assert np.all(want.golden["dk"][:, 1] == 0) and np.all(want.golden["dv"][:, 1] == 0)
    assert np.all(want.golden["dq"][0, 2] == 0)
    assert np.all(want.golden["dbias"][np.isneginf(bias)] == 0)


def test_alibi():
    q, k, v, d_out = _arrays((1, 2), 3, 5)
    _check_against_differences(Inputs(q, k, v, causal=True, keywords={"alibi_slopes": np.array([0.5, 0.25])}),
                               d_out, align="bottom_right")


def test_softcap_through_its_derivative():
    q, k, v, d_out = _arrays((2,), 4, 4, d=4)
    want = _check_against_differences(Inputs(q * 3, k * 3, v, scale=0.9, keywords={"softcap": 1.5}), d_out)
    plain = oracle.gradients(_target(), Inputs(q * 3, k * 3, v, scale=0.9), d_out)
    assert np.max(np.abs(want.golden["dq"] - plain.golden["dq"])) > 1e-2  # the cap bends these scores


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_sinks_and_dsinks_per_head(lead):
    q, k, v, d_out = _arrays(lead, 3, 4)
    sinks = np.array([0.3, -1.0, 2.0][:lead[-1]] if lead else [0.7])
    want = _check_against_differences(Inputs(q, k, v, causal=True, keywords={"sinks": sinks}), d_out,
                                      extras=("dsinks",))
    assert want.golden["dsinks"].shape == sinks.shape


def test_a_sink_with_a_row_that_sees_nothing():
    q, k, v, d_out = _arrays((1,), 3, 2)
    mask = np.array([[True, True], [False, False], [True, False]])
    _check_against_differences(Inputs(q, k, v, mask=mask, keywords={"sinks": np.array([0.5])}), d_out,
                               extras=("dsinks",))


def test_window_both_alignments():
    q, k, v, d_out = _arrays((2,), 4, 6)
    for align in ("top_left", "bottom_right"):
        inputs = Inputs(q, k, v, causal=True, keywords={"window": (1, 0)})
        _check_against_differences(inputs, d_out, align=align)


def test_kv_lengths_zero_included():
    q, k, v, d_out = _arrays((3, 1), 2, 4)
    want = _check_against_differences(Inputs(q, k, v, keywords={"kv_lengths": np.array([2, 0, 4])}), d_out)
    assert np.all(want.golden["dk"][0, :, 2:] == 0) and np.all(want.golden["dq"][1] == 0)


def test_packed_sequences_aligned_per_sequence_with_grouped_heads():
    q, k, v, d_out = _arrays((4,), 5, 6, kv_lead=(2,))
    packing = {"cu_seqlens_q": np.array([0, 2, 2, 5]), "cu_seqlens_k": np.array([0, 3, 4, 6])}
    _check_against_differences(Inputs(q, k, v, causal=True, keywords=packing), d_out, align="bottom_right")


def test_mask_and_scale():
    q, k, v, d_out = _arrays((2,), 3, 4)
    mask = np.random.default_rng(3).random((2, 3, 4)) < 0.6
    mask[:, :, 0] = True
    _check_against_differences(Inputs(q, k, v, mask=mask, scale=1.7), d_out)


def test_dropout_keep_in_the_backward():
    q, k, v, d_out = _arrays((2,), 3, 4)
    keep = np.where(np.random.default_rng(4).random((2, 3, 4)) < 0.3, 0.0, 1 / 0.7)
    inputs = Inputs(q, k, v, causal=True, keywords={"dropout_p": 0.3, "seed": 1})
    want = _check_against_differences(inputs, d_out, keep=keep)
    assert np.max(np.abs(want.golden["dv"] - oracle.gradients(_target(), inputs, d_out).golden["dv"])) > 1e-2


def test_every_keyword_at_once_against_impls_backward():
    """Two derivations (the full Jacobian here, the D = rowsum(dO ∘ O) form in impl) meet in float64."""
    q, k, v, d_out = _arrays((2, 4), 5, 6, kv_lead=(2, 2), d=4)
    rng = np.random.default_rng(5)
    keywords = {"bias": rng.standard_normal((2, 1, 5, 6)), "window": (2, 1), "softcap": 2.0,
                "sinks": rng.standard_normal(4), "kv_lengths": np.array([6, 3]), "alibi_slopes": np.array(
                    [0.5, 0.25, 0.125, 0.0625])}
    inputs = Inputs(q, k, v, causal=True, scale=0.8, keywords=keywords)
    want = oracle.gradients(_target(), inputs, d_out).golden
    *grads, extras = attention_backward(q, k, v, d_out, causal=True, scale=0.8, return_extras=True,
                                        **keywords)
    for name, got in zip(golden.GRADS, grads, strict=True):
        np.testing.assert_allclose(got, want[name], rtol=1e-10, atol=1e-12, err_msg=name)
    for name, got in extras.items():
        np.testing.assert_allclose(got, want[name], rtol=1e-10, atol=1e-12, err_msg=name)


# --- the baseline and the floors ---------------------------------------------------------------


def _every_keyword() -> Inputs:
    q, k, v, _ = _arrays((2, 2), 4, 5, d=4)
    rng = np.random.default_rng(6)
    return Inputs(q, k, v, causal=True, scale=0.7, keywords={
        "bias": rng.standard_normal((2, 1, 4, 5)), "softcap": 1.5, "sinks": np.array([0.2, -0.5]),
        "window": (2, 2), "kv_lengths": np.array([5, 4])})


def test_the_backward_baseline_takes_the_same_terms():
    """float64 baseline == golden (both exact to rounding) through every term; float32 within
    float32 rounding; without the terms it differs (the test can fail)."""
    inputs = _every_keyword()
    d_out = np.random.default_rng(7).standard_normal((2, 2, 4, 2))
    want = oracle.gradients(_target(), inputs, d_out)
    for name, gold in want.golden.items():
        np.testing.assert_allclose(want.baseline[name], gold, rtol=1e-10, atol=1e-12, err_msg=name)
    narrow = _target(dtypes=("float32", "float64"), computes={"float64": "float32"})
    f32 = oracle.gradients(narrow, inputs, d_out)
    for name, gold in want.golden.items():
        assert f32.baseline[name].dtype == np.float32
        assert 0 < np.max(np.abs(f32.baseline[name] - gold)) < 1e-4, name
        assert f32.floors[name] > 0, name
    plain = tolerance.baseline_backward(inputs.q, inputs.k, inputs.v, d_out,
                                        visible=np.ones((2, 2, 4, 5), bool), scale=0.7)
    assert np.max(np.abs(plain.dq - want.golden["dq"])) > 1e-2


def test_the_floors_bound_a_correct_float32_backward():
    """impl's backward computed in float32 stays within the floors alone (no baseline term)."""
    inputs = _every_keyword()
    d_out = np.random.default_rng(8).standard_normal((2, 2, 4, 2))
    f32 = {name: x.astype(np.float32) for name, x in (("q", inputs.q), ("k", inputs.k), ("v", inputs.v))}
    keywords = {n: x.astype(np.float32) if n in ("bias", "sinks") else x for n, x in inputs.keywords.items()}
    narrow = inputs.replace(**f32, **keywords)
    want = oracle.gradients(_target(dtypes=("float32",)), narrow, d_out.astype(np.float32))
    *grads, extras = attention_backward(narrow.q, narrow.k, narrow.v, d_out.astype(np.float32), causal=True,
                                        scale=0.7, return_extras=True, **keywords)
    for name, got in {**dict(zip(golden.GRADS, grads, strict=True)), **extras}.items():
        assert np.max(np.abs(got - want.golden[name])) <= want.floors[name], name


def test_unbroadcast_sums_the_copies_and_refuses_a_shape_that_does_not_broadcast():
    grad = np.arange(24.0).reshape(2, 3, 4)
    want = grad.sum(axis=0).sum(axis=-1, keepdims=True)
    np.testing.assert_array_equal(oracle.unbroadcast(grad, (3, 1)), want)
    with pytest.raises(ValueError, match=re.escape("(2,) does not broadcast to (2, 3, 4)")):
        oracle.unbroadcast(grad, (2,))


# --- what one example costs ------------------------------------------------------------------------


def test_an_example_builds_its_arrays_and_its_expectation_once():
    """One example of matches_golden draws its q, k and v once and works out its expectation once,
    on the very inputs the target was called with, and keeps it there (``Inputs.memo``): a case
    that rebuilt its arrays, or an expectation worked out again on a copy, redoes the float64 golden
    and the baseline several times an example. The draws are counted by a Case of the test's own
    whose ``values_like`` (the hook a case draws its values through) counts them; the law runs as
    the runner runs it, in a run's context, which records the call the target received."""
    drawn = []

    class Counted(Case):
        def values_like(self, rng, shape):
            drawn.append(shape)
            return super().values_like(rng, shape)

    case = Counted(dtype="float32", ndim=3, batch=1, heads=2, n_q=5, n_k=7, d_k=4, d_v=3, seed=1, causal=True)
    with running(RunContext()) as run:
        spec.LAWS["matches_golden"].check(Target(attention), case)
    assert run.calls and all(made.inputs is case.inputs() for made in run.calls)
    assert [type(x) for x in case.inputs().memo.values()].count(oracle.Expected) == 1
    assert case.arrays() is case.arrays() and case.inputs().q is case.arrays()[0]
    assert len(drawn) == 3  # q, k and v, once each, however often they were asked for
