"""``python -m calc compare``: the side-by-side table, its formats, --plot, and calc.verify's
one-line refusal without transformers."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

import pytest

from calc import costs, ledger
from calc.cli import main
from calc.presets import PRESETS, preset
from calc.training import training

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_table_shows_total_active_share_cache_and_flops(capsys):
    code, out, err = run(capsys, "compare", "mistral-7b", "mixtral-8x7b", "deepseek-v3", "--width", "0")
    assert (code, err) == (0, "")
    header = out.splitlines()[0].split()
    assert header == ["mistral-7b", "mixtral-8x7b", "deepseek-v3"]
    for figure in ("46,702,792,704", "12,879,925,248", "671,026,419,200", "512 MiB (536,870,912 B)",
                   "128 KiB (131,072 B)", "68.6 KiB (70,272 B)", "attention share", "FLOPs per token",
                   "bf16 (2 bytes a value)", "MiB = 2^20 bytes"):
        assert figure in out, figure


def test_compare_json_and_csv_are_exact(capsys):
    code, out, _ = run(capsys, "compare", "gpt3", str(ROOT / "tests/calc/configs/gemma2-9b.json"),
                       "--seq", "8192", "--format", "json")
    assert code == 0
    gpt3, gemma = json.loads(out)
    assert (gpt3["model"], gemma["model"]) == ("gpt3", "gemma2-9b")
    assert gpt3["kv_bytes_at_n"] == 2 * 96 * 96 * 128 * 2 * 8192
    assert gemma["kv_bytes_at_n"] == 2_113_929_216
    # FLOPs per token at n: 2N + the attention a new token does (PaLM), the same as the single report's.
    (row,) = costs.forward_flops_per_token(preset("gpt3"), [8192])
    assert gpt3["forward_flops_per_token"] == row["palm"]
    code, out, _ = run(capsys, "compare", "mixtral-8x7b", "llama3-8b", "--format", "csv")
    table = {r[0]: r[1:] for r in csv.reader(io.StringIO(out))}
    assert table["params_active"] == [str(ledger.active(preset("mixtral-8x7b"))), "8030261248"]
    assert table["n_tokens"] == ["32768", "8192"]  # each model's own context length


@pytest.mark.parametrize("fmt", ["github", "latex"])
def test_compare_markup(capsys, fmt):
    code, out, _ = run(capsys, "compare", "gpt2", "pythia-1.4b", "--format", fmt)
    assert code == 0 and "1,414,647,808" in out
    assert ("| parameters" in out) if fmt == "github" else ("\\begin{tabular}" in out)


def test_compare_plot_writes_a_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "kv.png"
    code, out, err = run(capsys, "compare", "mistral-7b", "gemma2-9b", "--plot", str(path))
    assert (code, err) == (0, "")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert f"plot: {path}" in out


def test_compare_plot_without_matplotlib_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    code, out, err = run(capsys, "compare", "gpt2", "--plot", str(tmp_path / "kv.png"))
    assert (code, out) == (2, "")
    assert err == "python -m calc: error: --plot needs matplotlib: pip install 'attention-spec[plot]'\n"
    assert not (tmp_path / "kv.png").exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["compare"], "the following arguments are required: MODEL"),
        (["compare", "gpt3", "gtp2"], "did you mean 'gpt2'?"),
        (["compare", "gpt3", "--seq", "0"], "argument --seq: must be a positive integer"),
        (["compare", "gpt3", "--plot", "/no/such/folder/kv.png"],
         "--plot: folder /no/such/folder does not exist"),
        (["compare", "gpt3", "missing.json"], "missing.json: config: cannot read"),
    ],
)
def test_compare_bad_input_exits_2_in_one_line(capsys, argv, expected):
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and expected in err, err


def test_compare_carries_training_and_serving(capsys):
    code, out, _ = run(capsys, "compare", "llama2-7b", "deepseek-v3", "--seq", "4096", "--gpu", "h100",
                       "--format", "json")
    assert code == 0
    llama, deepseek = json.loads(out)
    (row,) = training(preset("llama2-7b"), [4096])["rows"]
    assert llama["train_states"] == 16 * 6_738_415_616 and llama["train_activations"] == row["activations"]
    assert llama["train_quadratic_share"] == float(row["quadratic_share"])
    assert llama["train_flash"] == row["flash"]
    assert llama["serve_batch"] == (80 * 10**9 - 2 * 6_738_415_616) // (4096 * 2 * 32 * 32 * 128 * 2)
    assert deepseek["serve_batch"] is None  # 1.3 TB of bf16 weights do not fit 80 GB
    _, table, _ = run(capsys, "compare", "llama2-7b", "deepseek-v3", "--seq", "4096", "--gpu", "h100")
    assert "serving: batch at n, one device" in table and "does not fit" in table
    assert "training: n² share of activations" in table


class _Tensor:
    def __init__(self, *shape: int) -> None:
        self.shape = shape

    def numel(self) -> int:
        return math.prod(self.shape)


class _Model:
    """What calc.verify reads of a transformers model: named parameters, buffers, a state dict."""

    def __init__(self, params: dict[str, _Tensor]) -> None:
        self.params = params

    def named_parameters(self):
        return iter(self.params.items())

    def parameters(self):
        return iter(self.params.values())

    def named_buffers(self):
        return iter(())

    def state_dict(self):
        return dict(self.params)


def test_verify_reads_the_active_count_from_fused_and_listed_experts():
    from calc.verify import active_count

    # a fused layout: 4 experts in 3-D tensors (weights and biases), a shared expert and a router outside
    fused = _Model({"embed": _Tensor(10, 3), "layers.0.mlp.experts.gate_up_proj": _Tensor(4, 3, 6),
                    "layers.0.mlp.experts.down_proj_bias": _Tensor(4, 3),
                    "layers.0.mlp.shared_expert.up_proj.weight": _Tensor(5, 3),
                    "layers.0.mlp.gate": _Tensor(4, 3)})
    total = 30 + 72 + 12 + 15 + 12
    assert active_count(fused, experts_per_token=1) == total - (72 + 12) * 3 // 4
    # one module per expert: E is the number of expert indices
    listed = _Model({f"layers.1.moe.experts.{i}.w1": _Tensor(2, 3) for i in range(8)} | {"norm": _Tensor(3)})
    assert active_count(listed, experts_per_token=2) == 8 * 6 + 3 - 6 * 6


def test_verify_names_presets_files_and_folders():
    from calc.verify import expand

    fixtures = sorted(str(p) for p in (ROOT / "tests" / "calc" / "configs").glob("*.json"))
    assert expand([]) == expand(["--presets"]) == list(PRESETS)
    assert expand(["gpt2", str(ROOT / "tests" / "calc" / "configs")]) == ["gpt2", *fixtures]
    assert len(fixtures) == 48


def test_verify_without_transformers_says_what_to_install(capsys, monkeypatch):
    from calc import verify

    monkeypatch.setitem(sys.modules, "transformers", None)
    assert verify.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "pip install torch==2.13.0 'transformers>=4.45'" in err and "transformers" in err


def test_verify_refuses_an_unknown_preset_or_a_bad_config(capsys, tmp_path):
    from calc import verify

    assert verify.main(["gtp3"]) == 2
    assert "unknown preset 'gtp3'" in capsys.readouterr().err
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "bert"}', encoding="utf-8")
    assert verify.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}: model_type: 'bert' is not supported" in err


def test_formulas_print_the_new_components(capsys):
    code, out, _ = run(capsys, "formulas")
    assert code == 0
    for row in ("MoE routed experts", "3·E·d·d_e·(L - L_d)", "MoE inactive per token", "MLA keys, values",
                "d·(d_r + r_kv) + h·r_kv·(d_k - d_r + d_v)", "QKV bias (Qwen2", "q/k norms", "2·L_a·d_k",
                "fused QKV", "parallel block, partial rotary, NoPE: no parameters", "n·Min(n, w)",
                "KV cache bytes at n (windows, chunks)", "MLA cache bytes per token",
                "b·(L_a·(d_r + r_kv) + L_s·d_I)",
                "attention sinks (gpt-oss) = L_a·h", "C^2·m_C + r_C^2", "Gated DeltaNet layer", "Mamba layer",
                "MoE shared-expert gate", "MoE expert biases (gpt-oss) = E·(L - L_d)·(d + 2·d_e)",
                "q/k norms, per head (OLMo 2, Cohere, StableLM) = L_a·d_k·(g + h)", "position table",
                "training activations per layer, no parallelism (Korthikanti) = b_m·d·n·(34 + 5·h·n/d)",
                "FlashAttention, tensor and sequence parallelism = 34·b_m·d·n/t + 4·b_m·h·n/t",
                "MLA queries, no LoRA"):
        assert row in out, row


def test_package_exports_from_config_and_load():
    import doctest

    import calc

    result = doctest.testmod(calc)
    assert result.attempted >= 4 and result.failed == 0
