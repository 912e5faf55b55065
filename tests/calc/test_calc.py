"""calc: symbolic identities, the source material's figures, exact checkpoint counts, cost tables."""

from __future__ import annotations

import itertools
import sys
from collections import Counter

import pytest
from sympy import Rational, Symbol, expand, sqrt, stats

from calc import costs, ledger
from calc import formulas as f
from calc.presets import PRESETS, Config, ConfigError, UnknownModel, custom, llama_d_ff, preset
from calc.report import billions, binary_bytes, build, percent

MiB, GiB = 2**20, 2**30
GPT3 = preset("gpt3")


# --- symbolic identities -------------------------------------------------------------------------------
def test_attention_per_layer_is_4d2_for_multi_head_attention():
    assert expand(f.attention_per_layer.subs(f.GPT_SHAPE) - 4 * f.d**2) == 0


def test_per_head_times_heads_is_per_layer():
    assert expand(f.attention_per_head * f.h - f.attention_per_layer) == 0


def test_gqa_attention_is_smaller_than_mha_by_the_kv_share():
    # K and V shrink by g/h; Q and O do not.
    saved = f.attention_per_layer.subs(f.g, f.h) - f.attention_per_layer
    assert expand(saved - 2 * f.d * f.d_k * (f.h - f.g)) == 0


def test_attention_flops_scale_as_n_squared():
    assert expand(f.attention_flops_per_head.subs(f.n, 2 * f.n) / f.attention_flops_per_head) == 4


def test_causal_flops_count_the_visible_triangle():
    assert expand(f.causal_flops_per_head - 2 * f.d_k * f.n * (f.n + 1)) == 0


def test_palm_attention_term_is_twice_kaplans_when_values_are_as_wide_as_keys():
    palm = (f.forward_flops_per_token_palm - 2 * f.N).subs(f.d_v, f.d_k)
    kaplan = f.forward_flops_per_token_kaplan - 2 * f.N
    assert expand(palm - 2 * kaplan) == 0
    # one kind of layer (every layer attends to all keys): L·n keys per token
    assert expand(f.keys_seen.subs(f.GPT_SHAPE) - f.L * f.n) == 0


def test_evaluate_refuses_missing_symbols():
    with pytest.raises(ValueError, match="free symbols"):
        f.evaluate(f.attention_per_layer, {f.d: 4, f.h: 2})


def test_evaluate_count_refuses_fractions_instead_of_rounding():
    values = {f.d: 1, f.d_k: 1, f.g: 1, f.h: 4}
    assert f.evaluate(f.attention_per_head, values) == Rational(5, 2)
    with pytest.raises(ValueError, match="not a whole number"):
        f.evaluate_count(f.attention_per_head, values)
    assert f.evaluate_count(f.attention_per_layer, values) == 10


# --- the two derivations ----------------------------------------------------------------------------
def test_score_variance_is_d_k_and_one_after_scaling():
    assert f.score_variance() == (f.d_k, 1)


def test_score_variance_general_moments_match_sympy_stats():
    mu, sigma = Symbol("mu", real=True), Symbol("sigma", positive=True)
    q, k = stats.Normal("q", mu, sigma), stats.Normal("k", mu, sigma)
    one_term = expand(stats.variance(q * k))
    var_score, var_scaled = f.score_variance(mu, sigma**2)
    assert expand(var_score - f.d_k * one_term) == 0
    assert expand(var_scaled - one_term) == 0
    assert expand(var_score * (1 / sqrt(f.d_k)) ** 2 - var_scaled) == 0


def _recall_by_brute_force(n_values: int, n_pairs: int) -> Rational:
    # Independent of calc: every draw, every question, every tie-broken guess, equally weighted.
    right = Rational(0)
    for draw in itertools.product(range(n_values), repeat=n_pairs):
        counts = Counter(draw)
        top = max(counts.values())
        guesses = [v for v, c in counts.items() if c == top]
        for asked in range(n_pairs):
            right += Rational(sum(g == draw[asked] for g in guesses), len(guesses) * n_pairs)
    return right / n_values**n_pairs


def test_recall_ceiling_is_29_over_64():
    ceiling = f.recall_ceiling(n_values=8, n_pairs=3)
    assert ceiling == Rational(29, 64)
    assert float(ceiling) == 0.453125


