"""Gallery for the rank laws (`spec.laws.ranks`): context-parallel targets (`spec.RankTarget`), each
broken one the suite's ring attention (`spec.adapters.torch_ring`) with one of its pieces
(`RingParts`) changed, each a re-creation of a reported bug, and correct variants that compute it
differently. Empty without PyTorch's torch.distributed (the rank laws are then skipped, saying so).
"""

from __future__ import annotations

import math
from typing import Any

from gallery.base import Broken

try:
    import torch
    import torch.distributed as dist

    HAS_RANKS = dist.is_available() and dist.is_gloo_available()
except ImportError:
    HAS_RANKS = False

Tensor = Any


# --- correct: the state merged in ring-flash-attention's form


def sigmoid_merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """``out − σ(lse_b − lse_a)·(out − out_b)``, ``lse − logσ(lse − lse_b)``, an empty part passed over."""
    a_empty, b_empty = torch.isneginf(lse_a), torch.isneginf(lse_b)
    share = torch.where(b_empty, 0.0, torch.where(a_empty, 1.0, torch.sigmoid(lse_b - lse_a)))
    both = lse_a - torch.nn.functional.logsigmoid(lse_a - lse_b)
    lse = torch.where(b_empty, lse_a, torch.where(a_empty, lse_b, both))
    return out_a - share[..., None] * (out_a - out_b), lse


# --- broken: each changes one piece of the ring


def plus_inf_block(q: Tensor, k: Tensor, v: Tensor, visible: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    # an empty row's lse written as FlashAttention's +inf sentinel
    from spec.adapters.torch_ring import block_attention

    out, lse = block_attention(q, k, v, visible, scale)
    return out, torch.where(torch.isneginf(lse), math.inf, lse)


def unguarded_merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    # the max shift taken as it is: the +inf sentinel gives e^(inf − inf) = NaN
    top = torch.maximum(lse_a, lse_b)
    ea, eb = torch.exp(lse_a - top), torch.exp(lse_b - top)
    total = ea + eb
    return (ea[..., None] * out_a + eb[..., None] * out_b) / total[..., None], top + torch.log(total)


def overflowing_merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    # exp(lse_a) + exp(lse_b) computed directly: inf once an lse passes the dtype's range
    ea, eb = torch.exp(lse_a), torch.exp(lse_b)
    total = ea + eb
    out = (ea[..., None] * out_a + eb[..., None] * out_b) / torch.where(total > 0, total, 1)[..., None]
    return out, torch.log(total)


def zigzag_off_by_one(lengths: list[int], layout: str) -> list[Tensor]:
    # rank r's second zigzag chunk taken as 2W − r (mod 2W), not 2W − 1 − r
    from spec.adapters.torch_ring import layout_positions

    if layout != "zigzag":
        return layout_positions(lengths, layout)
    world, n = len(lengths), sum(lengths)
    c = n // (2 * world)
    second = [(2 * world - r) % (2 * world) for r in range(world)]
    return [torch.cat([torch.arange(r * c, (r + 1) * c), torch.arange(s * c, (s + 1) * c)])
            for r, s in zip(range(world), second, strict=True)]


def skips_later_ranks(visible: Tensor, *, rank: int, source: int, causal: bool) -> bool:
    # a contiguous layout's causal schedule (later ranks' keys all in the future) under any layout
    return causal and source > rank


def _ring(name: str, **parts: Any) -> Any:
    from spec.adapters.torch_ring import RingParts, ring_target

    return ring_target(RingParts(**parts), name=name)


def _broken(name: str, catches: str, bug: str, **parts: Any) -> Broken:
    return Broken(_ring(name, **parts), catches, bug)


BROKEN: list[Broken] = [
    _broken("ring_plus_inf_sentinel", "ranks_match_golden",
            "an empty block's +inf LSE sentinel merged as a number: NaN (flash-attention PR #1936)",
            block=plus_inf_block, merge=unguarded_merge),
    _broken("ring_overflowing_merge", "ranks_large_logits",
            "blocks merged by exp(lse) directly: overflows (EasyContext #14)", merge=overflowing_merge),
    _broken("ring_zigzag_off_by_one", "ranks_invariant",
            "zigzag permutation off by one chunk: rank r's second chunk 2W − r", positions=zigzag_off_by_one),
    _broken("ring_skips_visible_block", "ranks_causal_balanced",
            "contiguous causal schedule under a balanced layout: a block with visible keys skipped "
            "(PyTorch #147793)", skip=skips_later_ranks),
    _broken("ring_pads_into_softmax", "ranks_uneven_and_empty",
            "uneven shards padded to one length, the padding's keys left visible", mask_padding=False),
    _broken("ring_local_documents", "ranks_documents",
            "documents read at local positions in the shard, not global ones", local_documents=True),
    _broken("ring_backward_block_lse", "ranks_backward",
            "backward normalises each block by its own LSE: the correction to the global LSE dropped "
            "(ring-flash-attention #42)", block_lse_backward=True),
] if HAS_RANKS else []

CORRECT = [_ring("ring_sigmoid_merge", merge=sigmoid_merge)] if HAS_RANKS else []
