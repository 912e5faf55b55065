"""Activation memory per layer kind (calc.activations): layers derived by hand term by term, the blocks no
measured type has refused with a reason, and, where torch and transformers are installed, every layer kind
equal to the bytes PyTorch saves (calc.measure)."""

from __future__ import annotations

import pytest

from calc import activations
from calc.hf import from_config
from calc.measure import SPECS
from calc.presets import preset


def small(name: str):
    return from_config(SPECS[name], name=name)


# The small Llama: T = 2·40 = 80 tokens, d = 96, h = 6 heads of d_k = 16, g = 2, d_ff = 160, fp32 (b = 4).
def test_llama_layer_by_hand_eager_and_flash():
    t, d, h, g, dk, dff, n, b = 80, 96, 6, 2, 16, 160, 40, 4
    norm = (4 + b) * t * d + 4 * t  # input in fp32, 1/rms, normalized values
    eager = b * t * h * dk * 4 + 2 * h * n * n * 4  # Q, K and V at h heads, output; softmax in fp32
    flash = b * t * (h + 2 * g + h) * dk + 4 * 2 * h * n  # Q, K, V at g heads, output; logsumexp
    mlp = b * t * dff * 4  # gate and up outputs, silu's output, the product
    for attention, mixer in (("eager", eager), ("flash", flash)):
        parts = activations.per_layer(small("llama"), n, attention=attention, micro_batch=2, dtype="fp32")
        expected = {"eager": 292_160, "flash": 176_320}[attention]  # PyTorch's bytes (calc.measure)
        assert parts["attention"] == norm + b * t * d + mixer == expected
        assert parts["dense"] == norm + b * t * d + mlp == 297_280


def test_bf16_keeps_the_fp32_upcasts_and_their_casts():
    t, d, h, dk, n = 80, 96, 6, 16, 40
    parts = activations.per_layer(small("llama"), n, attention="eager", micro_batch=2, dtype="bf16")
    norm = 4 * t * d + 4 * t + 2 * t * d  # the fp32 copy of the input and the bf16 normalized values
    softmax = 2 * h * n * n * (4 + 2)  # fp32 softmax and its bf16 cast, both kept
    assert parts["attention"] == norm + 2 * t * d + 2 * t * h * dk * 4 + softmax


def test_mixture_of_experts_by_hand():
    # Mixtral's router: probabilities (fp32, E = 4), top-2 indices (int64), the weights renormalized and their
    # sum; each of the 160 routed tokens: two int64 indices, its input, gate-up (2·160), silu, product, the
    # expert's output and that output weighted, and its fp32 weight
    t, d, de, e, k = 80, 96, 160, 4, 2
    router = t * (4 * e + 8 * k) + t * (4 * k + 4)
    experts = t * k * (4 * (3 * d + 4 * de) + 16 + 4)
    norm = 8 * t * d + 4 * t
    parts = activations.per_layer(small("mixtral"), 40, micro_batch=2, dtype="fp32")
    assert parts["moe"] == norm + 4 * t * d + router + experts == 693_120


def test_a_capacity_factor_scales_the_experts_only():
    from sympy import Rational

    config = small("mixtral")
    dropless = activations.per_layer(config, 40, micro_batch=2, dtype="fp32")
    padded = activations.per_layer(config, 40, micro_batch=2, dtype="fp32", capacity_factor="1.25")
    experts = 80 * 2 * (4 * (3 * 96 + 4 * 160) + 16 + 4)  # the routed tokens' bytes at c_f = 1
    assert padded["moe"] - dropless["moe"] == Rational(1, 4) * experts
    assert padded["attention"] == dropless["attention"]
    for bad in (0.5, "many", True):
        with pytest.raises(ValueError, match="capacity_factor"):
            activations.per_layer(config, 40, capacity_factor=bad)


def test_mamba_by_hand_in_bf16():
    # Jamba's small Mamba layer: d_in = 192, d_st = 8, r_dt = 12, K = 4; 40 steps of state
    bs, n, t, d, din, st, r, conv = 2, 40, 80, 96, 192, 8, 12, 4
    b = 2
    mamba = (2 * b * t * din + 8 * din * st + b * bs * din * (n + conv - 1) + b * t * din
             + (4 + b) * t * (r + 2 * st) + 12 * t + b * t * r + 2 * b * t * din + 2 * 4 * t * din * st
             + 4 * t * st + (4 + b) * t * din + bs * din * st * (2 * b + (n - 1) * (4 + b)) + b * t * st
             + 4 * din + 4 * t * din + 2 * b * t * din)
    parts = activations.per_layer(small("jamba"), n, micro_batch=bs, dtype="bf16")
    assert parts["mamba"] == (4 + b) * t * d + 4 * t + b * t * d + mamba


def test_the_head_keeps_the_loss_over_the_vocabulary():
    t, d, v, n = 80, 96, 256, 40
    head = activations.per_layer(small("llama"), n, micro_batch=2, dtype="fp32")["head"]
    # token ids, cos and sin, the final norm, the head's input, the fp32 log-softmax, the targets, the loss
    assert head == 8 * t + 2 * 4 * n * 16 + 8 * t * d + 4 * t + 4 * t * d + 4 * t * v + 8 * t + 4


def test_a_real_model_all_layers():
    config = preset("llama3-8b")
    parts = activations.per_layer(config, 8192, attention="flash", dtype="bf16")
    assert activations.model_bytes(config, 8192, attention="flash", dtype="bf16") == (
        32 * (parts["attention"] + parts["dense"]) + parts["head"])
    # the loss's fp32 log-softmax alone: 8,192 · 128,256 · 4 bytes
    assert parts["head"] > 8192 * 128256 * 4


@pytest.mark.parametrize(("config", "reason"), [
    (preset("deepseek-v3"), "model_type deepseek_v3's layers are not among those checked"),
    (preset("gemma2-9b"), "model_type gemma2"),
    (from_config({**SPECS["llama"], "hidden_act": "relu"}), "activation 'relu' is not one calc has checked"),
])
def test_what_is_not_checked_against_pytorch_gets_no_figure(config, reason):
    assert reason in activations.coverage(config)
    with pytest.raises(ValueError, match="no activation figure"):
        activations.per_layer(config, 1024)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"dtype": "fp64"}, "dtype"), ({"micro_batch": 0}, "micro_batch"), ({"attention": "paged"}, "attention"),
    ({"n": 0}, "n")])
def test_bad_options_name_the_argument(kwargs, name):
    options = {"n": 64, **kwargs}
    with pytest.raises(ValueError, match=name):
        activations.per_layer(small("llama"), options.pop("n"), **options)


def test_every_layer_kind_equals_the_bytes_pytorch_saves():
    pytest.importorskip("transformers")
    from calc.measure import check

    rows = check(shapes=((23, 3),))
    assert {row.model_type for row in rows} == set(SPECS) and len(SPECS) >= 6
    assert [row for row in rows if not row.exact] == []
