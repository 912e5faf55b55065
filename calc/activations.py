"""Training activations per layer kind: the bytes each layer keeps for its backward pass.

A layer is assembled from the blocks of `calc.formulas` (derived op by op from what PyTorch's autograd saves
for each operation of transformers' implementation): its norm, the input of its projections, its mixer
(attention, eager or FlashAttention-style, with GQA; or Mamba) and its MLP (dense, gated, or a mixture of
experts with top-k routing). Beside the layers a model keeps its token ids, its final norm, the head's input,
the log-softmax of the loss (fp32, n·V a sequence) and the targets. Every figure is an exact integer of bytes
for ``micro_batch`` sequences of n tokens in one dtype (fp32, or bf16/fp16 with the fp32 upcasts the models
make), without dropout and on one device.

The layouts are those of the model types whose every block ``python -m calc.verify --activations`` checks
against the bytes PyTorch saves (`calc.measure`); for any other type `coverage` says why calc gives no figure
rather than a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sympy import Expr, Integer, Rational, Symbol

from calc import formulas as f
from calc.config import Config
from calc.ledger import values


@dataclass(frozen=True)
class Layout:
    """What one transformers model type's layers keep, where the generic blocks leave a choice."""

    norm: str  # "rms": RMSNorm upcast to fp32 (Llama's); "layer": LayerNorm
    softmax_fp32: bool  # eager attention computes softmax in fp32 and casts it back (both kept)
    activation: str  # the MLP's activation where the config names none (the type's config default)
    # GPT-NeoX: V is a view of the fused QKV output, so FlashAttention keeps that output whole (its Q and K
    # parts too), and W_O's input is a copy of the attention output
    fused_qkv_view: bool = False
    router: str | None = None  # "renormalized": the top-k weights divided by their sum (Mixtral); "top_k"
    positions: str = "rope"  # "rope": cos and sin tables; "learned": a position table (GPT-2); "none" (Jamba)


LAYOUTS: dict[str, Layout] = {
    "gpt2": Layout("layer", softmax_fp32=False, activation="gelu_new", positions="learned"),
    "gpt_neox": Layout("layer", softmax_fp32=True, activation="gelu", fused_qkv_view=True),
    "llama": Layout("rms", softmax_fp32=True, activation="silu"),
    "mistral": Layout("rms", softmax_fp32=True, activation="silu"),
    "qwen2": Layout("rms", softmax_fp32=True, activation="silu"),
    "qwen3": Layout("rms", softmax_fp32=True, activation="silu"),
    "mixtral": Layout("rms", softmax_fp32=True, activation="silu", router="renormalized"),
    "jamba": Layout("rms", softmax_fp32=True, activation="silu", router="top_k", positions="none"),
}
ARCH_TYPES = {"gpt": "gpt2", "llama": "llama", "neox": "gpt_neox"}  # a custom config's layout
# k_a: the tensors an activation keeps for its backward (its input included) besides its output
ACTIVATIONS: dict[str, tuple[int, str]] = {
    "silu": (1, "SiLU keeps its input"),
    "gelu": (1, "GELU keeps its input"),
    "gelu_new": (4, "transformers' NewGELU is a formula of PyTorch operations: pow keeps x, tanh its output, "
                 "the last product its factors 0.5·x and 1 + tanh"),
}
# (b, c_up): bytes a value, and whether casts to fp32 are copies of their own (the dtypes checked against
# PyTorch; fp16 would follow bf16's formulas, but is not measured)
DTYPES = {"fp32": (4, 0), "bf16": (2, 1)}
ATTENTIONS = ("eager", "flash")


def layout(config: Config) -> Layout | None:
    return LAYOUTS.get(config.model_type or ARCH_TYPES[config.arch])


def activation(config: Config) -> str:
    """The MLP's activation: the config's, else its type's default."""
    found = layout(config)
    return config.activation or (found.activation if found else "")