@pytest.mark.parametrize(("n_values", "n_pairs"), [(8, 3), (2, 2), (3, 4), (5, 1), (1, 3), (6, 3)])
def test_recall_ceiling_matches_brute_force(n_values, n_pairs):
    assert f.recall_ceiling(n_values, n_pairs) == _recall_by_brute_force(n_values, n_pairs)


def test_recall_cases_probabilities_sum_to_one():
    cases = f.recall_cases()
    assert sum(p for p, _ in cases.values()) == 1
    assert cases[(1, 1, 1)] == (Rational(8 * 7 * 6, 512), Rational(1, 3))


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "8"])
def test_recall_ceiling_refuses_bad_sizes(bad):
    with pytest.raises(ValueError, match="n_values"):
        f.recall_ceiling(n_values=bad)


def test_recall_ceiling_refuses_huge_enumerations():
    with pytest.raises(ValueError, match="too many"):
        f.recall_ceiling(n_values=100, n_pairs=4)


# --- the figures of the article "How an LLM Works, Part 6: Attention" -----------------------------
def test_gpt3_source_ledger():
    led = ledger.source_ledger(GPT3)
    assert led["attention_per_head"] == 6_291_456
    assert led["attention_per_layer"] == 603_979_776 == 4 * 12_288**2
    assert led["attention"] == 57_982_058_496
    assert led["total"] == 175_181_291_520
    assert led["embedding"] == led["unembedding"] == 50257 * 12288
    assert percent(led["attention_share"]) == "33.1 %"
    assert led["attention_share"] == Rational(57_982_058_496, 175_181_291_520)


def test_d4096_h32_gives_d_k_128_and_67_1_million():
    config = custom(d_model=4096, n_heads=32, n_layers=1)
    assert config.d_head == 128
    per_layer = ledger.source_ledger(config)["attention_per_layer"]
    assert per_layer == 4 * 4096**2 == 67_108_864
    assert round(per_layer / 1e6, 1) == 67.1


def test_pattern_memory_per_head_fp32_is_16_64_256_mib():
    rows = costs.pattern_memory(GPT3, [2048, 4096, 8192])
    assert [r["bytes_per_head"]["fp32"] for r in rows] == [16 * MiB, 64 * MiB, 256 * MiB]
    assert [binary_bytes(r["bytes_per_head"]["fp32"]) for r in rows] == ["16 MiB", "64 MiB", "256 MiB"]


def test_gpt3_patterns_at_2048_are_38_7_billion_entries_and_72_gib_at_2_bytes():
    (row,) = costs.pattern_memory(GPT3, [2048])
    assert row["entries_per_head"] == 4_194_304
    assert row["entries_per_model"] == 4_194_304 * 96 * 96 == 38_654_705_664
    assert billions(row["entries_per_model"]) == "38.7 billion"
    assert row["bytes_per_model"]["fp16"] == 72 * GiB
    assert binary_bytes(row["bytes_per_model"]["fp16"]) == "72 GiB"


def test_tiled_working_set_grows_linearly_not_quadratically():
    small, big = costs.pattern_memory(GPT3, [4096, 8192])
    assert big["tiled_bytes_per_head"] - small["tiled_bytes_per_head"] == 4 * 2 * 4096
    assert small["tiled_bytes_per_head"] == 4 * (128 * 128 + 2 * 4096)


# --- checkpoint counts ----------------------------------------------------------------------------
RELEASED = [name for name, c in PRESETS.items() if c.published is not None]
NEW = ["mixtral-8x7b", "qwen2-7b", "qwen3-8b", "gemma2-9b", "gemma3-1b", "llama3.2-1b", "mistral-nemo-12b",
       "phi3-mini", "pythia-1.4b", "deepseek-v3"]


def test_every_released_preset_has_a_published_count():
    assert sorted(RELEASED) == sorted(
        ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama2-7b", "llama2-13b", "llama2-70b",
         "llama3-8b", "llama3-70b", "mistral-7b", *NEW]
    )


@pytest.mark.parametrize("name", RELEASED)
def test_checkpoint_count_equals_the_released_checkpoint(name):
    config = PRESETS[name]
    assert ledger.checkpoint(config)["total"] == config.published


