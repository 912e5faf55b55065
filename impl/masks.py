"""Boolean mask builders: ``True`` means the query may attend to the key.

Each builder is pure and small; combine them with ``np.logical_and`` and pass the result as
``mask=`` to `impl.attention` (or any attention that takes a boolean mask).

Causal masks, sliding windows and ALiBi's distances are measured from each query's *diagonal* key:
``diag = i`` for the ``top_left`` alignment (PyTorch's ``is_causal``), ``diag = i + n_k − n_q``
for ``bottom_right`` (FlashAttention ≥ 2.1, MLX: the last query sits on the last key), and
``diag = i + kv_lengths[b] − n_q`` for ``kv_lengths``: bottom-right per batch row, the last query of
row b on its last real key (a KV cache: FlashAttention's ``cache_seqlens``, ONNX's
``nonpad_kv_seqlen``). One helper, ``_diagonal``, places it for all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

Align = Literal["top_left", "bottom_right", "kv_lengths"]
ALIGNMENTS: tuple[Align, ...] = ("top_left", "bottom_right", "kv_lengths")


def _positions(n_q: int, n_k: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    for name, n in (("n_q", n_q), ("n_k", n_k)):
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0):
            raise ValueError(f"{name} must be a non-negative integer, got {n!r}")
    n_k = n_q if n_k is None else n_k
    return np.arange(n_q)[:, None], np.arange(n_k)[None, :], n_k


def _lengths(kv_lengths: object, n_k: int) -> np.ndarray:  # -> [batch] int
    lengths = np.asarray(kv_lengths)
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"kv_lengths must be integers, got dtype {lengths.dtype}")
    if lengths.ndim != 1:
        raise ValueError(f"kv_lengths must be 1-D (one length per batch row), got shape {lengths.shape}")
    if np.any(lengths < 0) or np.any(lengths > n_k):
        raise ValueError(f"kv_lengths must lie in [0, n_k={n_k}], got {lengths.tolist()}")
    return lengths


def _diagonal(
    n_q: int, n_k: int | None, align: Align, kv_lengths: object = None
) -> tuple[np.ndarray, np.ndarray]:
    # -> diag [n_q, 1] (align="kv_lengths": [batch, 1, n_q, 1]), key positions j [1, n_k]
    """The key each query is aligned with: the one place every causal edge and window starts from.

    ``top_left``: i; ``bottom_right``: i + n_k − n_q; ``kv_lengths``: i + kv_lengths[b] − n_q for
    batch row b (the heads axis stays 1 and broadcasts). ``kv_lengths`` is read only with that
    alignment, and refused with the others, where it would silently mean nothing.
    """
    i, j, n_k = _positions(n_q, n_k)
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {', '.join(map(repr, ALIGNMENTS))}, got {align!r}")
    if (kv_lengths is None) != (align != "kv_lengths"):
        raise ValueError("kv_lengths gives the diagonal exactly when align='kv_lengths': "
                         f"got align={align!r} with kv_lengths {'absent' if kv_lengths is None else 'given'}")
    if align == "top_left":
        return i, j
    if align == "bottom_right":
        return i + (n_k - n_q), j
    lengths = _lengths(kv_lengths, n_k)
    return i + (lengths[:, None, None, None] - n_q), j


def causal_mask(
    n_q: int, n_k: int | None = None, *, align: Align = "top_left", kv_lengths: object = None
) -> np.ndarray:  # -> [n_q, n_k]; align="kv_lengths": [batch, 1, n_q, n_k]
    """Causal visibility: query i sees keys j ≤ diag.

    ``top_left`` (PyTorch's ``is_causal``): query i sees keys j ≤ i.
    ``bottom_right`` (FlashAttention ≥ 2.1, MLX): the last query sees the last key, so query i
    sees keys j ≤ i + (n_k − n_q) — the alignment of decoding with a KV cache.
    ``kv_lengths`` (with ``kv_lengths`` int ``[batch]``): the same per batch row,
    j ≤ i + kv_lengths[b] − n_q, for caches whose rows hold different numbers of keys; a query
    before the start of its row's cache (i < n_q − kv_lengths[b]) sees nothing.

    >>> causal_mask(2, 3).astype(int)
    array([[1, 0, 0],
           [1, 1, 0]])
    >>> causal_mask(2, 3, align="bottom_right").astype(int)
    array([[1, 1, 0],
           [1, 1, 1]])
    >>> causal_mask(2, 3, align="kv_lengths", kv_lengths=[1, 2])[:, 0].astype(int)
    array([[[0, 0, 0],
            [1, 0, 0]],
    <BLANKLINE>
           [[1, 0, 0],
            [1, 1, 0]]])
    """
    diag, j = _diagonal(n_q, n_k, align, kv_lengths)
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
    n_q: int, n_k: int | None = None, *, window: tuple[int, int], align: Align = "top_left",
    kv_lengths: object = None,
) -> np.ndarray:  # -> [n_q, n_k]; align="kv_lengths": [batch, 1, n_q, n_k]
    """Local attention: query i sees keys j with diag − left ≤ j ≤ diag + right, ``window = (left, right)``.

    ``diag`` follows ``align`` as in [causal_mask][impl.masks.causal_mask] (``kv_lengths``: per batch row).

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
    diag, j = _diagonal(n_q, n_k, align, kv_lengths)
    return (j >= diag - left) & (j <= diag + right)


def check_chunk(attention_chunk: object) -> int:
    """Validate ``attention_chunk``: an integer > 0 (``TypeError``/``ValueError`` naming it)."""
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, (int, np.integer)):
        raise TypeError(f"attention_chunk must be an integer > 0, got {attention_chunk!r}")
    if attention_chunk <= 0:
        raise ValueError(f"attention_chunk must be an integer > 0, got {attention_chunk}")
    return int(attention_chunk)


