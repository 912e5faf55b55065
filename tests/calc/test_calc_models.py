"""The model types of 2024–25 read from their published config.json files (tests/calc/configs/): totals and
active counts against transformers' own models, counts derived by hand from each architecture, KV caches
derived by hand (hybrids: the attention layers only; MLA: the latent and the rotary key), and a reader
that says why it refuses."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from pathlib import Path
from typing import NamedTuple

import pytest

from calc import costs, ledger
from calc.cli import main
from calc.config import ConfigError
from calc.hf import IGNORED, INERT, INERT_KINDS, InertKeyWarning, closest_type, from_config, layer_types, load

CONFIGS = Path(__file__).resolve().parents[2] / "tests" / "calc" / "configs"


def raw(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))


class Counted(NamedTuple):
    total: int  # transformers' model on the meta device: parameters and saved buffers
    active: int | None  # the same model less (E − k)/E of its routed experts' tensors; None: dense
    kv_per_token: int  # bf16, derived by hand below


# total and active: `python -m calc.verify tests/calc/configs/*.json` (transformers 5.25.0 for the types added
# with DeepSeek V3.2) (calc.verify.stored_count and
# active_count, read from the models alone), transformers 5.24.0, torch 2.13.0; every one equal to
# calc's count.
# KV bytes per token, bf16 (2 bytes): 2 (K and V) · attention layers · key/value heads · d_k · 2.
MODELS = {
    "qwen3-30b-a3b": Counted(30_532_122_624, 3_353_032_704, 2 * 48 * 4 * 128 * 2),
    "gpt-oss-20b": Counted(20_914_757_184, 4_187_440_704, 2 * 24 * 8 * 64 * 2),
    "llama4-scout-17b-16e": Counted(107_769_861_120, 17_172_894_720, 2 * 48 * 8 * 128 * 2),
    "deepseek-v2-lite": Counted(15_706_484_224, 2_661_150_208, 27 * (512 + 64) * 2),  # MLA's latent and key
    # transformers 5.25.0: MLA's latent and key, and the indexer's key of 128, in each of the 61 layers
    "deepseek-v3.2": Counted(671_877_944_064, 38_403_822_336, 61 * (512 + 64 + 128) * 2),
    "qwen3-next-80b-a3b": Counted(79_674_391_296, 3_874_929_408, 2 * 12 * 2 * 256 * 2),  # 12 of 48 layers
    "jamba-v0.1": Counted(51_570_323_328, 12_110_311_296, 2 * 4 * 8 * 128 * 2),  # 4 of 32 layers attend
    "qwen1.5-moe-a2.7b": Counted(14_315_784_192, 2_689_173_504, 2 * 24 * 16 * 128 * 2),
    "gemma-7b": Counted(8_537_680_896, None, 2 * 28 * 16 * 256 * 2),
    "smollm3-3b": Counted(3_075_098_624, None, 2 * 36 * 4 * 128 * 2),
    "olmo2-7b": Counted(7_298_617_344, None, 2 * 32 * 32 * 128 * 2),
    "phi-2": Counted(2_779_683_840, None, 2 * 32 * 32 * 80 * 2),
    "starcoder2-3b": Counted(3_030_371_328, None, 2 * 30 * 2 * 128 * 2),
    "command-r-v01": Counted(34_980_831_232, None, 2 * 40 * 64 * 128 * 2),
    "falcon-7b": Counted(6_921_720_704, None, 2 * 32 * 1 * 64 * 2),  # multi-query: one K/V head
    "stablelm-3b-4e1t": Counted(2_795_443_200, None, 2 * 32 * 32 * 80 * 2),
    "starcoder": Counted(15_517_456_384, None, 2 * 40 * 1 * 128 * 2),
    "opt-125m": Counted(125_239_296, None, 2 * 12 * 12 * 64 * 2),
    # transformers 5.25.0's configuration classes' defaults, saved by to_dict (tests/calc/configs/README.md)
    "olmo3-transformers-defaults": Counted(6_888_624_128, None, 2 * 32 * 32 * 128 * 2),
    "minimax-m2-transformers-defaults": Counted(228_689_764_864, 11_030_553_088, 2 * 62 * 8 * 128 * 2),
    # MLA's latent and rotary key, and the indexer's key, in each of the 78 layers
    "glm-moe-dsa-transformers-defaults": Counted(743_911_218_432, 41_784_728_832, 78 * (512 + 64 + 128) * 2),
    "ernie4-5-transformers-defaults": Counted(360_748_032, None, 2 * 18 * 2 * 128 * 2),
    "ernie4-5-moe-transformers-defaults": Counted(21_825_437_888, 3_352_150_208, 2 * 28 * 4 * 128 * 2),
    # Qwen3.5's text models: 8 of 32 and 10 of 40 layers attend, the others are Gated DeltaNet
    "qwen3-5-transformers-defaults": Counted(8_953_803_264, None, 2 * 8 * 4 * 256 * 2),
    "qwen3-5-moe-transformers-defaults": Counted(34_660_610_688, 3_454_988_928, 2 * 10 * 2 * 256 * 2),
    # Qwen3-VL's text models (the multimodal model's language model and head; its vision tower apart)
    "qwen3-vl-transformers-defaults": Counted(12_049_461_248, None, 2 * 32 * 32 * 128 * 2),
    "qwen3-vl-moe-transformers-defaults": Counted(13_485_121_536, 1_858_510_848, 2 * 24 * 16 * 128 * 2),
    # Nemotron-H's four blocks (Mamba-2, experts, attention, MLP): 1 attention layer of 8 K/V heads of 128
    "nemotron-h-transformers-defaults": Counted(1_968_355_720, 1_590_475_144, 2 * 1 * 8 * 128 * 2),
    # MiMo-V2-Flash: keys of 192 and values of 128; 9 full layers of 4 K/V heads, 39 windowed of 8 (w = 129)
    "mimo-v2-flash-transformers-defaults": Counted(308_778_780_864, 15_445_936_320,
                                                   (9 * 4 + 39 * 8) * (192 + 128) * 2),
    # LongCat-Flash: 28 layers of two MLA sublayers, each caching its latent of 512 and rotary key of 64
    "longcat-flash-transformers-defaults": Counted(560_664_980_480, 32_182_676_480, 56 * (512 + 64) * 2),
    # Gemma 4's text model: 25 windowed layers of 4 K/V heads of 256, 5 full of 4 K/V heads of 512
    "gemma4-transformers-defaults": Counted(5_077_177_886, None, (25 * 2 * 4 * 256 + 5 * 2 * 4 * 512) * 2),
    # DeepSeek V4: per token, once every window is full, the pooled entries: 23 HCA layers one key of 512
    # every 128 tokens, 20 CSA layers one of 512 and the indexer's of 128 every 4 (the windows are bounded)
    "deepseek-v4-transformers-defaults": Counted(284_328_206_295, 13_795_598_295,
                                                 (23 * 512 // 128 + 20 * (512 + 128) // 4) * 2),
    # files with keys of calc.hf.INERT (runner_max_sequence_length, use_mrope, transformers.js_config)
    "santacoder": Counted(1_124_886_528, None, 2 * 24 * 1 * 128 * 2),  # multi-query
    "qwen2.5-0.5b": Counted(494_032_768, None, 2 * 24 * 2 * 64 * 2),
    "smollm2-1.7b-instruct": Counted(1_711_376_384, None, 2 * 24 * 32 * 64 * 2),
}


def _load(name: str):
    """A fixture, its inert keys' warning (tested below) kept out of the way."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InertKeyWarning)
        return load(str(CONFIGS / f"{name}.json"))


@pytest.mark.parametrize("name", MODELS)
def test_totals_and_active_equal_transformers_count(name):
    config, counted = _load(name), MODELS[name]
    assert ledger.checkpoint(config)["total"] == counted.total
    assert ledger.active(config) == (counted.active or counted.total)


@pytest.mark.parametrize("name", MODELS)
def test_kv_bytes_per_token_by_hand(name):
    config = _load(name)
    kv = costs.kv_cache(config, [128], "bf16")
    assert kv["bytes_per_token"] == MODELS[name].kv_per_token
    if config.compressed is None:  # DeepSeek V4's windows and entries: test_deepseek_v4_kv_cache_by_hand
        assert kv["rows"][0]["bytes"] == 128 * MODELS[name].kv_per_token  # no window (gpt-oss: 128) over-full


def test_every_new_type_has_a_fixture_here():
    new = {"qwen3_moe", "gpt_oss", "llama4", "deepseek_v2", "deepseek_v32", "qwen3_next", "jamba",
           "qwen2_moe", "gemma", "smollm3",
           "olmo2", "phi", "starcoder2", "cohere", "falcon", "stablelm", "gpt_bigcode", "opt",
           "qwen2", "llama",  # Qwen2.5 and SmolLM2: the inert keys of their files
           "olmo3", "minimax_m2", "glm_moe_dsa", "ernie4_5", "ernie4_5_moe", "qwen3_5",
           "qwen3_5_moe", "qwen3_vl", "qwen3_vl_moe", "nemotron_h", "mimo_v2_flash",
           "longcat_flash", "gemma4", "deepseek_v4"}
    assert {raw(name)["model_type"] for name in MODELS} == new


