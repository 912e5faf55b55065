"""Boolean mask builders: ``True`` means the query may attend to the key.

Each builder is pure and small; combine them with ``np.logical_and`` and pass the result as
``mask=`` to :func:`impl.attention` (or any attention that takes a boolean mask).

Causal masks and sliding windows are measured from each query's *diagonal* key:
``diag = i`` for the ``top_left`` alignment (PyTorch's ``is_causal``) and ``diag = i + n_k − n_q``
for ``bottom_right`` (FlashAttention ≥ 2.1, MLX: the last query sits on the last key).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

Align = Literal["top_left", "bottom_right"]


def _positions(n_q: int, n_k: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    for name, n in (("n_q", n_q), ("n_k", n_k)):
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0):
            raise ValueError(f"{name} must be a non-negative integer, got {n!r}")
    n_k = n_q if n_k is None else n_k
    return np.arange(n_q)[:, None], np.arange(n_k)[None, :], n_k


def _diagonal(n_q: int, n_k: int | None, align: Align) -> tuple[np.ndarray, np.ndarray]:
    # -> diag [n_q, 1], key positions j [1, n_k]
    i, j, n_k = _positions(n_q, n_k)
    if align == "top_left":
        return i, j
    if align == "bottom_right":
        return i + (n_k - n_q), j
    raise ValueError(f"align must be 'top_left' or 'bottom_right', got {align!r}")


def causal_mask(
    n_q: int, n_k: int | None = None, *, align: Align = "top_left"
) -> np.ndarray:  # -> [n_q, n_k]
    """Causal visibility: query i sees keys j ≤ diag.

    ``top_left`` (PyTorch's ``is_causal``): query i sees keys j ≤ i.
    ``bottom_right`` (FlashAttention ≥ 2.1, MLX): the last query sees the last key, so query i
    sees keys j ≤ i + (n_k − n_q) — the alignment of decoding with a KV cache.

    >>> causal_mask(2, 3).astype(int)
    array([[1, 0, 0],
           [1, 1, 0]])
    >>> causal_mask(2, 3, align="bottom_right").astype(int)
    array([[1, 1, 0],
           [1, 1, 1]])
    """
    diag, j = _diagonal(n_q, n_k, align)
    return j <= diag


def padding_mask(key_lengths: np.ndarray | list[int], n_k: int) -> np.ndarray:
    """Key padding: sequence b has ``key_lengths[b]`` real keys, the rest are padding.

    ``key_lengths`` ``[...]`` → mask ``[..., 1, n_k]`` (the 1 broadcasts over queries). For
    ``[batch, heads, n_q, n_k]`` scores pass ``key_lengths[:, None]``.

    >>> padding_mask([1, 3], 3).astype(int)
    array([[[1, 0, 0]],
    <BLANKLINE>
           [[1, 1, 1]]])
    """
    lengths = np.asarray(key_lengths)
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"key_lengths must be integers, got dtype {lengths.dtype}")
    if np.any(lengths < 0) or np.any(lengths > n_k):
        raise ValueError(f"key_lengths must lie in [0, n_k={n_k}], got {lengths.tolist()}")
    return np.arange(n_k) < lengths[..., None, None]


def check_window(window: object) -> tuple[int, int]:
    """Validate ``window = (left, right)``: two integers ≥ 0 (``TypeError``/``ValueError`` naming it)."""
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be a pair (left, right) of integers >= 0, got {window!r}")
    if any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) for w in window):
        raise TypeError(f"window must be a pair (left, right) of integers >= 0, got {window!r}")
    if min(window) < 0:
        raise ValueError(f"window must be (left, right) with both >= 0, got {tuple(window)}")
    return int(window[0]), int(window[1])


def sliding_window_mask(
    n_q: int, n_k: int | None = None, *, window: tuple[int, int], align: Align = "top_left"
) -> np.ndarray:  # -> [n_q, n_k]
    """Local attention: query i sees keys j with diag − left ≤ j ≤ diag + right, ``window = (left, right)``.

    ``(w − 1, 0)`` is a causal window of w keys (Mistral's sliding window with W = w);
    FlashAttention's ``window_size`` uses the same ``(left, right)`` convention (bottom-right).

    >>> sliding_window_mask(4, window=(1, 0)).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    >>> sliding_window_mask(2, 4, window=(1, 0), align="bottom_right").astype(int)
    array([[0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    left, right = check_window(window)
    diag, j = _diagonal(n_q, n_k, align)
    return (j >= diag - left) & (j <= diag + right)


def packed_mask(
    cu_seqlens_q: np.ndarray, cu_seqlens_k: np.ndarray,
    within: Callable[[int, int], np.ndarray | None] = lambda n_q, n_k: None,
) -> np.ndarray:  # [b + 1], [b + 1] -> [total_q, total_k]
    """Packed sequences (FlashAttention's varlen): a query sees only the keys of its own sequence.

    Sequence s holds queries ``cu_seqlens_q[s] : cu_seqlens_q[s + 1]`` and keys
    ``cu_seqlens_k[s] : cu_seqlens_k[s + 1]``; inside that block, ``within(n_q_s, n_k_s)`` (a
    ``[n_q_s, n_k_s]`` mask in the sequence's own positions, e.g. a causal mask; None = all) says
    which pairs are visible. Every other pair is hidden (a block-diagonal mask).

    >>> packed_mask(np.array([0, 1, 3]), np.array([0, 2, 3]), causal_mask).astype(int)
    array([[1, 0, 0],
           [0, 0, 1],
           [0, 0, 1]])
    """
    cu_q, cu_k = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    keep = np.zeros((int(cu_q[-1]), int(cu_k[-1])), dtype=bool)
    for q0, q1, k0, k1 in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:], strict=True):
        block = within(int(q1 - q0), int(k1 - k0))
        keep[q0:q1, k0:k1] = True if block is None else block
    return keep