def chunk_mask(
    n_q: int, n_k: int | None = None, *, attention_chunk: int, align: Align = "top_left",
    kv_lengths: object = None,
) -> np.ndarray:  # -> [n_q, n_k]; align="kv_lengths": [batch, 1, n_q, n_k]
    """Chunked local attention (Llama 4's): query i sees key j only when both lie in the same chunk
    of ``attention_chunk`` = C positions: ``diag // C == j // C``.

    Query i sits at position ``diag`` (as in [causal_mask][impl.masks.causal_mask]: i, i + n_k − n_q
    or i + kv_lengths[b] − n_q), key j at position j. A query before the first key (diag < 0) floors
    to a chunk of negative index, which holds no key (FlashAttention's ``construct_chunk_mask``).
    ANDed with ``causal`` it is Llama 4's chunked attention.

    >>> chunk_mask(4, attention_chunk=2).astype(int)
    array([[1, 1, 0, 0],
           [1, 1, 0, 0],
           [0, 0, 1, 1],
           [0, 0, 1, 1]])
    >>> chunk_mask(2, 3, attention_chunk=2, align="bottom_right").astype(int)
    array([[1, 1, 0],
           [0, 0, 1]])
    """
    chunk = check_chunk(attention_chunk)
    diag, j = _diagonal(n_q, n_k, align, kv_lengths)
    return np.floor_divide(diag, chunk) == j // chunk


def key_distance(
    n_q: int, n_k: int | None = None, *, align: Align = "bottom_right", kv_lengths: object = None,
) -> np.ndarray:  # -> [n_q, n_k] int ([batch, 1, n_q, n_k] with align="kv_lengths")
    """``|diag − j|``: how far key j lies from query i's diagonal — the distance ALiBi penalises.

    ALiBi (Press et al., 2022, "Train Short, Test Long") adds ``−slope·|diag − j|`` to each score;
    FlashAttention measures it from the bottom-right diagonal, ``|i + n_k − n_q − j|``, the default
    here, whatever alignment the causal mask uses; over a KV cache (``align="kv_lengths"``) from
    each batch row's own, ``|i + kv_lengths[b] − n_q − j|``.

    >>> key_distance(2, 3)
    array([[1, 0, 1],
           [2, 1, 0]])
    """
    diag, j = _diagonal(n_q, n_k, align, kv_lengths)
    return np.abs(diag - j)


def per_sequence(
    cu_seqlens_q: np.ndarray, cu_seqlens_k: np.ndarray, within: Callable[[int, int], Any], *, outside: Any,
) -> np.ndarray:  # [b + 1], [b + 1] -> [total_q, total_k]
    """Packed sequences: ``within(n_q_s, n_k_s)`` on each sequence's own block, ``outside`` elsewhere.

    Sequence s holds queries ``cu_seqlens_q[s] : cu_seqlens_q[s + 1]`` and keys
    ``cu_seqlens_k[s] : cu_seqlens_k[s + 1]``; ``within`` sees only that sequence's own lengths, so
    every position inside it counts from the sequence's start. The dtype is ``outside``'s.

    >>> per_sequence(np.array([0, 1, 3]), np.array([0, 2, 3]), key_distance, outside=-1)
    array([[ 1,  0, -1],
           [-1, -1,  1],
           [-1, -1,  0]])
    """
    cu_q, cu_k = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    blocks = np.full((int(cu_q[-1]), int(cu_k[-1])), outside)
    for q0, q1, k0, k1 in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:], strict=True):
        blocks[q0:q1, k0:k1] = within(int(q1 - q0), int(k1 - k0))
    return blocks


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

    def block(n_q: int, n_k: int) -> np.ndarray | bool:
        seen = within(n_q, n_k)
        return True if seen is None else seen

    return per_sequence(cu_seqlens_q, cu_seqlens_k, block, outside=False)


