"""What each kind of layer costs as the context n grows: one cost model per layer kind, summed over a model.

A layer's kind says how its queries see earlier tokens: every key (``dense``; ``mla`` when it caches MLA's
latent), the last w (``sliding``), its own chunk of C (``chunked``), the k_I its indexer selects (``sparse``,
with the indexer, a kind of its own: ``indexer``), the last w and pooled entries (DeepSeek V4: ``csa``,
the k_I of the entries of m_c tokens its indexer selects, indexer included; ``hca``, every entry of m_h
tokens), or none, through a fixed-size state (``linear``: Gated DeltaNet; ``mamba``, ``mamba2``). For each
kind, per layer and one sequence, five formulas of `calc.formulas`' symbols:

- ``prefill_flops``: the sequence-mixing FLOPs of a causal forward pass over n tokens (QKᵀ and AV of the
  entries a query sees; the indexer's scores; the recurrent state's updates and readouts and the short
  convolution), a multiply-add counted as 2. Projections are not here: they are 2N per token whatever n.
- ``score_bytes_naive``: the score entries of all the layer's heads stored at once, at b bytes a value
  (the indexer's at b_I).
- ``score_bytes_tiled``: the working set of a tiled kernel for the head at work, in fp32: one B×B tile and 2
  running values a query (FlashAttention); the indexer keeps a B×B tile and the running top-k_I values and
  indices of the B queries at work. The tiled figure is one head's, whatever the layers: a model's is the
  largest kind's.
- ``cache_bytes``: what the layer keeps for the next token at n tokens, at b bytes a value: K and V of g heads
  (2·g·d_k a token) or MLA's latent and rotary key (r_kv + d_r), for the tokens its queries may still see; the
  indexer's key (d_I a token); a linear or Mamba layer's fixed state.
- ``decode_flops``: one decode step at context n (a query that sees the layer's keys at n; chunked: a full
  chunk, the most a step sees).

The model's figures are each kind's times its layer count, and their sum (``total``; tiled: the largest).
``crossovers`` finds the n where one kind's figure overtakes another's (the indexer's n² the sparse n·k_I,
the full layers' n² a hybrid's linear layers). Every figure is an exact integer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sympy import Expr, Integer, Max, Min, Symbol

from calc import formulas as f
from calc.config import Config
from calc.ledger import values

b_I = Symbol("b_I", positive=True, integer=True)  # bytes a value of the indexer's scores
CROSSOVER_METRICS = ("prefill_flops", "cache_bytes", "score_bytes_naive")  # what the table and plot mark
INDEX_BYTES = 1  # the indexer's scores in FP8, as DeepSeek V3.2's kernel computes them
TILE_BYTES = 4  # a tiled kernel keeps its tile, running statistics and selections in fp32 (and int32)
METRICS = ("prefill_flops", "score_bytes_naive", "score_bytes_tiled", "cache_bytes", "decode_flops")
METRIC_TEXT = {
    "prefill_flops": "prefill FLOPs", "score_bytes_naive": "scores, naive",
    "score_bytes_tiled": "scores, tiled", "cache_bytes": "cache at n", "decode_flops": "decode FLOPs",
}

# --- the pieces, per layer and sequence -----------------------------------------------------------------
# QKᵀ over d_k and AV over d_v for one entry of each of the h heads.
per_entry = f.h * (2 * f.d_k + 2 * f.d_v)
# The indexer (DeepSeek V3.2, Liu et al. 2025): for each (query, key) it takes a dot product of width d_I at
# each of its h_I heads and sums them with the per-head weights: 2·d_I + 2 FLOPs a head.
indexer_per_entry = f.h_I * (2 * f.d_I + 2)
causal_entries = f.n * (f.n + 1) / 2  # query i sees the i + 1 keys up to itself
# Gated DeltaNet's delta rule per token and value head, S of d_lk × d_lv (Yang et al. 2024, eq. 10):
# S·k (2), the decay α·S (1), the rank-1 write β(v − αSk)kᵀ (2) and the readout S·q (2) per state entry;
# plus its causal convolution of K taps over q, k and v (2 a tap and channel).
deltanet_token = 7 * f.h_lv * f.d_lk * f.d_lv + 2 * f.K * f.deltanet_conv_width
# Mamba's selective scan per token and channel (Gu & Dao 2023, Algorithm 2): the decay exp(ΔA)·h (1), the
# write ΔB·x (a product and a sum, 2) and the readout C·h (2) per state entry; plus its convolution of K taps.
mamba_token = 5 * f.d_in * f.d_st + 2 * f.K * f.d_in
# Mamba-2's the same per state entry (its decay is one scalar per head, still a product per entry); its
# convolution runs over x, B and C.
mamba2_token = 5 * f.d_in * f.d_st + 2 * f.K * f.mamba2_conv_width
tile = f.B**2 + 2 * f.n  # FlashAttention: a B×B tile and a running max and sum per query
indexer_tile = f.B**2 + 2 * f.B * f.k_I  # a B×B tile and the B queries' running top-k_I values and indices
gqa_token = 2 * f.g * f.d_k  # K and V of g heads
mla_token = f.r_kv + f.d_r  # MLA's latent and shared rotary key


@dataclass(frozen=True)
class Kind:
    """One layer kind's cost formulas, per layer and sequence (see the module's docstring)."""

    name: str
    what: str
    prefill_flops: Expr
    score_bytes_naive: Expr
    score_bytes_tiled: Expr
    cache_bytes: Expr
    decode_flops: Expr
    held: Expr | None = None  # tokens an attention layer's cache holds at n (None: not an attention kind)

    def formula(self, metric: str) -> Expr:
        return getattr(self, metric)


def _attention(name: str, what: str, causal: Expr, entries: Expr, held: Expr, seen: Expr,
               token: Expr = gqa_token) -> Kind:
    return Kind(name, what, prefill_flops=per_entry * causal, score_bytes_naive=f.h * entries * f.b,
                score_bytes_tiled=TILE_BYTES * tile, cache_bytes=token * held * f.b,
                decode_flops=per_entry * seen, held=held)


KINDS: dict[str, Kind] = {k.name: k for k in (
    _attention("dense", "every earlier key (n²)", causal_entries, f.n**2, f.n, f.n),
    _attention("mla", "every earlier key, MLA's latent cached (n²)", causal_entries, f.n**2, f.n, f.n,
               mla_token),
    _attention("sliding", "the last w keys (n·w)", f.windowed_causal_entries, f.windowed_entries_per_head,
               Min(f.n, f.w), Min(f.n, f.w)),
    _attention("chunked", "its own chunk of C (n·C)", f.chunked_causal_entries, f.chunked_entries_per_head,
               Min(f.n, f.C), Min(f.n, f.C)),
    _attention("sparse", "the k_I keys its indexer selects (n·k_I)", f.sparse_causal_entries,
               f.sparse_entries_per_head, f.n, Min(f.n, f.k_I), mla_token),
    Kind("indexer", "a sparse layer's indexer: every earlier key at h_I heads of d_I (n²)",
         prefill_flops=indexer_per_entry * causal_entries, score_bytes_naive=f.h_I * f.n**2 * b_I,
         score_bytes_tiled=TILE_BYTES * indexer_tile, cache_bytes=f.d_I * f.n * f.b,
         decode_flops=indexer_per_entry * f.n),
    Kind("csa", "DeepSeek V4's compressed sparse attention: the last w keys, the k_I of the ⌊n/m_c⌋ pooled "
         "entries its indexer selects, and the indexer over them all (n·(w + k_I) + n²/m_c)",
         prefill_flops=per_entry * f.csa_causal_entries + indexer_per_entry * f.pooled_causal_entries(f.m_c),
         score_bytes_naive=f.h * f.n * (Min(f.n, f.w) + Min(f.csa_entries, f.k_I)) * f.b
         + f.h_I * f.n * f.csa_entries * b_I,
         score_bytes_tiled=TILE_BYTES * Max(tile, indexer_tile), cache_bytes=f.csa_layer_cache,
         decode_flops=per_entry * (Min(f.n, f.w) + Min(f.csa_entries, f.k_I))
         + indexer_per_entry * f.csa_entries),
    Kind("hca", "DeepSeek V4's heavily compressed attention: the last w keys and every one of the ⌊n/m_h⌋ "
         "pooled entries (n·w + n²/m_h)",
         prefill_flops=per_entry * f.hca_causal_entries,
         score_bytes_naive=f.h * f.n * (Min(f.n, f.w) + f.hca_entries) * f.b,
         score_bytes_tiled=TILE_BYTES * tile, cache_bytes=f.hca_layer_cache,
         decode_flops=per_entry * (Min(f.n, f.w) + f.hca_entries)),
    Kind("linear", "a state of d_lk × d_lv per value head (Gated DeltaNet, O(n))",
         prefill_flops=f.n * deltanet_token, score_bytes_naive=Integer(0), score_bytes_tiled=Integer(0),
         cache_bytes=f.deltanet_state * f.b, decode_flops=deltanet_token),
    Kind("mamba", "a state of d_in × d_st (Mamba, O(n))",
         prefill_flops=f.n * mamba_token, score_bytes_naive=Integer(0), score_bytes_tiled=Integer(0),
         cache_bytes=f.mamba_state * f.b, decode_flops=mamba_token),
    Kind("mamba2", "a state of d_in × d_st in h_m heads (Mamba-2, O(n))",
         prefill_flops=f.n * mamba2_token, score_bytes_naive=Integer(0), score_bytes_tiled=Integer(0),
         cache_bytes=f.mamba2_state * f.b, decode_flops=mamba2_token),
)}


def layer_kinds(config: Config) -> dict[str, int]:
    """How many layers of each kind ``config`` has (kinds it has none of left out), in KINDS' order; a
    sparse layer counts once as ``sparse`` and once as ``indexer``."""
    full = "mla" if config.is_mla else "dense"
    counts = {full: config.n_full_layers, "sliding": config.n_window_layers,
              "chunked": config.n_chunked_layers, "sparse": config.n_sparse_layers,
              "indexer": config.n_sparse_layers, "csa": config.n_csa_layers, "hca": config.n_hca_layers,
              "linear": config.n_linear_layers,
              "mamba2" if config.mamba2 is not None else "mamba": config.n_mamba_layers}
    return {name: counts[name] for name in KINDS if counts.get(name)}


def cache_layers(config: Config) -> dict[str, int]:
    """How many layers of each kind keep a cache of their own: all of them, less the layers that reuse an
    earlier layer's keys and values (Gemma 4's last L_x, windowed or full)."""
    counts = layer_kinds(config)
    shared = {"sliding": config.n_kv_shared_window_layers,
              "dense": config.n_kv_shared_layers - config.n_kv_shared_window_layers}
    return {kind: layers - shared.get(kind, 0) for kind, layers in counts.items()}


def layers_for(config: Config, kind: str, metric: str) -> int:
    """The layers ``metric`` of ``kind`` is summed over: one head's tile for ``score_bytes_tiled``, the layers
    with a cache of their own for ``cache_bytes``, else every layer of the kind."""
    if metric == "score_bytes_tiled":
        return 1
    return (cache_layers if metric == "cache_bytes" else layer_kinds)(config)[kind]


def kind_formula(config: Config, kind: str, metric: str) -> Expr:
    """``metric`` of one layer of ``kind`` as ``config`` builds it (a sliding or chunked layer of an MLA
    model caches the latent, as its dense layers do)."""
    one = KINDS[kind]
    if config.split_attention and kind == "dense":  # Gemma 4's full layers: heads of d_kf, g_f K/V heads
        return kind_formula(dataclasses.replace(config, d_head_full=0, n_kv_heads_full=0,
                                                full_values_are_keys=False, n_kv_shared_layers=0,
                                                n_kv_shared_window_layers=0, shared_mlp_double=False),
                            kind, metric).xreplace({f.d_k: f.d_kf, f.d_v: f.d_kf, f.g: f.g_f})
    if metric == "cache_bytes" and one.held is not None:
        if config.compressed is not None:  # DeepSeek V4's windowed layers keep w − 1 keys and values
            return 2 * f.d_k * f.v4_window_cached * f.b
        if config.general_gqa:  # K of d_k and V of d_v, a windowed layer's g_w heads
            heads = f.g_w if kind == "sliding" else f.g
            return heads * (f.d_k + f.d_v) * one.held * f.b
        return (mla_token if config.is_mla else gqa_token) * one.held * f.b
    return one.formula(metric)


def _env(config: Config, n: int, dtype_bytes: int, index_bytes: int, block: int) -> dict[Symbol, Any]:
    env: dict[Symbol, Any] = values(config)
    env.update({f.n: n, f.b: dtype_bytes, b_I: index_bytes, f.B: block})
    env.update(f.chunk_values(n, config.attention_chunk or config.n_ctx))
    return env


def at(config: Config, kind: str, metric: str, n: int, *, dtype_bytes: int = 2, index_bytes: int = 1,
       block: int = 128) -> int:
    """One layer's ``metric`` for ``kind`` at n tokens: an exact integer."""
    env = _env(config, n, dtype_bytes, index_bytes, block)
    return f.evaluate_count(kind_formula(config, kind, metric), env)


