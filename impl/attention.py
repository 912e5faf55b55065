"""Scaled dot-product attention, the reference.

Dimension letters, used in every shape code of this package:

    n_q  queries            n_k  keys (and values)
    d_k  query/key width    d_v  value width
    h    query heads        g    key/value heads
    d    model width        ...  leading dims (batch, heads), broadcast

    attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V,   scale = 1/√d_k by default

and with every keyword, in this order: ``s = scale·q·kᵀ`` (``+ scale·qv·vᵀ``) → softcap
``c·tanh(s/c)`` → ``+ bias`` and ALiBi's ``−slope·|i + n_k − n_q − j|`` → ``-inf`` where hidden
(causal ∧ window ∧ chunk ∧ mask ∧ top-k ∧ kv_lengths ∧ same packed sequence) → softmax with the
sinks in its denominator → dropout → ``@ v``.
Three layers, as JAX's: `attention` validates (through ``_checked``, which the backward in
``impl.grad`` shares), `_grouped` maps grouped K/V heads, `_core` is the maths. The keywords are
declared once, in `impl.keywords`, for `attention`, its backward and `impl.flash_attention` alike.

Numerics: scores, softmax and the weighted sum run in float64 for float64 inputs and in float32
for float32, float16 and bfloat16-like inputs (as JAX does); the result is cast back to the input
dtype. A query row with no visible key gives zeros and zero weights (PyTorch's and
FlashAttention's choice). NaN and Inf in the inputs propagate; they are never replaced.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import reduce
from typing import Any, Unpack, overload

import numpy as np

from impl.cache import read_cache
from impl.keywords import (
    CacheKeywords,
    Keywords,
    WithLse,
    WithoutLse,
    WithoutWeights,
    WithWeights,
    given,
    takes,
)
from impl.masks import (
    ALIGNMENTS,
    Align,
    causal_mask,
    check_chunk,
    check_selection_keywords,
    check_window,
    chunk_mask,
    key_distance,
    packed_mask,
    padding_mask,
    per_sequence,
    sliding_window_mask,
    topk_block_mask,
    topk_mask,
)

Array = np.ndarray


def softmax_lse(x: Array, sinks: Array | float = -np.inf) -> tuple[Array, Array]:
    # [..., n], [..., 1] -> weights [..., n], lse [..., 1]
    """Softmax along the last axis and its natural-log normaliser ``lse = log Σ exp``.

    ``sinks`` is one extra logit per row that joins the denominator and gets no weight of its
    own to return (attention sinks); ``-inf``, the default, adds exactly 0 — no sink at all.
    The row maximum is subtracted before ``exp``, so nothing overflows. A row that is entirely
    ``-inf`` gives zeros (not 0/0 = NaN) and ``lse = -inf``; NaN anywhere makes the row NaN.
    """
    row_max = np.maximum(np.max(x, axis=-1, keepdims=True, initial=-np.inf), sinks)
    # An all -inf row has max -inf; shifting by it would give -inf - -inf = NaN.
    shift = np.where(np.isneginf(row_max), 0.0, row_max).astype(x.dtype, copy=False)
    e = np.exp(x - shift)
    total = np.sum(e, axis=-1, keepdims=True) + np.exp(sinks - shift)
    with np.errstate(divide="ignore"):  # log(0) = -inf for a row that sees nothing
        lse = shift + np.log(total)
    # total is exactly 0 only for rows with nothing visible (otherwise the max gives exp(0) = 1).
    return e / np.where(total == 0, 1, total), lse


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
    weights, _ = softmax_lse(np.moveaxis(np.asarray(x), axis, -1))
    return np.moveaxis(weights, -1, axis)


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


def kv_groups(q_shape: tuple[int, ...], k_shape: tuple[int, ...], v_shape: tuple[int, ...]) -> int | None:
    """The number g of K/V heads when k and v hold fewer heads than q (grouped-query attention), else None.

    Heads sit on axis -3. With h query heads and g ≥ 1 K/V heads, h divisible by g, query head i
    reads K/V head ``i // (h // g)`` (PyTorch's ``enable_gqa``, JAX); g = h (groups of one) and
    g = 1 (one group) are the plain broadcasts, computed the same way. g = 0 K/V heads serve no
    query head: None, and the leading dims must broadcast as they are (h = 0 or 1).
    """
    if min(len(q_shape), len(k_shape), len(v_shape)) < 3:
        return None
    h, g = q_shape[-3], k_shape[-3]
    if v_shape[-3] != g or g == 0 or h % g:
        return None
    return g


def check_qkv(
    q: Any, k: Any, v: Any, *, grouped: bool = False
) -> tuple[Array, Array, Array, tuple[int, ...]]:
    """Validate q, k, v and return them as arrays with the broadcast leading shape.

    q ``[..., n_q, d_k]``, k ``[..., n_k, d_k]``, v ``[..., n_k, d_v]``; the leading dims of the
    three must broadcast together — or, with ``grouped=True``, k and v may have g heads (axis -3)
    where q has h, h divisible by g (see `kv_groups`). Raises ``TypeError`` for non-float or
    mixed dtypes and ``ValueError`` for wrong ndim, mismatched widths or lengths, unbroadcastable
    leading dims and ``d_k = 0``.
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
    k_lead, v_lead = k.shape[:-2], v.shape[:-2]
    if grouped and kv_groups(q.shape, k.shape, v.shape):
        # Each K/V head serves h/g query heads: as leading dims, k and v count q's h heads.
        k_lead, v_lead = (*k_lead[:-1], q.shape[-3]), (*v_lead[:-1], q.shape[-3])
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k_lead, v_lead)
    except ValueError:
        groups = (
            f"; as grouped-query attention, q's heads (h = {q.shape[-3]}, axis -3) must be divisible "
            f"by k's and v's (g = {k.shape[-3]})" if grouped and min(q.ndim, k.ndim) >= 3 else ""
        )
        raise ValueError(
            f"leading dims of q, k and v must broadcast{groups}, got q {q.shape}, k {k.shape}, v {v.shape}"
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
    return _broadcasts_to_scores("mask", arr, shape)


def _broadcasts_to_scores(name: str, arr: Array, shape: tuple[int, ...]) -> Array:
    """``arr`` itself, once it is known to broadcast to the scores' ``shape`` = (..., n_q, n_k)."""
    try:
        broadcast = np.broadcast_shapes(arr.shape, shape)
    except ValueError:
        broadcast = None
    if broadcast != shape:
        raise ValueError(f"{name} of shape {arr.shape} does not broadcast to (..., n_q, n_k) = {shape}")
    return arr


def _check_real(name: str, x: Any, expected: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be {expected}, got {type(x).__name__}")
    return float(x)


def check_softcap(softcap: Any) -> float | None:
    """``softcap = c``: a finite real number > 0, or None for no cap."""
    if softcap is None:
        return None
    c = _check_real("softcap", softcap, "a real number > 0 or None")
    if not (math.isfinite(c) and c > 0):
        raise ValueError(f"softcap must be a finite number > 0, got {softcap}")
    return c


def _float_array(name: str, x: Any, work: np.dtype) -> Array:
    arr = np.asarray(x)
    if not _is_real_float(arr.dtype):
        raise TypeError(f"{name} must be a real floating array, got dtype {arr.dtype} with shape {arr.shape}")
    return arr.astype(work, copy=False)


def check_bias(bias: Any, shape: tuple[int, ...], work: np.dtype) -> Array | None:
    """An additive float bias broadcasting to ``shape`` = (..., n_q, n_k), in the compute dtype."""
    if bias is None:
        return None
    return _broadcasts_to_scores("bias", _float_array("bias", bias, work), shape)


def check_sinks(sinks: Any, batch: tuple[int, ...], work: np.dtype) -> Array | float:
    # [heads] -> [heads, 1, 1] ([1] -> [1, 1] for 2-D inputs), or -inf (no sink) if None
    """One sink logit per query head: shape ``[heads]`` (``[1]`` for 2-D inputs), real floats."""
    if sinks is None:
        return -np.inf
    arr = _float_array("sinks", sinks, work)
    heads = batch[-1] if batch else 1
    if arr.shape != (heads,):
        raise ValueError(f"sinks must have shape (heads,) = ({heads},), one per query head, got {arr.shape}")
    return arr.reshape(heads, 1, 1) if batch else arr.reshape(1, 1)


def check_alibi_slopes(alibi_slopes: Any, batch: tuple[int, ...], work: np.dtype) -> Array | None:
    # [heads] or [batch, heads] -> broadcastable to batch ([1] -> [] for 2-D inputs), or None
    """ALiBi slopes, one per query head: ``[heads]`` (``[1]`` for 2-D inputs) or, for 4-D inputs,
    ``[batch, heads]``; finite real floats, in the compute dtype."""
    if alibi_slopes is None:
        return None
    arr = _float_array("alibi_slopes", alibi_slopes, work)
    heads = batch[-1] if batch else 1
    shapes = [(heads,), *([batch] if len(batch) == 2 else [])]
    if arr.shape not in shapes:
        per_batch = f" or (batch, heads) = {batch}" if len(batch) == 2 else " (or (batch, heads), 4-D inputs)"
        raise ValueError(f"alibi_slopes must have shape (heads,) = ({heads},){per_batch}, "
                         f"one per query head, got {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"alibi_slopes must be finite, got {arr.tolist()}")
    return arr.reshape(batch[-1:]) if arr.ndim == 1 else arr


def alibi_bias(
    slopes: Array, n_q: int, n_k: int, packed: tuple[Array, Array] | None, lengths: Array | None = None,
) -> Array:  # slopes [..., h] -> [..., h, n_q, n_k]
    """ALiBi's term ``−slope·|i + n_k − n_q − j|`` (FlashAttention's definition), per packed sequence;
    with ``lengths`` (``align="kv_lengths"``, a paged cache) each batch row's own length for n_k."""
    if lengths is not None:
        distance = key_distance(n_q, n_k, align="kv_lengths", kv_lengths=lengths)  # [batch, 1, n_q, n_k]
    elif packed is None:
        distance = key_distance(n_q, n_k)
    else:
        distance = per_sequence(*packed, key_distance, outside=0)
    return -(slopes[..., None, None] * distance.astype(slopes.dtype))


def _check_int_array(name: str, x: Any) -> Array:
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr


def check_kv_lengths(kv_lengths: Any, batch: tuple[int, ...], n_k: int) -> Array | None:
    # [batch] -> [batch, 1, 1, n_k] bool
    """Keys per batch row: int ``[batch]`` (4-D inputs), each in [0, n_k]; later keys are hidden."""
    if kv_lengths is None:
        return None
    if len(batch) != 2:
        raise ValueError(f"kv_lengths needs 4-D inputs (batch, heads, n, d), got leading dims {batch}")
    lengths = _check_int_array("kv_lengths", kv_lengths)
    if lengths.shape != batch[:1]:
        raise ValueError(f"kv_lengths must have shape (batch,) = ({batch[0]},), got {lengths.shape}")
    if np.any(lengths < 0) or np.any(lengths > n_k):
        raise ValueError(f"kv_lengths must lie in [0, n_k={n_k}], got {lengths.tolist()}")
    return padding_mask(lengths[:, None], n_k)


def check_cu_seqlens(
    cu_seqlens_q: Any, cu_seqlens_k: Any, batch: tuple[int, ...], n_q: int, n_k: int
) -> tuple[Array, Array] | None:
    """Packed sequences: both offsets or neither; int ``[b + 1]``, 0 first, non-decreasing, ending at n."""
    if cu_seqlens_q is None and cu_seqlens_k is None:
        return None
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together (packed sequences)")
    if len(batch) > 1:
        raise ValueError(
            f"cu_seqlens_q/cu_seqlens_k need packed 3-D inputs (heads, total, d), got leading dims {batch}"
        )
    checked = []
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, n_q), ("cu_seqlens_k", cu_seqlens_k, n_k)):
        cu = _check_int_array(name, cu)
        if cu.size == 0 or cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] != total:
            raise ValueError(
                f"{name} must start at 0, never decrease and end at the packed length {total}, "
                f"got {cu.tolist()}"
            )
        checked.append(cu)
    if checked[0].shape != checked[1].shape:
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must count the same sequences, got lengths "
            f"{checked[0].size} and {checked[1].size}"
        )
    return checked[0], checked[1]


