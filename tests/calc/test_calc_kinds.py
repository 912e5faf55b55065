"""calc.kinds: each layer kind's cost formulas against a count done by hand, loop by loop, for one small
configuration (n = 7 tokens, a window and chunk and top-k of 3, 2 heads); the model's tables as the sum of its
kinds; the n where one kind overtakes another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calc import kinds
from calc.config import CompressedAttention, Config, GatedDeltaNet, Mamba, Mamba2
from calc.hf import from_config

CONFIGS = Path(__file__).resolve().parent / "configs"
N, H, G, D_K, W, CHUNK, TOPK = 7, 2, 1, 4, 3, 3, 3
BYTES = 2  # b: bf16
MLA = {"kv_lora_rank": 8, "q_lora_rank": 16, "d_rope": 2, "d_value": 4}  # d_k = 6 = 4 (no rotary) + 2


def small(**fields) -> Config:
    """A 4-layer model of width 8, 2 query heads of 4, one K/V head, and the kinds in ``fields``."""
    base = dict(arch="llama", n_layers=4, d_model=8, n_heads=H, d_head=D_K, n_kv_heads=G, d_ff=16,
                vocab_size=32, n_ctx=64, tied_embeddings=False)
    return Config(**{**base, **fields})


def flops_over_keys(keys_of_query, per_key: int) -> int:
    """Sum over the N queries of a causal prefill of the keys query i attends to, times the FLOPs a key."""
    return sum(per_key * keys_of_query(i) for i in range(N))


def per_key_attention(d_k: int = D_K, d_v: int = D_K) -> int:
    # each head: QKᵀ one dot product of d_k (d_k multiply-adds), AV d_v multiply-adds; 2 FLOPs each
    return H * (2 * d_k + 2 * d_v)


def test_dense_layer_by_hand():
    config = small()
    assert kinds.at(config, "dense", "prefill_flops", N) == flops_over_keys(lambda i: i + 1,
                                                                            per_key_attention())
    stored = H * N * N  # every head's n×n scores at once
    assert kinds.at(config, "dense", "score_bytes_naive", N, dtype_bytes=BYTES) == stored * BYTES
    # K and V of the one K/V head for each of the 7 tokens
    assert kinds.at(config, "dense", "cache_bytes", N, dtype_bytes=BYTES) == N * 2 * G * D_K * BYTES
    assert kinds.at(config, "dense", "decode_flops", N) == N * per_key_attention()
    # the tiled kernel: one 4×4 tile and 2 running values per query, 4 bytes each
    assert kinds.at(config, "dense", "score_bytes_tiled", N, block=4) == (4 * 4 + 2 * N) * 4


def test_sliding_layer_by_hand():
    config = small(sliding_window=W, n_window_layers=2)
    assert kinds.at(config, "sliding", "prefill_flops", N) == flops_over_keys(lambda i: min(i + 1, W),
                                                                              per_key_attention())
    stored = H * sum(min(N, W) for _ in range(N))  # each row of the scores holds at most w keys
    assert kinds.at(config, "sliding", "score_bytes_naive", N, dtype_bytes=BYTES) == stored * BYTES
    assert kinds.at(config, "sliding", "cache_bytes", N, dtype_bytes=BYTES) == W * 2 * G * D_K * BYTES
    assert kinds.at(config, "sliding", "decode_flops", N) == W * per_key_attention()


def test_chunked_layer_by_hand():
    config = small(attention_chunk=CHUNK, n_chunked_layers=2)
    # chunks [0 1 2] [3 4 5] [6]: query i sees the keys of its chunk up to itself
    assert kinds.at(config, "chunked", "prefill_flops", N) == flops_over_keys(lambda i: i % CHUNK + 1,
                                                                              per_key_attention())
    stored = H * (3 * 3 + 3 * 3 + 1 * 1)  # the block-diagonal scores
    assert kinds.at(config, "chunked", "score_bytes_naive", N, dtype_bytes=BYTES) == stored * BYTES
    assert kinds.at(config, "chunked", "cache_bytes", N, dtype_bytes=BYTES) == CHUNK * 2 * G * D_K * BYTES


def test_a_windowed_layer_with_its_own_kv_heads_caches_keys_and_values_of_their_widths():
    # MiMo-V2-Flash's layout: keys of 4 and values of 3; 1 K/V head on the full layers, 2 on the windowed
    config = small(d_value=3, sliding_window=W, n_window_layers=2, n_kv_heads_window=2)
    held = {"dense": N, "sliding": min(N, W)}
    heads = {"dense": 1, "sliding": 2}
    for kind in ("dense", "sliding"):
        assert kinds.at(config, kind, "cache_bytes", N, dtype_bytes=BYTES) == \
            heads[kind] * (D_K + 3) * held[kind] * BYTES


def test_full_layers_of_their_own_head_width_and_layers_reusing_keys_and_values_by_hand():
    # Gemma 4's layout: 6 layers, 4 windowed with heads of 4 and one K/V head, 2 full with heads of 8 and 2
    # K/V heads (values their keys); the last 2 layers (one windowed, one full) reuse earlier keys and values
    config = small(n_layers=6, sliding_window=W, n_window_layers=4, d_head_full=8, n_kv_heads_full=2,
                   full_values_are_keys=True, n_kv_shared_layers=2, n_kv_shared_window_layers=1)
    assert kinds.layer_kinds(config) == {"dense": 2, "sliding": 4}
    assert kinds.cache_layers(config) == {"dense": 1, "sliding": 3}
    assert kinds.at(config, "dense", "prefill_flops", N) == flops_over_keys(lambda i: i + 1,
                                                                            per_key_attention(8, 8))
    assert kinds.at(config, "sliding", "prefill_flops", N) == flops_over_keys(lambda i: min(i + 1, W),
                                                                              per_key_attention())
    # a full layer caches K and V of its 2 heads of 8 (both, though its values are its keys), each token
    assert kinds.at(config, "dense", "cache_bytes", N, dtype_bytes=BYTES) == N * 2 * 2 * 8 * BYTES
    assert kinds.at(config, "dense", "decode_flops", N) == N * per_key_attention(8, 8)
    (row,) = kinds.by_kind(config, [N], dtype_bytes=BYTES)
    # the model's cache: 1 full layer and 3 windowed ones keep their own; the 2 reusing layers none
    assert row["kinds"]["dense"]["cache_bytes"] == 1 * N * 2 * 2 * 8 * BYTES
    assert row["kinds"]["sliding"]["cache_bytes"] == 3 * W * 2 * G * D_K * BYTES
    # every layer still attends: prefill over all 2 and 4
    assert row["kinds"]["dense"]["prefill_flops"] == 2 * flops_over_keys(lambda i: i + 1,
                                                                         per_key_attention(8, 8))


def test_mla_layer_caches_its_latent_and_rotary_key():
    config = small(d_head=6, **MLA)
    d_k, d_v = 6, 4
    assert kinds.layer_kinds(config) == {"mla": 4}
    assert kinds.at(config, "mla", "prefill_flops", N) == flops_over_keys(lambda i: i + 1,
                                                                          per_key_attention(d_k, d_v))
    assert kinds.at(config, "mla", "cache_bytes", N, dtype_bytes=BYTES) == N * (8 + 2) * BYTES


def test_sparse_layer_and_its_indexer_by_hand():
    h_i, d_i = 3, 5
    config = small(d_head=6, **MLA, n_sparse_layers=4, index_topk=TOPK, index_heads=h_i, index_head_dim=d_i)
    assert kinds.layer_kinds(config) == {"sparse": 4, "indexer": 4}
    # the main attention: query i attends to min(i + 1, k_I) selected keys
    assert kinds.at(config, "sparse", "prefill_flops", N) == flops_over_keys(lambda i: min(i + 1, TOPK),
                                                                             per_key_attention(6, 4))
    assert kinds.at(config, "sparse", "score_bytes_naive", N, dtype_bytes=BYTES) == H * N * TOPK * BYTES
    # the cache holds every token, the indexer scoring them all
    assert kinds.at(config, "sparse", "cache_bytes", N, dtype_bytes=BYTES) == N * (8 + 2) * BYTES
    assert kinds.at(config, "sparse", "decode_flops", N) == TOPK * per_key_attention(6, 4)
    # the indexer scores every earlier key: at each of its h_I heads a dot product of d_I (multiply-adds),
    # then one multiply-add by that head's weight
    per_key = sum(2 * d_i + 2 for _ in range(h_i))
    assert kinds.at(config, "indexer", "prefill_flops", N) == flops_over_keys(lambda i: i + 1, per_key)
    # its scores per head, all n×n of them, at 1 byte (FP8)
    assert kinds.at(config, "indexer", "score_bytes_naive", N, index_bytes=1) == h_i * N * N
    assert kinds.at(config, "indexer", "cache_bytes", N, dtype_bytes=BYTES) == N * d_i * BYTES  # its key
    assert kinds.at(config, "indexer", "decode_flops", N) == N * per_key
    # tiled: a 4×4 tile and the 4 queries' running top-3 values and indices, 4 bytes each
    assert kinds.at(config, "indexer", "score_bytes_tiled", N, block=4) == (4 * 4 + 4 * 3 * 2) * 4


def compressed(n_window_layers: int = 1, csa: int = 1, hca: int = 1, **fields) -> Config:
    """DeepSeek V4's layout at small sizes: a window of 3, CSA pooling every 2 tokens with a top-2 indexer of
    3 heads of 5, HCA pooling every 3; one K/V head of 4 (the key is the value)."""
    return small(n_layers=n_window_layers + csa + hca, sliding_window=W, n_window_layers=n_window_layers,
                 q_lora_rank=8, n_experts=2, experts_per_token=1, d_expert=4, index_topk=2, index_heads=3,
                 index_head_dim=5, compressed=CompressedAttention(
                     csa_layers=csa, hca_layers=hca, csa_rate=2, hca_rate=3, out_groups=2, out_rank=4,
                     hc_mult=2, hash_layers=0), **fields)


def test_compressed_layers_by_hand():
    config = compressed()
    assert kinds.layer_kinds(config) == {"sliding": 1, "csa": 1, "hca": 1}
    d_i, h_i, top = 5, 3, 2
    indexer_per_key = sum(2 * d_i + 2 for _ in range(h_i))  # as V3.2's: a dot product and a weight a head
    for n in range(1, 30):
        # query i sees its last min(i + 1, w) keys and the entries of the windows closed by then,
        # (i + 1) // m: an HCA layer all of them, a CSA layer the top 2; the CSA indexer scores every one
        queries = range(n)
        hca = sum(per_key_attention() * (min(i + 1, W) + (i + 1) // 3) for i in queries)
        csa = sum(per_key_attention() * (min(i + 1, W) + min((i + 1) // 2, top))
                  + indexer_per_key * ((i + 1) // 2) for i in queries)
        assert kinds.at(config, "hca", "prefill_flops", n) == hca
        assert kinds.at(config, "csa", "prefill_flops", n) == csa
        assert kinds.at(config, "hca", "decode_flops", n) == per_key_attention() * (min(n, W) + n // 3)
        csa_step = per_key_attention() * (min(n, W) + min(n // 2, top)) + indexer_per_key * (n // 2)
        assert kinds.at(config, "csa", "decode_flops", n) == csa_step
        # the scores within reach: each row its window and its pooled entries; the indexer's at 1 byte
        hca_scores = H * sum(min(n, W) + n // 3 for _ in queries)
        csa_scores = H * sum(min(n, W) + min(n // 2, top) for _ in queries)
        assert kinds.at(config, "hca", "score_bytes_naive", n, dtype_bytes=BYTES) == hca_scores * BYTES
        assert kinds.at(config, "csa", "score_bytes_naive", n, dtype_bytes=BYTES, index_bytes=1) == \
            csa_scores * BYTES + h_i * n * (n // 2)
        # the cache, tensor by tensor: the last w − 1 keys (the values: one tensor), the entries pooled, the
        # tokens of the window in progress (a key and a gate each), and a CSA layer's overlap with the next
        # window once one closed (2 keys at b bytes and 2 gates in fp32, the compressor's and the indexer's)
        kept = min(n, W - 1)
        hca_cache = (kept * D_K + n // 3 * D_K + n % 3 * 2 * D_K) * BYTES
        csa_cache = ((kept * D_K + n // 2 * (D_K + d_i) + n % 2 * 2 * 2 * (D_K + d_i)) * BYTES
                     + (2 * (D_K + d_i) * (BYTES + 4) if n >= 2 else 0))
        assert kinds.at(config, "hca", "cache_bytes", n, dtype_bytes=BYTES) == hca_cache
        assert kinds.at(config, "csa", "cache_bytes", n, dtype_bytes=BYTES) == csa_cache
        # a windowed-only layer of this layout keeps w − 1 keys and values, as transformers' sliding layer
        assert kinds.at(config, "sliding", "cache_bytes", n, dtype_bytes=BYTES) == 2 * kept * D_K * BYTES
    # tiled: one 4×4 tile and 2 running values a query; the CSA layer's indexer keeps the 4 queries' top 2
    assert kinds.at(config, "hca", "score_bytes_tiled", N, block=4) == (4 * 4 + 2 * N) * 4
    assert kinds.at(config, "csa", "score_bytes_tiled", N, block=4) == \
        max(4 * 4 + 2 * N, 4 * 4 + 4 * 2 * 2) * 4


@pytest.mark.parametrize(("change", "field"), [
    ({"n_layers": 4}, "compressed"),  # 1 windowed, 1 CSA and 1 HCA layer are not 4 layers
    ({"n_kv_heads": 2}, "n_kv_heads"),  # one key/value head, which is also the value
    ({"q_lora_rank": 0}, "q_lora_rank"),  # the indexer reads the query latent
    ({"n_experts": 0, "experts_per_token": 0, "d_expert": 0}, "compressed.hash_layers"),  # experts everywhere
    ({"index_topk": 0}, "index_topk"),  # a CSA layer's indexer keeps k_I entries
    ({"sliding_window": None, "n_window_layers": 0, "n_layers": 2}, "sliding_window"),
])
def test_compressed_layout_refuses_by_field(change, field):
    import dataclasses

    from calc.config import ConfigError

    with pytest.raises(ConfigError) as err:
        dataclasses.replace(compressed(), **change)
    assert err.value.field == field


def test_compressed_shape_refuses_by_field():
    from calc.config import ConfigError

    with pytest.raises(ConfigError) as err:
        CompressedAttention(csa_layers=1, hca_layers=1, csa_rate=0, hca_rate=3, out_groups=2, out_rank=4,
                            hc_mult=2, hash_layers=0)
    assert err.value.field == "compressed.csa_rate"
    with pytest.raises(ConfigError) as err:
        compressed().__class__(**{**compressed().__dict__, "compressed": CompressedAttention(
            csa_layers=1, hca_layers=1, csa_rate=2, hca_rate=3, out_groups=3, out_rank=4, hc_mult=2,
            hash_layers=0)})
    assert err.value.field == "compressed.out_groups"  # 3 groups do not split 2 heads


def delta_rule_ops(d_k: int, d_v: int) -> int:
    """FLOPs of one token of the gated delta rule on one value head, counted operation by operation:
    u = S·k, S ← α·S, S ← S + β·(v − α·u)·kᵀ, o = S·q."""
    ops = 0
    for _ in range(d_v):
        for _ in range(d_k):
            ops += 2  # u = S·k: a multiply-add
            ops += 1  # α·S: a multiply
            ops += 2  # the rank-1 write: a multiply and an add
            ops += 2  # o = S·q: a multiply-add
    return ops


def test_linear_attention_layer_and_its_state_by_hand():
    shape = GatedDeltaNet(key_heads=2, value_heads=4, d_key=3, d_value=5, conv_kernel=4)
    config = small(linear_attention=shape, n_linear_layers=3)
    conv_channels = 2 * 3 + 2 * 3 + 4 * 5  # q and k (2 heads of 3), v (4 heads of 5)
    per_token = 4 * delta_rule_ops(3, 5) + conv_channels * 4 * 2  # a multiply-add per tap and channel
    assert kinds.at(config, "linear", "prefill_flops", N) == N * per_token
    assert kinds.at(config, "linear", "decode_flops", N) == per_token
    # the state: 4 value heads of a 3 × 5 matrix, and the last K − 1 = 3 inputs of the convolution
    state_values = 4 * 3 * 5 + 3 * conv_channels
    for n in (1, N, 10**6):  # whatever n
        assert kinds.at(config, "linear", "cache_bytes", n, dtype_bytes=BYTES) == state_values * BYTES
    assert kinds.at(config, "linear", "score_bytes_naive", N) == 0


def test_mamba_layer_and_its_state_by_hand():
    shape = Mamba(d_inner=6, d_state=3, dt_rank=2, conv_kernel=4, conv_bias=True, proj_bias=False,
                  inner_norms=True)
    config = small(mamba=shape, n_mamba_layers=3)
    scan = sum(1 + 2 + 2 for _ in range(6) for _ in range(3))  # decay, write, readout per state entry
    per_token = scan + 6 * 4 * 2  # and the convolution: a multiply-add per tap and channel
    assert kinds.at(config, "mamba", "prefill_flops", N) == N * per_token
    assert kinds.at(config, "mamba", "cache_bytes", N, dtype_bytes=BYTES) == (6 * 3 + 3 * 6) * BYTES


def test_mamba2_layer_and_its_state_by_hand():
    # 3 heads of 2 channels (d_in = 6), 2 groups of B and C with a state of 3, a convolution of 4 taps
    shape = Mamba2(d_inner=6, heads=3, groups=2, d_state=3, conv_kernel=4, conv_bias=True, proj_bias=False)
    config = small(mamba2=shape, n_mamba_layers=3)
    assert kinds.layer_kinds(config) == {"dense": 1, "mamba2": 3}
    scan = sum(1 + 2 + 2 for _ in range(6) for _ in range(3))  # decay, write, readout per state entry
    conv_channels = 6 + 2 * 2 * 3  # x, and B and C of each group
    per_token = scan + conv_channels * 4 * 2  # a multiply-add per tap and channel
    assert kinds.at(config, "mamba2", "prefill_flops", N) == N * per_token
    assert kinds.at(config, "mamba2", "decode_flops", N) == per_token
    state_values = 6 * 3 + 3 * conv_channels  # 6 channels × 3, and the last K − 1 = 3 convolution inputs
    for n in (1, N, 10**6):  # whatever n
        assert kinds.at(config, "mamba2", "cache_bytes", n, dtype_bytes=BYTES) == state_values * BYTES


def test_model_tables_sum_their_kinds():
    config = small(sliding_window=W, n_window_layers=2)
    (row,) = kinds.by_kind(config, [N], dtype_bytes=BYTES, block=4)
    assert {k: v["layers"] for k, v in row["kinds"].items()} == {"dense": 2, "sliding": 2}
    for metric in ("prefill_flops", "score_bytes_naive", "cache_bytes", "decode_flops"):
        one = {k: kinds.at(config, k, metric, N, dtype_bytes=BYTES, block=4) for k in ("dense", "sliding")}
        assert row["kinds"]["dense"][metric] == 2 * one["dense"]
        assert row["total"][metric] == 2 * one["dense"] + 2 * one["sliding"]
    # one head at work whatever the layers: the largest kind's tile
    assert row["total"]["score_bytes_tiled"] == kinds.at(config, "dense", "score_bytes_tiled", N, block=4)


def _load(name: str) -> Config:
    return from_config(json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8")))


@pytest.mark.parametrize(("name", "kind", "other"), [("deepseek-v3.2", "indexer", "sparse"),
                                                      ("qwen3-next-80b-a3b", "dense", "linear"),
                                                      ("gemma3-1b", "dense", "sliding")])
def test_crossover_is_where_one_kind_overtakes_the_other(name, kind, other):
    config = _load(name)
    found = {(c["kind"], c["overtakes"]): c["n_tokens"]
             for c in kinds.crossovers(config, "prefill_flops", 2**20)}
    n = found[kind, other]
    layers = kinds.layer_kinds(config)

    def cost(k: str, m: int) -> int:
        return layers[k] * kinds.at(config, k, "prefill_flops", m)

    assert cost(kind, n) > cost(other, n) and cost(kind, n - 1) <= cost(other, n - 1)


def test_crossover_none_where_one_never_overtakes():
    assert kinds.crossover(lambda n: n, lambda n: 2 * n, 1000) is None
    assert kinds.crossover(lambda n: n * n, lambda n: 100 * n, 1000) == 101


# --- the report, the JSON and the plot -------------------------------------------------------------------
def run(capsys, *argv: str) -> tuple[int, str, str]:
    from calc.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_carries_each_kind_and_their_sum(capsys):
    code, out, _ = run(capsys, str(CONFIGS / "deepseek-v3.2.json"), "--seq", "1024", "65536", "--format",
                       "json")
    assert code == 0
    cost = json.loads(out)["cost_by_kind"]
    assert (cost["dtype"], cost["bytes_per_value"], cost["index_bytes_per_value"]) == ("bf16", 2, 1)
    assert cost["layers"] == {"sparse": 61, "indexer": 61}
    for row in cost["rows"]:
        for metric in kinds.METRICS:
            figures = [k[metric] for k in row["kinds"].values()]
            assert row["total"][metric] == (max if metric == "score_bytes_tiled" else sum)(figures)
    (found,) = cost["crossovers"]["prefill_flops"]
    assert (found["kind"], found["overtakes"]) == ("indexer", "sparse")


def test_table_per_kind_only_where_a_model_has_other_kinds(capsys):
    _, dense, _ = run(capsys, "gpt3", "--seq", "2048")
    assert "Cost per layer kind" not in dense
    _, hybrid, _ = run(capsys, str(CONFIGS / "qwen3-next-80b-a3b.json"), "--seq", "4096")
    assert "Cost per layer kind" in hybrid
    assert "dense overtakes linear at n = 1,368" in " ".join(hybrid.split())


def test_plot_draws_a_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "kinds.png"
    code, out, _ = run(capsys, str(CONFIGS / "gemma3-1b.json"), "--seq", "4096", "--plot", str(path))
    assert code == 0 and out.rstrip().endswith(f"plot: {path}")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_into_a_missing_folder_exits_2_in_one_line(capsys, tmp_path):
    code, out, err = run(capsys, "gpt2", "--plot", str(tmp_path / "nowhere" / "x.png"))
    assert code == 2 and out == "" and err.count("\n") == 1 and "--plot" in err


def test_compare_v3_against_v32_per_kind_and_where_sparse_selection_pays(capsys):
    v3, v32 = (str(CONFIGS / f"{name}.json") for name in ("deepseek-v3", "deepseek-v3.2"))
    code, out, _ = run(capsys, "compare", v3, v32, "--seq", "4096", "131072", "--format", "json")
    assert code == 0
    dense, sparse = json.loads(out)
    assert dense["n_tokens"] == sparse["n_tokens"] == 4096  # the first --seq for every other row
    assert dense["cost_by_kind"]["layers"] == {"mla": 61}
    assert sparse["cost_by_kind"]["layers"] == {"sparse": 61, "indexer": 61}
    assert [r["n_tokens"] for r in sparse["cost_by_kind"]["rows"]] == [4096, 131072]
    # the same figures as the single model's report
    assert sparse["cost_by_kind"]["rows"] == kinds.by_kind(_load("deepseek-v3.2"), [4096, 131072])
    (found,) = dense["cost_overtakes"]
    assert (found["model"], found["metric"]) == ("deepseek-v3.2", "prefill_flops")
    n = found["n_tokens"]

    def prefill(name: str, m: int) -> int:
        return kinds.by_kind(_load(name), [m])[0]["total"]["prefill_flops"]

    assert prefill("deepseek-v3", n) > prefill("deepseek-v3.2", n)
    assert prefill("deepseek-v3", n - 1) <= prefill("deepseek-v3.2", n - 1)
    # V3.2 costs more from n = 1 (its indexer beside attention to every key while n ≤ k_I): no crossing
    assert sparse["cost_overtakes"] == []


def test_compare_csv_names_each_kind_and_leaves_the_others_empty(capsys):
    import csv
    import io

    v3, v32 = (str(CONFIGS / f"{name}.json") for name in ("deepseek-v3", "deepseek-v3.2"))
    _, out, _ = run(capsys, "compare", v3, v32, "--seq", "8192", "--format", "csv")
    table = {r[0]: r[1:] for r in csv.reader(io.StringIO(out))}
    assert table["prefill_flops@8192:indexer"][0] == ""
    assert int(table["prefill_flops@8192:indexer"][1]) == kinds.by_kind(
        _load("deepseek-v3.2"), [8192])[0]["kinds"]["indexer"]["prefill_flops"]