# --- counts by hand, one per new feature ---------------------------------------------------------------
def test_gpt_oss_sinks_biases_and_biased_experts_by_hand():
    d, h, g, d_k, layers, experts, d_e, vocab = 2880, 64, 8, 64, 24, 32, 2880, 201088
    # Q, K, V, O, their biases, the sinks
    attention = 2 * d * h * d_k + 2 * d * g * d_k + (h + 2 * g) * d_k + d + h
    expert = 3 * d * d_e + 2 * d_e + d  # gate and up (fused), down, their biases
    moe = experts * expert + experts * d + experts  # experts, router and its bias
    total = layers * (attention + moe + 2 * d) + d + 2 * vocab * d
    config = load(str(CONFIGS / "gpt-oss-20b.json"))
    assert ledger.checkpoint(config)["total"] == total
    assert ledger.active(config) == total - layers * (experts - 4) * expert
    # OpenAI's card: 3.61 B active, counting the embedding but not the unembedding
    assert round((ledger.active(config) - vocab * d) / 1e9, 2) == 3.61


def test_qwen3_next_gated_deltanet_and_gated_attention_by_hand():
    d, vocab = 2048, 151936
    # Q and its gate, K, V, O, q/k norms
    attention = 2 * 16 * 256 * d + 2 * 2 * 256 * d + 16 * 256 * d + 2 * 256
    conv = 2 * 16 * 128 + 32 * 128  # q, k and v, convolved
    deltanet = (d * (2 * 16 * 128 + 2 * 32 * 128) + d * 2 * 32 + conv * 4 + 2 * 32 + 128 + 32 * 128 * d)
    moe = 512 * d + 512 * 3 * d * 512 + 3 * d * 512 + d  # router, experts, shared expert and its gate
    total = 12 * attention + 36 * deltanet + 48 * (moe + 2 * d) + d + 2 * vocab * d
    config = load(str(CONFIGS / "qwen3-next-80b-a3b.json"))
    assert (config.n_attention_layers, config.n_linear_layers) == (12, 36)
    assert ledger.checkpoint(config)["total"] == total
    kv = costs.kv_cache(config, [4096], "bf16")
    # 36 layers keep h_v = 32 states of 128 × 128 and K − 1 = 3 inputs of the convolution, at 2 bytes
    assert kv["state_bytes_per_sequence"] == 36 * (32 * 128 * 128 + 3 * conv) * 2 == 39_518_208


def test_jamba_mamba_layers_and_interleaved_experts_by_hand():
    d, d_in, state, rank, vocab = 4096, 8192, 16, 256, 65536
    attention = 2 * d * 32 * 128 + 2 * d * 8 * 128
    # in, conv and its bias, x, dt and its bias, A, D, out, the dt/B/C norms
    mamba = (d * 2 * d_in + d_in * 4 + d_in + d_in * (rank + 2 * state) + rank * d_in + d_in + d_in * state
             + d_in + d_in * d + rank + 2 * state)
    moe, dense = 16 * 3 * d * 14336 + 16 * d, 3 * d * 14336
    total = 4 * attention + 28 * mamba + 16 * moe + 16 * dense + 32 * 2 * d + d + 2 * vocab * d
    config = load(str(CONFIGS / "jamba-v0.1.json"))
    assert (config.n_attention_layers, config.n_mamba_layers, config.n_dense_layers) == (4, 28, 16)
    assert ledger.checkpoint(config)["total"] == total
    assert costs.kv_cache(config, [1],
                          "bf16")["state_bytes_per_sequence"] == 28 * (d_in * state + 3 * d_in) * 2


# Nemotron-H at small sizes: 8 attention heads of 32 (2 K/V), 8 Mamba-2 heads of 16 in 2 groups of state 16
NEMOTRON_H_SMALL = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8,
                    "num_key_value_heads": 2, "head_dim": 32, "mamba_num_heads": 8, "mamba_head_dim": 16,
                    "n_groups": 2, "ssm_state_size": 16, "vocab_size": 1000, "moe_intermediate_size": 64,
                    "moe_shared_expert_intermediate_size": 96, "n_routed_experts": 4}


def _nemotron_h(drop: tuple[str, ...] = (), **changes) -> dict:
    """The fixture at NEMOTRON_H_SMALL's sizes, its block list dropped (give one), keys dropped, changed."""
    small = {k: v for k, v in NEMOTRON_H_SMALL.items() if k not in drop}
    return _variant("nemotron-h-transformers-defaults", drop=("layers_block_type", *drop), **small, **changes)


def test_nemotron_h_mamba2_blocks_and_layers_without_an_mlp_by_hand():
    # 10 blocks: 5 Mamba-2, 2 attention, 3 MLP; biases on the Mamba-2 and MLP projections, none on the conv
    config = from_config(_nemotron_h(hybrid_override_pattern="M-M*-MM-*M", use_bias=True, mlp_bias=True,
                                     use_conv_bias=False))
    d, d_in, groups, state, heads, vocab = 256, 128, 2, 16, 8, 1000
    in_proj = 2 * d_in + 2 * groups * state + heads  # x, the gate z, B and C, a step per head
    mamba2 = d * in_proj + in_proj + (d_in + 2 * groups * state) * 4 + 3 * heads + d_in + d_in * d + d
    attention = 2 * d * 8 * 32 + 2 * d * 2 * 32
    mlp = 2 * d * 512 + 512 + d  # up and down, no gate, their biases
    total = 5 * mamba2 + 2 * attention + 3 * mlp + (10 + 1) * d + 2 * vocab * d  # a norm a block, the last
    assert (config.n_layers, config.n_mamba_layers, config.n_mlp_free_layers) == (7, 5, 4)
    assert ledger.checkpoint(config)["total"] == total
    assert layer_types(_nemotron_h(hybrid_override_pattern="M-M*-MM-*M")) == ["mamba"] * 2 + [FULL] + \
        ["mamba"] * 2 + [FULL] + ["mamba"]
    # 5 layers keep 8 heads of 16 × 16 and K − 1 = 3 inputs of the convolution over x, B and C, at 2 bytes
    kv = costs.kv_cache(config, [4096], "bf16")
    assert kv["state_bytes_per_sequence"] == 5 * (d_in * state + 3 * (d_in + 2 * groups * state)) * 2
    assert kv["bytes_per_token"] == 2 * 2 * 2 * 32 * 2


def test_nemotron_h_experts_without_a_gate_and_one_shared_expert_by_hand():
    # blocks: Mamba-2, experts, attention, MLP; 4 experts of 64 (2 a token), one shared of 96, a router bias
    config = from_config(_nemotron_h(layers_block_type=["linear_attention", "moe", "full_attention", "mlp"],
                                     n_shared_experts=3))  # NemotronHMoE builds one shared expert whatever
    d = 256
    moe = 4 * 2 * d * 64 + 4 * d + 4 + 2 * d * 96
    assert ledger.checkpoint(config)["experts"] + ledger.checkpoint(config)["shared_experts"] == \
        4 * 2 * d * 64 + 2 * d * 96
    assert ledger.checkpoint(config)["router"] + ledger.checkpoint(config)["router_bias"] == 4 * d + 4
    assert ledger.checkpoint(config)["dense_mlp"] == 2 * d * 512
    assert ledger.checkpoint(config)["total"] - ledger.active(config) == (4 - 2) * 2 * d * 64 < moe


def test_nemotron_h_decode_step_reads_the_experts_of_its_expert_blocks_only():
    # 6 mixer layers, 4 of them with an expert block (L_0 = 2): one token reads the active weights, less the
    # embedding table but its own row; many tokens read every expert of the 4 blocks at most
    from calc.serving import step_bytes

    config = from_config(_nemotron_h(hybrid_override_pattern="MEM*EMEM*E"))
    assert (config.n_layers, config.n_mlp_free_layers) == (6, 2)
    d, vocab = 256, 1000
    assert step_bytes(config, 1, 2) == 2 * (ledger.active(config) - vocab * d + d)
    whole = 2 * (ledger.checkpoint(config)["total"] - vocab * d + 10**5 * d)
    assert whole - 2 <= step_bytes(config, 10**5, 2) <= whole


def test_nemotron_h_ties_no_head_and_says_so():
    untied = from_config(_nemotron_h())
    tied = from_config(_nemotron_h(tie_word_embeddings=True))  # NemotronHForCausalLM ties no weights
    assert not tied.tied_embeddings and ledger.checkpoint(tied) == ledger.checkpoint(untied)
    assert any("ties no weights" in note for note in tied.notes)


# MiMo-V2-Flash at small sizes: 8 query heads, keys of 24 and values of 16, 2 K/V heads (4 on windowed
# layers)
MIMO_SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 24, "v_head_dim": 16, "vocab_size": 1000,
              "moe_intermediate_size": 32,
              "n_routed_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 6, "sliding_window": 8}


def _mimo(**changes) -> dict:
    return _variant("mimo-v2-flash-transformers-defaults", drop=("layer_types", "mlp_layer_types"),
                    **{**MIMO_SMALL, **changes})


