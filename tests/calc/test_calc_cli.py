"""``python -m calc``: output, formats, the JSON contract, and one line + exit 2 on every bad input."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from calc.cli import main
from calc.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_gpt3_table_shows_the_source_figures(capsys):
    code, out, err = run(capsys, "gpt3")
    assert (code, err) == (0, "")
    for figure in ("6,291,456", "603,979,776", "57,982,058,496", "175,181,291,520", "33.1 %",
                   "16 MiB", "64 MiB", "256 MiB", "38,654,705,664", "38.7 billion", "72 GiB", "×4.00",
                   "MiB = 2^20 bytes", "GiB = 2^30 bytes"):
        assert figure in out, figure


def test_gpt3_175b_is_gpt3(capsys):
    _, gpt3, _ = run(capsys, "gpt3", "--format", "json")
    _, alias, _ = run(capsys, "gpt3-175b", "--format", "json")
    assert json.loads(alias)["ledger"] == json.loads(gpt3)["ledger"]


def test_gpt3_xl_says_h_d_k_differs_from_d(capsys):
    _, out, _ = run(capsys, "gpt3-xl")
    assert "3072 ≠ d_model = 2048" in out


def test_json_carries_the_contract_keys(capsys):
    code, out, _ = run(capsys, "gpt3", "--format", "json", "--seq", "2048", "4096")
    assert code == 0
    report = json.loads(out)
    assert set(report["config"]) >= {"arch", "n_layers", "d_model", "n_heads", "d_head", "n_kv_heads",
                                     "d_ff", "vocab_size", "n_ctx", "tied_embeddings"}
    assert set(report["ledger"]) >= {"attention_per_head", "attention_per_layer", "attention", "mlp",
                                     "embedding", "unembedding", "total", "attention_share"}
    assert report["ledger"]["total"] == 175_181_291_520
    assert round(report["ledger"]["attention_share"], 3) == 0.331
    assert report["params"]["total"] == 174_604_259_328
    memory = report["pattern_memory"]
    assert [m["n_tokens"] for m in memory] == [2048, 4096]
    for row in memory:
        assert set(row) >= {"n_tokens", "entries_per_head", "entries_per_model", "bytes_per_head",
                            "bytes_per_model"}
        assert set(row["bytes_per_head"]) >= {"fp32", "fp16"}
        assert set(row["bytes_per_model"]) >= {"fp32", "fp16"}
    assert memory[0]["bytes_per_head"]["fp32"] == 16 * 2**20
    assert memory[0]["bytes_per_model"]["fp16"] == 72 * 2**30
    flops = report["flops"]
    assert [set(r) >= {"n_tokens", "attention_flops_per_head", "ratio"} for r in flops] == [True, True]
    assert [r["ratio"] for r in flops] == [None, 4]


@pytest.mark.parametrize("fmt", ["github", "latex"])
def test_markup_formats(capsys, fmt):
    code, out, _ = run(capsys, "gpt2", "--format", fmt)
    assert code == 0 and "124,439,808" in out
    assert ("| total" in out) if fmt == "github" else ("\\begin{tabular}" in out)


def test_csv_blocks_parse_with_exact_numbers(capsys):
    code, out, _ = run(capsys, "gpt3", "--format", "csv", "--seq", "2048")
    assert code == 0
    blocks = [b for b in out.split("\n\n") if b]
    assert all(b.startswith("# ") for b in blocks)
    ledger_rows = dict(list(csv.reader(io.StringIO(blocks[0].split("\n", 1)[1])))[1:])
    assert ledger_rows["total"] == "175181291520"
    memory = list(csv.DictReader(io.StringIO(blocks[2].split("\n", 1)[1])))
    assert memory[0]["entries_per_model"] == "38654705664"


def test_seq_and_dtype_and_peak(capsys):
    code, out, _ = run(capsys, "llama2-7b", "--seq", "100", "--dtype", "fp32", "--peak-tflops", "1",
                       "--format", "json")
    report = json.loads(out)
    assert code == 0
    assert [r["n_tokens"] for r in report["pattern_memory"]] == [100]
    assert report["kv_cache"]["bytes_per_token"] == 2 * 32 * 32 * 128 * 4
    assert report["time"]["peak_tflops"] == 1.0


def test_list_shows_every_preset_with_its_source(capsys):
    code, out, _ = run(capsys, "--list", "--width", "0")
    assert code == 0
    for name, config in PRESETS.items():
        assert f"\n{name} " in out
        assert config.source.split(",")[0] in out
    code, out, _ = run(capsys, "--list", "--format", "json")
    assert [row["name"] for row in json.loads(out)] == list(PRESETS)


@pytest.mark.parametrize(
    "argv",
    [["formulas"], ["gpt3"], ["--list"], ["deepseek-v3", "--train", "--gpu", "h100"],
     ["tests/calc/configs/qwen3-next-80b-a3b.json", "--train"],
     ["compare", "gpt3", "llama3-8b", "mixtral-8x7b"]],
)
@pytest.mark.parametrize("width", [None, 100, 60])
def test_table_output_fits_the_width(capsys, monkeypatch, argv, width):
    # from the checkout's root: the config's path is printed whole (a path broken across lines cannot be
    # copied), so its length would otherwise be the length of wherever the checkout lies
    monkeypatch.chdir(ROOT)
    code, out, _ = run(capsys, *argv, *([] if width is None else ["--width", str(width)]))
    assert code == 0
    widest = max(map(len, out.splitlines()))
    assert widest <= (width or 100), [line for line in out.splitlines() if len(line) > (width or 100)][:1]


def test_width_0_keeps_one_line_each(capsys):
    _, wrapped, _ = run(capsys, "formulas")
    _, whole, _ = run(capsys, "formulas", "--width", "0")
    assert max(map(len, whole.splitlines())) > 100 >= max(map(len, wrapped.splitlines()))
    assert "".join(whole.split()) == "".join(wrapped.split())  # the same text, only the line breaks differ
    _, split, _ = run(capsys, "gpt3", "--width", "60")
    assert "(continued)" in split
    _, one, _ = run(capsys, "gpt3", "--width", "0")
    assert "(continued)" not in one and max(map(len, one.splitlines())) > 200


def test_formulas_prints_4d2_and_both_derivations(capsys):
    code, out, _ = run(capsys, "formulas")
    assert code == 0
    assert "2·d·d_k·g + 2·d·d_k·h" in out and "4·d^2" in out
    assert "Var(q·k) = d_k,  Var(q·k / √d_k) = 1" in out
    assert "P(right) = 29/64 = 45.3125 %" in out


def test_custom_with_defaults(capsys):
    code, out, _ = run(capsys, "custom", "--d-model", "4096", "--n-heads", "32", "--n-layers", "1",
                       "--format", "json")
    assert code == 0
    report = json.loads(out)
    assert report["config"]["d_head"] == 128
    assert report["ledger"]["attention_per_layer"] == 67_108_864
    code, out, _ = run(capsys, "custom", "--d-model", "4096", "--n-heads", "32", "--n-kv-heads", "8",
                       "--n-layers", "2", "--arch", "llama", "--tied", "--format", "json")
    assert code == 0
    config = json.loads(out)["config"]
    assert (config["arch"], config["n_kv_heads"], config["d_ff"]) == ("llama", 8, 11008)
    assert config["tied_embeddings"] is True


@pytest.mark.parametrize("fmt", ["table", "github", "latex", "csv", "json"])
def test_custom_renders_in_every_format(capsys, fmt):
    # A GQA config whose per-head share is fractional: 2·d·d_k·(1 + g/h) = 2.5.
    code, out, err = run(capsys, "custom", "--d-model", "1", "--n-heads", "4", "--n-kv-heads", "1",
                         "--d-head", "1", "--n-layers", "1", "--vocab", "3", "--n-ctx", "4", "--format", fmt)
    assert (code, err) == (0, "")
    assert "2.5" in out


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_renders(capsys, name):
    code, out, err = run(capsys, name, "--seq", "1024")
    assert (code, err) == (0, "")
    assert f"{PRESETS[name].n_layers}" in out


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "--format" in capsys.readouterr().out


CUSTOM = ["custom", "--d-model", "64", "--n-heads", "4", "--n-layers", "2"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["gtp3"], "did you mean 'gpt3'?"),
        (["llama2_7b"], "did you mean 'llama2-7b'?"),
        (["bert-base"], "unknown model 'bert-base'"),
        ([], "give a MODEL"),
        (["gpt3", "--format", "xml"], "argument --format"),
        (["gpt3", "--seq", "0"], "argument --seq: must be a positive integer, got '0'"),
        (["gpt3", "--seq", "1.5"], "argument --seq: must be a positive integer, got '1.5'"),
        (["gpt3", "--dtype", "int8"], "argument --dtype"),
        (["gpt3", "--peak-tflops", "-1"], "argument --peak-tflops"),
        (["gpt3", "--bandwidth-gbs", "nan"], "argument --bandwidth-gbs"),
        (["gpt3", "--bogus"], "unrecognized arguments: --bogus"),
        (["--list", "gpt3"], "--list takes no MODEL"),
        (["formulas", "extra"], "unrecognized arguments: extra"),
        (["custom", "--n-heads", "4", "--n-layers", "2"], "--d-model"),
        (["custom", "--d-model", "0", "--n-heads", "4", "--n-layers", "2"], "argument --d-model: must be"),
        (["custom", "--d-model", "-64", "--n-heads", "4", "--n-layers", "2"], "argument --d-model"),
        (["custom", "--d-model", "64", "--n-heads", "four", "--n-layers", "2"], "argument --n-heads"),
        (["custom", "--d-model", "64", "--n-heads", "4", "--n-layers", "2.0"], "argument --n-layers"),
        ([*CUSTOM, "--n-kv-heads", "3"], "--n-kv-heads: 4 query heads cannot share 3 key/value heads"),
        ([*CUSTOM, "--n-kv-heads", "8"], "--n-kv-heads"),
        (["custom", "--d-model", "100", "--n-heads", "3", "--n-layers", "2"], "--n-heads: d_model 100"),
        ([*CUSTOM, "--vocab", "0"], "argument --vocab"),
        ([*CUSTOM, "--tied", "--untied"], "not allowed with argument"),
        ([*CUSTOM, "--arch", "bert"], "argument --arch"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, expected):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("python -m calc: error:"), err
    assert expected in err


def test_subprocess_run_and_error():
    done = subprocess.run([sys.executable, "-m", "calc", "gpt3", "--format", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ledger"]["attention_per_head"] == 6_291_456
    bad = subprocess.run([sys.executable, "-m", "calc", "gpt-3"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "python -m calc: error: unknown model 'gpt-3'; did you mean 'gpt3'?\n"


@pytest.mark.parametrize("argv", [["gpt3"]])
def test_readme_shows_the_real_output(capsys, argv):
    readme = (ROOT / "docs" / "calc.md").read_text(encoding="utf-8")  # the calc guide shows it now
    shown = readme.split(f"$ python -m calc {' '.join(argv)}\n", 1)[1].split("\n```", 1)[0]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert out.rstrip("\n") == shown
