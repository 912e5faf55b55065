"""PyTorch's own context parallelism as the context-parallel built-in ``torch_cp`` (a
`spec.RankTarget`): ``torch.distributed.tensor.experimental.context_parallel`` on a CPU device mesh
over gloo, around ``F.scaled_dot_product_attention``.

``context_parallel`` takes whole buffers and shards them itself (its own load balancer), so each
rank gathers the whole q, k, v from the shards it was given (by the layout), runs SDPA under
``context_parallel``, takes the whole output back with ``context_parallel_unshard`` and returns its
own positions: every layout is a gather away from the one PyTorch picks. What runs on the CPU in
torch 2.13 (probed; docs/targets.md, "Declare a context-parallel target", has the replay lines):

- SDPA's math backend, non-causal: conforms — the built-in is declared so (``supports_causal=False``);
- the math backend with ``is_causal=True``: every rank raises ``aten.add.Tensor got mixed
  torch.Tensor and DTensor`` (PyTorch #147793);
- the CPU's default backend (``_scaled_dot_product_flash_attention_for_cpu``, which context
  parallelism does not dispatch): no rank returns within 40 s (DTensor's sharding propagation).

Not declared ``in_process``: on entry ``context_parallel`` replaces ``F.scaled_dot_product_attention``
for the whole process (its default dispatch mode, a monkey patch bound to the rank's mesh) and
restores it on exit, so rank threads would call each other's patch and undo it under each other.

Imported only when the built-in ``torch_cp`` is asked for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spec.adapters.torch_ring import _torch, layout_positions, padded_to, shard_lengths
from spec.rank_target import RankTarget
from spec.target import TargetError

Array = np.ndarray


def _context_parallel() -> Any:
    try:
        from torch.distributed.tensor.experimental import context_parallel
    except ImportError as e:
        raise TargetError("built-in context-parallel target 'torch_cp' needs PyTorch with "
                          f"torch.distributed.tensor.experimental.context_parallel: {e}") from None
    return context_parallel


def _whole(x: Array, where: list[Any], lengths: list[int], group: Any) -> Any:  # shard -> [..., n, d]
    """The whole sequence from every rank's shard (an all-gather, padded to the longest shard)."""
    torch = _torch()
    import torch.distributed as dist

    longest = max(lengths)
    got = [torch.zeros((*x.shape[:-2], longest, x.shape[-1]), dtype=torch.from_numpy(x[:0]).dtype)
           for _ in lengths]
    dist.all_gather(got, padded_to(torch.from_numpy(np.ascontiguousarray(x)), longest), group=group)
    whole = torch.zeros((*x.shape[:-2], sum(lengths), x.shape[-1]), dtype=got[0].dtype)
    for block, at, n in zip(got, where, lengths, strict=True):
        whole[..., at, :] = block[..., :n, :]
    return whole


def torch_context_parallel(q: Array, k: Array, v: Array, *, group: Any, rank: int, layout: str,
                           causal: bool = False, math_backend: bool = True) -> Array:
    # shards [..., n_r, d_k], [..., n_r, d_k], [..., n_r, d_v] -> [..., n_r, d_v]
    """This rank's shard of SDPA run under ``context_parallel`` on the group's CPU mesh."""
    torch = _torch()
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    from torch.nn.attention import SDPBackend, sdpa_kernel

    lengths = shard_lengths(q.shape[-2], group)
    where = layout_positions(lengths, layout)
    qf, kf, vf = (_whole(x, where, lengths, group) for x in (q, k, v))
    mesh = init_device_mesh("cpu", (dist.get_world_size(group),))
    backend = SDPBackend.MATH if math_backend else SDPBackend.FLASH_ATTENTION
    seq = q.ndim - 2
    with _context_parallel()(mesh, buffers=[qf, kf, vf], buffer_seq_dims=[seq] * 3,
                             no_restore_buffers={qf, kf, vf}), sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
    (out,) = context_parallel_unshard(mesh, [out], [seq])
    return torch.index_select(out, seq, where[rank]).numpy().astype(q.dtype)


def torch_cp() -> RankTarget:
    """The built-in: SDPA's math backend under ``context_parallel``, non-causal (what runs on the CPU)."""
    _context_parallel()  # refuse now, naming what is missing, rather than in the first law
    return RankTarget(torch_context_parallel, name="torch_cp", supports_causal=False,
                      supports_uneven=False)