def check_dropout(dropout_p: Any, seed: Any) -> tuple[float, int | None]:
    """``dropout_p`` in [0, 1); a ``seed`` (int ≥ 0) is required when it is > 0: every output reproducible."""
    p = _check_real("dropout_p", dropout_p, "a real number in [0, 1)")
    if not 0 <= p < 1:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    if seed is None:
        if p > 0:
            raise ValueError("seed is required when dropout_p > 0 (the reference's dropout is reproducible)")
        return p, None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer >= 0 or None, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return p, int(seed)


def check_align(align: Any, kv_lengths: Any = None) -> Align:
    """``align`` as given, None meaning ``"top_left"``; ``"kv_lengths"`` needs ``kv_lengths``."""
    if align is None:
        return "top_left"
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {', '.join(map(repr, ALIGNMENTS))} or None, got {align!r}")
    if align == "kv_lengths" and kv_lengths is None:
        raise ValueError("align='kv_lengths' puts batch row b's diagonal at i + kv_lengths[b] − n_q: "
                         "it needs kv_lengths")
    return align


def selection_shape(q_shape: tuple[int, ...], k_shape: tuple[int, ...], v_shape: tuple[int, ...],
                    batch: tuple[int, ...]) -> tuple[int, ...]:
    # -> (batch, g, n_q) for 4-D inputs, (g, n_q) for 3-D, (n_q,) for 2-D
    """The shape of a top-k list (``topk_indices``, ``topk_blocks``) but its last axis: a row per
    query of each K/V head, g = k's heads (1 when k has no head axis)."""
    n_q = q_shape[-2]
    if not batch:
        return (n_q,)
    return (*batch[:-1], kv_groups(q_shape, k_shape, v_shape) or 1, n_q)


