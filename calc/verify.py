"""``python -m calc.verify``: each preset's checkpoint count against a real model definition.

Builds the Hugging Face ``transformers`` model of every preset from its config on PyTorch's meta
device (shapes only: no weights, no download) and compares what a checkpoint of it stores (every
parameter, tied weights once, plus the buffers saved with the weights, such as DeepSeek-V3's
score-correction bias; rotary tables are not saved) with `calc.ledger.checkpoint`, and with
the count recorded in the preset; for a mixture-of-experts model, also the parameters one token uses,
from the model's own expert tensors (see ``active_count``). Presets read from a config.json are built
from that config by ``AutoConfig.for_model``; so are config.json files named on the command line
(``python -m calc.verify tests/calc/configs/*.json``, or the folder; ``--presets`` names every preset, as
no argument does). Needs ``torch`` and ``transformers``; exit 0 when every buildable preset agrees,
1 otherwise, 2 (one line) when they are not installed.

GPT-3's XL and 13B rows (h·d_k ≠ d) cannot be built: transformers' GPT-2 ties the head width to
d/h. They are counted by the same formula as the rows that are built.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

from calc.cli import is_path
from calc.hf import InertKeyWarning, load
from calc.ledger import active, checkpoint
from calc.presets import PRESETS, Config, ConfigError

INSTALL = "pip install torch==2.13.0 'transformers>=4.45' (or run tox -e calc-verify)"


def build_model(config: Config) -> Any:
    """The transformers causal-LM of ``config`` on the meta device (None if it cannot be built)."""
    import torch
    import transformers as tf

    if config.hf_config is not None:
        hf = dict(config.hf_config)
        hf_config: Any = tf.AutoConfig.for_model(hf.pop("model_type"), **hf)
        with torch.device("meta"):
            if type(hf_config) in tf.MODEL_FOR_CAUSAL_LM_MAPPING:
                return tf.AutoModelForCausalLM.from_config(hf_config)
            return text_model_with_head(hf_config, config.tied_embeddings)
    if config.arch == "gpt":
        if config.attention_width != config.d_model or config.n_kv_heads != config.n_heads:
            return None
        hf_config = tf.GPT2Config(
            vocab_size=config.vocab_size, n_positions=config.n_ctx, n_embd=config.d_model,
            n_layer=config.n_layers, n_head=config.n_heads, n_inner=config.d_ff,
            tie_word_embeddings=config.tied_embeddings,
        )
        model_class: Any = tf.GPT2LMHeadModel
    else:
        kwargs: dict[str, Any] = dict(
            vocab_size=config.vocab_size, hidden_size=config.d_model, intermediate_size=config.d_ff,
            num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
            num_key_value_heads=config.n_kv_heads, max_position_embeddings=config.n_ctx,
            tie_word_embeddings=config.tied_embeddings,
        )
        mistral = config.model_type == "mistral"
        config_class = tf.MistralConfig if mistral else tf.LlamaConfig
        if mistral:
            kwargs["sliding_window"] = config.sliding_window
        hf_config = config_class(head_dim=config.d_head, **kwargs)
        model_class = tf.MistralForCausalLM if mistral else tf.LlamaForCausalLM
    with torch.device("meta"):
        return model_class(hf_config)


def text_model_with_head(hf_config: Any, tied: bool) -> Any:
    """A text model that transformers builds only inside its multimodal model (Qwen3-VL's): the text model
    and the unembedding the multimodal model puts on it (d → V, no bias; the embedding's own tensor where
    tied), as the language model of its ``...ForConditionalGeneration``."""
    import torch
    import transformers as tf

    model = tf.AutoModel.from_config(hf_config)
    embedding = model.get_input_embeddings()
    head = torch.nn.Linear(embedding.embedding_dim, embedding.num_embeddings, bias=False)
    if tied:
        head.weight = embedding.weight
    return torch.nn.ModuleDict({"model": model, "lm_head": head})


def stored_count(model: Any) -> int:
    """Parameters (tied ones once) plus the buffers a checkpoint saves (those in the state dict)."""
    saved = set(model.state_dict())
    params = sum(p.numel() for p in model.parameters())
    return params + sum(b.numel() for name, b in model.named_buffers() if name in saved)


def active_count(model: Any, experts_per_token: int) -> int:
    """Parameters one token uses, read from the model alone: its stored count less, in every MoE layer,
    the share (E − k)/E of the routed experts' tensors (weights and biases) that a token skips.

    Routed experts are the parameters under an ``experts`` module (``mlp.experts.gate_up_proj``,
    ``feed_forward.experts.3.w1``); shared experts (``shared_expert``, ``shared_experts``) and routers are
    outside it. E is read from the tensors: their leading dimension where the experts are fused in one
    tensor, else the number of expert submodules.
    """
    import re
    from collections import defaultdict

    layers: dict[str, list[tuple[Any, int | None]]] = defaultdict(list)
    for name, p in model.named_parameters():
        found = re.match(r"(.*\.experts)\.(\d+\.)?", name)
        if found:
            layers[found[1]].append((p, None if found[2] is None else int(found[2][:-1])))
    skipped = 0
    for tensors in layers.values():
        indices = {i for _, i in tensors if i is not None}
        n_experts = len(indices) if indices else tensors[0][0].shape[0]
        size = sum(p.numel() for p, _ in tensors)
        if size * (n_experts - experts_per_token) % n_experts:
            raise ValueError(f"{n_experts} experts do not split {size} parameters evenly")
        skipped += size * (n_experts - experts_per_token) // n_experts
    return stored_count(model) - skipped


Row = tuple[str, int, int | None, int | None, int | None, int | None]


def verify(names: Sequence[str] | None = None) -> list[Row]:
    """(name, calc's count, the model's count or None, the recorded count, calc's active count and the
    model's, both None for a dense model) for every preset, or for the presets and config.json files named."""
    rows: list[Row] = []
    for name in names or PRESETS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InertKeyWarning)  # main has named them
            config = load(name) if is_path(name) else PRESETS[name]
        model = build_model(config)
        built = None if model is None else stored_count(model)
        counted_active = active(config) if config.is_moe else None
        built_active = None if model is None or not config.is_moe else active_count(
            model, config.experts_per_token)
        rows.append((name, checkpoint(config)["total"], built, config.published, counted_active,
                     built_active))
        del model
    return rows


def expand(argv: Sequence[str]) -> list[str]:
    """The presets and files the arguments name: ``--presets`` is every preset, a folder every .json in it,
    no argument every preset."""
    import os
    from pathlib import Path

    names: list[str] = []
    for arg in argv or ["--presets"]:
        if arg == "--presets":
            names += PRESETS
        elif os.path.isdir(arg):
            names += sorted(str(path) for path in Path(arg).glob("*.json"))
        else:
            names.append(arg)
    return names


def agreement(predicted: int, measured: tuple[int, ...]) -> str:
    """``exact`` when every layer measured equals calc's bytes, else the largest gap in % of PyTorch's."""
    worst = max(measured, key=lambda size: abs(predicted - size))
    return "exact" if predicted == worst and len(set(measured)) == 1 else \
        f"{(predicted - worst) / worst:+.2%} (calc − PyTorch)"


def activations_table(names: Sequence[str] | None = None) -> tuple[str, bool]:
    """calc.activations' bytes beside PyTorch's (calc.measure.check) for the small model of each type, eager
    and FlashAttention-style (SDPA) side by side; and whether every one is exact."""
    from tabulate import tabulate

    from calc.measure import check

    rows = check(tuple(names) if names else None)
    flash = {(r.model_type, r.dtype, r.n, r.micro_batch, r.kind): r for r in rows if r.attention == "flash"}
    cells = []
    for r in (r for r in rows if r.attention == "eager"):
        other = flash[r.model_type, r.dtype, r.n, r.micro_batch, r.kind]
        sizes = (r.predicted, r.measured[0], other.predicted, other.measured[0])
        cells.append((r.model_type, r.dtype, f"{r.n} × {r.micro_batch}", r.kind, str(r.layers),
                      *(f"{size:,}" for size in sizes),
                      agreement(r.predicted, r.measured) if r.exact == other.exact and r.exact
                      else f"eager {agreement(r.predicted, r.measured)}, flash "
                           f"{agreement(other.predicted, other.measured)}"))
    table = tabulate(cells, headers=("model_type", "dtype", "n × b_m", "layer", "layers", "eager: calc",
                                     "eager: PyTorch", "flash: calc", "flash: PyTorch", "agreement"),
                     disable_numparse=True, colalign=("left",) * 5 + ("right",) * 4 + ("left",))
    return table, all(r.exact for r in rows)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m calc.verify [NAME | config.json | FOLDER | --presets ...]``; no argument: every preset.
    ``python -m calc.verify --activations [MODEL_TYPE ...]``: activation bytes against PyTorch's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--activations"]:
        return main_activations(argv[1:])
    argv = expand(argv)
    unknown = [name for name in argv if name not in PRESETS and not is_path(name)]
    if unknown:
        print(f"python -m calc.verify: error: unknown preset {unknown[0]!r}; see python -m calc --list",
              file=sys.stderr)
        return 2
    for name in filter(is_path, argv):
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", InertKeyWarning)
                load(name)
        except ConfigError as err:
            print(f"python -m calc.verify: error: {name}: {err}", file=sys.stderr)
            return 2
        for warning in caught:  # keys ignored as inert: said once, as calc says it
            print(f"python -m calc.verify: warning: {warning.message}", file=sys.stderr)
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as err:
        print(f"python -m calc.verify: error: needs torch and transformers ({err.name} is missing): "
              f"{INSTALL}", file=sys.stderr)
        return 2
    print(f"transformers {transformers.__version__}, models built on the meta device", flush=True)
    ok = True
    width = max(map(len, argv))
    for name, counted, built, published, counted_active, built_active in verify(argv):
        agree = ((built is None or built == counted) and (published is None or published == counted)
                 and counted_active == built_active)
        ok &= agree
        verdict = "MISMATCH" if not agree else "formula only" if built is None and published is None else "ok"
        model = "not buildable" if built is None else f"{built:,}"
        recorded = "-" if published is None else f"{published:,}"
        line = f"{name:{width}} calc {counted:>16,}  model {model:>16}  recorded {recorded:>16}"
        if counted_active is not None:
            line += f"  active: calc {counted_active:,}, model {built_active:,}"
        print(f"{line}  {verdict}", flush=True)
    return 0 if ok else 1


def main_activations(names: Sequence[str]) -> int:
    from calc.measure import SPECS

    unknown = [name for name in names if name not in SPECS]
    if unknown:
        print(f"python -m calc.verify: error: --activations: no small model of type {unknown[0]!r} "
              f"(there are {', '.join(SPECS)})", file=sys.stderr)
        return 2
    try:
        import torch
        import transformers
    except ImportError as err:
        print(f"python -m calc.verify: error: needs torch and transformers ({err.name} is missing): "
              f"{INSTALL}", file=sys.stderr)
        return 2
    from calc.report import wrap

    table, exact = activations_table(names)
    title = (f"Bytes kept for the backward pass per layer: calc.activations against PyTorch's saved tensors "
             f"(torch.autograd.graph.saved_tensors_hooks), transformers {transformers.__version__}, torch "
             f"{torch.__version__}; small random-weight models on the CPU (calc.measure.SPECS), b_m "
             "sequences of n tokens, no dropout; 'head' is everything outside the layers (embedding, final "
             "norm, head, loss)")
    print("\n".join(wrap(title, 100)) + f"\n\n{table}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
