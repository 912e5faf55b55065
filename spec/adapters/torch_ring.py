"""Ring attention on ``torch.distributed``, the suite's own, as the context-parallel built-in
``ring`` (a `spec.RankTarget`): each rank keeps its query shard and passes its key/value block
round the ring (``send`` to rank + 1, ``recv`` from rank − 1, W − 1 times); each block's partial
attention ``(out, lse)`` is merged into the running state by the logsumexps, and a block no query
of the rank can see under the causal mask or the documents is skipped. The backward passes each
block round again together with its dK and dV accumulators, home after W passes; every block's
weights are ``exp(s − lse)`` with the *global* lse of the forward (FlashAttention-2's backward).

Blocks are sent padded to the longest shard (a contiguous layout of uneven n), the padding masked.
Everything runs in float64 for float64 inputs, float32 else, on CPU tensors over gloo.
`RingParts` names the pieces a ring is made of, so that a variant changes one of them.
Imported only when the built-in ``ring`` is asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from spec.rank_target import RankTarget
from spec.target import TargetError

Array = np.ndarray
Tensor = Any  # torch.Tensor, imported on first use


def _torch() -> Any:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise TargetError("built-in context-parallel target 'ring' needs PyTorch (the torch extra): "
                          f"{e}") from None
    if not dist.is_available() or not dist.is_gloo_available():
        raise TargetError("built-in context-parallel target 'ring' needs torch.distributed with gloo")
    return torch


# --- the pieces


def layout_positions(lengths: list[int], layout: str) -> list[Tensor]:  # W lengths -> W × [n_r] int64
    """The global positions each rank's shard holds, from every rank's shard length: contiguous
    (consecutive runs), zigzag (2W equal chunks, rank r holding r and 2W − 1 − r), striped (t mod W)."""
    torch = _torch()
    world, n = len(lengths), sum(lengths)
    if layout == "contiguous":
        starts = np.cumsum([0, *lengths])
        return [torch.arange(int(starts[r]), int(starts[r + 1])) for r in range(world)]
    if layout == "striped":
        return [torch.arange(n)[r::world] for r in range(world)]
    if layout == "zigzag":
        c = n // (2 * world)
        return [torch.cat([torch.arange(r * c, (r + 1) * c),
                           torch.arange((2 * world - 1 - r) * c, (2 * world - r) * c)]) for r in range(world)]
    raise ValueError(f"layout must be contiguous, zigzag or striped, got {layout!r}")


def block_attention(q: Tensor, k: Tensor, v: Tensor, visible: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v], [n_q, n_k] bool -> [..., n_q, d_v], [..., n_q]
    """One block's attention state: a row that sees no key has output 0 and lse −inf."""
    torch = _torch()
    s = torch.where(visible, (q @ k.transpose(-1, -2)) * scale, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    return p @ v, lse


def merge_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """The state over both key sets: weights ``exp(lse_i − lse)`` with ``lse = logaddexp``, an
    empty state (lse −inf) weighing 0."""
    torch = _torch()
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, 0)
    wa = torch.where(torch.isneginf(lse_a), 0, torch.exp(lse_a - safe))[..., None]
    wb = torch.where(torch.isneginf(lse_b), 0, torch.exp(lse_b - safe))[..., None]
    return wa * out_a + wb * out_b, lse


def no_visible_key(visible: Tensor, *, rank: int, source: int, causal: bool) -> bool:
    """The causal schedule: a block is skipped when no query of ``rank`` sees any of the keys of
    ``source`` (whatever the layout: a balanced one leaves few such blocks)."""
    return not bool(visible.any())


@dataclass(frozen=True)
class RingParts:
    """The pieces of a ring: where each rank's tokens sit, one block's attention, the merge, which
    blocks are skipped, and whether the padding of a block is masked."""

    positions: Callable[[list[int], str], list[Tensor]] = layout_positions
    block: Callable[..., tuple[Tensor, Tensor]] = block_attention
    merge: Callable[..., tuple[Tensor, Tensor]] = merge_states
    skip: Callable[..., bool] = no_visible_key
    mask_padding: bool = True
    local_documents: bool = False  # (a variant's bug) document ids read at local, not global, positions
    block_lse_backward: bool = False  # (a variant's bug) the backward normalises each block by its own lse


RING = RingParts()


# --- the ring


def _work_dtype(x: Array) -> Any:
    torch = _torch()
    return torch.float64 if x.dtype == np.float64 else torch.float32


