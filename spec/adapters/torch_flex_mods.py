"""PyTorch's FlexAttention given mask and score functions, as the ``torch_flex`` (eager) and
``torch_flex_compiled`` built-in targets: ``mask_mod=`` and ``score_mod=`` passed to
``create_block_mask`` and ``flex_attention`` as they are, beside `spec.adapters.torch` (whose array
conversions it uses)."""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any

import numpy as np

from spec.adapters.torch import _from_torch, _to_torch
from spec.target import Target

Array = np.ndarray


@functools.cache
def _flex(compiled: bool) -> Any:
    """``flex_attention``, under ``torch.compile`` if asked (one compilation per new shape)."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, fullgraph=True, dynamic=False) if compiled else flex_attention


def _compiling() -> Any:
    """The dynamo settings a compiled call runs under: every new function (each one the suite draws
    is a new object, guarded on) compiles anew instead of falling back to the eager path after
    ``recompile_limit`` (8) compilations, as torch does silently; and a float a function holds (a
    softcap's cap) stays a constant: made a dynamic float on a second value, inductor's CPU
    lowering of FlexAttention refuses it (``InductorError: unbacked_bindings``, torch 2.13.0+cpu)."""
    import torch

    return torch._dynamo.config.patch(recompile_limit=10**6, accumulated_recompile_limit=10**6,
                                      specialize_float=True)


def as_4d(x: Array) -> Array:  # [n, d] or [h, n, d] or [b, h, n, d] -> [b, h, n, d]
    return np.asarray(x).reshape((1,) * (4 - np.ndim(x)) + np.shape(x))


def torch_flex_mods_attention(
    q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, mask_mod: Any = None, score_mod: Any = None, compiled: bool = False,
) -> Array:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v]
    """FlexAttention on NumPy arrays: inputs of 2 or 3 dimensions are read as batch (and heads) of
    one, so the functions see b = 0 (and h = 0); ``mask_mod``, ANDed with ``q_idx >= kv_idx`` for
    ``causal`` (top-left) and with ``mask=`` read as a table (as FlexAttention users pass a
    boolean mask), becomes a block mask by ``create_block_mask`` over the call's batch and
    heads (FlexAttention's default block of 128 positions), and ``score_mod`` goes to
    ``flex_attention`` as it is; the functions receive torch tensors. Grouped K/V heads turn on
    ``enable_gqa``.

    ``compiled=True`` runs ``torch.compile(flex_attention, fullgraph=True, dynamic=False)`` under
    `_compiling`: the fused kernel that visits only the blocks the block mask keeps and applies the
    mask inside partial blocks. Static shapes, because with a second key length dynamo compiles for
    dynamic shapes and the CPU kernel it generates does not compile (``‘cur_kvSplitSize9’ was not
    declared in this scope``, torch 2.13.0+cpu). ``compiled=False`` is FlexAttention's eager path,
    which (its own warning says) computes the whole score matrix, applies ``score_mod`` to every
    score and then the mask.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    shape = np.shape(q)
    q4, k4, v4 = (as_4d(x) for x in (q, k, v))
    batch, heads, n_q, _ = q4.shape
    n_k = k4.shape[2]
    block_mask = None
    table = None if mask is None else _to_torch(np.broadcast_to(as_4d(mask), (batch, heads, n_q, n_k)))
    if mask_mod is not None or causal or table is not None:
        def combined(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            keep = q_idx >= kv_idx if causal else q_idx >= 0
            if table is not None:
                keep = keep & table[b, h, q_idx, kv_idx]
            return keep if mask_mod is None else keep & mask_mod(b, h, q_idx, kv_idx)

        block_mask = create_block_mask(combined, batch, heads, n_q, n_k, device="cpu")
    with warnings.catch_warnings(), _compiling() if compiled else contextlib.nullcontext():
        warnings.filterwarnings("ignore", message=r".*flex_attention called without torch.compile")
        out = _flex(compiled)(_to_torch(q4), _to_torch(k4), _to_torch(v4), score_mod=score_mod,
                              block_mask=block_mask, scale=scale, enable_gqa=k4.shape[1] != heads)
    return _from_torch(out).reshape(*shape[:-1], v4.shape[-1])


def torch_flex(q: Array, k: Array, v: Array, **kwargs: Any) -> Array:
    """`torch_flex_mods_attention` on FlexAttention's eager path."""
    return torch_flex_mods_attention(q, k, v, compiled=False, **kwargs)


def torch_flex_compiled(q: Array, k: Array, v: Array, **kwargs: Any) -> Array:
    """`torch_flex_mods_attention` under ``torch.compile``."""
    return torch_flex_mods_attention(q, k, v, compiled=True, **kwargs)


DECLARED = {"dtypes": ("float32", "float64"), "ndims": (2, 3, 4), "supports_scale": True,
            "supports_mask": True, "supports_gqa": True, "masked_rows": "zeros", "empty_keys": "raise",
            "supports_mask_mod": True, "supports_score_mod": True}
"""What both paths were measured to do on torch 2.13.0+cpu
(tests/spec/test_spec_adapters_torch_flex_mods.py re-measures it): top-left causal, zeros for a
row that sees no key, grouped K/V heads, d_v ≠ d_k; no backward on the CPU. A call with no keys
(n_k = 0) is refused, but not as the suite asks (`EAGER_FAILURES`, `COMPILED_FAILURES`)."""

EAGER_FAILURES = {"empty_keys": "FlexAttention refuses n_k = 0 with an IndexError (max(): Expected "
                                "reduction dim 3 to have non-zero size; with a block mask, "
                                "create_block_mask's select(): index 0 out of range), not a ValueError "
                                "naming the keys (docs/targets.md)"}
"""What the eager path fails, measured at profile quick under seeds 0 and 1."""

COMPILED_FAILURES = {"empty_keys": "compiled FlexAttention with n_k = 0 and no block mask kills its "
                                   "process (SIGFPE in the generated CPU kernel); with a block mask, "
                                   "create_block_mask raises an IndexError (docs/targets.md)"}
"""What the compiled path fails, measured at profile quick with ``--max-examples 2 --seed 0``."""


def eager_target(device: str = "cpu") -> Target:
    """The ``torch_flex`` built-in target: FlexAttention's eager path given ``mask_mod=`` and
    ``score_mod=`` (`torch_flex_mods_attention`). The CPU only: ``device`` other than ``cpu`` is
    refused."""
    import torch

    if device != "cpu":
        raise ValueError(f"the torch_flex built-in runs on the CPU only, not on {device!r}")
    return Target(torch_flex, name=f"torch {torch.__version__} flex_attention (eager) with mask and score "
                                   "functions", deadline_s=60.0, expected_failures=EAGER_FAILURES, **DECLARED)


def compiled_target(device: str = "cpu") -> Target:
    """The ``torch_flex_compiled`` built-in target: FlexAttention under ``torch.compile`` given
    ``mask_mod=`` and ``score_mod=``; sizes from a small grid (``compiles_per_shape``), since each
    new shape and each new function compiles again (seconds on a CPU). Each call runs in a worker
    process (``isolation="process"``): a call with no keys kills the process it runs in
    (`COMPILED_FAILURES`), and the run goes on. float32 only: inductor's CPU lowering of
    FlexAttention refuses float64 ("`torch.float`, `torch.float16` and `torch.bfloat16` are
    supported in FlexAttention for CPU device"). The CPU only."""
    import torch

    if device != "cpu":
        raise ValueError(f"the torch_flex_compiled built-in runs on the CPU only, not on {device!r}")
    return Target(torch_flex_compiled, name=f"torch {torch.__version__} flex_attention (compiled) with mask "
                                            "and score functions", deadline_s=300.0, compiles_per_shape=True,
                  isolation="process", expected_failures=COMPILED_FAILURES,
                  **{**DECLARED, "dtypes": ("float32",)})


TARGETS = {"torch_flex": eager_target, "torch_flex_compiled": compiled_target}
"""The built-in targets of this module (`spec.adapters.ADAPTERS` names them)."""
