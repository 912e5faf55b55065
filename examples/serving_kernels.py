"""Serving kernels of our own, each with one contract that it enforces (a call outside it raises
ValueError, as a production kernel with no code path for it) and declared to the suite with
`spec.Target` alone (docs/targets.md, "Declare a serving kernel"):

    python -m spec check examples.serving_kernels:causal          # causal_only
    python -m spec check examples.serving_kernels:decode          # decode_only
    python -m spec check examples.serving_kernels:chunked_prefill # keys_cover_queries
    python -m spec check examples.serving_kernels:prefill         # self_attention_only
    python -m spec check examples.serving_kernels:paged           # how it takes its keywords

Inputs in the suite's ``bhnd`` layout, ``[..., n, d]``; computed in float64, returned in the
inputs' dtype. ``paged`` takes float8 caches, which need ml_dtypes (the test extra).
"""

import numpy as np

import spec


def attend(q, k, v, visible, bias=0.0):
    # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [..., n_q, n_k] bool -> [..., n_q, d_v]
    """softmax(q kᵀ/√d_k + bias) v over the visible keys; a row that sees no key gives zeros."""
    s = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) / np.sqrt(q.shape[-1]) + bias
    s = np.where(visible, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    w = np.exp(s - np.where(np.isfinite(top), top, 0.0))  # exp(-inf) = 0: hidden keys weigh nothing
    total = w.sum(axis=-1, keepdims=True)
    return ((w / np.where(total > 0, total, 1.0)) @ v.astype(np.float64)).astype(q.dtype)


def causal_attention(q, k, v, *, causal=False):
    """Causal attention and nothing else (query i sees keys j ≤ i): a prefill kernel that asserts
    causal."""
    if not causal:
        raise ValueError("causal must be True: this kernel has no non-causal mode")
    return attend(q, k, v, np.tri(q.shape[-2], k.shape[-2], dtype=bool))


causal = spec.Target(causal_attention, name="causal prefill", causal_only=True)


def decode_attention(q, k, v, *, causal=False):
    """One query per sequence over its whole cache: the query comes after every key, so causal or
    not it sees them all (a bottom-right diagonal)."""
    if q.shape[-2] != 1:
        raise ValueError(f"q must hold one query per sequence, got n_q={q.shape[-2]}")
    return attend(q, k, v, np.ones((1, k.shape[-2]), dtype=bool))


decode = spec.Target(decode_attention, name="decode", decode_only=True, causal_alignment="bottom_right")


def chunked_prefill_attention(q, k, v, *, causal=False):
    """A chunk of n_q new tokens over the cache: n_k − n_q cached keys, then one new key per query;
    causal, query i sees the cached keys and the new ones up to its own (j ≤ i + n_k − n_q)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    if n_k < n_q:
        raise ValueError(f"k must hold a key per query and the cached ones, got n_k={n_k} < n_q={n_q}")
    visible = np.tri(n_q, n_k, n_k - n_q, dtype=bool) if causal else np.ones((n_q, n_k), dtype=bool)
    return attend(q, k, v, visible)


chunked_prefill = spec.Target(chunked_prefill_attention, name="chunked prefill", keys_cover_queries=True,
                              causal_alignment="bottom_right")


def prefill_attention(q, k, v, *, causal=False):
    """Self-attention over a prompt: the keys are the queries' own tokens (n_q = n_k), top-left
    causal; no scale= argument (always 1/√d_k)."""
    n = q.shape[-2]
    if k.shape[-2] != n:
        raise ValueError(f"k must hold the queries' own tokens, got n_k={k.shape[-2]} for n_q={n}")
    return attend(q, k, v, np.tri(n, dtype=bool) if causal else np.ones((n, n), dtype=bool))


prefill = spec.Target(prefill_attention, name="prefill", self_attention_only=True)


def paged_attention(q, k, v, *, causal=False, window=None, alibi_slopes=None, block_table=None,
                    kv_lengths=None, k_descale=None, v_descale=None):
    # q [batch, heads, n_q, d]; k, v [batch, heads, n_k, d] or paged [blocks, block_size, heads, d]
    """Bottom-right causal attention over a KV cache, contiguous or paged in blocks of 16·m keys
    (``block_table`` [batch, max_blocks], ``kv_lengths`` [batch]), float8 or not (one descale per
    tensor), with a sliding window that looks back only and exists only with causal, and ALiBi
    slopes per head."""
    if window is not None and (window[1] != 0 or not causal):
        raise ValueError(f"window must be (left, 0) with causal=True, got {window} with causal={causal}")
    if alibi_slopes is not None and np.ndim(alibi_slopes) != 1:
        raise ValueError(f"alibi_slopes must be [heads], got shape {np.shape(alibi_slopes)}")
    if block_table is not None and k.shape[1] % 16:
        raise ValueError(f"the block size must be a multiple of 16, got {k.shape[1]}")
    if k_descale is not None:  # float8 codes
        if np.ptp(k_descale) or np.ptp(v_descale):
            raise ValueError("k_descale and v_descale must each hold one value (one scale per tensor)")
        k, v = k.astype(np.float32) * k_descale.flat[0], v.astype(np.float32) * v_descale.flat[0]
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    for b in range(q.shape[0]):
        if block_table is None:
            kb, vb = k[b], v[b]  # [heads, n_k, d]
        else:  # this sequence's blocks, and its keys alone: the rest of the pool is junk
            length, size = int(kv_lengths[b]), k.shape[1]
            blocks = block_table[b, :-(-length // size)]
            kb, vb = (np.moveaxis(x[blocks].reshape(-1, *x.shape[2:])[:length], 0, 1) for x in (k, v))
        n_q, n_k = q.shape[-2], kb.shape[-2]
        diag = np.arange(n_q)[:, None] + n_k - n_q  # [n_q, 1]: the last query sees the last key
        j = np.arange(n_k)[None, :]
        visible = j <= diag if causal else np.ones((n_q, n_k), dtype=bool)
        if window is not None:
            visible = visible & (j >= diag - window[0])
        bias = 0.0 if alibi_slopes is None else -np.reshape(alibi_slopes, (-1, 1, 1)) * np.abs(diag - j)
        out[b] = attend(q[b], kb, vb, visible, bias)
    return out


paged = spec.Target(paged_attention, name="paged attention", ndims=(4,), causal_alignment="bottom_right",
                    supports_window=True, supports_alibi=True, supports_paged_kv=True, supports_fp8_kv=True,
                    window_sides="left", window_needs_causal=True, alibi_shape="heads", fp8_scale="tensor",
                    block_multiple=16)
