"""Gallery of the chunk laws (``attention_chunk=C``, Llama 4's chunked attention): broken chunks,
each rejected by its law, and correct variants that build the chunk as a mask of their own."""

from __future__ import annotations

from typing import Any

import numpy as np

from gallery._keywords import textbook
from gallery.base import broken
from impl import attention
from spec import Target

Array = np.ndarray


def same_chunk(query_positions: Array, key_positions: Array, chunk: int) -> Array:  # -> [n_q, n_k]
    """Whether each query and key lie in one chunk of ``chunk`` positions (Python's // floors)."""
    return (np.asarray(query_positions)[:, None] // chunk) == (np.asarray(key_positions)[None, :] // chunk)


def _and(mask: Any, more: Array) -> Array:
    return more if mask is None else np.logical_and(mask, more)


def chunk_top_left(q: Array, k: Array, v: Array, *, attention_chunk: Any = None, mask: Any = None,
                   **kw: Any) -> Array:
    """The causal mask bottom-right, as declared, but the chunks measured top-left (query i at
    position i): a decode step's query reads the cache's first chunk (vllm PR #28739)."""
    if attention_chunk is not None:
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = _and(mask, same_chunk(np.arange(n_q), np.arange(n_k), attention_chunk))
    return attention(q, k, v, mask=mask, align="bottom_right", **kw)


def chunk_off_by_one(q: Array, k: Array, v: Array, *, attention_chunk: Any = None, mask: Any = None,
                     **kw: Any) -> Array:
    """The chunk boundary off by one: key j's chunk j // C compared with (i + 1) // C, so the last
    query of each chunk sees the next chunk's keys."""
    if attention_chunk is not None:
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = _and(mask, same_chunk(np.arange(n_q) + 1, np.arange(n_k), attention_chunk))
    return attention(q, k, v, mask=mask, **kw)


def chunk_on_packed_index(q: Array, k: Array, v: Array, *, attention_chunk: Any = None, mask: Any = None,
                          **kw: Any) -> Array:
    """Chunks computed on the packed token index instead of each sequence's own positions: a
    sequence that starts mid-chunk has its first chunk cut short."""
    if attention_chunk is not None:
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = _and(mask, same_chunk(np.arange(n_q), np.arange(n_k), attention_chunk))
    return attention(q, k, v, mask=mask, **kw)


def chunk_as_window(q: Array, k: Array, v: Array, *, attention_chunk: Any = None, **kw: Any) -> Array:
    """Chunked attention built as a sliding window of C keys on each side: what a query sees slides
    with it instead of restarting at each chunk's start."""
    window = None if attention_chunk is None else (attention_chunk - 1, attention_chunk - 1)
    return attention(q, k, v, window=window, **kw)


def chunk_clipped(q: Array, k: Array, v: Array, *, attention_chunk: Any = None, **kw: Any) -> Array:
    """The chunk silently clipped to a fixed 16-key tile."""
    return attention(q, k, v, attention_chunk=None if attention_chunk is None else min(attention_chunk, 16),
                     **kw)


def chunk_drops_causal(q: Array, k: Array, v: Array, *, attention_chunk: Any = None, causal: bool = False,
                       **kw: Any) -> Array:
    """The chunked path drops the causal mask: a query sees the later keys of its chunk."""
    causal = causal and attention_chunk is None
    return attention(q, k, v, attention_chunk=attention_chunk, causal=causal, **kw)


def chunk_drops_lengths(q: Array, k: Array, v: Array, *, attention_chunk: Any = None, kv_lengths: Any = None,
                        **kw: Any) -> Array:
    """The chunked path builds its own mask and forgets the key lengths."""
    return attention(q, k, v, attention_chunk=attention_chunk,
                     kv_lengths=None if attention_chunk is not None else kv_lengths, **kw)


PLAIN = {"supports_chunk": True, "supports_mask": True, "supports_scale": True, "ndims": (2, 3, 4)}
"""What most variants declare besides their bug's needs (top-left causal)."""


BROKEN = [
    broken(chunk_top_left, "chunk_alignment",
           "chunk positions measured top-left while the causal mask and cache align bottom-right "
           "(vllm PR #28739: wrong Llama 4 outputs)", causal_alignment="bottom_right", **PLAIN),
    broken(chunk_off_by_one, "chunk_no_leak",
           "chunk boundary off by one: j // C compared with (i + 1) // C", **PLAIN),
    broken(chunk_on_packed_index, "chunk_per_sequence",
           "chunk computed on the packed token index instead of each sequence's own position",
           supports_varlen=True, **PLAIN),
    broken(chunk_as_window, "chunk_matches_golden",
           "chunked attention built as a sliding window of C keys (|i − j| < C)", **PLAIN),
    broken(chunk_clipped, "chunk_wider_than_sequence", "chunk silently clipped to a fixed 16-key tile",
           **PLAIN),
    broken(chunk_drops_causal, "chunk_with_causal", "the chunked path drops the causal mask", **PLAIN),
    broken(chunk_drops_lengths, "chunk_with_kv_lengths", "the chunked path drops kv_lengths",
           supports_kv_lengths=True, **PLAIN),
]


def chunk_as_mask(q: Array, k: Array, v: Array, *, attention_chunk: Any = None, mask: Any = None,
                  **kw: Any) -> Array:
    """Correct: the chunk as a boolean mask (top-left positions) passed to a plain softmax."""
    if attention_chunk is not None:
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = _and(mask, same_chunk(np.arange(n_q), np.arange(n_k), attention_chunk))
    return textbook(q, k, v, mask=mask, **kw)


def chunk_sequence_by_sequence(q: Array, k: Array, v: Array, *, attention_chunk: Any = None,
                               cu_seqlens_q: Any = None, cu_seqlens_k: Any = None, **kw: Any) -> Array:
    """Correct: packed sequences attended one at a time, each with its own chunk mask (positions
    from 0 in each sequence), the rows of a sequence without keys left at zero."""
    if cu_seqlens_q is None:
        return chunk_as_mask(q, k, v, attention_chunk=attention_chunk, **kw)
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    bounds = zip(cu_seqlens_q[:-1], cu_seqlens_q[1:], cu_seqlens_k[:-1], cu_seqlens_k[1:], strict=True)
    for q0, q1, k0, k1 in bounds:
        if q1 > q0 and k1 > k0:
            out[..., q0:q1, :] = chunk_as_mask(q[..., q0:q1, :], k[..., k0:k1, :], v[..., k0:k1, :],
                                               attention_chunk=attention_chunk, **kw)
    return out


def chunk_bottom_right(q: Array, k: Array, v: Array, **kw: Any) -> Array:
    """Correct: impl's chunks on the bottom-right diagonal, so that with more queries than keys the
    first queries lie before the first key (chunk −1) and see nothing, as declared."""
    return attention(q, k, v, align="bottom_right", **kw)


# A plain softmax's row max raises on an empty key axis (n_k = 0): declared.
CORRECT = [Target(chunk_as_mask, name="chunk_as_mask", empty_keys="raise", **PLAIN),
           Target(chunk_sequence_by_sequence, name="chunk_sequence_by_sequence", supports_chunk=True,
                  supports_varlen=True, supports_scale=True, ndims=(3,), empty_keys="raise"),
           Target(chunk_bottom_right, name="chunk_bottom_right", causal_alignment="bottom_right",
                  empty_keys="compute", **PLAIN)]
