"""PyTorch's own merge of attention states as a `spec.MergeTarget`: ``_SDPAMerger`` of
``torch.distributed.tensor.experimental._context_parallel._attention``, the merge context-parallel
SDPA (ring attention) reduces its partial results with, on CPU tensors.

It is pure PyTorch: ``out ← out − sigmoid(lse_b − lse)·(out − out_b)``,
``lse ← lse − logsigmoid(lse − lse_b)`` (ring-flash-attention's stable form), 16-bit states in float32
(``convert_to_f32``), outputs ``[..., n_q, d_v]`` with a natural ``lse [..., n_q]``.
Imported only when the built-in ``torch_sdpa_merger`` is asked for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spec.merge_target import MergeTarget
from spec.target import TargetError

Array = np.ndarray


def _merger_class() -> Any:
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention
    except ImportError as e:
        raise TargetError(f"built-in merge target 'torch_sdpa_merger' needs PyTorch with "
                          f"torch.distributed's context parallelism (>= 2.9): {e}") from None
    return _attention._SDPAMerger


def sdpa_merger_n(outs: Array, lses: Array) -> tuple[Array, Array]:
    # [s, ..., n_q, d_v], [s, ..., n_q] -> [..., n_q, d_v], [..., n_q]
    """The states stepped into one ``_SDPAMerger`` in order (``partial=False``: whole blocks)."""
    import torch

    # 16-bit states merged in float32 (and narrowed back), as context parallelism asks; float32
    # and float64 in their own precision
    merger = _merger_class()(convert_to_f32=outs.dtype.itemsize < 4, seq_dim=outs.ndim - 3)
    for out, lse in zip(outs, lses, strict=True):
        merger.step(torch.from_numpy(np.ascontiguousarray(out)), torch.from_numpy(np.ascontiguousarray(lse)),
                    False)
    out, lse = merger.results()
    return out.numpy(), lse.numpy()


def sdpa_merger(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> tuple[Array, Array]:
    # [..., n_q, d_v], [..., n_q] twice -> [..., n_q, d_v], [..., n_q]
    """Two states merged by one ``_SDPAMerger``."""
    return sdpa_merger_n(np.stack([out_a, out_b]), np.stack([lse_a, lse_b]))


def torch_sdpa_merger() -> MergeTarget:
    """The built-in: both forms, float16, float32 and float64. Declared as context parallelism
    uses it: ``empty_parts=False`` (its ring skips the blocks a causal mask empties; given an
    empty state, −inf − (−inf) in its ``logsigmoid`` update makes the merged lse NaN)."""
    _merger_class()  # refuse now, naming what is missing, rather than in the first law
    return MergeTarget(sdpa_merger, fn_n=sdpa_merger_n, name="torch_sdpa_merger",
                       dtypes=("float16", "float32", "float64"), empty_parts=False)