def by_kind(config: Config, seqs: Sequence[int], *, dtype_bytes: int = 2, index_bytes: int = 1,
            block: int = 128) -> list[dict[str, Any]]:
    """For each n: per kind, its layers and each metric over them (per layer × layers; tiled: one head's),
    and the model's ``total`` (the sum; tiled: the largest)."""
    kinds = layer_kinds(config)
    rows = []
    for n in seqs:
        env = _env(config, n, dtype_bytes, index_bytes, block)
        per_kind: dict[str, dict[str, int]] = {}
        for kind, layers in kinds.items():
            one = {m: f.evaluate_count(kind_formula(config, kind, m), env) for m in METRICS}
            per_kind[kind] = {"layers": layers, **{m: one[m] * layers_for(config, kind, m) for m in METRICS}}
        total = {m: (max if m == "score_bytes_tiled" else sum)(k[m] for k in per_kind.values())
                 for m in METRICS}
        rows.append({"n_tokens": n, "kinds": per_kind, "total": total})
    return rows


def crossover(a: Callable[[int], int], b: Callable[[int], int], n_max: int) -> int | None:
    """An n ≤ n_max where a overtakes b: a(n) > b(n) and a(n − 1) ≤ b(n − 1), the first doubling of n past
    which a exceeds b narrowed by bisection; None where a ≤ b at n_max, or a > b already at n = 1."""
    if a(1) > b(1) or a(n_max) <= b(n_max):
        return None
    lo, hi = 1, 2
    while hi < n_max and a(hi) <= b(hi):
        lo, hi = hi, min(2 * hi, n_max)
    while hi - lo > 1:  # a(lo) ≤ b(lo), a(hi) > b(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a(mid) <= b(mid) else (lo, mid)
    return hi