def test_mimo_v2_flash_windowed_layers_with_twice_the_kv_heads_and_sinks_by_hand():
    config = from_config(_mimo(attention_bias=True))
    d, h, g, d_k, d_v = 128, 8, 2, 24, 16
    # Q, K of d_k, V, O of d_v, biases on Q, K and V
    full = d * h * d_k + d * g * d_k + d * g * d_v + h * d_v * d + h * d_k + g * (d_k + d_v)
    windowed = full + d * g * (d_k + d_v) + g * (d_k + d_v) + h  # twice the K and V heads, and a sink a head
    moe = 4 * 3 * d * 32 + 4 * d + 4  # experts, router, its score-correction bias
    # layers 0 and 5 full, 1–4 windowed; layer 0 dense, 1–5 experts
    total = 2 * full + 4 * windowed + 3 * d * 256 + 5 * moe + 6 * 2 * d + d + 2 * 1000 * d
    assert (config.n_window_layers, config.n_kv_heads_window, config.n_dense_layers) == (4, 4, 1)
    assert ledger.checkpoint(config)["total"] == total
    # at n = 100 a full layer holds 100 tokens of 2 heads, a windowed one 8 tokens of 4, K of 24 and V of 16
    (row,) = costs.kv_cache(config, [100], "bf16")["rows"]
    assert row["bytes"] == (2 * 100 * 2 + 4 * 8 * 4) * (d_k + d_v) * 2


def test_mimo_v2_flash_legacy_window_is_one_more():
    # the hub files' sliding_window_size counts the keys before the query; MiMoV2FlashConfig adds 1
    config = from_config(_mimo(sliding_window_size=127, sliding_window=None))
    assert config.sliding_window == 128


# Gemma 4 at small sizes: 4 query heads, 2 K/V heads of 16 on a windowed layer, heads of 32 on a full one
# (global_head_dim), per-layer inputs of 8 from a table of 300 rows
GEMMA4_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32, "vocab_size": 500,
                "vocab_size_per_layer_input": 300,
                "hidden_size_per_layer_input": 8, "num_hidden_layers": 6, "sliding_window": 16}


def _gemma4(**changes) -> dict:
    return _variant("gemma4-transformers-defaults", drop=("layer_types", "per_layer_config"),
                    **{**GEMMA4_SMALL, **changes})


GEMMA4_SHARED = dict(attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=2,
                     use_double_wide_mlp=True, layer_types=["sliding_attention"] * 2 + ["full_attention"]
                     + ["sliding_attention"] * 2 + ["full_attention"])


def test_gemma4_values_as_keys_shared_kv_layers_and_per_layer_inputs_by_hand():
    config = from_config(_gemma4(**GEMMA4_SHARED))
    d, h, g, d_k, g_f, d_kf, d_ff, d_p, layers = 64, 4, 2, 16, 1, 32, 128, 8, 6
    windowed = 2 * d * h * d_k + 2 * d * g * d_k + 2 * d_k  # Q, O, K, V; q and k norms
    full = 2 * d * h * d_kf + d * g_f * d_kf + 2 * d_kf  # Q, O, K (its values are its keys); q and k norms
    # layers 4 (windowed) and 5 (full) reuse the keys and values of layers 3 and 2: Q, O and the q norm only
    shared_windowed, shared_full = 2 * d * h * d_k + d_k, 2 * d * h * d_kf + d_kf
    mlp = 3 * d * d_ff  # gate, up, down; twice as wide on the 2 reusing layers
    per_layer = 2 * d * d_p + 5 * d + 1  # input gate and projection, 5 norms, the layer's scalar
    body = (3 * windowed + full + shared_windowed + shared_full + 4 * mlp + 2 * 2 * mlp + layers * per_layer)
    per_layer_inputs = 300 * layers * d_p + d * layers * d_p + d_p  # table, projection, its norm
    assert ledger.checkpoint(config)["total"] == body + per_layer_inputs + d + 500 * d  # final norm, tied
    assert (config.n_kv_shared_layers, config.n_kv_shared_window_layers) == (2, 1)
    # at n = 100 (w = 16) layers 0, 1, 3 hold 16 tokens of 2 heads of 16, layer 2 100 of 1 head of 32 (K and V
    # both, as transformers caches them); layers 4 and 5 none of their own
    (row,) = costs.kv_cache(config, [100], "bf16")["rows"]
    assert row["bytes"] == (3 * 16 * 2 * g * d_k + 100 * 2 * g_f * d_kf) * 2
    assert costs.kv_cache(config, [100], "bf16")["bytes_per_token"] == (3 * 2 * g * d_k + 2 * g_f * d_kf) * 2
    # the per-layer table is a lookup, like the token embedding: no part of N
    assert ledger.non_embedding(config) == ledger.checkpoint(config)["total"] - 500 * d - 300 * layers * d_p


def test_gemma4_attention_figures_take_each_layer_at_its_width():
    # the roofline's causal FLOPs and the KV cache equal the sum of the per-kind figures, each kind at its
    # heads (the full layers' of 32, the windowed layers' of 16)
    config = from_config(_gemma4(**GEMMA4_SHARED))
    from calc import kinds

    for n in (10, 100):
        (row,) = kinds.by_kind(config, [n])
        assert costs.flops(config, [n])[0]["causal_flops_per_model"] == row["total"]["prefill_flops"]
        assert costs.kv_cache(config, [n], "bf16")["rows"][0]["bytes"] == row["total"]["cache_bytes"]


def test_gemma4_experts_beside_the_dense_mlp_by_hand():
    config = from_config(_gemma4(enable_moe_block=True, num_experts=4, top_k_experts=2,
                                 moe_intermediate_size=24, hidden_size_per_layer_input=0))
    d, d_e = 64, 24
    # per layer: 4 experts of 3·d·d_e, the router d → 4 with a scale of d and one per expert, 3 more norms
    moe = 4 * 3 * d * d_e + 4 * d + d + 4 + 3 * d
    dense = from_config(_gemma4(hidden_size_per_layer_input=0))
    assert ledger.checkpoint(config)["total"] - ledger.checkpoint(dense)["total"] == 6 * moe
    assert ledger.checkpoint(config)["total"] - ledger.active(config) == 6 * 2 * 3 * d * d_e


# DeepSeek V4 at small sizes: 5 layers (HCA, CSA, windowed only, CSA, HCA), the first routed by its hash table
CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"
V4_SMALL = {"vocab_size": 97, "hidden_size": 64, "moe_intermediate_size": 32, "num_hidden_layers": 5,
            "num_attention_heads": 4, "head_dim": 32, "q_lora_rank": 24, "num_experts_per_tok": 2,
            "n_routed_experts": 4, "sliding_window": 8, "o_groups": 2, "o_lora_rank": 16, "index_n_heads": 2,
            "index_head_dim": 16, "index_topk": 3, "hc_mult": 2, "max_position_embeddings": 256,
            "layer_types": [HCA, CSA, "sliding_attention", CSA, HCA],
            "compress_rates": {CSA: 4, HCA: 16}, "mlp_layer_types": ["hash_moe"] + ["moe"] * 4}


def _v4(drop: tuple[str, ...] = (), **changes) -> dict:
    """DeepseekV4Config's saved defaults at V4_SMALL's sizes, ``changes`` made, ``drop``'s keys left out."""
    merged = {k: v for k, v in {**V4_SMALL, **changes}.items() if k not in drop}
    return _variant("deepseek-v4-transformers-defaults", drop=("qk_rope_head_dim", *drop), **merged)