def coverage(config: Config) -> str | None:
    """Why calc derives no activation figure for ``config`` (None: it does)."""
    kind = config.model_type or ARCH_TYPES[config.arch]
    if kind not in LAYOUTS:
        return (f"model_type {kind}'s layers are not among those checked against PyTorch "
                f"({', '.join(LAYOUTS)})")
    if activation(config) not in ACTIVATIONS:
        return f"its activation {activation(config)!r} is not one calc has checked ({', '.join(ACTIVATIONS)})"
    if config.n_shared_experts or config.is_mla or config.n_linear_layers:
        return "shared experts, MLA and linear attention are not among the blocks checked against PyTorch"
    if config.qk_norm and config.model_type != "qwen3":
        return "its q/k norms are not among the blocks checked against PyTorch"
    if config.parallel_block and LAYOUTS[kind].norm == "rms":
        return "a parallel block with RMSNorms is not among the blocks checked against PyTorch"
    return None


def _norm(config: Config, kind: Layout) -> Expr:
    return f.rms_norm_saved(f.d) if kind.norm == "rms" else f.layer_norm_saved(f.d)


def mixer_formula(config: Config, attention: str = "flash", mixer: str = "attention") -> Expr:
    """Bytes a layer's first half keeps: its norm, the input of its projections, and its attention (``eager``
    or ``flash``) or Mamba mixer."""
    kind = _checked(config, attention)
    head = _norm(config, kind) + f.projection_input
    if mixer == "mamba":
        return head + f.mamba_saved
    if attention == "eager":
        body = f.attention_eager_linear + (f.softmax_fp32_saved if kind.softmax_fp32 else f.softmax_saved)
        if kind.fused_qkv_view:  # one sequence: V is a view, and keeps the fused output's Q and K parts
            body += f.s_1 * f.b * f.tokens * (f.h * f.d_k + f.g * f.d_k)
    else:
        body = f.attention_flash_saved
        if kind.fused_qkv_view:  # the fused output's Q and K parts, and W_O's input copied
            body += f.b * f.tokens * (f.h * f.d_k + f.g * f.d_k + f.h * f.d_v)
    return head + body + (f.qk_norm_saved if config.qk_norm else 0)


def mlp_formula(config: Config, mlp: str = "dense") -> Expr:
    """Bytes a layer's second half keeps: its norm (its statistics only where the block is parallel and
    shares the first norm's input), the MLP's input, and a dense or gated MLP or the routed experts."""
    kind = _checked(config, "flash")
    norm = _norm(config, kind)
    if config.parallel_block:  # both LayerNorms keep the same input
        norm -= f.b * f.tokens * f.d
    head = norm + f.projection_input
    if mlp == "moe":
        router = f.moe_router_saved + (f.moe_router_renormalized if kind.router == "renormalized" else 0)
        return head + router + f.moe_experts_saved
    return head + (f.mlp_gated_saved if config.mlp_gated else f.mlp_dense_saved)


# Outside the layers: the token ids (kept by the embedding), the positions (the position ids of a learned
# table; RoPE's cos and sin, n·d_rot each in b, shared by the sequences and the layers), the final norm, the
# head's input, the loss's log-softmax over the vocabulary (fp32) and its targets (int64), the loss's weight.
def head_formula(config: Config) -> Expr:
    kind = _checked(config, "flash")
    positions = {"rope": 2 * f.b * f.n * D_ROT, "learned": 8 * f.n, "none": Integer(0)}[kind.positions]
    # one sequence: the targets are a view of the labels padded by one (8 bytes more)
    return (8 * f.tokens + positions + _norm(config, kind) + f.projection_input + 4 * f.tokens * f.V
            + 8 * f.tokens + 8 * f.s_1 + 4)


D_ROT = Symbol("d_rot", positive=True, integer=True)  # rotary dimensions of a head (d_k unless partial)