def shard_lengths(n_local: int, group: Any) -> list[int]:
    """Every rank's shard length (an all-gather)."""
    torch = _torch()
    import torch.distributed as dist

    got = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(got, torch.tensor([n_local], dtype=torch.int64), group=group)
    return [int(x) for x in got]


def padded_to(x: Tensor, n: int) -> Tensor:  # [..., m, d] -> [..., n, d]
    torch = _torch()
    pad = torch.zeros((*x.shape[:-2], n - x.shape[-2], x.shape[-1]), dtype=x.dtype)
    return torch.cat([x, pad], dim=-2)


def _pass_on(block: Tensor, group: Any, rank: int) -> Tensor:
    """Send ``block`` to rank + 1, receive rank − 1's (all blocks the same shape)."""
    torch = _torch()
    import torch.distributed as dist

    world = dist.get_world_size(group)
    got = torch.empty_like(block)
    ops = [dist.P2POp(dist.isend, block.contiguous(), dist.get_global_rank(group, (rank + 1) % world), group),
           dist.P2POp(dist.irecv, got, dist.get_global_rank(group, (rank - 1) % world), group)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return got


@dataclass
class _Ring:
    """What every step of one rank's ring reads: its queries, their positions and documents, and
    for each source rank the positions and documents of its keys (padded to the longest shard)."""

    parts: RingParts
    rank: int
    world: int
    longest: int
    q_where: Tensor
    k_where: list[Tensor]
    q_doc: Tensor | None
    k_doc: list[Tensor | None]
    valid: list[Tensor]
    causal: bool

    def visible(self, source: int) -> Tensor:  # -> [n_q, longest] bool
        torch = _torch()
        k_where = torch.cat([self.k_where[source],
                             torch.full((self.longest - len(self.k_where[source]),), -1, dtype=torch.int64)])
        see = torch.ones((len(self.q_where), self.longest), dtype=torch.bool)
        if self.causal:
            see &= k_where[None, :] <= self.q_where[:, None]
        if self.q_doc is not None:
            k_doc = self.k_doc[source]
            assert k_doc is not None
            see &= self.q_doc[:, None] == k_doc[None, :]
        if self.parts.mask_padding:
            see &= self.valid[source][None, :]
        return see


def _setup(k: Array, group: Any, rank: int, layout: str, causal: bool, parts: RingParts,
           cu_seqlens: Array | None) -> _Ring:
    torch = _torch()
    import torch.distributed as dist

    world = dist.get_world_size(group)
    lengths = shard_lengths(k.shape[-2], group)
    longest = max(lengths)
    where = parts.positions(lengths, layout)
    q_doc, k_doc = None, [None] * world
    if cu_seqlens is not None:
        ends = torch.as_tensor(np.asarray(cu_seqlens, dtype=np.int64)[1:])

        def doc(at: Tensor) -> Tensor:
            return torch.bucketize(at.contiguous(), ends, right=True)

        local = [torch.arange(n) for n in lengths]
        read = local if parts.local_documents else where
        q_doc, k_doc = doc(read[rank]), [_pad_ids(doc(r), longest) for r in read]
    valid = [torch.arange(longest) < n for n in lengths]
    return _Ring(parts, rank, world, longest, where[rank], where, q_doc, k_doc, valid, causal)


def _pad_ids(ids: Tensor, n: int) -> Tensor:
    torch = _torch()
    return torch.cat([ids, torch.full((n - len(ids),), -1, dtype=ids.dtype)])


def _forward(q: Tensor, kv: Tensor, d_k: int, ring: _Ring, scale: float, group: Any) -> tuple[Tensor, Tensor]:
    """The ring's forward: every block merged into this rank's state."""
    torch = _torch()
    out = torch.zeros((*q.shape[:-1], kv.shape[-1] - d_k), dtype=q.dtype)
    lse = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype)
    for step in range(ring.world):
        if step:
            kv = _pass_on(kv, group, ring.rank)
        source = (ring.rank - step) % ring.world
        visible = ring.visible(source)
        if ring.parts.skip(visible, rank=ring.rank, source=source, causal=ring.causal):
            continue
        o, block_lse = ring.parts.block(q, kv[..., :d_k], kv[..., d_k:], visible, scale)
        out, lse = ring.parts.merge(out, lse, o, block_lse)
    return out, lse