def crossovers(config: Config, metric: str, n_max: int, **options: int) -> list[dict[str, Any]]:
    """Each pair of the model's kinds where one kind's ``metric`` over its layers overtakes another's below
    n_max: ``{"kind", "overtakes", "n_tokens"}``."""
    kinds = layer_kinds(config)

    def total(kind: str) -> Callable[[int], int]:
        scale = layers_for(config, kind, metric)
        return lambda n: scale * at(config, kind, metric, n, **options)

    found = []
    for a in kinds:
        for other in kinds:
            if a != other and (n := crossover(total(a), total(other), n_max)) is not None:
                found.append({"kind": a, "overtakes": other, "n_tokens": n})
    return found


def plot_grid(n_max: int, extra: Sequence[int] = ()) -> list[int]:
    """The lengths a plot draws: powers of two from 256 up to n_max, n_max, and ``extra`` (crossovers)."""
    grid = {2**k for k in range(8, n_max.bit_length()) if 2**k <= n_max} | {n_max} | set(extra)
    return sorted(n for n in grid if n <= n_max)


def plot(config: Config, path: str, *, n_max: int, dtype_bytes: int = 2, dtype: str = "bf16",
         index_bytes: int = INDEX_BYTES, block: int = 128) -> list[dict[str, Any]]:
    """Draw into ``path`` (PNG; matplotlib, the ``plot`` extra) each kind's prefill FLOPs (left) and memory
    (right: the cache, solid; the naive scores, dashed) over its layers against n, log-log, with a dotted line
    at each n where one kind overtakes another; return those crossovers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    options = {"dtype_bytes": dtype_bytes, "index_bytes": index_bytes, "block": block}
    found = {m: crossovers(config, m, n_max, **options) for m in CROSSOVER_METRICS}
    seqs = plot_grid(n_max, [c["n_tokens"] for rows in found.values() for c in rows])
    rows = by_kind(config, seqs, **options)
    fig, (flops_ax, memory_ax) = plt.subplots(1, 2, figsize=(11, 4.4))
    for kind in layer_kinds(config):
        line, = flops_ax.plot(seqs, [r["kinds"][kind]["prefill_flops"] for r in rows], label=kind)
        color = line.get_color()
        memory_ax.plot(seqs, [r["kinds"][kind]["cache_bytes"] / 2**30 for r in rows], color=color,
                       label=f"{kind}: cache")
        naive = [r["kinds"][kind]["score_bytes_naive"] / 2**30 for r in rows]
        if any(naive):
            memory_ax.plot(seqs, naive, color=color, linestyle="--", label=f"{kind}: scores, naive")
    for ax, metric in ((flops_ax, "prefill_flops"), (memory_ax, "cache_bytes"),
                       (memory_ax, "score_bytes_naive")):
        for c in found[metric]:
            ax.axvline(c["n_tokens"], color="grey", linestyle=":", linewidth=1)
            what = {"prefill_flops": "", "cache_bytes": "cache: ", "score_bytes_naive": "scores: "}[metric]
            ax.annotate(f"{what}{c['kind']} > {c['overtakes']}\nn = {c['n_tokens']:,}", (c["n_tokens"], 0.02),
                        xycoords=("data", "axes fraction"), fontsize="x-small", rotation=90, ha="right")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length n (tokens)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="x-small")
    flops_ax.set_ylabel("prefill FLOPs over the kind's layers")
    flops_ax.set_title(f"{config.name}: sequence mixing per layer kind")
    memory_ax.set_ylabel(f"GiB ({dtype}, {dtype_bytes} bytes a value; indexer scores {index_bytes})")
    memory_ax.set_title("cache (solid) and naive scores (dashed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [c for rows_ in found.values() for c in rows_]