def _per_head(length: Array, shape: tuple[int, ...]) -> Array:  # [..., n_q] -> [..., 1, n_q] (4-D)
    """``topk_length`` ``[batch, n_q]`` made to broadcast over a list's heads axis."""
    return np.expand_dims(length, -2) if len(shape) > 2 else length


def to_query_heads(x: Array, batch: tuple[int, ...]) -> Array:  # [..., g, n_q, ·] -> [..., h, n_q, ·]
    """A per-K/V-head array repeated for each query head it serves: head i reads ``i // (h // g)``."""
    if not batch:
        return x
    g = x.shape[-3]
    return np.repeat(x, batch[-1] // g, axis=-3) if g else x


def check_selection(
    keywords: Any, shape: tuple[int, ...], n_k: int,
) -> Array | None:  # -> [*shape, n_k] bool (K/V heads), or None without a list
    """Top-k keys and top-k blocks as one mask over K/V heads: ``topk_mask`` ∧ ``topk_block_mask``."""
    indices, length, blocks, size = check_selection_keywords(keywords, shape)
    listed = None if indices is None else topk_mask(
        indices, n_k, None if length is None else _per_head(length, shape))
    chosen = None if blocks is None or size is None else topk_block_mask(blocks, size, n_k)
    return _all(listed, chosen)


def latent_values(k: Any, v: Any, d_v: Any) -> Any:  # k [..., n_k, d_k] -> v [..., n_k, d_v]
    """v as given; or, with ``v=None``, MLA's shared latent ``v = k[..., :d_v]`` (FlashMLA reads the
    values as the first d_v columns of the keys' latent)."""
    if v is not None:
        if d_v is not None:
            raise ValueError("d_v is given only with v=None (the values are then k[..., :d_v]), "
                             f"got d_v={d_v!r} and v of shape {np.shape(v)}")
        return v
    if d_v is None:
        raise TypeError("v is None: d_v= must give the width of the values read as k[..., :d_v]")
    if isinstance(d_v, bool) or not isinstance(d_v, (int, np.integer)):
        raise TypeError(f"d_v must be an integer, got {type(d_v).__name__}")
    k = _as_float_array("k", k)
    if not 0 < d_v <= k.shape[-1]:
        raise ValueError(f"d_v must lie in [1, d_k={k.shape[-1]}] (the values are k[..., :d_v]), got {d_v}")
    return k[..., :d_v]


def check_qv(qv: Any, q: Array, d_v: int) -> Array | None:  # -> [..., n_q, d_v] or None
    """``qv`` (FlashAttention 3's, absorbed MLA): q's shape with width d_v, and q's dtype."""
    if qv is None:
        return None
    arr = np.asarray(qv)
    if arr.dtype != q.dtype:
        raise TypeError(f"qv must have q's dtype {q.dtype}, got {arr.dtype}")
    want = (*q.shape[:-1], d_v)
    if arr.shape != want:
        raise ValueError(f"qv must have shape (..., n_q, d_v) = {want} (q's, with v's width), "
                         f"got {arr.shape}")
    return arr


def _all(*masks: Array | None) -> Array | None:  # broadcastable masks -> their AND (None if none)
    present = [m for m in masks if m is not None]
    return reduce(np.logical_and, present) if present else None


def visible(
    n_q: int, n_k: int, *, causal: bool, window: tuple[int, int] | None, align: Align,
    mask: Array | None, kv_lengths: Array | None, packed: tuple[Array, Array] | None,
    lengths: Array | None = None, chunk: int | None = None,
) -> Array | None:  # -> [..., n_q, n_k] bool, or None when every key is visible
    """Which keys each query sees: causal ∧ window ∧ chunk (per packed sequence) ∧ mask ∧ kv_lengths.

    ``kv_lengths`` is the padding mask; ``lengths`` the validated ``[batch]`` lengths themselves,
    which place the diagonal when ``align="kv_lengths"``.
    """
    diagonal_lengths = lengths if align == "kv_lengths" else None

    def within(n_q: int, n_k: int) -> Array | None:  # one sequence's own positions
        causal_part = causal_mask(n_q, n_k, align=align, kv_lengths=diagonal_lengths) if causal else None
        window_part = None if window is None else sliding_window_mask(
            n_q, n_k, window=window, align=align, kv_lengths=diagonal_lengths)
        chunk_part = None if chunk is None else chunk_mask(
            n_q, n_k, attention_chunk=chunk, align=align, kv_lengths=diagonal_lengths)
        return _all(causal_part, window_part, chunk_part)

    positions = within(n_q, n_k) if packed is None else packed_mask(*packed, within)
    return _all(positions, mask, kv_lengths)


# --- the core: plain maths ---------------------------------------------------------------------


def _cap(scores: Array, softcap: float | None) -> Array:  # [..., n_q, n_k] -> same
    """Logit soft-capping (Gemma 2): ``s → c·tanh(s/c)``, close to s for |s| ≪ c, never beyond ±c."""
    if softcap is None:
        return scores
    c = scores.dtype.type(softcap)
    return c * np.tanh(scores / c)


def _dropout(weights: Array, p: float, seed: int | None) -> Array:  # [..., n_q, n_k] -> same
    """Drop each weight with probability p and scale the kept ones by 1/(1 − p), so the mean is unchanged.

    The kept entries are ``default_rng(seed).random(weights.shape) >= p`` (NumPy's PCG64, float64
    draws over the whole ``[..., n_q, n_k]`` pattern in C order). Linear in ``weights``, so it is
    its own adjoint: the backward applies it, with the same seed, to the gradient of the weights.
    """
    if p == 0:
        return weights
    kept = np.random.default_rng(seed).random(weights.shape) >= p
    return np.where(kept, weights / weights.dtype.type(1 - p), weights.dtype.type(0))


def _full_rows(q: Array, k: Array, v: Array) -> Array:  # [..., n_q, d_k] -> [lead, n_q, d_k]
    """q broadcast to the leading dims of all three: a score row per output row, even if only v has a dim."""
    if q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        return q  # already one row per output row
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    return np.broadcast_to(q, (*lead, *q.shape[-2:]))


def _scores(q: Array, k: Array, scale: float) -> Array:  # [..., n_q, d_k], [..., n_k, d_k] -> [..., n_q, n_k]
    return (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(scale)


def _weights(
    scores: Array, *, bias: Array | None, keep: Array | None, sinks: Array | float
) -> tuple[Array, Array]:  # [..., n_q, n_k] (capped) -> weights [..., n_q, n_k], lse [..., n_q, 1]
    """``+ bias`` (ALiBi's term included), hidden keys to ``-inf``, softmax with the sinks' denominators."""
    scores = scores if bias is None else scores + bias
    scores = scores if keep is None else np.where(keep, scores, -np.inf)
    return softmax_lse(scores, sinks)


def _raw_scores(q: Array, k: Array, v: Array, qv: Array | None, scale: float) -> Array:
    # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], qv [..., n_q, d_v] -> [..., n_q, n_k]
    """``scale·q·kᵀ``, and with ``qv`` (absorbed MLA) ``+ scale·qv·vᵀ``: attention with
    q' = [q, qv] and k' = [k, v] concatenated, at the same scale."""
    scores = _scores(_full_rows(q, k, v), k, scale)
    return scores if qv is None else scores + _scores(_full_rows(qv, k, v), v, scale)


def _core(
    q: Array, k: Array, v: Array, *, qv: Array | None, scale: float, softcap: float | None,
    bias: Array | None, keep: Array | None, sinks: Array | float, dropout: tuple[float, int | None],
) -> tuple[Array, Array, Array]:
    # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v]; bias, keep [..., n_q, n_k]; sinks [..., 1, 1]
    # -> out [..., n_q, d_v], weights [..., n_q, n_k], lse [..., n_q, 1]
    scores = _cap(_raw_scores(q, k, v, qv, scale), softcap)  # c·tanh(scale·(q·kᵀ + qv·vᵀ) / c)
    weights, lse = _weights(scores, bias=bias, keep=keep, sinks=sinks)
    weights = _dropout(weights, *dropout)
    return weights @ v, weights, lse  # [..., n_q, n_k] @ [..., n_k, d_v]


# --- the middle: grouped-query attention -------------------------------------------------------


def _split_heads(x: Any, g: int) -> Any:  # [..., s, a, b] -> [..., g, s/g, a, b], s = 1: [..., 1, 1, a, b]
    """Head axis s ∈ {h, g, 1} → (K/V head, query head in its group): head i = (i // (h/g), i % (h/g))."""
    if not isinstance(x, np.ndarray) or x.ndim < 3:
        return x  # scalars and arrays without a head axis broadcast as they are
    groups = 1 if x.shape[-3] == 1 else g  # h = 0 query heads too: g groups of none
    return x.reshape(*x.shape[:-3], groups, x.shape[-3] // groups, *x.shape[-2:])


def _merge_heads(x: Array) -> Array:  # [..., g, h/g, a, b] -> [..., h, a, b]
    return x.reshape(*x.shape[:-4], x.shape[-4] * x.shape[-3], *x.shape[-2:])


def _grouped(core: Callable[..., tuple[Array, ...]], q: Array, k: Array, v: Array, **per_row: Any) -> Any:
    """``core(q, k, v, ...)`` with grouped K/V heads, without copying K or V: query head i reads
    K/V head ``i // (h // g)``.

    The query heads are reshaped to ``[..., g, h/g, n_q, d_k]`` against K/V ``[..., g, 1, n_k, ·]``,
    so each K/V head broadcasts over its group; the results (each with a head axis, split the
    same way) are reshaped back to h heads. ``core`` is ``_core``, or its backward.
    """
    g = kv_groups(q.shape, k.shape, v.shape)
    if g is None:
        return core(q, k, v, **per_row)
    split = {name: _split_heads(x, g) for name, x in per_row.items()}
    results = core(_split_heads(q, g), _split_heads(k, g), _split_heads(v, g), **split)
    return tuple(_merge_heads(r) for r in results)


# --- the public function: validation ------------------------------------------------------------


def _checked(
    q: Any, k: Any, v: Any, keywords: Keywords,
) -> tuple[Array, Array, Array, tuple[int, ...], dict[str, Any]]:
    """q, k, v and every keyword of the maths (`impl.keywords.Keywords`, each one given or at its
    default) validated: q, k, v as arrays, their leading shape, and the keyword arguments of
    ``_core`` (in the compute dtype). Shared with the backward, so both refuse the same input with
    the same words."""
    q, k, v, batch = check_qkv(q, k, v, grouped=True)
    n_q, d_k = q.shape[-2:]
    n_k = k.shape[-2]
    shape = (*batch, n_q, n_k)
    work = compute_dtype(q.dtype)
    packed = check_cu_seqlens(keywords["cu_seqlens_q"], keywords["cu_seqlens_k"], batch, n_q, n_k)
    kv_lengths, window, mask = keywords["kv_lengths"], keywords["window"], keywords["mask"]
    align = check_align(keywords["align"], kv_lengths)
    padding = check_kv_lengths(kv_lengths, batch, n_k)
    lengths = None if kv_lengths is None else np.asarray(kv_lengths)
    selected = check_selection(keywords, selection_shape(q.shape, k.shape, v.shape, batch), n_k)
    selected = None if selected is None else to_query_heads(selected, batch)
    keep = visible(
        n_q, n_k, causal=keywords["causal"], align=align,
        window=None if window is None else check_window(window),
        chunk=None if keywords["attention_chunk"] is None else check_chunk(keywords["attention_chunk"]),
        mask=_all(None if mask is None else check_mask(mask, shape), selected),
        kv_lengths=padding, packed=packed, lengths=lengths,
    )
    bias = check_bias(keywords["bias"], shape, work)
    slopes = check_alibi_slopes(keywords["alibi_slopes"], batch, work)
    if slopes is not None:  # ALiBi joins the bias: added after the softcap, before the masks
        alibi = alibi_bias(slopes, n_q, n_k, packed, lengths if align == "kv_lengths" else None)
        bias = alibi if bias is None else bias + alibi
    qv = check_qv(keywords["qv"], q, v.shape[-1])
    core = dict(qv=None if qv is None else qv.astype(work, copy=False),
                scale=check_scale(keywords["scale"], d_k), softcap=check_softcap(keywords["softcap"]),
                bias=bias, keep=keep, sinks=check_sinks(keywords["sinks"], batch, work),
                dropout=check_dropout(keywords["dropout_p"], keywords["seed"]))
    return q, k, v, batch, core


class AttentionKeywords(Keywords, CacheKeywords, total=False):
    """Every keyword of `attention` but the two that choose what it returns."""


class _Out(AttentionKeywords, WithoutWeights, WithoutLse): ...  # -> out


class _OutWeights(AttentionKeywords, WithWeights, WithoutLse): ...  # -> (out, weights)


class _OutLse(AttentionKeywords, WithoutWeights, WithLse): ...  # -> (out, lse)


class _OutWeightsLse(AttentionKeywords, WithWeights, WithLse): ...  # -> (out, weights, lse)


_Results = Array | tuple[Array, Array] | tuple[Array, Array, Array]


@overload
def attention(q: Any, k: Any, v: Any, **keywords: Unpack[_Out]) -> Array: ...
@overload
def attention(q: Any, k: Any, v: Any, **keywords: Unpack[_OutWeights]) -> tuple[Array, Array]: ...
@overload
def attention(q: Any, k: Any, v: Any, **keywords: Unpack[_OutLse]) -> tuple[Array, Array]: ...
@overload
def attention(q: Any, k: Any, v: Any, **keywords: Unpack[_OutWeightsLse]) -> tuple[Array, Array, Array]: ...
@takes(AttentionKeywords)
def attention(
    q: Any, k: Any, v: Any, *, return_weights: bool = False, return_lse: bool = False,
    **keywords: Unpack[AttentionKeywords],
) -> _Results:
    """Scaled dot-product attention, ``softmax(q kᵀ · scale) v``, with the keywords real kernels take.

    In order: ``s = scale·q·kᵀ`` (``+ scale·qv·vᵀ``) → ``c·tanh(s/c)`` (softcap) → ``+ bias`` and
    ALiBi's term → hidden keys to ``-inf`` (causal ∧ window ∧ chunk ∧ mask ∧ top-k ∧ kv_lengths ∧
    same packed sequence) → softmax
    with the sinks in the denominator → dropout → ``@ v``.

    Args:
      q: queries ``[..., h, n_q, d_k]`` (or any leading dims ``[..., n_q, d_k]``).
      k: keys ``[..., g, n_k, d_k]``: g = h, or 1, or any divisor of h (grouped-query attention:
        query head i reads K/V head ``i // (h // g)``).
      v: values ``[..., g, n_k, d_v]``. The other leading dims of q, k and v broadcast.
      causal: query i sees keys j ≤ diag (below), top-left aligned by default, as PyTorch.
      mask: boolean, True = may attend, broadcastable to ``[..., n_q, n_k]``.
      scale: multiplies the scores; default ``1/√d_k``.
      bias: float, broadcastable to ``[..., n_q, n_k]``, added to the (capped) scores; ``-inf`` hides a key.
      window: ``(left, right)``, ints ≥ 0: query i sees keys ``diag − left … diag + right``.
      attention_chunk: C, an int > 0: query i sees key j only when ``diag // C == j // C`` (Llama 4's
        chunked attention, with ``causal``): both in one chunk of C positions, query i at position
        ``diag`` (below), key j at j; a query before the first key (diag < 0) sees no key.
      align: where the diagonal of ``causal``, ``window`` and ``attention_chunk`` sits:
        ``"top_left"`` (diag = i, the default for contiguous keys), ``"bottom_right"``
        (diag = i + n_k − n_q, FlashAttention ≥ 2.1; per sequence when packed) or ``"kv_lengths"``
        (diag = i + kv_lengths[b] − n_q, bottom-right per batch row: a KV cache's alignment, and the
        default with ``block_table``).
      softcap: c > 0: scores become ``c·tanh(s/c)`` before bias and masks.
      sinks: float ``[h]`` (``[1]`` for 2-D inputs): one extra logit per query head in every row's
        softmax denominator that carries no value; the row's weights then sum to less than 1.
      kv_lengths: int ``[batch]``, 4-D inputs: keys at positions ≥ ``kv_lengths[b]`` are hidden.
      cu_seqlens_q, cu_seqlens_k: int ``[b + 1]``, 0 first, non-decreasing, ending at n_q and n_k:
        packed sequences in 3-D inputs ``(heads, total, d)``; attention stays within a sequence.
      dropout_p, seed: each weight is dropped with probability ``dropout_p`` in [0, 1), the kept ones
        scaled by ``1/(1 − dropout_p)``; kept = ``np.random.default_rng(seed).random(shape) >= dropout_p``
        with ``shape = [..., h, n_q, n_k]`` (the pattern's). A seed is required when ``dropout_p > 0``.
      return_weights: also return the attention pattern ``[..., n_q, n_k]`` as applied (after dropout).
      return_lse: also return ``lse [..., n_q]``, the natural-log logsumexp of each row's final scores,
        sinks included (``-inf`` for a row that sees nothing and has no sink).
      alibi_slopes: float ``[h]`` (``[1]`` for 2-D inputs) or, for 4-D inputs, ``[batch, h]``: ALiBi,
        ``−slope·|i + n_k − n_q − j|`` added to the score of query i and key j after the softcap,
        with the bias (FlashAttention's definition: measured from the bottom-right diagonal whatever
        ``align`` says; per sequence when packed). Slopes must be finite; one per query head.
      block_table: int ``[batch, max_blocks]``: k and v are paged caches ``[num_blocks, block_size, g, d]``
        and key j of sequence b is ``k[block_table[b, j // block_size], j % block_size]`` for
        ``j < kv_lengths[b]`` (``kv_lengths`` is required); q is ``[batch, h, n_q, d_k]``. Blocks past a
        sequence's length and the tail of its last block are never read (they may hold NaN).
        ``align`` defaults to ``"kv_lengths"``; ``"bottom_right"`` is refused. With
        ``align="kv_lengths"`` a query before its sequence's first key (i < n_q − kv_lengths[b])
        sees nothing under ``causal`` and gets zeros. The weights have ``n_k = max(kv_lengths)``.
      topk_indices: int ``[batch, g, n_q, topk]`` (3-D inputs ``[g, n_q, topk]``, 2-D ``[n_q, topk]``):
        top-k sparse attention; query i of query head h sees only the keys listed in row i of its
        K/V head's list (``impl.masks.topk_mask``). Entries ``< 0`` or ``>= n_k`` are ignored, and a
        key listed twice counts once (a mask), ANDed with every other restriction.
      topk_length: int ``[batch, n_q]`` (``[n_q]`` for 3-D and 2-D inputs), each in ``[0, topk]``:
        only the first ``topk_length[b, i]`` entries of row i are read; only with ``topk_indices``.
      topk_blocks, topk_block_size: int ``[batch, g, n_q, n_blocks]`` (3-D and 2-D as
        ``topk_indices``) and an int > 0: query i sees key j when ``j // topk_block_size`` is listed
        (``impl.masks.topk_block_mask``); entries ``< 0`` or ``>= ceil(n_k / topk_block_size)`` are
        ignored, a block listed twice counts once. Given together.
      qv: float ``[..., h, n_q, d_v]``, q's dtype (FlashAttention 3's ``qv``, absorbed MLA): the
        score of query i and key j gains ``scale·qv_i·v_j`` (attention with q' = [q, qv] and
        k' = [k, v] at the same scale); pass ``scale`` with it, as kernels differ on its default.
      d_v: with ``v=None``, MLA's shared latent: the values are ``k[..., :d_v]`` (FlashMLA's).
      k_descale, v_descale: float ``[batch, g]``: k and v are ``float8_e4m3fn`` (ml_dtypes), contiguous
        4-D or paged, and mean ``k.astype(float32) · k_descale[b, g]`` (and so for v; float64 for
        float64 q). The maths runs in the compute dtype; the output has q's dtype.

    The paged and float8 paths have no gradients here (``attention_backward`` does not take them).
    Returns:
      ``out [..., n_q, d_v]`` in the input dtype; then the weights and the lse, if asked, in the
      compute dtype (float64 for float64 inputs, float32 otherwise).

    A query with no visible key gets zeros and zero weights; n_k = 0 gives zeros, n_q = 0 an empty result.

    >>> q = np.array([[1.0, 0.0]]); k = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> v = np.array([[10.0], [20.0]])
    >>> out, w = attention(q, k, v, scale=np.log(3.0), return_weights=True)
    >>> w, out
    (array([[0.75, 0.25]]), array([[12.5]]))
    >>> out, lse = attention(q, k, v, scale=np.log(3.0), sinks=np.array([0.0]), return_lse=True)
    >>> out, lse  # the sink takes 1/5 of the weight: (3·10 + 20)/5; lse = log(3 + 1 + 1)
    (array([[10.]]), array([1.60943791]))
    """
    keywords = given(attention, keywords)
    v = latent_values(k, v, keywords["d_v"])
    q = _as_float_array("q", q)
    dtype = q.dtype  # the output's, even where a float8 cache widens q to the compute dtype
    # A cache read into contiguous keys: its lengths and their alignment are then the maths' own.
    q, k, v, keywords["kv_lengths"], keywords["align"] = read_cache(
        q, k, v, block_table=keywords["block_table"], kv_lengths=keywords["kv_lengths"],
        k_descale=keywords["k_descale"], v_descale=keywords["v_descale"], align=keywords["align"],
        work=compute_dtype(dtype))
    if keywords["qv"] is not None and np.asarray(keywords["qv"]).dtype == dtype != q.dtype:
        keywords["qv"] = np.asarray(keywords["qv"]).astype(q.dtype)  # widened as q was (a float8 cache)
    q, k, v, _, core = _checked(q, k, v, keywords)
    work = compute_dtype(q.dtype)
    out, weights, lse = _grouped(_core, *(x.astype(work, copy=False) for x in (q, k, v)), **core)
    out = out.astype(dtype, copy=False)
    extras = (weights,) * bool(return_weights) + (lse[..., 0],) * bool(return_lse)
    return (out, *extras) if extras else out
