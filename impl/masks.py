"""Boolean mask builders: ``True`` means the query may attend to the key.

Each builder is pure and small; combine them with ``np.logical_and`` and pass the result as
``mask=`` to :func:`impl.attention` (or any attention that takes a boolean mask).
"""

from __future__ import annotations

from typing import Literal

import numpy as np


def _positions(n_q: int, n_k: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    for name, n in (("n_q", n_q), ("n_k", n_k)):
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0):
            raise ValueError(f"{name} must be a non-negative integer, got {n!r}")
    n_k = n_q if n_k is None else n_k
    return np.arange(n_q)[:, None], np.arange(n_k)[None, :], n_k


def causal_mask(
    n_q: int, n_k: int | None = None, *, align: Literal["top_left", "bottom_right"] = "top_left"
) -> np.ndarray:  # -> [n_q, n_k]
    """Causal visibility.

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
    i, j, n_k = _positions(n_q, n_k)
    if align == "top_left":
        return j <= i
    if align == "bottom_right":
        return j <= i + (n_k - n_q)
    raise ValueError(f"align must be 'top_left' or 'bottom_right', got {align!r}")


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


def sliding_window_mask(n_q: int, n_k: int | None = None, *, window: tuple[int, int]) -> np.ndarray:
    """Local attention: query i sees keys j with i − left ≤ j ≤ i + right, ``window = (left, right)``.

    ``(w − 1, 0)`` is a causal window of w keys (Mistral's sliding window with W = w);
    FlashAttention's ``window_size`` uses the same ``(left, right)`` convention.

    >>> sliding_window_mask(4, window=(1, 0)).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    left, right = window
    if min(left, right) < 0:
        raise ValueError(f"window must be (left, right) with both >= 0, got {window}")
    i, j, _ = _positions(n_q, n_k)
    return (j >= i - left) & (j <= i + right)