def _checked(config: Config, attention: str) -> Layout:
    why = coverage(config)
    if why is not None:
        raise ValueError(f"no activation figure for {config.name}: {why}")
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
    found = layout(config)
    assert found is not None
    return found


def env(config: Config, n: int, *, micro_batch: int = 1, dtype: str = "bf16",
        capacity_factor: int | str | Rational = 1) -> dict[Symbol, Any]:
    """The symbols' values: the config's, n, the micro-batch, the dtype's b and c_up, k_a, w_b, and the
    capacity factor c_f (exact: an int, a Rational or a string such as "1.25"; at least 1)."""
    for name, value in (("n", n), ("micro_batch", micro_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    try:
        factor = Rational(capacity_factor) if not isinstance(capacity_factor, bool) else None
    except (TypeError, ValueError):
        factor = None
    if factor is None or factor < 1:
        raise ValueError(f"capacity_factor must be a number of at least 1 (exact: 5/4 or '1.25'), got "
                         f"{capacity_factor!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    b, c_up = DTYPES[dtype]
    kind = layout(config)
    out = values(config)
    out.update({f.n: n, f.b_m: micro_batch, f.b: b, f.c_up: c_up, f.c_f: factor,
                f.k_a: ACTIVATIONS.get(activation(config), (0, ""))[0],
                f.w_b: 4 if kind is not None and kind.router == "renormalized" else b,
                f.s_1: int(micro_batch == 1), D_ROT: config.d_rotary or config.d_head})
    return out


def per_layer(config: Config, n: int, *, attention: str = "flash", micro_batch: int = 1, dtype: str = "bf16",
              capacity_factor: int | str | Rational = 1) -> dict[str, int]:
    """Bytes of each half-layer kind the model has (``attention`` or ``mamba``; ``dense`` or ``moe``) and
    of ``head`` (outside the layers), exact (rounded up to whole bytes only where a capacity factor above 1
    leaves a fraction of a token)."""
    at = env(config, n, micro_batch=micro_batch, dtype=dtype, capacity_factor=capacity_factor)

    def whole(expr: Expr) -> int:
        value = f.evaluate(expr, at)
        return -(-int(value.p) // int(value.q))

    out = {}
    for mixer, count in (("attention", config.n_attention_layers), ("mamba", config.n_mamba_layers)):
        if count:
            out[mixer] = whole(mixer_formula(config, attention, mixer))
    for mlp, count in (("moe", _moe_layers(config)), ("dense", config.n_layers - _moe_layers(config))):
        if count:
            out[mlp] = whole(mlp_formula(config, mlp))
    out["head"] = whole(head_formula(config))
    return out


def _moe_layers(config: Config) -> int:
    return config.n_layers - config.n_dense_layers if config.is_moe else 0


def model_bytes(config: Config, n: int, **options: object) -> int:
    """Every layer's bytes (each kind times its count) and the head's."""
    parts = per_layer(config, n, **options)  # type: ignore[arg-type]
    counts: Mapping[str, int] = {"attention": config.n_attention_layers, "mamba": config.n_mamba_layers,
                                 "moe": _moe_layers(config), "dense": config.n_layers - _moe_layers(config),
                                 "head": 1}
    return sum(counts[kind] * size for kind, size in parts.items())


def formulas(config: Config) -> dict[str, Expr]:
    """The formulas of ``config``'s half-layer kinds, eager and flash, for ``python -m calc formulas``."""
    out = {f"{mixer}, {attention}": mixer_formula(config, attention, mixer)
           for mixer, count in (("attention", config.n_attention_layers), ("mamba", config.n_mamba_layers))
           if count for attention in (ATTENTIONS if mixer == "attention" else ("flash",))}
    for mlp, count in (("moe", _moe_layers(config)), ("dense", config.n_layers - _moe_layers(config))):
        if count:
            out[mlp] = mlp_formula(config, mlp)
    out["head"] = head_formula(config)
    return {name: expr if isinstance(expr, Expr) else Integer(expr) for name, expr in out.items()}
