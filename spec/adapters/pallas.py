"""JAX's Pallas attention kernels, run by the Pallas interpreter (``interpret=True``), as built-in
targets: ``pallas_mha`` (``ops.gpu.attention.mha``, forward and backward).

Each kernel is called as JAX ships it, with its default block sizes (its recommended ones), its
own keyword names and its own layout; the targets declare the kernel's limits instead of padding
or splitting the suite's inputs. What an adapter function here does beyond the layout is said in
its docstring. The arrays go through the ``jax`` adapter's `Framework` record (bit for bit,
bfloat16 included), and the backward is ``jax.vjp`` of the same call, which runs the kernel's own
``custom_vjp``.

Under the interpreter each new shape (and each new value of a static argument such as
``sm_scale``) is a new trace and XLA compilation of the kernel's grid loop: about a second a shape
here, so the targets compile per shape and carry a deadline for that.

The declarations were read from the kernels' source (jax 0.10.2,
``jax/experimental/pallas/ops/...``) and measured on CPU; ``tests/test_spec_adapters_pallas.py``
keeps the ones a new version could change. What the kernels fail is recorded in docs/peers.md
("Pallas"), each finding with its replay line.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from spec import dtypes
from spec.adapters import wrap
from spec.adapters.jax import FRAMEWORK
from spec.target import Target

Array = np.ndarray

LN2 = math.log(2.0)


def _version() -> str:
    import jax

    return str(jax.__version__)


def _scale(q: Any, sm_scale: float | None) -> float:
    """The kernel's ``sm_scale``: the one given, else 1/√d_k (the suite's default; ``mha``'s own
    default is 1.0, so it is always passed)."""
    return float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])


# --- ops.gpu.attention.mha -------------------------------------------------------------------------


def pallas_mha(q: Any, k: Any, v: Any, *, causal: bool = False, sm_scale: float | None = None,
               return_residuals: bool = False) -> Any:  # [b, n, h, d] (bnhd) jax arrays -> [b, n_q, h, d]
    """``jax.experimental.pallas.ops.gpu.attention.mha`` in interpret mode, its default
    ``BlockSizes`` (forward 128 × 128, backward 32 × 32), ``sm_scale`` 1/√d_k unless given.

    With ``return_residuals=True`` it returns ``(out, lse)``: the kernel's residual is the
    logsumexp in base 2 (its softmax runs on ``exp2`` of the scores times log2 e), which this
    returns in the natural log the suite's ``lse`` is (times ln 2), ``[b, h, n_q]`` as the kernel
    writes it."""
    from jax.experimental.pallas.ops.gpu import attention

    got = attention.mha(q, k, v, None, sm_scale=_scale(q, sm_scale), causal=causal, interpret=True,
                        return_residuals=return_residuals)
    if return_residuals:
        out, lse2 = got
        return out, lse2 * LN2
    return got


def mha_target(device: str = "cpu") -> Target:
    """The ``pallas_mha`` built-in target: `pallas_mha`, forward and backward (the kernel's
    ``custom_vjp``, through ``jax.vjp``)."""
    import jax.experimental.pallas.ops.gpu.attention  # noqa: F401  (a missing module is said at once)

    return wrap(
        FRAMEWORK, pallas_mha, name=f"jax {_version()} pallas ops.gpu.attention.mha (interpret)",
        device=device, grad=True,
        rename={"scale": "sm_scale", "return_lse": "return_residuals"},
        # Measured under the interpreter (jax 0.10.2): float16 and bfloat16 accumulate in float32.
        dtypes=("float16", "float32", *dtypes.bfloat16_if_installed()),
        layout="bnhd",
        ndims=(4,),  # q, k, v [batch, seq, heads, head_dim]
        supports_scale=True,
        # span_q >= span_k over the whole sequence: top-left (measured with n_q ≠ n_k).
        causal_alignment="top_left",
        # "This kernel expects q, k, and v to have the same head dimension" (a ValueError); any
        # head size (it pads the tile to the next power of two and masks the padding).
        equal_head_dims=True,
        # block_q = min(128, n_q), block_k = min(128, n_k), and "q_seq_len must be a multiple of
        # block_q" (the same for n_k): any length up to 128, multiples of 128 beyond. The
        # backward's 32 × 32 blocks divide 128 too.
        seq_multiple=128,
        # K/V heads are read at the query's head index: no grouped heads (the interpreter clamps
        # the out-of-range head block; on a GPU it is an out-of-bounds read).
        supports_gqa=False,
        returns_lse=True,
        # n_k = 0: block_k = min(128, 0) = 0, and the kernel's own check `kv_seq_len % block_k`
        # raises ZeroDivisionError before any ValueError.
        empty_keys="raise",
        compiles_per_shape=True,
        deadline_s=120.0,
        # Found, verified, declared (docs/peers.md, "Pallas", with the replay lines).
        expected_failures={
            "empty_keys": "n_k = 0 makes block_k = min(128, 0) = 0: the kernel's `kv_seq_len % block_k` "
                          "raises ZeroDivisionError, not a ValueError naming the length",
            "large_logits[float32]": "the interpreter's XLA:CPU compilation of the kernel's tile gives NaN for "
                                     "scores near float32's edge (~4e34); the same arithmetic run eagerly "
                                     "is finite",
        },
    )


TARGETS = {"pallas_mha": mha_target}
"""The built-in targets of this module (`spec.adapters.ADAPTERS` names them under ``jax``)."""