def topk_mask(indices: Any, n_k: int, length: Any = None) -> np.ndarray:
    # [..., n_q, topk] int, length [..., n_q] -> [..., n_q, n_k] bool
    """Top-k sparse selection (DeepSeek's sparse attention, FlashMLA's ``indices``): query i sees
    key j exactly when j is listed in row i, ``j ∈ {indices[..., i, t] : t < length[..., i]}``.

    An entry ``< 0`` or ``>= n_k`` lists no key (the padding of a short row); ``length`` (default:
    every entry) reads only a row's first ``length[..., i]`` entries. A key listed twice is seen,
    once: this is a mask. A row that lists no valid key sees nothing.

    >>> topk_mask(np.array([[2, 0], [1, -1]]), 3).astype(int)
    array([[1, 0, 1],
           [0, 1, 0]])
    >>> topk_mask(np.array([[2, 0], [1, 1]]), 3, length=np.array([1, 2])).astype(int)
    array([[0, 0, 1],
           [0, 1, 0]])
    """
    indices = np.asarray(indices)
    listed = (indices >= 0) & (indices < n_k)
    if length is not None:
        listed &= np.arange(indices.shape[-1]) < np.asarray(length)[..., None]
    # Every unlisted entry points at one extra column, n_k, which is then dropped.
    seen = np.zeros((*indices.shape[:-1], n_k + 1), dtype=bool)
    np.put_along_axis(seen, np.where(listed, indices, n_k), True, axis=-1)
    return seen[..., :n_k]


def topk_block_mask(blocks: Any, block_size: int, n_k: int) -> np.ndarray:
    # [..., n_q, n_blocks] int -> [..., n_q, n_k] bool
    """Block-sparse selection (NSA's selected branch): query i sees key j exactly when
    ``j // block_size`` is listed in row i.

    Key blocks are ``[b·block_size, (b + 1)·block_size)``, the last one cut at n_k; an entry ``< 0``
    or ``>= ceil(n_k / block_size)`` lists no block, and a block listed twice is seen once.

    >>> topk_block_mask(np.array([[1], [0]]), 2, 3).astype(int)
    array([[0, 0, 1],
           [1, 1, 0]])
    """
    n_blocks = -(-n_k // block_size)
    return np.repeat(topk_mask(blocks, n_blocks), block_size, axis=-1)[..., :n_k]


def check_topk(
    indices: Any, length: Any, shape: tuple[int, ...], *,
    names: tuple[str, str] = ("topk_indices", "topk_length"),
) -> tuple[np.ndarray | None, np.ndarray | None]:
    # indices [*shape, topk] int, length shape[:-2] + shape[-1:] int -> the two as arrays
    """Validate a top-k list and its lengths (``TypeError``/``ValueError`` naming each).

    ``shape`` is the list's shape but its last axis: ``(batch, heads_kv, n_q)`` for 4-D inputs,
    ``(heads_kv, n_q)`` for 3-D, ``(n_q,)`` for 2-D. ``length`` has that shape without the heads
    axis (``(batch, n_q)``, else ``(n_q,)``), values in ``[0, topk]``, and is taken only with a list.
    No list gives ``(None, None)``.
    """
    name, length_name = names
    if indices is None:
        if length is not None:
            raise ValueError(f"{length_name} is given only with {name}")
        return None, None
    arr = np.asarray(indices)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if arr.shape[:-1] != shape or arr.ndim != len(shape) + 1:
        raise ValueError(f"{name} must have shape {(*shape, 'topk')}, got {arr.shape}")
    if length is None:
        return arr, None
    lengths = np.asarray(length)
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"{length_name} must be an integer array, got dtype {lengths.dtype}")
    want = (*shape[:-2], shape[-1]) if len(shape) > 2 else shape[-1:]
    if lengths.shape != want:
        raise ValueError(f"{length_name} must have shape {want}, got {lengths.shape}")
    if lengths.size and (lengths.min() < 0 or lengths.max() > arr.shape[-1]):
        raise ValueError(f"{length_name} must lie in [0, topk={arr.shape[-1]}], got values from "
                         f"{lengths.min()} to {lengths.max()}")
    return arr, lengths


def check_selection_keywords(
    keywords: Any, shape: tuple[int, ...],
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, int | None]:
    """``topk_indices`` and ``topk_length`` (`check_topk`), ``topk_blocks`` and ``topk_block_size``
    (`check_block_size`; the two given together) from a call's keywords, each validated."""
    indices, length = check_topk(keywords["topk_indices"], keywords["topk_length"], shape)
    blocks, _ = check_topk(keywords["topk_blocks"], None, shape, names=("topk_blocks", "topk_length"))
    size = keywords["topk_block_size"]
    if (blocks is None) != (size is None):
        raise ValueError("topk_blocks and topk_block_size are given together, got "
                         f"topk_blocks {'absent' if blocks is None else 'given'} and "
                         f"topk_block_size {size!r}")
    return indices, length, blocks, None if size is None else check_block_size(size)


def check_block_size(block_size: object) -> int:
    """Validate ``topk_block_size``: an integer > 0 (``TypeError``/``ValueError`` naming it)."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"topk_block_size must be an integer > 0, got {block_size!r}")
    if block_size <= 0:
        raise ValueError(f"topk_block_size must be an integer > 0, got {block_size}")
    return int(block_size)