def ring_attention(q: Array, k: Array, v: Array, *, group: Any, rank: int, layout: str, causal: bool = False,
                   return_lse: bool = False, cu_seqlens_q: Array | None = None,
                   cu_seqlens_k: Array | None = None, parts: RingParts = RING) -> Any:
    # shards [..., n_r, d_k], [..., n_r, d_k], [..., n_r, d_v] -> [..., n_r, d_v] (and lse [..., n_r])
    """This rank's shard of ``softmax(q kᵀ/√d_k) v`` over the whole sequence (the contract of
    `spec.RankTarget`)."""
    torch = _torch()
    work = _work_dtype(q)
    qt = torch.from_numpy(np.ascontiguousarray(q)).to(work)
    kv = torch.cat([torch.from_numpy(np.ascontiguousarray(k)).to(work),
                    torch.from_numpy(np.ascontiguousarray(v)).to(work)], dim=-1)
    ring = _setup(k, group, rank, layout, causal, parts, cu_seqlens_k)
    kv = padded_to(kv, ring.longest)
    out, lse = _forward(qt, kv, k.shape[-1], ring, 1 / math.sqrt(q.shape[-1]), group)
    out = out.numpy().astype(q.dtype)
    if not return_lse:
        return out
    return out, lse.numpy().astype(np.float64 if q.dtype == np.float64 else np.float32)


def ring_attention_backward(q: Array, k: Array, v: Array, d_out: Array, *, group: Any, rank: int, layout: str,
                            causal: bool = False, cu_seqlens_q: Array | None = None,
                            cu_seqlens_k: Array | None = None, parts: RingParts = RING) -> tuple[Array, ...]:
    """This rank's shards of ``(dq, dk, dv)``: the forward's ring for ``(out, lse)``, then each block
    round the ring again with its dK, dV accumulators (home after W passes)."""
    torch = _torch()
    work = _work_dtype(q)
    qt, dot = (torch.from_numpy(np.ascontiguousarray(x)).to(work) for x in (q, d_out))
    d_k, scale = k.shape[-1], 1 / math.sqrt(q.shape[-1])
    ring = _setup(k, group, rank, layout, causal, parts, cu_seqlens_k)
    kv = padded_to(torch.cat([torch.from_numpy(np.ascontiguousarray(k)).to(work),
                            torch.from_numpy(np.ascontiguousarray(v)).to(work)], dim=-1), ring.longest)
    out, lse = _forward(qt, kv, d_k, ring, scale, group)
    delta = (dot * out).sum(-1, keepdim=True)  # D = rowsum(dO ∘ O)
    dq = torch.zeros_like(qt)
    carried = torch.cat([kv, torch.zeros_like(kv)], dim=-1)  # [k | v | dk | dv]
    width = kv.shape[-1]
    for step in range(ring.world):
        if step:
            carried = _pass_on(carried, group, rank)
        source = (rank - step) % ring.world
        visible = ring.visible(source)
        if ring.parts.skip(visible, rank=rank, source=source, causal=ring.causal):
            continue
        kb, vb = carried[..., :d_k], carried[..., d_k:width]
        s = torch.where(visible, (qt @ kb.transpose(-1, -2)) * scale, -math.inf)
        norm = torch.logsumexp(s, dim=-1) if ring.parts.block_lse_backward else lse
        p = torch.exp(s - torch.where(torch.isfinite(norm), norm, 0)[..., None])
        ds = p * (dot @ vb.transpose(-1, -2) - delta)
        dq += ds @ kb * scale
        carried[..., width:width + d_k] += ds.transpose(-1, -2) @ qt * scale
        carried[..., width + d_k:] += p.transpose(-1, -2) @ dot
    carried = _pass_on(carried, group, rank) if ring.world > 1 else carried  # each block's gradients home
    n = k.shape[-2]
    return (dq.numpy().astype(q.dtype), carried[..., :n, width:width + d_k].numpy().astype(q.dtype),
            carried[..., :n, width + d_k:].numpy().astype(q.dtype))


def ring_target(parts: RingParts = RING, *, name: str = "ring", **declared: Any) -> RankTarget:
    """A ring made of ``parts`` as a `spec.RankTarget`: forward, LSE and backward, every layout,
    world sizes 2 and 4, float32 and float64, packed documents."""
    import functools

    _torch()  # refuse now, naming what is missing, rather than in the first law
    forward = ring_attention if parts is RING else functools.partial(ring_attention, parts=parts)
    backward = ring_attention_backward if parts is RING else functools.partial(ring_attention_backward,
                                                                               parts=parts)
    settings: dict[str, Any] = {"returns_lse": True, "grad_fn": backward, "supports_varlen": True,
                                "in_process": True, **declared}
    return RankTarget(forward, name=name, **settings)