def test_well_known_checkpoint_counts():
    assert ledger.checkpoint(preset("gpt2"))["total"] == 124_439_808
    assert ledger.checkpoint(preset("llama2-7b"))["total"] == 6_738_415_616


def test_gpt2_breakdown_by_component():
    parts = ledger.checkpoint(preset("gpt2"))
    assert parts["token_embedding"] == 50257 * 768
    assert parts["position_embedding"] == 1024 * 768
    assert parts["attention_bias"] == 12 * (3 * 768 + 768)
    assert parts["norms"] == 12 * 2 * 2 * 768 + 2 * 768
    assert "unembedding" not in parts  # tied
    assert sum(v for k, v in parts.items() if k != "total") == parts["total"]


def test_untying_adds_exactly_the_unembedding():
    tied = custom(d_model=64, n_heads=4, n_layers=2, vocab_size=100)
    untied = custom(d_model=64, n_heads=4, n_layers=2, vocab_size=100, tied_embeddings=False)
    assert ledger.checkpoint(untied)["total"] - ledger.checkpoint(tied)["total"] == 100 * 64


@pytest.mark.parametrize("name", [n for n in PRESETS if n.startswith("gpt3") and n != "gpt3-xl"])
def test_gpt3_counts_are_within_2_percent_of_the_paper(name):
    config = PRESETS[name]
    assert abs(ledger.checkpoint(config)["total"] / config.paper_size - 1) < 0.02


def test_gpt3_xl_as_printed_is_not_1_3b_but_with_d_k_d_over_h_it_is():
    xl = preset("gpt3-xl")
    assert xl.attention_width == 3072 != xl.d_model
    assert any("3072 ≠ d_model = 2048" in note for note in xl.notes)
    assert ledger.checkpoint(xl)["total"] / 1.3e9 > 1.15
    coupled = custom(d_model=2048, n_heads=16, n_layers=24, n_ctx=2048)  # h·d_k = d
    assert abs(ledger.checkpoint(coupled)["total"] / 1.3e9 - 1) < 0.02


def test_non_embedding_excludes_token_and_position_tables():
    parts = ledger.checkpoint(GPT3)
    expected = parts["total"] - 50257 * 12288 - 2048 * 12288
    assert ledger.non_embedding(GPT3) == expected
    llama = preset("llama2-7b")  # untied: the unembedding stays in N
    assert ledger.non_embedding(llama) == ledger.checkpoint(llama)["total"] - 32000 * 4096


# --- presets and configs ---------------------------------------------------------------------------
def test_preset_names_are_the_contract():
    assert list(PRESETS) == [
        "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-small", "gpt3-medium", "gpt3-large",
        "gpt3-xl", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3", "llama2-7b", "llama2-13b", "llama2-70b",
        "llama3-8b", "llama3-70b", "mistral-7b", *NEW,
    ]
    assert all(c.source for c in PRESETS.values())


def test_gpt3_175b_alias_and_case():
    assert preset("gpt3-175b") is preset("GPT3") is GPT3


def test_unknown_model_suggests_the_nearest():
    with pytest.raises(UnknownModel) as err:
        preset("gtp3")
    assert err.value.suggestion == "gpt3"
    assert "did you mean 'gpt3'?" in str(err.value)


def test_llama_d_ff_rule():
    assert [llama_d_ff(d) for d in (4096, 5120)] == [11008, 13824]


def _fields(**overrides):
    base = dict(arch="gpt", n_layers=2, d_model=64, n_heads=4, d_head=16, n_kv_heads=4, d_ff=256,
                vocab_size=100, n_ctx=32, tied_embeddings=True)
    return {**base, **overrides}


@pytest.mark.parametrize(
    ("field", "value"),
    [("n_layers", 0), ("d_model", -4), ("n_heads", 2.5), ("d_head", True), ("vocab_size", None),
     ("n_ctx", "32"), ("arch", "bert"), ("n_kv_heads", 3), ("n_kv_heads", 8), ("tied_embeddings", 1)],
)
def test_config_refuses_bad_fields(field, value):
    with pytest.raises(ConfigError) as err:
        Config(**_fields(**{field: value}))
    assert err.value.field == field


