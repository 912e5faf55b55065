"""Scaled dot-product attention, the reference.

Dimension letters, used in every shape code of this package:

    n_q  queries            n_k  keys (and values)
    d_k  query/key width    d_v  value width
    h    query heads        g    key/value heads
    d    model width        ...  leading dims (batch, heads), broadcast

    attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V,   scale = 1/√d_k by default

Numerics: scores, softmax and the weighted sum run in float64 for float64 inputs and in float32
for float32, float16 and bfloat16-like inputs (as JAX does); the result is cast back to the input
dtype. A query row with no visible key gives zeros and zero weights (PyTorch's and
FlashAttention's choice). NaN and Inf in the inputs propagate; they are never replaced.
"""

from __future__ import annotations

import math
from typing import Any, Literal, overload

import numpy as np

from impl.masks import causal_mask

Array = np.ndarray


def softmax(x: Array, axis: int = -1) -> Array:  # [..., n] -> [..., n]
    """Softmax along ``axis``, stable for any finite input.

    The row maximum is subtracted before ``exp`` (softmax is invariant to a shift, and the
    largest entry becomes exp(0) = 1, so nothing overflows). A row that is entirely ``-inf``
    (nothing visible) gives all zeros instead of 0/0 = NaN. NaN anywhere in a row makes the
    whole row NaN.

    >>> softmax(np.array([0.0, np.log(3.0)]))
    array([0.25, 0.75])
    >>> softmax(np.array([-np.inf, -np.inf]))
    array([0., 0.])
    """
    x = np.asarray(x)
    row_max = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    # An all -inf row has max -inf; shifting by it would give -inf - -inf = NaN.
    shift = np.where(np.isneginf(row_max), 0.0, row_max)
    e = np.exp(x - shift)
    total = np.sum(e, axis=axis, keepdims=True)
    # total is exactly 0 only for rows with nothing visible (otherwise the max gives exp(0) = 1).
    return e / np.where(total == 0, 1, total)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype the maths runs in for inputs of ``dtype``: float64 stays, narrower floats use float32."""
    return np.dtype(np.float64) if np.dtype(dtype).itemsize >= 8 else np.dtype(np.float32)


def _is_real_float(dtype: np.dtype) -> bool:
    # bfloat16 from ml_dtypes is a NumPy 'V'-kind dtype named 'bfloat16'; accept it as a float.
    return dtype.kind == "f" or dtype.name == "bfloat16"


def _as_float_array(name: str, x: Any) -> Array:
    if isinstance(x, (bool, int, float, complex)) or x is None:
        raise TypeError(f"{name} must be an array of shape (..., n, d), got {type(x).__name__}")
    arr = np.asarray(x)
    if not _is_real_float(arr.dtype):
        raise TypeError(
            f"{name} must have a real floating dtype (float16/32/64), got {arr.dtype} "
            f"with shape {arr.shape}"
        )
    if arr.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dims (..., n, d), got shape {arr.shape}")
    return arr


def check_qkv(q: Any, k: Any, v: Any) -> tuple[Array, Array, Array, tuple[int, ...]]:
    """Validate q, k, v and return them as arrays with the broadcast leading shape.

    q ``[..., n_q, d_k]``, k ``[..., n_k, d_k]``, v ``[..., n_k, d_v]``; the leading dims of the
    three must broadcast together. Raises ``TypeError`` for non-float or mixed dtypes and
    ``ValueError`` for wrong ndim, mismatched widths or lengths, unbroadcastable leading dims and
    ``d_k = 0``.
    """
    q = _as_float_array("q", q)
    k = _as_float_array("k", k)
    v = _as_float_array("v", v)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same width d_k, got q {q.shape} and k {k.shape}"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"d_k must be positive, got q {q.shape} and k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length n_k, got k {k.shape} and v {v.shape}"
        )
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"leading dims of q, k and v must broadcast, got q {q.shape}, k {k.shape}, v {v.shape}"
        ) from None
    return q, k, v, batch


def check_scale(scale: Any, d_k: int) -> float:
    """Return the score scale: ``1/√d_k`` when ``scale`` is None, else ``scale`` (finite, real)."""
    if scale is None:
        return 1.0 / math.sqrt(d_k)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def check_mask(mask: Any, shape: tuple[int, ...]) -> Array:
    """Validate a boolean mask (True = may attend) that broadcasts to ``shape`` = (..., n_q, n_k)."""
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {arr.dtype}")
    try:
        broadcast = np.broadcast_shapes(arr.shape, shape)
    except ValueError:
        broadcast = None
    if broadcast != shape:
        raise ValueError(f"mask of shape {arr.shape} does not broadcast to (..., n_q, n_k) = {shape}")
    return arr


def visible(
    n_q: int, n_k: int, *, causal: bool, mask: Array | None, shape: tuple[int, ...]
) -> Array | None:  # -> [..., n_q, n_k] bool, or None when every key is visible
    """The combined visibility: the top-left causal mask and ``mask``, ANDed; None if neither."""
    keep = causal_mask(n_q, n_k) if causal else None
    if mask is not None:
        keep = mask if keep is None else np.logical_and(keep, mask)
    return None if keep is None else np.broadcast_to(keep, shape)


@overload
def attention(
    q: Any, k: Any, v: Any, *, causal: bool = ..., mask: Any = ..., scale: float | None = ...,
    return_weights: Literal[False] = ...,
) -> Array: ...
@overload
def attention(
    q: Any, k: Any, v: Any, *, causal: bool = ..., mask: Any = ..., scale: float | None = ...,
    return_weights: Literal[True],
) -> tuple[Array, Array]: ...
def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    mask: Any = None,
    scale: float | None = None,
    return_weights: bool = False,
) -> Array | tuple[Array, Array]:
    """Scaled dot-product attention, ``softmax(q kᵀ · scale) v``.

    Args:
      q: queries ``[..., n_q, d_k]``.
      k: keys ``[..., n_k, d_k]``.
      v: values ``[..., n_k, d_v]``. The leading dims of q, k and v broadcast.
      causal: query i sees keys j ≤ i (top-left aligned, as PyTorch). For the bottom-right
        alignment (FlashAttention ≥ 2.1) pass ``mask=causal_mask(n_q, n_k, align="bottom_right")``.
      mask: boolean, True = may attend, broadcastable to ``[..., n_q, n_k]``; ANDed with ``causal``.
      scale: multiplies the scores; default ``1/√d_k``.
      return_weights: also return the attention pattern ``[..., n_q, n_k]``.

    Returns:
      ``[..., n_q, d_v]`` in the input dtype, and the pattern (compute dtype) if asked.

    A query with no visible key gets zeros and zero weights.

    >>> q = np.array([[1.0, 0.0]]); k = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> v = np.array([[10.0], [20.0]])
    >>> out, w = attention(q, k, v, scale=np.log(3.0), return_weights=True)
    >>> w, out
    (array([[0.75, 0.25]]), array([[12.5]]))
    """
    q, k, v, batch = check_qkv(q, k, v)
    n_q, d_k = q.shape[-2:]
    n_k = k.shape[-2]
    scale = check_scale(scale, d_k)
    shape = (*batch, n_q, n_k)
    if mask is not None:
        mask = check_mask(mask, shape)
    work = compute_dtype(q.dtype)
    q_, k_, v_ = (x.astype(work, copy=False) for x in (q, k, v))

    scores = (q_ @ np.swapaxes(k_, -1, -2)) * work.type(scale)  # [..., n_q, n_k]
    # The mask may carry leading dims that only v has, so broadcast to the full output batch.
    keep = visible(n_q, n_k, causal=causal, mask=mask, shape=shape)
    if keep is not None:
        scores = np.where(keep, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    out = (weights @ v_).astype(q.dtype, copy=False)  # [..., n_q, n_k] @ [..., n_k, d_v]
    if return_weights:
        return out, weights
    return out
