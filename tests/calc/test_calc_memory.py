"""Training memory (ZeRO's model states, Korthikanti et al.'s activations and their n² term) against the
papers' own worked figures, serving memory against hand-derived figures, and both through the CLI."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from sympy import Rational, Symbol, ceiling, expand

from calc import formulas as f
from calc.cli import main
from calc.presets import preset
from calc.serving import GPUS, parse_size, serving, serving_time, step_bytes
from calc.training import activation_rows, model_states, training


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- ZeRO (Rajbhandari et al. 2020), Figure 1: P = 7.5 B, N_d = 64, mixed-precision Adam (K = 12) ---------
@pytest.mark.parametrize(("stage", "gigabytes"), [(0, "120.0"), (1, "31.4"), (2, "16.6"), (3, "1.9")])
def test_zero_figure_1_per_device_memory(stage, gigabytes):
    states = model_states(7_500_000_000, zero=stage, dp=64)
    assert f"{states['total'] / 1e9:.1f}" == gigabytes  # the figure prints GB = 10^9 bytes, one decimal


def test_zero_stages_by_hand():
    p, n = 7_500_000_000, 64  # 7.5 B splits evenly over 64: 117,187,500 parameters a device
    assert [model_states(p, zero=k, dp=n)["total"] for k in range(4)] == [
        16 * p, 2 * p + 2 * p + 12 * p // n, 2 * p + 14 * p // n, 16 * p // n]
    assert model_states(p, precision="bf16")["total"] == 8 * p
    assert model_states(p, precision="fp32")["total"] == 16 * p
    # tensor parallelism splits every matrix first; ZeRO pads its parts to equal size
    states = {"weights": 4, "gradients": 4, "optimizer": 24, "total": 32}
    assert model_states(10, zero=3, dp=3, tp=2) == states


def test_zero_stages_are_the_papers_formulas_in_sympy():
    # §5: (2 + 2 + K)Ψ, 2Ψ + 2Ψ + KΨ/N_d, 2Ψ + (2 + K)Ψ/N_d, (2 + 2 + K)Ψ/N_d, K = 12, where N_d divides Ψ
    q = Symbol("q", positive=True, integer=True)
    psi, k = f.N_d * q, 12
    papers = [(2 + 2 + k) * psi, 2 * psi + 2 * psi + k * psi / f.N_d, 2 * psi + (2 + k) * psi / f.N_d,
              (2 + 2 + k) * psi / f.N_d]
    for stage, paper in enumerate(papers):
        total = f.zero_model_states_total[stage]
        assert expand(total - sum(f.zero_model_states[stage])) == 0  # the total is its three parts
        assert expand(total.subs(f.MIXED_PRECISION).subs(f.P, psi) - paper) == 0, stage
    # where N_d does not divide P, every device holds the padded ⌈P/N_d⌉
    assert f.zero_model_states[3][0].subs({f.P: 10, f.N_d: 3, f.b_w: 2}) == 2 * ceiling(Rational(10, 3)) == 8


def test_model_states_are_exact_integers_from_the_formulas():
    states = model_states(7_500_000_000, zero=1, dp=64)
    assert all(type(v) is int for v in states.values())
    assert states["optimizer"] == 12 * 7_500_000_000 // 64


def test_formulas_show_zero_per_stage(capsys):
    assert main(["formulas", "--width", "0"]) == 0
    out = capsys.readouterr().out
    assert "ZeRO stage 1, model states per device (Rajbhandari et al. §5) = P·(b_g + b_w) + " \
           "b_o·ceiling(P/N_d)" in out
    assert "mixed-precision Adam (b_w = b_g = 2, b_o = K = 12), stage 2 = 2·P + 14·ceiling(P/N_d)" in out
    assert "tensor parallelism = b_m·d·n·(10 + 24/t + 5·h·n/(d·t))" in out


@pytest.mark.parametrize(("kwargs", "text"),
                         [({"zero": 4}, "zero"), ({"dp": 0}, "dp"), ({"precision": "fp8"}, "precision")])
def test_model_states_refuse_bad_options(kwargs, text):
    with pytest.raises(ValueError, match=text):
        model_states(1000, **kwargs)


# --- Korthikanti et al. 2022: GPT-3 at s = 2,048 ----------------------------------------------------------
def test_gpt3_attention_term_is_80_of_114_as_the_paper_works_it():
    # §4.1: for GPT-3 (a = 96, s = 2,048, h = 12,288) 5as/h = 80, against the 34 of everything else: the
    # attention scores are 80/114 ≈ 70 % of a layer's activations, what selective recomputation removes.
    (row,) = activation_rows(preset("gpt3"), [2048])
    assert 5 * 96 * 2048 / 12288 == 80
    assert row["quadratic_share"] == Rational(80, 114)
    assert row["activations_per_layer"] == 2048 * 12288 * (34 + 80)  # 2.87 GB a layer at micro-batch 1
    assert row["selective"] == 96 * 34 * 2048 * 12288
    assert row["quadratic_per_layer"] == 5 * 96 * 2048**2
    assert row["full_recompute"] == 96 * 2 * 2048 * 12288


# Table 2 in the paper's letters: s tokens, b micro-batch, h width, a heads, t tensor-parallel devices.
def _sbh(s, b, h):
    return Fraction(s * b * h)


TABLE_2 = {  # (sequence parallel, selective recomputation) → bytes per layer and device
    (False, False): lambda s, b, h, a, t: _sbh(s, b, h) * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t)),
    (True, False): lambda s, b, h, a, t: _sbh(s, b, h) / t * (34 + Fraction(5 * a * s, h)),
    (False, True): lambda s, b, h, a, t: _sbh(s, b, h) * (10 + Fraction(24, t)),
    (True, True): lambda s, b, h, a, t: 34 * _sbh(s, b, h) / t,
}
GPT3 = {"s": 2048, "b": 1, "h": 12288, "a": 96}


@pytest.mark.parametrize("t", [1, 2, 8, 64])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp-sp"])
def test_every_table_2_row_equals_its_formula(sp, t):
    (row,) = activation_rows(preset("gpt3"), [2048], tp=t, sequence_parallel=sp)
    assert row["activations_per_layer"] == TABLE_2[sp, False](**GPT3, t=t)
    assert row["selective"] == 96 * TABLE_2[sp, True](**GPT3, t=t)
    assert row["full_recompute"] == 96 * 2 * 2048 * 12288  # full recomputation: 2sbh, whatever t
    assert row["quadratic_share"] == Rational(5 * 96 * 2048**2) / t / row["activations_per_layer"]


@pytest.mark.parametrize(
    ("sp", "t", "per_layer", "selective"),
    [
        (False, 1, 2048 * 12288 * (34 + 80), 2048 * 12288 * 34),  # no parallelism: sbh(34 + 5as/h)
        (True, 1, 2048 * 12288 * (34 + 80), 2048 * 12288 * 34),
        # 5as/(ht) = 80/8 = 10, 24/t = 3: sbh(10 + 3 + 10) stored, sbh(10 + 3) with selective recomputation
        (False, 8, 2048 * 12288 * 23, 2048 * 12288 * 13),
        (True, 8, 2048 * 12288 * 114 // 8, 34 * 2048 * 12288 // 8),  # everything over 8
    ],
)
def test_table_2_rows_for_gpt3_by_hand(sp, t, per_layer, selective):
    (row,) = activation_rows(preset("gpt3"), [2048], tp=t, sequence_parallel=sp)
    assert (row["activations_per_layer"], row["selective"]) == (per_layer, 96 * selective)
    assert row["flash"] == 96 * (selective + 4 * 96 * 2048 // t)  # a 4-byte logsumexp per row and head


def test_without_sequence_parallelism_the_ten_sbh_stay_whole():
    (tp,), (sp,) = (activation_rows(preset("gpt3"), [2048], tp=8, sequence_parallel=on)
                    for on in (False, True))
    assert tp["activations_per_layer"] - sp["activations_per_layer"] == 2048 * 12288 * (10 - Fraction(10, 8))
    assert tp["quadratic_per_layer"] == sp["quadratic_per_layer"] == 5 * 96 * 2048**2 // 8
    assert tp["quadratic_share"] == Rational(10, 23)


def test_tensor_and_sequence_parallelism_split_every_term():
    (one,), (eight,) = activation_rows(preset("gpt3"), [2048]), activation_rows(preset("gpt3"), [2048], tp=8)
    assert eight["activations_per_layer"] * 8 == one["activations_per_layer"]
    assert eight["quadratic_share"] == one["quadratic_share"]
    (batch4,) = activation_rows(preset("gpt3"), [2048], micro_batch=4)
    assert batch4["activations"] == 4 * one["activations"]


def test_flash_attention_keeps_the_linear_part_and_a_logsumexp_per_row():
    (row,) = activation_rows(preset("llama3-8b"), [8192])
    assert row["flash"] == 32 * (34 * 8192 * 4096 + 4 * 32 * 8192)
    assert row["flash"] < row["activations"] and row["flash"] > row["selective"]


def test_n_squared_share_grows_with_n_and_is_the_closed_form():
    rows = activation_rows(preset("llama2-7b"), [1024, 4096, 32768])
    shares = [r["quadratic_share"] for r in rows]
    assert shares == [Rational(5 * 32 * n, 34 * 4096 + 5 * 32 * n) for n in (1024, 4096, 32768)]
    assert shares == sorted(shares) and shares[-1] > Rational(97, 100)


def test_korthikanti_formula_is_the_sum_of_its_parts():
    assert (f.activations_per_layer - f.activations_linear - f.activations_quadratic).expand() == 0


def test_training_totals_add_the_model_states():
    t = training(preset("gpt2"), [1024], zero=2, dp=8, precision="mixed")
    (row,) = t["rows"]
    assert t["model_states"] == model_states(124_439_808, zero=2, dp=8)
    assert row["total_flash"] == t["model_states"]["total"] + row["flash"]


# --- serving -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "value"), [("80GiB", 80 * 2**30), ("141 GB", 141 * 10**9),
                                             ("81920MiB", 80 * 2**30), ("1.5TB", 15 * 10**11),
                                             ("512kib", 512 * 1024)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["80", "eighty GB", "80 GiBs", "0GB", "-1GB", ""])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_llama2_7b_on_an_h100_by_hand():
    s = serving(preset("llama2-7b"), memory=GPUS["h100"][1], device="h100", n=4096)
    weights = 6_738_415_616 * 2
    per_token = 2 * 32 * 32 * 128 * 2  # K and V, 32 layers, 32 heads of 128, bf16
    one = s["rows"][0]
    assert (one["weights"], one["kv_bytes_per_token"]) == (weights, per_token)
    assert one["batch"] == (80 * 10**9 - weights) // (4096 * per_token)
    assert one["context"] == (80 * 10**9 - weights) // per_token
    exact = serving(preset("llama2-7b"), memory=weights + 1000 * per_token, device="x")["rows"][0]
    assert exact["context"] == 1000  # a context that fills the memory to the byte fits
    eight = s["rows"][3]
    assert (eight["tp"], eight["weights"], eight["kv_bytes_per_token"]) == (8, weights // 8, per_token // 8)


def test_tensor_parallel_kv_heads_replicate_past_g_and_fp8_halves_the_cache():
    s = serving(preset("llama3-8b"), memory=80 * 2**30, device="x", kv_dtype="fp8", n=8192)
    # g = 8: t = 1, 2, 4, 8 hold 8, 4, 2, 1 heads; a byte a value
    assert [r["kv_bytes_per_token"] for r in s["rows"]] == [2 * 32 * k * 128 for k in (8, 4, 2, 1)]
    gemma = serving(preset("gemma3-1b"), memory=80 * 2**30, device="x")
    # one K/V head: every t keeps it whole; 4 query heads do not split over 8
    assert [r.get("kv_bytes_per_token") for r in gemma["rows"]][:3] == [2 * 26 * 256 * 2] * 3
    assert gemma["rows"][3]["fits"] is False and "do not split" in gemma["rows"][3]["reason"]


def test_windows_make_the_context_unbounded_and_weights_can_exceed_the_device():
    mistral = serving(preset("mistral-7b"), memory=GPUS["h100"][1], device="h100")
    assert mistral["rows"][0]["context"] is None  # every layer holds at most 4,096 tokens
    big = serving(preset("deepseek-v3"), memory=GPUS["h100"][1], device="h100")
    assert not any(r["fits"] for r in big["rows"])


# --- the CLI -----------------------------------------------------------------------------------------------
def test_train_table_and_json(capsys):
    code, out, err = run(capsys, "gpt3", "--seq", "2048", "--train")
    assert (code, err) == (0, "")
    assert "Training memory per device" in out and "70.2 %" in out
    code, out, _ = run(capsys, "gpt3", "--seq", "2048", "--train", "--zero", "3", "--dp", "64", "--tp", "8",
                       "--format", "json")
    report = json.loads(out)
    t = report["training"]
    assert (t["zero"], t["dp"], t["tp"], t["micro_batch"], t["precision"]) == (3, 64, 8, 1, "mixed")
    assert t["rows"][0]["activations_per_layer"] == 2048 * 12288 * 114 // 8
    assert t["model_states"] == model_states(174_604_259_328, zero=3, dp=64, tp=8)


def test_train_without_sequence_parallelism(capsys):
    code, out, err = run(capsys, "gpt3", "--seq", "2048", "--train", "--tp", "8", "--no-sequence-parallel",
                         "--format", "json")
    assert (code, err) == (0, "")
    t = json.loads(out)["training"]
    assert (t["tp"], t["sequence_parallel"]) == (8, False)
    assert t["rows"][0]["activations_per_layer"] == 2048 * 12288 * 23
    _, out, _ = run(capsys, "gpt3", "--seq", "2048", "--train", "--tp", "8", "--format", "json")
    assert json.loads(out)["training"]["sequence_parallel"] is True
    _, out, _ = run(capsys, "gpt3", "--seq", "2048", "--train", "--tp", "8", "--no-sequence-parallel",
                    "--width", "0")
    assert "n·b·d·(10 + 24/t + 5·h·n/(d·t)) bytes per layer with tensor parallelism over t and no sequence " \
           "parallelism" in out and "43.5 %" in out  # 10/23


def test_serving_table_and_json(capsys):
    code, out, err = run(capsys, "llama2-7b", "--seq", "4096", "--gpu", "h100")
    assert (code, err) == (0, "")
    assert "Serving on NVIDIA H100" in out and "batch at n = 4,096" in out
    _, out, _ = run(capsys, "llama2-7b", "--seq", "4096", "--gpu-memory", "80GB", "--format", "json")
    expected = serving(preset("llama2-7b"), memory=80 * 10**9, device="one device", n=4096)
    got = json.loads(out)["serving"]
    assert {k: v for k, v in got.items() if k != "time"} == json.loads(json.dumps(expected))
    # without --gpu, the time table is an H100's (the flags' defaults)
    timed = serving_time(preset("llama2-7b"), [4096], peak_tflops=989.0, bandwidth_gbs=3350.0)
    assert got["time"] == json.loads(json.dumps(timed))


# --- serving time: prefill and decode rooflines -------------------------------------------------------------
def test_llama2_7b_decode_step_by_hand():
    (row,) = serving_time(preset("llama2-7b"), [4096], peak_tflops=989.0, bandwidth_gbs=3350.0)["rows"]
    total, embedding = 6_738_415_616, 32000 * 4096
    kv = 2 * 32 * 32 * 128 * 2 * 4096  # K and V, 32 layers, 32 heads of 128, bf16, 4,096 tokens
    assert row["decode_flops"] == 2 * (total - embedding) + 2 * 32 * (128 + 128) * 32 * 4096
    # every weight but the embedding table, and the one row the token looks up, in bf16
    assert row["decode_weight_bytes"] == 2 * (total - embedding + 4096) and row["decode_kv_bytes"] == kv
    assert row["decode_bound"] == "memory"
    assert row["decode_s"] == (2 * (total - embedding + 4096) + kv) / 3.35e12
    assert row["tokens_per_s"] == 1 / row["decode_s"]
    assert row["prefill_bound"] == "compute"  # 4,096 tokens a step: 4,096 times the FLOPs per weight read


def test_a_mixture_reads_the_experts_its_tokens_touch():
    from calc.ledger import active

    mixtral = preset("mixtral-8x7b")
    embedding = 32000 * 4096
    # one token touches its 2 of 8 experts: the active parameters
    assert step_bytes(mixtral, 1, 2) == 2 * (active(mixtral) - embedding + 4096)
    # a prefill of many tokens touches nearly all of them: every parameter but the embedding table
    whole = 2 * (46_702_792_704 - embedding + 10**5 * 4096)
    assert whole - 2 <= step_bytes(mixtral, 10**5, 2) <= whole
    assert step_bytes(mixtral, 1, 2) < step_bytes(mixtral, 4, 2) < step_bytes(mixtral, 64, 2)


def test_a_window_caps_what_a_decode_step_reads():
    rows = serving_time(preset("mistral-7b"), [4096, 32768], peak_tflops=989.0, bandwidth_gbs=3350.0)["rows"]
    assert rows[0]["decode_kv_bytes"] == rows[1]["decode_kv_bytes"] == 32 * 4096 * 2 * 8 * 128 * 2


def test_batch_and_gpu_set_the_serving_time(capsys):
    code, out, _ = run(capsys, "llama3-8b", "--seq", "8192", "--gpu", "h200", "--batch", "8",
                       "--format", "json")
    report = json.loads(out)
    t = report["serving"]["time"]
    assert code == 0 and (t["peak_tflops"], t["bandwidth_gbs"], t["batch"]) == (989.0, 4800.0, 8)
    assert report["time"]["bandwidth_gbs"] == 4800.0  # the attention roofline too
    one = serving_time(preset("llama3-8b"), [8192], peak_tflops=989.0, bandwidth_gbs=4800.0)["rows"][0]
    assert t["rows"][0]["decode_weight_bytes"] == one["decode_weight_bytes"] + 7 * 4096 * 2  # 7 more rows
    assert t["rows"][0]["decode_kv_bytes"] == 8 * one["decode_kv_bytes"]
    _, out, _ = run(capsys, "llama3-8b", "--gpu", "h200", "--bandwidth-gbs", "1000", "--format", "json")
    assert json.loads(out)["serving"]["time"]["bandwidth_gbs"] == 1000.0  # a flag wins over the datasheet
    code, out, err = run(capsys, "llama3-8b", "--batch", "8")
    assert (code, out) == (2, "") and err.count("\n") == 1 and "--batch needs --gpu-memory or --gpu" in err
    code, out, _ = run(capsys, "compare", "llama3-8b", "mixtral-8x7b", "--gpu", "h100", "--seq", "4096")
    assert code == 0 and "serving: decode step at n" in out and "(memory)" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["gpt3", "--zero", "2"], "--zero needs --train"),
        (["gpt3", "--train", "--zero", "2"], "--zero 2 partitions over data-parallel devices"),
        (["gpt3", "--train", "--zero", "5"], "--zero: invalid choice"),
        (["gpt3", "--gpu-memory", "80"], "--gpu-memory: must be a size with a unit"),
        (["gpt3", "--gpu", "h900"], "--gpu: invalid choice"),
        (["gpt3", "--gpu", "h100", "--gpu-memory", "80GB"], "not allowed with argument"),
        (["gpt3", "--weight-dtype", "fp8"], "--weight-dtype needs --gpu-memory or --gpu"),
        (["gpt3", "--train", "--micro-batch", "0"], "--micro-batch: must be a positive integer"),
        (["gpt3", "--no-sequence-parallel"], "--no-sequence-parallel needs --train"),
        (["gpt3", "--width", "10"], "--width: must be 0 (no wrapping) or at least 40 columns"),
    ],
)
def test_bad_memory_flags_exit_2_in_one_line(capsys, argv, expected):
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "") and err.count("\n") == 1 and expected in err


# --- n past the trained context ----------------------------------------------------------------------------
def test_seq_past_n_ctx_warns_on_stderr_and_in_the_json(capsys):
    code, out, err = run(capsys, "gpt3", "--seq", "2048", "8192", "16384", "--format", "json")
    assert code == 0
    assert err == ("python -m calc: warning: n = 8,192, 16,384 exceeds the trained context n_ctx = 2,048 of "
                   "gpt3: figures there extrapolate past what the model was trained on\n")
    assert json.loads(out)["warnings"] == [err.removeprefix("python -m calc: warning: ").rstrip("\n")]
    code, out, err = run(capsys, "gpt3", "--seq", "2048", "--format", "json")
    assert (code, err, json.loads(out)["warnings"]) == (0, "", [])
    _, _, err = run(capsys, "gpt3")  # the default lengths (to 4·n_ctx) are no request: no warning
    assert err == ""


def test_compare_warns_for_each_model_past_its_context(capsys):
    code, _, err = run(capsys, "compare", "gpt2", "llama2-7b", "--seq", "2048")
    assert code == 0 and err.count("\n") == 1 and "of gpt2" in err


# --- activations derived per layer kind in the training table (calc.activations) ----------------------------
def test_training_rows_carry_the_derived_activations_and_their_totals():
    from calc import activations

    t = training(preset("llama3-8b"), [8192], micro_batch=2)
    (row,) = t["rows"]
    assert t["derived"] == {"dtype": "bf16", "reason": None}
    for attention in ("eager", "flash"):
        expected = activations.model_bytes(preset("llama3-8b"), 8192, attention=attention, micro_batch=2,
                                           dtype="bf16")
        assert row[f"derived_{attention}"] == expected
        assert row[f"total_derived_{attention}"] == t["model_states"]["total"] + expected
    assert row["derived_flash"] < row["derived_eager"]  # the n×n softmax is the difference's bulk
    fp32 = training(preset("llama3-8b"), [8192], precision="fp32")
    assert fp32["derived"]["dtype"] == "fp32" and fp32["rows"][0]["derived_flash"] > row["derived_flash"] / 2


@pytest.mark.parametrize(("name", "options", "reason"), [
    ("llama3-8b", {"tp": 8}, "derived for one device"),
    ("deepseek-v3", {}, "model_type deepseek_v3's layers are not among those checked"),
])
def test_training_says_why_it_derives_nothing(capsys, name, options, reason):
    t = training(preset(name), [4096], **options)
    assert t["derived"]["reason"].startswith(reason)
    assert t["rows"][0]["derived_eager"] is None and t["rows"][0]["total_derived_flash"] is None
    argv = [name, "--seq", "4096", "--train", "--width", "0", *(("--tp", "8") if options else ())]
    code, out, err = run(capsys, *argv)
    assert (code, err) == (0, "") and f"derived: not given, {reason}" in out and "—" in out


def test_compare_shows_derived_activations_or_says_not_derived(capsys):
    code, out, _ = run(capsys, "compare", "llama3-8b", "deepseek-v3", "--seq", "4096", "--width", "0")
    line = next(row for row in out.splitlines() if "derived per layer kind, Flash" in row)
    assert code == 0 and line.split()[-2:] == ["not", "derived"] and "GiB" in line