def test_deepseek_v4_by_hand():
    config = from_config(_v4())
    d, h, d_k, r_q, vocab, d_e, experts, k = 64, 4, 32, 24, 97, 32, 4, 2
    w_o, r_o, h_i, d_i, streams = 2, 16, 2, 16, 2
    # every layer: q_a and its norm, q_b, one key (the value) and its norm, o_a (each of the 2 groups: 2 heads
    # of 32 → 16), o_b (2·16 → d), a sink per head
    attention = (d * r_q + r_q + r_q * h * d_k + d * d_k + d_k + w_o * (h * d_k // w_o) * r_o
                 + w_o * r_o * d + h)
    hca = 2 * d * d_k + 16 * d_k + d_k  # key and gate d → d_k, a position bias of 16 × d_k, a norm
    csa = 2 * d * 2 * d_k + 4 * 2 * d_k + d_k  # the same at 2·d_k (its norm d_k)
    indexer = 2 * d * 2 * d_i + 4 * 2 * d_i + d_i + r_q * h_i * d_i + d * h_i  # own pool, queries, weights
    # two hyper-connections a layer: (2 + 2)·2 = 8 mixing weights from the 2·d streams, their bias, 3 scales
    hyper = 2 * (8 * streams * d + 8 + 3)
    moe = experts * 3 * d * d_e + 3 * d * d_e + experts * d  # 4 experts, the shared one, the router
    layers = 5 * (attention + hyper + moe + 2 * d) + 2 * hca + 2 * (csa + indexer)
    saved = 4 * experts + 1 * vocab * k  # the score correction on 4 layers; layer 0's token → experts table
    head = streams * streams * d + streams + 1  # the hyper-connections' head
    total = layers + saved + head + d + 2 * vocab * d  # final norm, untied embedding and unembedding
    assert ledger.checkpoint(config)["total"] == total
    assert ledger.active(config) == total - 5 * (experts - k) * 3 * d * d_e  # hash-routed layers run k too


def test_deepseek_v4_kv_cache_by_hand():
    # As DeepseekV4HCACache and DeepseekV4CSACache hold it after 37 tokens (w = 8, bf16), tensor by tensor;
    # transformers 5.25.0's own cache, summed over its tensors (one storage once), holds the same 9,024 bytes
    config = from_config(_v4())
    n, w, d_k, d_i, b = 37, 8, 32, 16, 2
    window = min(n, w - 1)  # the last w − 1 keys
    hca = (window * d_k  # its keys, which are its values (one tensor)
           + n // 16 * d_k  # 2 entries pooled
           + n % 16 * 2 * d_k) * b  # 5 tokens of the window in progress: a key and a gate each
    csa = ((window * d_k + n // 4 * (d_k + d_i)  # 9 entries, the compressor's and the indexer's
            + n % 4 * (2 * 2 * d_k + 2 * 2 * d_i)) * b  # 1 token in progress: key and gate of 2·d_k, of 2·d_i
           + 4 * (d_k + d_i) * (b + 4))  # the overlap with the next window: 4 keys at b, 4 gates in fp32
    windowed = 2 * window * d_k * b  # a windowed-only layer: keys and values apart
    (row,) = costs.kv_cache(config, [n], "bf16")["rows"]
    assert row["bytes"] == 2 * hca + 2 * csa + windowed
    # per token once the windows are full: an entry of d_k every 16 tokens (2 layers), of d_k + d_i every 4
    per_token = (2 * d_k // 16 + 2 * (d_k + d_i) // 4) * b
    assert costs.kv_cache(config, [n], "bf16")["bytes_per_token"] == per_token
    # before any window closes: the window's keys and the tokens in progress, no entry, no overlap
    (early,) = costs.kv_cache(config, [3], "bf16")["rows"]
    hca_early, csa_early = 3 * d_k + 3 * 2 * d_k, 3 * d_k + 3 * 4 * (d_k + d_i)
    assert early["bytes"] == (2 * hca_early + 2 * csa_early + 2 * 3 * d_k) * b


def test_deepseek_v4_largest_context_is_the_longest_whose_every_prefix_fits():
    # the cache falls when a window closes (the tokens in progress, a key and a gate each, become one entry),
    # so the longest context is one less than the first length that does not fit, found here by walking
    from itertools import pairwise

    from calc import serving

    config = from_config(_v4())
    bytes_at = [serving.sequence_bytes(config, n, 2, 1) for n in range(1, 200)]
    assert any(later < earlier for earlier, later in pairwise(bytes_at))
    for free in range(bytes_at[0], bytes_at[-1], 1009):
        first_over = next(n for n, held in enumerate(bytes_at, start=1) if held > free)
        assert serving.largest_context(config, free, 2, 1) == first_over - 1


def test_deepseek_v4_costs_equal_the_sum_of_its_kinds():
    from calc import kinds

    config = from_config(_v4())
    for n in (3, 37, 100):
        (row,) = kinds.by_kind(config, [n])
        assert {k: v["layers"] for k, v in row["kinds"].items()} == {"sliding": 1, "csa": 2, "hca": 2}
        assert costs.kv_cache(config, [n], "bf16")["rows"][0]["bytes"] == row["total"]["cache_bytes"]
        # the causal pass over the windows and the pooled entries, plus (in the kinds) the CSA layers'
        # indexers, which score every closed entry: query i the (i + 1) // 4 of them, 2 heads of 16 (2·16 + 2
        # FLOPs a head)
        indexers = 2 * sum(2 * (2 * 16 + 2) * ((i + 1) // 4) for i in range(n))
        causal = costs.flops(config, [n])[0]["causal_flops_per_model"]
        assert causal + indexers == row["total"]["prefill_flops"]


def test_deepseek_v4_without_its_lists_follows_deepseek_v4_configs_rules():
    # DeepseekV4Config: two HCA layers, then CSA and HCA in turn; the first 3 layers hash-routed (what the
    # fixture's saved lists say, and what layer_types reads back)
    saved = raw("deepseek-v4-transformers-defaults")
    bare = from_config({k: v for k, v in saved.items() if k not in ("layer_types", "mlp_layer_types")})
    assert bare == from_config(saved)
    assert layer_types({k: v for k, v in saved.items() if k != "layer_types"}) == saved["layer_types"]
    assert bare.compressed is not None
    assert bare.compressed.hash_layers == saved["mlp_layer_types"].count("hash_moe")


def test_deepseek_v4_legacy_keys_read_as_deepseek_v4_config_folds_them():
    # compress_ratios (0/4/128 a layer, cut to the layers), compress_rate_csa/hca and num_hash_layers: what
    # DeepseekV4Config's __post_init__ folds into layer_types, compress_rates and mlp_layer_types
    legacy = _v4(compress_ratios=[128, 4, 0, 4, 128, 4], compress_rate_csa=4, compress_rate_hca=16,
                 num_hash_layers=1)
    for key in ("layer_types", "compress_rates", "mlp_layer_types"):
        del legacy[key]
    assert ledger.checkpoint(from_config(legacy)) == ledger.checkpoint(from_config(_v4()))


# LongCat-Flash at small sizes: 2 layers, 4 heads, MLA of ranks 32 (queries) and 16 (keys and values)
LONGCAT_SMALL = {"hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                 "ffn_hidden_size": 96,
                 "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                 "head_dim": 4, "qk_head_dim": 12, "v_head_dim": 8, "n_routed_experts": 6, "moe_topk": 2,
                 "zero_expert_num": 3, "expert_ffn_hidden_size": 16, "vocab_size": 500}


def _longcat(drop: tuple[str, ...] = (), **changes) -> dict:
    small = {k: v for k, v in LONGCAT_SMALL.items() if k not in drop}
    return _variant("longcat-flash-transformers-defaults", drop=drop, **{**small, **changes})


def test_longcat_flash_two_mla_sublayers_two_mlps_and_experts_with_zero_experts_by_hand():
    config = from_config(_longcat())
    d, h, vocab = 64, 4, 500
    # queries down to 32, normed, up to 4 heads of 12; a latent of 16 and a rotary key of 4, the latent normed
    # and up to keys of 8 and values of 8; the output from 4 values of 8
    mla = d * 32 + 32 + 32 * h * 12 + d * (16 + 4) + 16 + 16 * h * (8 + 8) + h * 8 * d
    mlp = 3 * d * 96
    # 6 experts of 16, a router over the 6 and the 3 zero experts, its score correction over all 9
    moe = 6 * 3 * d * 16 + 9 * d + 9
    layer = 2 * mla + 2 * mlp + moe + 4 * d  # and the four norms
    assert ledger.checkpoint(config)["total"] == 2 * layer + d + 2 * vocab * d
    assert ledger.checkpoint(config)["total"] - ledger.active(config) == 2 * (6 - 2) * 3 * d * 16
    assert (config.n_layers, config.n_dense_layers, config.n_zero_experts) == (4, 2, 3)
    assert costs.kv_cache(config, [10], "bf16")["bytes_per_token"] == 4 * (16 + 4) * 2  # 4 MLA sublayers


def test_deepseek_v32_indexer_by_hand():
    d, r_q, h_i, d_i, layers = 7168, 1536, 64, 128, 61
    # its queries from the query latent, its key and the key's LayerNorm, each head's weight per token
    indexer = r_q * h_i * d_i + d * d_i + 2 * d_i + d * h_i
    v32 = load(str(CONFIGS / "deepseek-v3.2.json"))
    v3 = load(str(CONFIGS / "deepseek-v3.json"))
    assert ledger.checkpoint(v32)["total"] - ledger.checkpoint(v3)["total"] == layers * indexer
    assert (v32.n_sparse_layers, v32.index_topk, v32.n_full_layers) == (61, 2048, 0)


def test_llama4_interleaved_moe_with_a_shared_expert_and_chunked_layers():
    d, vocab = 5120, 202048
    layer = 2 * d * 40 * 128 + 2 * d * 8 * 128 + 16 * 3 * d * 8192 + 16 * d + 3 * d * 8192 + 2 * d
    config = load(str(CONFIGS / "llama4-scout-17b-16e.json"))  # the multimodal outer config: its text_config
    assert config.model_type == "llama4_text"
    assert ledger.checkpoint(config)["total"] == 48 * layer + d + 2 * vocab * d
    # RoPE layers attend in chunks of 8,192; every fourth is a NoPE layer that sees every key
    assert (config.n_chunked_layers, config.n_nope_layers, config.attention_chunk) == (36, 12, 8192)
    (row,) = costs.kv_cache(config, [32768], "bf16")["rows"]
    assert row["bytes"] == 2 * 8 * 128 * 2 * (12 * 32768 + 36 * 8192)  # a chunked layer holds one chunk


def test_deepseek_v2_lite_mla_without_a_query_lora_by_hand():
    d, vocab = 2048, 102400
    mla = d * 16 * 192 + d * (512 + 64) + 512 + 512 * 16 * (128 + 128) + 16 * 128 * d  # Q, latent, up, O
    moe = 64 * 3 * d * 1408 + 64 * d + 2 * 3 * d * 1408  # routed experts, router, 2 shared experts
    total = 27 * mla + 3 * d * 10944 + 26 * moe + 27 * 2 * d + d + 2 * vocab * d
    config = load(str(CONFIGS / "deepseek-v2-lite.json"))
    # no query LoRA; V2's router keeps no score-correction bias
    assert (config.q_lora_rank, config.router_bias) == (0, False)
    assert ledger.checkpoint(config)["total"] == total


def test_falcon_multi_query_fused_qkv_and_one_layernorm_per_layer():
    d, layers, vocab = 4544, 32, 65024
    layer = d * (d + 2 * 64) + d * d + 2 * d * 4 * d + 2 * d  # Q + one K/V head, dense, 4d MLP, LayerNorm
    total = ledger.checkpoint(load(str(CONFIGS / "falcon-7b.json")))["total"]
    assert total == layers * layer + 2 * d + vocab * d


def test_opt_keeps_two_extra_position_rows_and_phi_a_biased_unembedding():
    d = 768
    layer = 4 * d * d + 4 * d + 2 * d * 3072 + 3072 + d + 2 * 2 * d
    opt = load(str(CONFIGS / "opt-125m.json"))
    assert ledger.checkpoint(opt)["position_embedding"] == (2048 + 2) * d
    assert ledger.checkpoint(opt)["total"] == 12 * layer + 2 * d + 50272 * d + 2050 * d
    phi = ledger.checkpoint(load(str(CONFIGS / "phi-2.json")))
    assert phi["lm_head_bias"] == 51200 and phi["norms"] == (32 + 1) * 2 * 2560


def test_qk_norm_weights_per_head_or_shared():
    olmo = ledger.checkpoint(load(str(CONFIGS / "olmo2-7b.json")))
    assert olmo["qk_norms"] == 32 * (32 + 32) * 128  # OLMo 2: over the whole width of Q and of K
    cohere = from_config({**raw("command-r-v01"), "use_qk_norm": True, "num_key_value_heads": 8})
    assert ledger.checkpoint(cohere)["qk_norms"] == 40 * (64 + 8) * 128  # Command R+: one weight per head
    qwen = ledger.checkpoint(load(str(CONFIGS / "qwen3-30b-a3b.json")))
    assert qwen["qk_norms"] == 48 * 2 * 128  # Qwen3: one d_k weight shared by the heads


# --- patterns and FLOPs of chunked layers ----------------------------------------------------------------
@pytest.mark.parametrize(("n", "chunk"), [(10, 4), (8, 4), (3, 4), (17, 1), (100, 7)])
def test_chunked_pattern_and_causal_flops_count_visible_keys_by_brute_force(n, chunk):
    config = dataclasses.replace(load(str(CONFIGS / "llama4-scout-17b-16e.json")), attention_chunk=chunk)
    same_chunk = sum(i // chunk == j // chunk for i in range(n) for j in range(n))
    visible = sum(i // chunk == j // chunk for i in range(n) for j in range(i + 1))  # causal, its own chunk
    (memory,) = costs.pattern_memory(config, [n])
    assert memory["entries_per_model"] == 40 * (12 * n * n + 36 * same_chunk)
    (flops,) = costs.flops(config, [n])
    causal = 12 * n * (n + 1) // 2 + 36 * visible
    assert flops["causal_flops_per_model"] == 40 * (2 * 128 + 2 * 128) * causal


def test_gpt_oss_window_caps_half_the_layers():
    (row,) = costs.kv_cache(load(str(CONFIGS / "gpt-oss-20b.json")), [8192], "bf16")["rows"]
    assert row["bytes"] == 2 * 8 * 64 * 2 * (12 * 8192 + 12 * 128)


# --- window rules, layer by layer (only visible with use_sliding_window) --------------------------------
def _variant(name: str, drop: tuple[str, ...] = (), **changes) -> dict:
    """A fixture (a multimodal one's text config) with keys dropped and changed."""
    base = raw(name)
    if "text_config" in base:
        base = {**base["text_config"], "model_type": base["text_config"]["model_type"]}
    return {**{k: v for k, v in base.items() if k not in drop}, **changes}


FULL, SLIDING = "full_attention", "sliding_attention"
# config → the layers with a window, derived by hand from transformers' rules (5.24): Qwen2Config and
# Qwen3Config window layer i ≥ max_window_layers (default 28) where sliding_window is set; Qwen2MoeConfig
# the even layers i < max_window_layers; Qwen3MoeAttention every layer, and it has no max_window_layers.
WINDOW_RULES = {
    "qwen3_moe: every layer": (
        _variant("qwen3-30b-a3b", use_sliding_window=True, sliding_window=4096), range(48)),
    "qwen3_moe: a null window is none": (_variant("qwen3-30b-a3b", use_sliding_window=True), ()),
    "qwen2_moe: the even layers below max_window_layers": (
        _variant("qwen1.5-moe-a2.7b", use_sliding_window=True), range(0, 21, 2)),
    "qwen2_moe: max_window_layers past the last layer": (
        _variant("qwen1.5-moe-a2.7b", use_sliding_window=True, max_window_layers=100), range(0, 24, 2)),
    "qwen2_moe: layer_types overrides the rule": (
        _variant("qwen1.5-moe-a2.7b", use_sliding_window=True, layer_types=[SLIDING] * 3 + [FULL] * 21),
        range(3)),
    "qwen2: from max_window_layers on": (
        _variant("qwen2-7b", use_sliding_window=True, max_window_layers=20), range(20, 28)),
    "qwen2: from layer 28 where max_window_layers is absent": (
        _variant("qwen2-7b", drop=("max_window_layers",), use_sliding_window=True, num_hidden_layers=32),
        range(28, 32)),
    "qwen3: a null window is none": (_variant("qwen3-8b", use_sliding_window=True), ()),
    "qwen3: the window's default, 4,096": (
        _variant("qwen3-8b", drop=("sliding_window",), use_sliding_window=True, max_window_layers=30),
        range(30, 36)),
}


@pytest.mark.parametrize("name", WINDOW_RULES)
def test_window_rules_layer_by_layer_by_hand(name):
    config, windowed = WINDOW_RULES[name]
    read = from_config(config)
    assert read.n_window_layers == len(windowed)
    assert read.sliding_window == (None if not windowed else config.get("sliding_window") or 4096)
    assert layer_types(config) == [SLIDING if i in windowed else FULL for i in range(read.n_layers)]


def test_qwen3_moe_window_caps_the_cache_of_every_layer():
    # 48 layers, each holding at most w = 4,096 tokens of K and V for 4 heads of 128, in bf16
    config = from_config(_variant("qwen3-30b-a3b", use_sliding_window=True, sliding_window=4096))
    (row,) = costs.kv_cache(config, [32768], "bf16")["rows"]
    assert row["bytes"] == 48 * 4096 * 2 * 4 * 128 * 2
    (pattern,) = costs.pattern_memory(config, [32768])
    assert pattern["entries_per_model"] == 32 * 48 * 32768 * 4096


def test_qwen2_moe_window_on_even_layers_caps_their_cache():
    # Qwen1.5-MoE: 11 windowed layers (here w = 1,024) of 24; 16 K/V heads of 128, bf16
    config = from_config(_variant("qwen1.5-moe-a2.7b", use_sliding_window=True, sliding_window=1024))
    (row,) = costs.kv_cache(config, [4096], "bf16")["rows"]
    assert row["bytes"] == 2 * 16 * 128 * 2 * (13 * 4096 + 11 * 1024)


@pytest.mark.parametrize("name", WINDOW_RULES)
def test_window_rules_layer_by_layer_equal_transformers(name):
    pytest.importorskip("transformers")
    import torch
    import transformers as tf

    config = dict(WINDOW_RULES[name][0])
    hf_config = tf.AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(hf_config)
    # each attention module's own window: Qwen2/Qwen3 set it to None on full layers, Qwen2-MoE only on
    # sliding ones, Qwen3-MoE on every layer
    theirs = [SLIDING if getattr(layer.self_attn, "sliding_window", None) else FULL
              for layer in model.model.layers]
    assert layer_types(WINDOW_RULES[name][0]) == theirs


# --- a reader that says why ------------------------------------------------------------------------------
def test_unknown_type_names_the_closest_supported_one_and_the_keys_it_could_not_place():
    config = {**raw("qwen3-30b-a3b"), "model_type": "qwen4_moe", "router_temperature": 0.7, "mtp_depth": 2}
    assert closest_type(config) == ("qwen3_moe", ["mtp_depth", "router_temperature"])
    with pytest.raises(ConfigError) as err:
        from_config(config)
    assert err.value.field == "model_type"
    assert "'qwen4_moe' is not supported; the closest supported type is 'qwen3_moe', which could not place " \
           "mtp_depth, router_temperature" in str(err.value)


def test_unknown_type_from_another_family_finds_its_family():
    falcon_like = {**raw("falcon-7b"), "model_type": "falcon_h2"}
    assert closest_type(falcon_like)[0] == "falcon"
    gpt2_like = {"model_type": "gpt3", "n_embd": 12288, "n_head": 96, "n_layer": 96, "n_positions": 2048,
                 "vocab_size": 50257}
    assert closest_type(gpt2_like) == ("gpt2", [])


def test_a_missing_key_does_not_hide_the_keys_a_type_would_read():
    # the first key a llama-family body reads is missing: every key after it still counts as placed
    qwen = {k: v for k, v in raw("qwen3-30b-a3b").items() if k != "num_attention_heads"}
    assert closest_type({**qwen, "model_type": "qwen4_moe"}) == ("qwen3_moe", [])
    mamba2 = {"model_type": "mamba2", "hidden_size": 2560, "num_hidden_layers": 64, "vocab_size": 50288,
              "head_dim": 64, "tie_word_embeddings": True, "use_bias": False, "state_size": 128, "expand": 2,
              "conv_kernel": 4, "n_groups": 1, "num_heads": 80, "use_conv_bias": True, "chunk_size": 256,
              "time_step_rank": 160, "rms_norm": True, "residual_in_fp32": True, "norm_before_gate": False}
    closest, unplaced = closest_type(mamba2)
    # Nemotron-H's Mamba-2 blocks place the keys it shares with Mamba-2 (expand, n_groups, conv_kernel...),
    # though it lacks the first key it reads (num_attention_heads); the rest are Mamba-2's own names
    assert closest == "nemotron_h"
    assert unplaced == sorted({"state_size", "num_heads", "time_step_rank", "rms_norm", "norm_before_gate"})


def test_a_fully_placed_unknown_type_says_so():
    gpt2_like = {"model_type": "gpt3", "n_embd": 12288, "n_head": 96, "n_layer": 96, "n_positions": 2048,
                 "vocab_size": 50257}
    with pytest.raises(ConfigError) as err:
        from_config(gpt2_like)
    message = str(err.value)
    assert "the closest supported type is 'gpt2', whose reader places every key of this file;" in message
    assert "nothing" not in message


@pytest.mark.parametrize(
    ("name", "changes", "key"),
    [
        ("qwen3-30b-a3b", {"num_nextn_predict_layers": 1}, "num_nextn_predict_layers"),  # MTP weights
        ("jamba-v0.1", {"layer_types": ["full_attention"] * 32}, "layer_types"),  # JambaConfig derives them
        ("qwen3-30b-a3b", {"layer_types": ["full_attention"] * 48}, "layer_types"),  # Qwen3MoeConfig has none
        ("mixtral-8x7b", {"layer_types": ["sliding_attention"] * 32}, "layer_types"),
        ("llama2-7b", {"num_nextn_predict_layers": 1}, "num_nextn_predict_layers"),
        ("gpt2", {"n_embd_kv": 128}, "n_embd_kv"),
    ],
)
def test_known_type_refuses_a_key_it_does_not_model(capsys, tmp_path, name, changes, key):
    config = {**raw(name), **changes}
    with pytest.raises(ConfigError) as err:
        from_config(config)
    assert err.value.field == key and "not a key calc models for model_type" in err.value.message
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    assert main([str(path)]) == 2
    out, err_text = capsys.readouterr()
    assert out == "" and err_text.count("\n") == 1 and f": {key}: not a key calc models" in err_text


def test_keys_without_parameters_stay_ignored():
    # what transformers 4.x saved in every config.json (PretrainedConfig's attributes, generation settings)
    extra = {"output_attentions": False, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
             "temperature": 1.0, "top_p": 1.0, "num_beams": 1, "max_length": 20, "is_decoder": False,
             "torchscript": False, "return_dict": True, "problem_type": None,
             "cache_implementation": "hybrid"}
    for name in ("qwen3-30b-a3b", "llama2-7b", "jamba-v0.1", "gpt2"):
        config = {**raw(name), **extra}
        assert ledger.checkpoint(from_config(config)) == ledger.checkpoint(from_config(raw(name))), name
    # a key a type reads, at the value it models: OPT-1.3b's file keeps its final LayerNorm
    opt = from_config({**raw("opt-125m"), "_remove_final_layer_norm": False})
    assert ledger.checkpoint(opt) == ledger.checkpoint(from_config(raw("opt-125m")))


# --- keys no transformers model reads (calc.hf.INERT): accepted, and named once ----------------------------
# a value of each as the published files carry it (the santacoder, qwen2.5-0.5b and smollm2-1.7b-instruct
# fixtures; nanotron's exports for is_llama_config and rope_interleaved; gpt2-medium's for the GPT ones)
INERT_SAMPLES = {"output_past": True, "runner_max_sequence_length": None,
                 "transformers.js_config": raw("smollm2-1.7b-instruct")["transformers.js_config"],
                 "is_llama_config": True, "rope_interleaved": False, "use_mrope": False, "n_special": 0,
                 "predict_special_tokens": True}


def test_inert_table_has_a_kind_and_a_reason_per_key_and_no_other_home():
    assert set(INERT_SAMPLES) == set(INERT)
    assert all(entry.kind in INERT_KINDS and len(entry.reason) > 40 for entry in INERT.values())
    assert not set(INERT) & IGNORED  # one place for each key


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")), ids=lambda path: path.stem)
def test_every_config_here_reads_and_names_each_key_it_ignores(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    carried = sorted(set(data.get("text_config", data)) & set(INERT))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load(str(path))  # no ConfigError: every file here reads
    said = [w for w in caught if w.category is InertKeyWarning]
    assert config.ignored_keys == tuple(carried)
    assert len(said) == (1 if carried else 0)
    assert all(key in str(said[0].message) for key in carried)


def test_the_files_that_were_refused_for_inert_keys_are_here():
    carried = {key for path in CONFIGS.glob("*.json")
               for key in json.loads(path.read_text(encoding="utf-8")) if key in INERT}
    assert carried == {"runner_max_sequence_length", "use_mrope", "transformers.js_config"}


@pytest.mark.parametrize("key", sorted(INERT))
def test_an_inert_key_changes_no_figure_and_is_named_once(key):
    from calc.report import build

    base = from_config(raw("llama2-7b"))
    with pytest.warns(InertKeyWarning, match=re.escape(key)) as said:
        config = from_config({**raw("llama2-7b"), key: INERT_SAMPLES[key]})
    assert len(said) == 1
    with_key, without = build(config, seqs=[4096], train={}), build(base, seqs=[4096], train={})
    assert with_key["warnings"] == [str(said[0].message)] and without["warnings"] == []
    assert {**with_key, "warnings": []} == {**without, "warnings": []}


def test_cli_names_every_ignored_key_in_one_line_and_in_the_json(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw("llama2-7b"), "is_llama_config": True, "output_past": True}),
                    encoding="utf-8")
    assert main([str(path), "--seq", "4096", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "is_llama_config (export tooling), output_past (runtime)" in err
    assert json.loads(out)["warnings"] == [err.removeprefix("python -m calc: warning: ").rstrip("\n")]
    assert main(["compare", str(path), "llama2-7b"]) == 0
    assert capsys.readouterr().err == err  # compare says it once too


@pytest.mark.parametrize(("key", "value"), [("use_mrope", True), ("rope_interleaved", True), ("n_special", 3),
                                            ("n_special", False)])
def test_a_key_inert_at_its_default_is_refused_at_another_value(capsys, tmp_path, key, value):
    config = {**raw("qwen2.5-0.5b"), key: value}
    with pytest.raises(ConfigError) as err:
        from_config(config)
    assert err.value.field == key and "is not a value calc can ignore" in err.value.message
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    assert main([str(path)]) == 2
    out, err_text = capsys.readouterr()
    assert out == "" and err_text.count("\n") == 1
    assert f": {key}: {json.dumps(value)} is not a value" in err_text


def test_inert_keys_never_count_as_unplaced():
    unknown = {**raw("qwen2.5-0.5b"), "model_type": "qwen9"}
    assert closest_type(unknown) == ("qwen2", [])  # use_mrope is known to change nothing


def test_no_inert_key_is_read_anywhere_in_transformers():
    transformers = pytest.importorskip("transformers")
    words = re.compile("|".join(rf"(?<![\w.]){re.escape(key)}(?![\w])" for key in INERT))
    root = Path(transformers.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if any(key in text for key in INERT):  # the regex only where a key occurs at all
            found |= {(m[0], str(path.relative_to(root))) for m in words.finditer(text)}
    assert found == set()


@pytest.mark.parametrize(
    ("config", "key", "text"),
    [
        ({**raw("qwen3-30b-a3b"), "rope_scaling": {"rope_type": "ntk-by-parts-2", "factor": 4.0}},
         "rope_scaling",
         "RoPE scaling 'ntk-by-parts-2' is not one calc knows"),
        ({**raw("gemma-7b"), "rope_parameters": {"full_attention": {"rope_type": "mystery"}}},
         "rope_parameters",
         "'mystery'"),
        ({**raw("gpt-oss-20b"), "layer_types": ["chunked_attention", "full_attention"] * 12}, "layer_types",
         "layer kind 'chunked_attention' is not one calc models for this model_type"),
        ({**raw("qwen3-next-80b-a3b"), "layer_types": ["mamba"] * 48}, "layer_types", "'mamba'"),
        ({**raw("opt-125m"), "word_embed_proj_dim": 512}, "word_embed_proj_dim", "not modelled"),
        ({**raw("opt-125m"), "do_layer_norm_before": False}, "do_layer_norm_before", "not supported"),
        ({**raw("falcon-7b"), "alibi": True}, "alibi", "not supported"),
        ({**raw("phi-2"), "qk_layernorm": True}, "qk_layernorm", "not supported"),
        ({**raw("qwen3-30b-a3b"), "attention_bias": True}, "attention_bias", "not supported"),
        ({**raw("jamba-v0.1"), "mamba_d_state": 0}, "mamba_d_state", "positive integer"),
        ({**raw("qwen3-next-80b-a3b"), "linear_num_value_heads": None}, "linear_num_value_heads", "positive"),
        ({"model_type": "llama4"}, "text_config", "missing"),
        (_nemotron_h(moe_latent_size=64), "moe_latent_size", "not modelled"),
        (_nemotron_h(num_nextn_predict_layers=1), "num_nextn_predict_layers", "not modelled"),
        (_nemotron_h(hybrid_override_pattern="M-*--"), "layers_block_type", "cannot pair more"),
        (_nemotron_h(hybrid_override_pattern="M-X*"), "hybrid_override_pattern", "must be a string of"),
        (_nemotron_h(layers_block_type=["mamba", "full_attention"]), "layers_block_type", "must list"),
    ],
)
def test_known_type_refuses_what_the_ledger_does_not_model(config, key, text):
    with pytest.raises(ConfigError) as err:
        from_config(config)
    assert err.value.field == key and text in str(err.value)


def test_unknown_type_exits_2_in_one_line(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw("olmo2-7b"), "model_type": "olmo9"}), encoding="utf-8")
    assert main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "'olmo9' is not supported; the closest supported type is" in err


def test_partial_rotary_and_nope_layers_are_named_in_the_notes():
    assert any("fraction 0.4" in note for note in load(str(CONFIGS / "phi-2.json")).notes)
    notes = load(str(CONFIGS / "smollm3-3b.json")).notes
    assert any("9 of 36 layers have no rotary positions" in note for note in notes)


# --- feature combinations no fixture has, against transformers itself (where it is installed) -----------
VARIANTS = {
    "falcon, grouped K/V and two norms (40B's layout)": _variant(
        "falcon-7b", hidden_size=1024, num_attention_heads=16, num_kv_heads=4, new_decoder_architecture=True,
        num_hidden_layers=4),
    "falcon, sequential blocks with biases": _variant(
        "falcon-7b", hidden_size=1024, num_attention_heads=16, parallel_attn=False, bias=True,
        num_hidden_layers=3),
    "falcon, new decoder with one norm (Falcon-11B's num_ln_in_parallel_attn)": _variant(
        "falcon-7b", hidden_size=1024, num_attention_heads=16, num_kv_heads=2, new_decoder_architecture=True,
        num_ln_in_parallel_attn=1, num_hidden_layers=3),
    "falcon, old multi-query with two norms (num_ln_in_parallel_attn 2)": _variant(
        "falcon-7b", hidden_size=1024, num_attention_heads=16, num_ln_in_parallel_attn=2, num_kv_heads=16,
        num_hidden_layers=3),
    "falcon, old multi-head: num_kv_heads sizes nothing": _variant(
        "falcon-7b", hidden_size=1024, num_attention_heads=16, multi_query=False, num_kv_heads=16,
        num_hidden_layers=3),
    "llama4, MoE on listed layers, NoPE layers listed": _variant(
        "llama4-scout-17b-16e", moe_layers=[1, 2], no_rope_layers=[1, 0, 1, 1], num_local_experts=4,
        hidden_size=512, num_hidden_layers=4, use_qk_norm=False),
    "jamba, attention every 4 from layer 1, experts every 3": _variant(
        "jamba-v0.1", attn_layer_period=4, attn_layer_offset=1, expert_layer_period=3, expert_layer_offset=2,
        num_hidden_layers=8, num_experts=4, hidden_size=512, intermediate_size=1024, mamba_dt_rank=32),
    "llama4, MoE every other layer (Maverick's interleave)": _variant(
        "llama4-scout-17b-16e", interleave_moe_layer_step=2, num_local_experts=8, hidden_size=512,
        num_hidden_layers=8, use_qk_norm=False),
    "stablelm, Q/K/V biases, per-head q/k norms, parallel": _variant(
        "stablelm-3b-4e1t", use_qkv_bias=True, qk_layernorm=True, use_parallel_residual=True,
        num_key_value_heads=8, num_hidden_layers=4),
    "cohere, per-head q/k norms and GQA (Command R+)": _variant(
        "command-r-v01", use_qk_norm=True, num_key_value_heads=8, num_hidden_layers=3, hidden_size=1024,
        num_attention_heads=8),
    "smollm3, windowed NoPE layers": _variant(
        "smollm3-3b", use_sliding_window=True, sliding_window=512, num_hidden_layers=8,
        no_rope_layers=[1, 1, 1, 0] * 2),
    "qwen2_moe, dense layers by index and by step": _variant(
        "qwen1.5-moe-a2.7b", mlp_only_layers=[0, 3], decoder_sparse_step=2, num_hidden_layers=6),
    "qwen3_moe, a window (transformers puts it on every layer)": _variant(
        "qwen3-30b-a3b", use_sliding_window=True, sliding_window=4096, max_window_layers=2,
        num_hidden_layers=4),
    "deepseek_v2, a query LoRA and two dense layers": _variant(
        "deepseek-v2-lite", q_lora_rank=384, num_hidden_layers=4, first_k_dense_replace=2),
    "gpt_bigcode, multi-head": _variant("starcoder", multi_query=False, n_layer=2),
    "starcoder2, no biases, no window": _variant(
        "starcoder2-3b", use_bias=False, num_hidden_layers=2, sliding_window=None),
    "jamba, biased projections, unbiased convolution": _variant(
        "jamba-v0.1", mamba_conv_bias=False, mamba_proj_bias=True, num_hidden_layers=8, num_experts=4),
    "gpt_oss, no attention biases": _variant(
        "gpt-oss-20b", attention_bias=False, num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2),
    "qwen3_next, a dense layer": _variant(
        "qwen3-next-80b-a3b", mlp_only_layers=[1], num_hidden_layers=8, num_experts=8, num_experts_per_tok=2),
    "phi, grouped K/V": _variant("phi-2", num_key_value_heads=8, num_hidden_layers=2),
    "opt, untied": _variant("opt-125m", tie_word_embeddings=False, num_hidden_layers=2),
    "nemotron_h, a dense pattern, layers without an MLP, biases": _nemotron_h(
        hybrid_override_pattern="M-M*-MM-*M", use_bias=True, mlp_bias=True, use_conv_bias=False),
    "nemotron_h, experts, the legacy Mamba keys (which win), a tie it ignores": _nemotron_h(
        hybrid_override_pattern="MEM*EMEM*E", mamba_n_groups=4, mamba_d_conv=3, tie_word_embeddings=True),
    "nemotron_h, layer_types and num_local_experts (aliases), MoE MLP biases": _nemotron_h(
        drop=("n_routed_experts",), mlp_bias=True, num_local_experts=6,
        layer_types=["full_attention", "moe", "mlp", "full_attention", "linear_attention", "moe"]),
    "mimo_v2_flash, biases, listed layers, the legacy window": _mimo(
        attention_bias=True, layer_types=[FULL, SLIDING, SLIDING, FULL, SLIDING, FULL],
        mlp_layer_types=["dense", "sparse", "dense", "sparse", "sparse", "dense"], sliding_window_size=5),
    "mimo_v2_flash, no window, every layer dense": _mimo(
        layer_types=[FULL] * 6, mlp_layer_types=["dense"] * 6),
    "longcat_flash, small": _longcat(),
    "longcat_flash, its config class's aliases, no zero experts, untied": _longcat(
        drop=("ffn_hidden_size", "n_routed_experts", "moe_topk", "expert_ffn_hidden_size"),
        intermediate_size=80, num_local_experts=4, num_experts_per_tok=3, moe_intermediate_size=24,
        zero_expert_num=0),
    "gemma4, values as keys, 2 layers reusing K/V with a double-wide MLP, per-layer inputs": _gemma4(
        **GEMMA4_SHARED),
    "gemma4, experts, no per-layer inputs, per_layer_config listed (values as keys)": _gemma4(
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24,
        hidden_size_per_layer_input=0, attention_k_eq_v=True, layer_types=[SLIDING, SLIDING, FULL] * 2,
        per_layer_config={"02": {"head_dim": 32, "num_key_value_heads": 1},
                          "05": {"head_dim": 32, "num_key_value_heads": 1}}),
    "gemma4, experts, reusing K/V, double-wide, untied, the last layer made full": _gemma4(
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24,
        num_kv_shared_layers=2, use_double_wide_mlp=True, tie_word_embeddings=False, num_hidden_layers=8),
    "deepseek_v4, small: HCA, CSA, a windowed-only layer, the first layer hash-routed": _v4(),
    "deepseek_v4, no CSA layer, shared-expert biases, tied, 3 streams, 4 output groups, 2 hash layers": _v4(
        layer_types=[HCA, "sliding_attention", HCA, "sliding_attention", HCA], mlp_bias=True,
        tie_word_embeddings=True, hc_mult=3, o_groups=4, mlp_layer_types=["hash_moe"] * 2 + ["moe"] * 3),
    "deepseek_v4, legacy compress_ratios, rates and hash layers, no hash layer": _v4(
        drop=("layer_types", "compress_rates", "mlp_layer_types"), compress_ratios=[4, 4, 128, 0, 4, 0],
        compress_rate_csa=2, compress_rate_hca=8, num_hash_layers=0),
    "qwen3_vl_moe, dense layers by index and by step": _variant(
        "qwen3-vl-moe-transformers-defaults", mlp_only_layers=[0], decoder_sparse_step=2, num_hidden_layers=4,
        num_local_experts=8, tie_word_embeddings=True),
}


# What FalconConfig and JambaConfig (transformers 5) write into every file they save, beside the keys of the
# published files: keys the class carries that this variant reads not at all (Falcon-7B's old architecture
# sizes nothing by num_kv_heads; its one norm is num_ln_in_parallel_attn's null) or that choose how the Mamba
# scan runs. The published files re-saved so read with the same counts.
SAVED_BY_TRANSFORMERS = {
    "falcon-7b": {"num_kv_heads": 71, "num_ln_in_parallel_attn": None, "num_key_value_heads": 1,
                  "ffn_hidden_size": 18176, "max_position_embeddings": 2048, "activation": "gelu"},
    "jamba-v0.1": {"use_mambapy": False, "use_associative_scan": True},
    # DeepseekV32Config: its derived widths and each layer's MLP and attention kind
    "deepseek-v3.2": {"qk_head_dim": 192, "head_dim": 64, "mlp_bias": False,
                      "mlp_layer_types": ["dense"] * 3 + ["sparse"] * 58,
                      "layer_types": ["indexed_attention"] * 61},
}


@pytest.mark.parametrize("name", SAVED_BY_TRANSFORMERS)
def test_keys_a_config_class_carries_and_the_variant_does_not_read_are_accepted(name):
    saved = {**raw(name), **SAVED_BY_TRANSFORMERS[name]}
    assert ledger.checkpoint(from_config(saved))["total"] == MODELS[name].total


@pytest.mark.parametrize(
    ("name", "changes", "key"),
    [
        # the new architecture sizes its fused QKV by num_kv_heads: read, and a bad value named
        ("falcon-7b", {"new_decoder_architecture": True, "num_kv_heads": 0}, "num_kv_heads"),
        ("falcon-7b", {"num_ln_in_parallel_attn": 3}, "num_ln_in_parallel_attn"),
        # keys that would add weights (experts, a Mamba-2 head width): still refused, named
        ("falcon-7b", {"num_kv_heads": 71, "num_experts": 8}, "num_experts"),
        ("jamba-v0.1", {"use_mambapy": False, "mamba_headdim": 64}, "mamba_headdim"),
        # derived keys that disagree with the keys they derive from, a layer without its own indexer
        ("deepseek-v3.2", {"qk_head_dim": 128}, "qk_head_dim"),
        ("deepseek-v3.2", {"mlp_layer_types": ["sparse"] * 61}, "mlp_layer_types"),
        ("glm-moe-dsa-transformers-defaults", {"indexer_types": ["full", "shared"] * 39}, "indexer_types"),
        # NemotronHConfig's alias of n_routed_experts, disagreeing with it
        ("nemotron-h-transformers-defaults", {"num_local_experts": 4}, "num_local_experts"),
        ("mimo-v2-flash-transformers-defaults", {"num_local_experts": 4}, "num_local_experts"),
        # LongcatFlashConfig's alias of ffn_hidden_size, disagreeing; a bias on its router's classifier; a
        # layer count that is not twice num_layers; multi-token-prediction layers it does not build
        ("longcat-flash-transformers-defaults", {"intermediate_size": 4096}, "intermediate_size"),
        ("longcat-flash-transformers-defaults", {"router_bias": True}, "router_bias"),
        ("longcat-flash-transformers-defaults", {"num_hidden_layers": 28}, "num_hidden_layers"),
        ("longcat-flash-transformers-defaults", {"num_nextn_predict_layers": 1}, "num_nextn_predict_layers"),
        ("mimo-v2-flash-transformers-defaults", {"mlp_layer_types": ["dense", "moe"] * 24},
         "mlp_layer_types"),
        # Gemma 4: bidirectional attention on every token, a per-layer override calc does not model, reusing
        # layers with no earlier layer of their kind, biases, a key of Gemma 3n's that would add weights
        ("gemma4-transformers-defaults", {"use_bidirectional_attention": "all"},
         "use_bidirectional_attention"),
        ("gemma4-transformers-defaults", {"use_bidirectional_attention": "text"},
         "use_bidirectional_attention"),
        ("gemma4-transformers-defaults", {"per_layer_config": {"05": {"intermediate_size": 4}}},
         "per_layer_config"),
        ("gemma4-transformers-defaults", {"per_layer_config": {"04": {"head_dim": 512}}}, "per_layer_config"),
        ("gemma4-transformers-defaults", {"num_kv_shared_layers": 25}, "num_kv_shared_layers"),
        ("gemma4-transformers-defaults", {"attention_bias": True}, "attention_bias"),
        ("gemma4-transformers-defaults", {"laurel_rank": 64}, "laurel_rank"),
        # DeepSeek V4: a bias its attention never builds, more than its one K/V head, a layer kind or pool it
        # does not have, a shared-expert count transformers does not read, output groups that split no head
        ("deepseek-v4-transformers-defaults", {"attention_bias": True}, "attention_bias"),
        ("deepseek-v4-transformers-defaults", {"num_key_value_heads": 2}, "num_key_value_heads"),
        ("deepseek-v4-transformers-defaults", {"layer_types": ["full_attention"] * 43}, "layer_types"),
        ("deepseek-v4-transformers-defaults", {"mlp_layer_types": ["dense"] * 43}, "mlp_layer_types"),
        ("deepseek-v4-transformers-defaults", {"compress_rates": {"full_attention": 2}}, "compress_rates"),
        ("deepseek-v4-transformers-defaults", {"compress_rates": {CSA: 0}}, "compress_rates"),
        ("deepseek-v4-transformers-defaults", {"n_shared_experts": 2}, "n_shared_experts"),
        ("deepseek-v4-transformers-defaults", {"o_groups": 3}, "o_groups"),
        ("deepseek-v4-transformers-defaults", {"qk_nope_head_dim": 448}, "qk_nope_head_dim"),
        # the alias Qwen3VLMoeTextConfig saves for num_experts, disagreeing with it
        ("qwen3-vl-moe-transformers-defaults", {"num_experts": 8}, "num_local_experts"),
    ],
)
def test_keys_that_would_change_a_count_are_still_refused(name, changes, key):
    config = raw(name)
    if "text_config" in config:
        config = {**config, "text_config": {**config["text_config"], **changes}}
    else:
        config = {**config, **changes}
    with pytest.raises(ConfigError) as err:
        from_config(config)
    assert err.value.field == key


def test_a_multimodal_models_head_is_tied_as_its_outer_config_says():
    # Qwen3VLMoeTextConfig's default ties (true), the multimodal config does not: transformers' model unties
    outer = raw("qwen3-vl-moe-transformers-defaults")
    assert outer["text_config"]["tie_word_embeddings"] is True and outer["tie_word_embeddings"] is False
    untied, tied = from_config(outer), from_config({**outer, "tie_word_embeddings": True})
    assert (untied.tied_embeddings, tied.tied_embeddings) == (False, True)
    d, vocab = 2048, 151936
    assert ledger.checkpoint(untied)["total"] - ledger.checkpoint(tied)["total"] == vocab * d
    # a text config without the key (Qwen3VLTextConfig has none) takes the outer one too
    assert from_config({**raw("qwen3-vl-transformers-defaults"), "tie_word_embeddings": True}).tied_embeddings


# transformers 5.25.0's Qwen3VLVisionModel on the meta device, at Qwen3VLVisionConfig's defaults (both
# fixtures keep their vision_config)
QWEN3_VL_TOWER = 566_949_104


@pytest.mark.parametrize("name", ["qwen3-vl-transformers-defaults", "qwen3-vl-moe-transformers-defaults"])
def test_a_multimodal_checkpoints_vision_tower_is_counted_apart_from_the_totals(name, capsys):
    config = _load(name)
    assert config.vision_parameters == QWEN3_VL_TOWER
    without = from_config({k: v for k, v in raw(name).items() if k != "vision_config"})
    assert without.vision_parameters == 0
    assert ledger.checkpoint(config) == ledger.checkpoint(without)  # no total takes it in
    assert main([str(CONFIGS / f"{name}.json"), "--format", "json"]) == 0
    params = json.loads(capsys.readouterr().out)["params"]
    assert (params["vision_tower"], params["total"]) == (QWEN3_VL_TOWER, MODELS[name].total)


def test_a_vision_config_key_that_is_not_a_count_is_named():
    config = raw("qwen3-vl-transformers-defaults")
    with pytest.raises(ConfigError) as err:
        from_config({**config, "vision_config": {**config["vision_config"], "depth": 0}})
    assert err.value.field == "vision_config.depth"


def test_qwen3_vl_vision_tower_equals_transformers_at_other_sizes():
    pytest.importorskip("transformers")
    import torch
    import transformers as tf

    from calc.vision import vision_tower

    vision = {**raw("qwen3-vl-transformers-defaults")["vision_config"], "depth": 3, "hidden_size": 64,
              "intermediate_size": 96, "num_heads": 4, "patch_size": 14, "spatial_merge_size": 3,
              "out_hidden_size": 80, "deepstack_visual_indexes": [1], "num_position_embeddings": 100}
    hf_config = tf.AutoConfig.for_model(vision.pop("model_type"), **vision)
    with torch.device("meta"):
        tower = tf.AutoModel.from_config(hf_config)
    counted = vision_tower({"model_type": "qwen3_vl", "vision_config": vision})
    assert counted is not None and counted["total"] == sum(p.numel() for p in tower.parameters())


def test_falcon_old_architecture_with_two_parallel_norms_counts_them():
    one = ledger.checkpoint(from_config(raw("falcon-7b")))["total"]
    two = ledger.checkpoint(from_config({**raw("falcon-7b"), "num_ln_in_parallel_attn": 2}))["total"]
    assert two - one == 32 * 2 * 4544  # a second LayerNorm (weight and bias) in each of the 32 layers


@pytest.mark.parametrize("name", VARIANTS)
def test_feature_combinations_equal_transformers_count(name):
    pytest.importorskip("transformers")
    from calc.verify import active_count, build_model, stored_count

    config = from_config(VARIANTS[name])
    model = build_model(config)
    assert stored_count(model) == ledger.checkpoint(config)["total"]
    if config.is_moe:
        assert active_count(model, config.experts_per_token) == ledger.active(config)