def test_custom_defaults_and_indivisible_width():
    gpt = custom(d_model=64, n_heads=4, n_layers=2)
    assert (gpt.d_head, gpt.n_kv_heads, gpt.d_ff) == (16, 4, 256)
    assert (gpt.vocab_size, gpt.tied_embeddings) == (50257, True)
    llama = custom(d_model=4096, n_heads=32, n_layers=2, arch="llama")
    assert (llama.d_ff, llama.vocab_size, llama.tied_embeddings) == (11008, 32000, False)
    with pytest.raises(ConfigError, match="not divisible") as err:
        custom(d_model=100, n_heads=3, n_layers=1)
    assert err.value.field == "n_heads"
    assert custom(d_model=100, n_heads=3, n_layers=1, d_head=32).attention_width == 96


# --- cost tables ---------------------------------------------------------------------------------
def test_flop_ratio_is_exactly_4_per_doubling():
    rows = costs.flops(GPT3, [1024, 2048, 4096, 8192])
    assert rows[0]["ratio"] is None
    assert [r["ratio"] for r in rows[1:]] == [4, 4, 4]
    assert rows[0]["attention_flops_per_head"] == 4 * 1024**2 * 128
    assert rows[0]["attention_flops_per_model"] == 96 * 96 * rows[0]["attention_flops_per_head"]
    assert rows[0]["causal_flops_per_model"] * 2 * 1024 == rows[0]["attention_flops_per_model"] * 1025


def test_kv_cache_is_gqa_aware():
    gqa = costs.kv_cache(preset("llama2-70b"), [4096], "bf16")
    assert gqa["bytes_per_token"] == 2 * 80 * 8 * 128 * 2 == 327_680
    assert gqa["bytes_per_context"] == 327_680 * 4096
    mha = costs.kv_cache(custom(d_model=8192, n_heads=64, n_layers=80, arch="llama"), [4096], "bf16")
    assert mha["bytes_per_token"] == 8 * gqa["bytes_per_token"]
    assert costs.kv_cache(GPT3, [1], "fp32")["bytes_per_token"] == 2 * 96 * 96 * 128 * 4


def test_roofline_takes_the_slower_of_compute_and_memory():
    (row,) = costs.roofline(GPT3, [2048], "bf16", peak_tflops=1000.0, bandwidth_gbs=1000.0)["rows"]
    assert row["compute_s"] == row["flops"] / 1e15
    assert row["naive_s"] == max(row["compute_s"], row["naive_bytes"] / 1e12)
    assert row["naive_bound"] == "memory"
    assert row["tiled_bytes"] == 96 * 96 * 4 * 2048 * 128 * 2
    (slow,) = costs.roofline(GPT3, [2048], "bf16", peak_tflops=1.0, bandwidth_gbs=1e6)["rows"]
    assert slow["naive_bound"] == slow["tiled_bound"] == "compute"


def test_default_seqs_double_from_1024_to_4_n_ctx():
    assert costs.default_seqs(2048) == [1024, 2048, 4096, 8192]
    assert costs.default_seqs(128) == [512]


def test_report_is_consistent_with_the_ledgers():
    report = build(GPT3, seqs=[2048])
    assert report["params"]["total"] == ledger.checkpoint(GPT3)["total"]
    assert report["ledger"]["total"] == 175_181_291_520
    assert report["config"]["d_head"] == 128


def test_bench_times_a_fresh_interpreter():
    from calc.bench import time_run

    wall, cpu = time_run([sys.executable, "-c", "pass"])
    assert wall > 0 and cpu > 0
    assert wall < 60


def test_custom_neox_has_a_dense_mlp_and_no_learned_positions():
    neox = custom(d_model=64, n_heads=4, n_layers=2, arch="neox", vocab_size=100)
    assert (neox.d_ff, neox.tied_embeddings) == (256, False)
    gpt = custom(d_model=64, n_heads=4, n_layers=2, vocab_size=100, n_ctx=32, tied_embeddings=False)
    # GPT-NeoX = GPT-2's layout less the learned positions (rotary has no parameters).
    assert ledger.checkpoint(gpt)["total"] - ledger.checkpoint(neox)["total"] == 32 * 64
