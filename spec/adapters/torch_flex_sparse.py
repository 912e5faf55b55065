"""PyTorch's FlexAttention given top-k lists and selected blocks, as the ``torch_flex_topk``
built-in target: the sparse selections of DeepSeek's and NSA's kernels written as FlexAttention's
``mask_mod`` (the way FlexAttention users express them), beside `spec.adapters.torch` (whose
array conversions it uses)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from spec.adapters.torch import _from_torch, _to_torch
from spec.target import Target

Array = np.ndarray


def listed_table(indices: Array, n_k: int, length: Array | None = None) -> Any:
    # [b, g, n_q, topk] -> torch bool [b, g, n_q, n_k]
    """The keys each row lists, as a dense boolean table FlexAttention's ``mask_mod`` reads: each
    entry read (the first ``length[b, i]`` of row i) and within [0, n_k) scattered into its
    row; the others into a column past the keys, dropped."""
    import torch

    idx = torch.from_numpy(np.asarray(indices).astype(np.int64))
    keep = (idx >= 0) & (idx < n_k)
    if length is not None:
        count = torch.from_numpy(np.asarray(length).astype(np.int64))  # [b, n_q]
        keep = keep & (torch.arange(idx.shape[-1]) < count[:, None, :, None])
    table = torch.zeros((*idx.shape[:-1], n_k + 1), dtype=torch.bool)
    table.scatter_(-1, torch.where(keep, idx, torch.full_like(idx, n_k)), True)
    return table[..., :n_k]


def block_table(blocks: Array, size: int, n_k: int) -> Any:
    # [b, g, n_q, n_blocks] -> torch bool [b, g, n_q, n_k]
    """The keys of the blocks each row lists: block j // size listed."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
        raise ValueError(f"topk_block_size must be an integer > 0, got {size!r}")
    per_block = listed_table(blocks, -(-n_k // int(size)))
    return per_block.repeat_interleave(int(size), dim=-1)[..., :n_k]


def torch_flex_sparse(
    q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, topk_indices: Array | None = None, topk_length: Array | None = None,
    topk_blocks: Array | None = None,
    topk_block_size: int | None = None, return_lse: bool = False,
) -> Any:  # [b, h, n_q, d_k], [b, g, n_k, d_k], [b, g, n_k, d_v] -> [b, h, n_q, d_v] (and lse [b, h, n_q])
    """FlexAttention's eager ``flex_attention`` with a ``mask_mod`` that reads the lists: query
    ``q_idx`` of head h sees ``kv_idx`` when row ``q_idx`` of K/V head h // (h/g) lists it (and its
    block, with ``topk_blocks``), ``q_idx >= kv_idx`` for ``causal`` (top-left), and ``mask=`` where
    given; ``create_block_mask`` turns it into FlexAttention's block mask; grouped K/V heads turn on
    ``enable_gqa``; ``return_lse=True`` returns FlexAttention's natural-log LSE (its
    ``AuxRequest(lse=True)``).

    Measured on torch 2.13.0+cpu (``tests/spec/test_spec_adapters_torch_flex.py``): within float64
    rounding of a dense masked softmax, a row that lists no key gets zeros and an LSE of −inf.
    The CPU has no FlexAttention backward ("FlexAttention does not support backward on CPU"), so the
    target declares none. The compiled kernel (``torch.compile(flex_attention)``) is FlexAttention's
    fast path; it costs ~15 s of compilation per new shape on this CPU, so the built-in runs the
    eager path, as ``torch_flex_paged`` does (tools/gpu_check.py runs the compiled one on a GPU).
    """
    import torch
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    q = np.asarray(q)
    batch, heads, n_q, _ = q.shape
    g, n_k = k.shape[1], k.shape[2]
    group = heads // g
    tables = []
    if topk_indices is not None:
        tables.append(listed_table(topk_indices, n_k, topk_length))
    if topk_blocks is not None:
        tables.append(block_table(topk_blocks, topk_block_size, n_k))  # type: ignore[arg-type]
    given = None if mask is None else torch.from_numpy(np.broadcast_to(mask, (batch, heads, n_q, n_k)).copy())

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        keep = q_idx >= kv_idx if causal else q_idx >= 0
        for table in tables:
            keep = keep & table[b, h // group, q_idx, kv_idx]
        if given is not None:
            keep = keep & given[b, h, q_idx, kv_idx]
        return keep

    block_mask = create_block_mask(mask_mod, batch, heads, n_q, n_k, device="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*flex_attention called without torch.compile")
        found = flex_attention(_to_torch(q), _to_torch(k), _to_torch(v), block_mask=block_mask, scale=scale,
                               enable_gqa=g != heads, return_aux=AuxRequest(lse=True) if return_lse else None)
    if return_lse:
        out, aux = found
        return _from_torch(out), _from_torch(aux.lse)
    return _from_torch(found)


def target(device: str = "cpu") -> Target:
    """The ``torch_flex_topk`` built-in target: FlexAttention's eager path given top-k lists and
    selected blocks as a ``mask_mod`` (`torch_flex_sparse`). A list counts a key listed twice once
    (a mask). Its lists live on the CPU: ``device`` other than ``cpu`` is refused."""
    import torch

    if device != "cpu":
        raise ValueError(f"the torch_flex_topk built-in runs on the CPU only, not on {device!r}")
    return Target(
        torch_flex_sparse, name=f"torch {torch.__version__} flex_attention (eager) with top-k lists",
        dtypes=("float32", "float64"), ndims=(4,), supports_scale=True, supports_mask=True, supports_gqa=True,
        masked_rows="zeros", returns_lse=True, supports_topk=True, supports_topk_blocks=True, deadline_s=60.0,
    )


TARGETS = {"torch_flex_topk": target}
"""The built-in target of this module (`spec.adapters.ADAPTERS` names it)."""
