"""The vision tower beside a multimodal config.json's language model: its parameters, by component.

calc's ledgers count the language model (``text_config``); a multimodal checkpoint also stores a vision
tower (``vision_config``), counted here for the types whose tower calc knows, and reported beside the
language model's totals, never in them. Each count follows the modules transformers builds; the tests
compare it with transformers' own tower on the meta device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calc.config import ConfigError

# transformers' Qwen3VLVisionConfig defaults, for keys a vision_config may leave out
QWEN3_VL_DEFAULTS = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                     "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                     "out_hidden_size": 3584, "num_position_embeddings": 2304,
                     "deepstack_visual_indexes": [8, 16, 24]}


def _positive(vision: Mapping[str, Any], key: str) -> int:
    value = vision.get(key, QWEN3_VL_DEFAULTS[key])
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"vision_config.{key}", f"must be a positive integer, got {value!r}")
    return value


def qwen3_vl_tower(vision: Mapping[str, Any]) -> dict[str, int]:
    """Qwen3-VL's vision tower (Qwen3VLVisionModel, also Qwen3-VL-MoE's) by component, with ``total``.

    A Conv3d patch embedding (C_in·T·P² → D, a bias), a learned table of N_pos positions, ``depth`` ViT
    blocks (two LayerNorms, a fused QKV and an output projection with biases, an MLP D → F → D with
    biases), a merger that concatenates s² neighbouring patches (M = s²·D) and projects them to the
    language model's width O (a LayerNorm of D, M → M → O with biases), and one more merger per
    ``deepstack_visual_indexes`` entry, whose LayerNorm is over M. Rotary tables are not saved."""
    d, f, depth = _positive(vision, "hidden_size"), _positive(vision, "intermediate_size"), \
        _positive(vision, "depth")
    patch, temporal, channels = (_positive(vision, "patch_size"), _positive(vision, "temporal_patch_size"),
                                 _positive(vision, "in_channels"))
    merged = _positive(vision, "spatial_merge_size") ** 2 * d
    out = _positive(vision, "out_hidden_size")
    deepstack = vision.get("deepstack_visual_indexes", QWEN3_VL_DEFAULTS["deepstack_visual_indexes"])
    if not isinstance(deepstack, list | tuple):
        raise ConfigError("vision_config.deepstack_visual_indexes", f"must be a list, got {deepstack!r}")
    projection = merged * merged + merged + merged * out + out  # fc1 and fc2 with their biases
    parts = {
        "patch_embedding": channels * temporal * patch**2 * d + d,
        "position_embedding": _positive(vision, "num_position_embeddings") * d,
        "blocks": depth * (2 * 2 * d + 3 * d * d + 3 * d + d * d + d + d * f + f + f * d + d),
        "merger": 2 * d + projection,
        "deepstack_mergers": len(deepstack) * (2 * merged + projection),
    }
    return {**parts, "total": sum(parts.values())}


TOWERS = {"qwen3_vl": qwen3_vl_tower, "qwen3_vl_moe": qwen3_vl_tower}


def vision_tower(raw: Mapping[str, Any]) -> dict[str, int] | None:
    """The vision tower of a multimodal config.json by component (None: it has no ``vision_config``, or
    one of a type whose tower calc does not count). Raises ConfigError naming a ``vision_config`` key
    that is not a positive integer."""
    vision = raw.get("vision_config")
    count = TOWERS.get(str(raw.get("model_type")))
    if count is None or vision is None:
        return None
    if not isinstance(vision, Mapping):
        raise ConfigError("vision_config", f"must be an object, got {vision!r}")
    return count(vision)
