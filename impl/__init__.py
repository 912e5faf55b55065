"""impl — scaled dot-product attention in NumPy, written to read like the maths.

    attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V

Shape codes in every docstring use the letters of `impl.attention`.
"""

from impl.attention import attention, softmax
from impl.flash import flash_attention
from impl.flash import flash_attention_backward as flash_attention_backward  # re-exported
from impl.grad import attention_backward, gradcheck
from impl.layers import multi_head_attention, self_attention
from impl.masks import (
    causal_mask,
    chunk_mask,
    packed_mask,
    padding_mask,
    sliding_window_mask,
    topk_block_mask,
    topk_mask,
)

__all__ = [
    "attention",
    "attention_backward",
    "causal_mask",
    "chunk_mask",
    "flash_attention",
    "gradcheck",
    "multi_head_attention",
    "packed_mask",
    "padding_mask",
    "self_attention",
    "sliding_window_mask",
    "softmax",
    "topk_block_mask",
    "topk_mask",
]
