"""calc.from_config: published config.json files give their presets' figures; window-capped and MLA
caches against hand-derived values; bad configs name the key (library) or exit 2 in one line (CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from calc import costs, ledger
from calc.cli import main
from calc.config import ConfigError
from calc.hf import OUTER, SUPPORTED, from_config, load
from calc.presets import PRESETS, preset
from calc.report import binary_bytes, build, render

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "calc" / "configs"
FIXTURES = sorted(CONFIGS.glob("*.json"))
PRESET_FIXTURES = [p for p in FIXTURES if p.stem in PRESETS]  # the others: tests/calc/test_calc_models.py
MiB, GiB = 2**20, 2**30


def raw(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))


# --- config.json of each supported type = its preset's figures ------------------------------------------
def figures(config, seqs=(1024, 4096, 8192)) -> dict:
    report = build(config, seqs=list(seqs))
    params = {k: v for k, v in report["params"].items() if k not in ("published", "paper_size")}
    kv = report["kv_cache"]
    return {"params": params, "ledger": report["ledger"], "pattern_memory": report["pattern_memory"],
            "flops": report["flops"], "per_token": report["forward_flops_per_token"],
            "kv": (kv["bytes_per_token"], kv["rows"])}


@pytest.mark.parametrize("path", PRESET_FIXTURES, ids=[p.stem for p in PRESET_FIXTURES])
def test_published_config_gives_the_preset_figures(path):
    config, named = load(str(path)), preset(path.stem)
    assert config.name == path.stem
    assert figures(config) == figures(named)
    assert named.source and named.published == ledger.checkpoint(config)["total"]


def test_every_supported_model_type_has_a_fixture():
    types = {json.loads(p.read_text(encoding="utf-8"))["model_type"] for p in FIXTURES}
    # a multimodal fixture (llama4) covers its text type; a text fixture (gemma3_text) its outer one
    inner = {OUTER[t] for t in types if t in OUTER}
    covered = types | inner | {outer for outer, text in OUTER.items() if text in types}
    assert covered == set(SUPPORTED)


def test_gemma3_multimodal_config_reads_its_text_config():
    wrapped = {"model_type": "gemma3", "text_config": raw("gemma3-1b"),
               "vision_config": {"hidden_size": 1152}}
    assert ledger.checkpoint(from_config(wrapped))["total"] == 999_885_952


# --- MoE: total and active -------------------------------------------------------------------------------
def test_mixtral_is_46_7_b_total_and_12_9_b_active():
    mixtral = preset("mixtral-8x7b")
    total, active = ledger.checkpoint(mixtral)["total"], ledger.active(mixtral)
    expert = 3 * 4096 * 14336  # gate, up, down
    # Hand count: attention 4096·(4096 + 2·1024 + 4096) per layer, 8 experts + a router of 8·4096 per layer,
    # 2 RMSNorms per layer + a final one, two untied embedding tables of 32,000 × 4,096.
    per_layer = 4096 * (4096 + 2 * 1024 + 4096) + 8 * expert + 8 * 4096 + 2 * 4096
    assert total == 32 * per_layer + 4096 + 2 * 32000 * 4096 == 46_702_792_704
    assert active == total - 32 * 6 * expert == 12_879_925_248  # 2 of 8 experts run per token
    assert (round(total / 1e9, 1), round(active / 1e9, 1)) == (46.7, 12.9)


def test_deepseek_v3_is_671_b_with_37_b_active_and_the_mtp_module_apart():
    ds = preset("deepseek-v3")
    total, active = ledger.checkpoint(ds)["total"], ledger.active(ds)
    assert round(total / 1e9) == 671 and round(active / 1e9) in (37, 38)
    expert = 3 * 7168 * 2048
    assert total - active == 58 * (256 - 8) * expert
    # The MTP module (paper §2.2; layer 61 of the checkpoint): one MoE layer (MLA, 256 routed + 1 shared
    # expert, router and its bias, 2 norms), enorm and hnorm, the 2d → d projection, a final norm, and
    # its own embedding and output head. The model card's "685 B = 671 B + 14 B" rounds 684.5 B.
    mla = (7168 * 1536 + 1536 + 1536 * 128 * 192  # queries: down, norm, up to 128 heads of 128 + 64
           + 7168 * (512 + 64) + 512 + 512 * 128 * (128 + 128)  # latent + rotary key, norm, up to K and V
           + 128 * 128 * 7168)  # output
    moe_layer = mla + 257 * expert + 256 * 7168 + 256 + 2 * 7168
    mtp = moe_layer + 2 * 7168 + 2 * 7168**2 + 7168 + 2 * 129280 * 7168
    assert ledger.mtp_module(ds) == mtp == 13_463_426_304
    assert "multi-token" in render(build(ds, seqs=[4096]))


def test_dense_model_is_all_active():
    assert ledger.active(preset("llama3-8b")) == ledger.checkpoint(preset("llama3-8b"))["total"]


# --- KV caches against hand-derived values ------------------------------------------------------------
def test_mistral_7b_window_caps_the_cache_at_512_mib():
    # Every one of 32 layers keeps at most w = 4,096 tokens; each token holds K and V of g = 8 heads of
    # d_k = 128 at 2 bytes: 2·8·128·2 = 4,096 bytes a layer, so 32·4,096·4,096 = 512 MiB at any n ≥ 4,096.
    kv = costs.kv_cache(preset("mistral-7b"), [2048, 4096, 8192, 32768], "bf16")
    assert kv["bytes_per_value"] == 2
    assert kv["bytes_per_token"] == 32 * 4096 == 131_072
    assert [r["bytes"] for r in kv["rows"]] == [256 * MiB, 512 * MiB, 512 * MiB, 512 * MiB]
    assert binary_bytes(kv["rows"][2]["bytes"]) == "512 MiB"
    out = render(build(preset("mistral-7b"), seqs=[8192]))
    assert "KV cache, bf16 (2 bytes a value)" in out and "536,870,912  512 MiB" in out


def test_gemma2_local_layers_hold_their_window_global_layers_everything():
    # 42 layers alternate local (w = 4,096) and global: 21 each. A token costs 2·g·d_k·b = 2·8·256·2 =
    # 8,192 bytes a layer. At n = 8,192: 21·8,192 + 21·4,096 = 258,048 token-layers.
    config = preset("gemma2-9b")
    assert (config.n_window_layers, config.sliding_window) == (21, 4096)
    (row,) = costs.kv_cache(config, [8192], "bf16")["rows"]
    assert row["bytes"] == 8192 * (21 * 8192 + 21 * 4096) == 2_113_929_216
    # Below the window nothing is capped: 42 layers · n tokens.
    assert costs.kv_cache(config, [1024], "bf16")["rows"][0]["bytes"] == 8192 * 42 * 1024


def test_gemma3_five_local_layers_to_one_global():
    # 26 layers, global where (i + 1) % 6 == 0: i = 5, 11, 17, 23, so 4 global and 22 local (w = 512).
    # 2·g·d_k·b = 2·1·256·2 = 1,024 bytes a layer-token; at n = 32,768: 4·32,768 + 22·512 token-layers.
    config = preset("gemma3-1b")
    assert (config.n_window_layers, config.n_layers - config.n_window_layers) == (22, 4)
    (row,) = costs.kv_cache(config, [32768], "bf16")["rows"]
    assert row["bytes"] == 1024 * (4 * 32768 + 22 * 512) == 145_752_064


def test_phi3_config_window_of_2047():
    # sliding_window 2,047 on all 32 layers; 2·32·96·2 = 12,288 bytes a layer-token.
    (row,) = costs.kv_cache(preset("phi3-mini"), [4096], "bf16")["rows"]
    assert row["bytes"] == 32 * 2047 * 12288


def test_deepseek_v3_mla_caches_one_latent_per_layer():
    # MLA keeps c_KV (kv_lora_rank 512) and the shared rotary key k_R (qk_rope_head_dim 64) per layer and
    # token: 61·(512 + 64)·2 bytes = 70,272 bytes a token, whatever the 128 heads; GQA-style K and V of
    # 128 heads of 192 and 128 would be 61·128·(192 + 128)·2 = 4,997,120, 71× more.
    kv = costs.kv_cache(preset("deepseek-v3"), [4096, 163840], "bf16")
    assert kv["bytes_per_token"] == 61 * 576 * 2 == 70_272
    assert [r["bytes"] for r in kv["rows"]] == [70_272 * 4096, 70_272 * 163840]
    assert kv["bytes_per_context"] == 70_272 * 163840


# --- patterns and FLOPs honour windows ---------------------------------------------------------------
def test_window_caps_pattern_entries_and_flops_grow_linearly_past_it():
    config = preset("mistral-7b")
    rows = costs.pattern_memory(config, [4096, 8192])
    assert rows[1]["entries_per_head"] == 8192 * 4096  # each query sees at most 4,096 keys
    assert rows[1]["entries_per_model"] == 32 * 32 * 8192 * 4096
    flops = costs.flops(config, [2048, 4096, 8192, 16384])
    assert [r["ratio"] for r in flops[1:]] == [4, 2, 2]  # n² up to the window, then n·w


@pytest.mark.parametrize(("n", "w"), [(8192, 4096), (4096, 4096), (100, 7), (5, 9)])
def test_causal_windowed_flops_count_visible_keys_by_brute_force(n, w):
    config = preset("mistral-7b")
    import dataclasses

    config = dataclasses.replace(config, sliding_window=w)
    visible = sum(min(i + 1, w) for i in range(n))  # query i sees keys max(0, i − w + 1) … i
    (row,) = costs.flops(config, [n])
    assert row["causal_flops_per_model"] == 32 * 32 * (2 * 128 + 2 * 128) * visible


def test_gemma2_pattern_sums_global_and_local_layers():
    (row,) = costs.pattern_memory(preset("gemma2-9b"), [8192])
    assert row["entries_per_head"] == 8192**2  # the largest head is a global one
    assert row["entries_per_model"] == 16 * (21 * 8192**2 + 21 * 8192 * 4096)


# --- bad configs --------------------------------------------------------------------------------------
def _llama(**changes):
    base = raw("llama2-7b")
    for key, value in changes.items():
        if value is ...:
            del base[key]
        else:
            base[key] = value
    return base


@pytest.mark.parametrize(
    ("config", "key", "text"),
    [
        ({"model_type": "bert"}, "model_type", "supported: gpt2, gpt_bigcode"),
        ({"hidden_size": 8}, "model_type", "missing"),
        (_llama(hidden_size=...), "hidden_size", "missing"),
        (_llama(hidden_size="4096"), "hidden_size", "positive integer"),
        (_llama(num_key_value_heads=3), "num_key_value_heads", "cannot share 3"),
        (_llama(num_attention_heads=0), "num_attention_heads", "positive integer"),
        (_llama(tie_word_embeddings="yes"), "tie_word_embeddings", "true or false"),
        (_llama(attention_bias=True), "attention_bias", "not supported"),
        ({**raw("gemma2-9b"), "layer_types": ["full_attention"]}, "layer_types", "must list 42"),
        ({**raw("deepseek-v3"), "moe_layer_freq": 2}, "moe_layer_freq", "only 1"),
        ({**raw("deepseek-v3"), "qk_rope_head_dim": None}, "qk_rope_head_dim", "positive integer"),
        ({**raw("mixtral-8x7b"), "num_experts_per_tok": 9}, "num_experts_per_tok", "between 1 and"),
        ({**raw("gpt2"), "n_head": 7}, "n_head", "not divisible"),
        ({"model_type": "gemma3"}, "text_config", "missing"),
        ([1, 2], "config", "JSON object"),
    ],
)
def test_bad_config_raises_value_error_naming_the_key(config, key, text):
    with pytest.raises(ValueError) as err:
        from_config(config)
    assert isinstance(err.value, ConfigError) and err.value.field == key
    assert text in str(err.value)


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"model_type": "t5"}', "model_type: 't5' is not supported; the closest supported type is"),
        (json.dumps(_llama(intermediate_size=...)), "intermediate_size: missing"),
        (json.dumps(_llama(num_key_value_heads=5)), "num_key_value_heads: 32 query heads cannot share 5"),
        ("{not json", "config: not JSON"),
        ("[]", "config: must be a JSON object"),
    ],
)
def test_bad_config_file_exits_2_in_one_line(capsys, tmp_path, content, expected):
    path = tmp_path / "config.json"
    path.write_text(content, encoding="utf-8")
    code, out, err = _cli(capsys, str(path))
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith(f"python -m calc: error: {path}: ")
    assert expected in err


def test_missing_config_file_exits_2(capsys, tmp_path):
    code, _, err = _cli(capsys, str(tmp_path / "nope.json"))
    assert code == 2 and "cannot read" in err and err.count("\n") == 1


def test_config_file_renders_in_every_format(capsys):
    path = str(CONFIGS / "gemma2-9b.json")
    for fmt in ("table", "github", "latex", "csv", "json"):
        code, out, err = _cli(capsys, path, "--seq", "8192", "--format", fmt)
        assert (code, err) == (0, ""), fmt
        assert ("2113929216" if fmt in ("csv", "json") else "2,113,929,216") in out, fmt
    _, out, _ = _cli(capsys, path, "--format", "json", "--seq", "8192")
    report = json.loads(out)
    assert report["params"]["total"] == report["params"]["active"] == 9_241_705_984
    assert report["kv_cache"]["dtype"] == "bf16" and report["kv_cache"]["bytes_per_token"] == 344_064
    assert report["kv_cache"]["rows"] == [{"n_tokens": 8192, "bytes": 2_113_929_216}]


def test_subprocess_reads_a_config_and_refuses_a_bad_one(tmp_path):
    argv = [sys.executable, "-m", "calc", str(CONFIGS / "mixtral-8x7b.json"), "--format", "json"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["params"]["active"] == 12_879_925_248
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "mixtral", "hidden_size": 4096}', encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "calc", str(bad)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"python -m calc: error: {bad}: num_attention_heads: missing\n"


def test_every_new_preset_has_a_published_config_fixture():
    new = [name for name, c in PRESETS.items() if c.hf_config is not None]
    assert sorted(new) == sorted(p.stem for p in PRESET_FIXTURES if preset(p.stem).hf_config is not None)
    assert len(new) == 10


# --- one place for each check and each message ----------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "key", "message"),
    [
        (_llama(hidden_size=4100), "num_attention_heads",
         "hidden_size 4100 is not divisible by 32 heads and no head_dim is given"),
        ({**raw("pythia-1.4b"), "hidden_size": 2050}, "num_attention_heads",
         "hidden_size 2050 is not divisible by 16 heads"),
        ({**raw("gpt2"), "n_embd": 770}, "n_head", "n_embd 770 is not divisible by 12 heads"),
    ],
)
def test_head_width_must_divide_with_the_same_words_in_every_layout(config, key, message):
    with pytest.raises(ConfigError) as err:
        from_config(config)
    assert (err.value.field, err.value.message) == (key, message)


def test_one_function_checks_head_widths_and_one_words_the_context_warning():
    import calc.compare
    from calc.report import past_context

    sources = {path.name: path.read_text(encoding="utf-8") for path in (ROOT / "calc").glob("*.py")}
    assert [name for name, text in sources.items() if "exceeds the trained context" in text] == ["report.py"]
    assert sources["hf.py"].count("is not divisible by") == 1
    gpt2 = preset("gpt2")
    assert past_context(gpt2, [512, 4096]) == [
        "n = 4,096 exceeds the trained context n_ctx = 1,024 of gpt2: figures there extrapolate past what "
        "the model was trained on"]
    assert calc.compare.figures(gpt2, n=4096)["warnings"] == past_context(gpt2, [4096])
    assert build(gpt2, seqs=[512, 4096])["warnings"] == past_context(gpt2, [512, 4096])
    assert past_context(gpt2, [1024]) == []
