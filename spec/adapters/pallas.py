"""JAX's Pallas attention kernels (``ops.gpu``, ``ops.tpu``) as six built-in targets, under interpreters.

Run by the Pallas interpreter (``interpret=True``): ``pallas_mha`` (``ops.gpu.attention.mha``,
forward and backward), ``pallas_decode`` (``ops.gpu.decode_attention.gqa``), ``pallas_gpu_paged``
(``ops.gpu.paged_attention``); by the TPU interpreter: ``pallas_tpu_flash``
(``ops.tpu.flash_attention``), ``pallas_tpu_paged`` (``ops.tpu.paged_attention``) and
``pallas_splash`` (``ops.tpu.splash_attention``).

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
``jax/experimental/pallas/ops/...``) and measured on CPU; ``tests/spec/test_spec_adapters_pallas.py``
keeps the ones a new version could change. What the kernels fail is recorded in docs/peers.md
("Pallas"), each finding with its replay line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Any

import numpy as np

from spec import dtypes
from spec.adapters import installed_version, wrap
from spec.adapters.jax import FRAMEWORK, _jax_grad, _jax_precision
from spec.target import Target

Array = np.ndarray

LN2 = math.log(2.0)


def _scale(q: Any, sm_scale: float | None) -> float:
    """The kernel's ``sm_scale``: the one given, else 1/√d_k (the suite's default; ``mha``'s own
    default is 1.0, so it is always passed)."""
    return float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])


LARGE_LOGITS = ("the interpreter's XLA:CPU compilation of the kernel's tile gives NaN for scores near "
                "float32's edge (~4e34; bfloat16 computes in float32); the same arithmetic run eagerly is "
                "finite")
"""The reason of ``pallas_mha``'s verified ``large_logits`` failure (docs/peers.md, "Pallas")."""


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
        FRAMEWORK, pallas_mha,
        name=f"jax {installed_version('jax')} pallas ops.gpu.attention.mha (interpret)",
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
            "large_logits[float32]": LARGE_LOGITS,
            "large_logits[bfloat16]": LARGE_LOGITS,
        },
    )


# --- ops.gpu.decode_attention.gqa ------------------------------------------------------------------


def pallas_decode(q: Any, k: Any, v: Any, *, sm_scale: float | None = None,
                  kv_seq_len: Any = None) -> Any:  # [b, h, n_q, d], [b, g, n_k, d] (bhnd) -> [b, h, n_q, d]
    """``jax.experimental.pallas.ops.gpu.decode_attention.gqa`` in interpret mode, its defaults
    (``block_h=16``, ``block_k=128``, ``k_splits=16``).

    The kernel decodes one query per sequence: q ``[batch, q_heads, head_dim]``, k and v
    ``[batch, n_k, kv_heads, head_dim]``, query head i reading K/V head i // (q_heads/kv_heads).
    The suite's n_q queries of a head are independent rows (there is no causal mode), so they are
    laid out as n_q query heads of that head's group: q ``[b, h, n_q, d]`` is read as ``[b, h·n_q,
    d]`` (a reshape, no copy), whose head h_i·n_q + i still reads K/V head h_i // (h/g)."""
    from jax.experimental.pallas.ops.gpu import decode_attention

    b, h, n_q, d = q.shape
    out = decode_attention.gqa(q.reshape(b, h * n_q, d), k.swapaxes(1, 2), v.swapaxes(1, 2),
                               kv_seq_len=None if kv_seq_len is None else kv_seq_len.astype("int32"),
                               sm_scale=_scale(q, sm_scale), interpret=True)
    return out.reshape(b, h, n_q, v.shape[-1])


DECODE_DTYPE = ("its last step, `o /= (l_next.astype(o.dtype) + eps)`, adds float32's eps as a float32 "
                "scalar: float16 and bfloat16 outputs are promoted to float32")
"""The reason of ``pallas_decode``'s verified ``output_shape_dtype`` failures."""


def decode_target(device: str = "cpu") -> Target:
    """The ``pallas_decode`` built-in target: `pallas_decode` (forward only: the kernel has no
    backward)."""
    import jax.experimental.pallas.ops.gpu.decode_attention  # noqa: F401

    return wrap(
        FRAMEWORK, pallas_decode,
        name=f"jax {installed_version('jax')} pallas ops.gpu.decode_attention.gqa (interpret)",
        device=device,
        rename={"scale": "sm_scale", "kv_lengths": "kv_seq_len"},
        dtypes=("float16", "float32", *dtypes.bfloat16_if_installed()),
        ndims=(4,),
        supports_scale=True,
        causal_alignment=None,  # a decoding step: its one query sees every key below kv_seq_len
        supports_gqa=True,
        supports_kv_lengths=True,
        # a row whose kv_seq_len is 0 skips every split (lax.cond) and gets 0 / (0 + eps) = 0
        masked_rows="zeros",
        # v is read at k's head_dim ("v.reshape(k_splits, k_seq_len // k_splits, head_dim)")
        equal_head_dims=True,
        # "k_seq_len must be divisible by k_splits" (16), "k_seq_len divided by k_splits must be
        # >= 16" and "Sequence length split by k_splits must be divisible by block_k" (min(128,
        # n_k / 16)): n_k = 16·s with 16 ≤ s ≤ 128, or a multiple of 2048 beyond. Multiples of 256
        # up to 2048 are the ones a declaration can say. (n_q, folded into the heads, has no limit
        # of its own: it is held to the same multiples.)
        seq_multiple=256,
        max_seq=2048,
        # n_k = 0 fails the kernel's assertion "k_seq_len divided by k_splits must be >= 16".
        empty_keys="raise",
        compiles_per_shape=True,
        deadline_s=120.0,
        # Found, verified, declared (docs/peers.md, "Pallas", with the replay lines).
        expected_failures={
            "output_shape_dtype[float16]": DECODE_DTYPE,
            "output_shape_dtype[bfloat16]": DECODE_DTYPE,
            "empty_keys": "n_k = 0 fails the kernel's `assert k_seq_len // k_splits >= 16`: an "
                          "AssertionError, not a ValueError",
        },
    )


# --- the paged kernels: ops.gpu.paged_attention, ops.tpu.paged_attention --------------------------------


def _prescaled(q: Any, sm_scale: float | None) -> Any:
    """q times the scale, in q's dtype: the paged kernels (and splash) take no scale, their
    logits are q·kᵀ, so the caller scales q (the adapter's one product, rounded once)."""
    import jax.numpy as jnp

    return (q.astype(jnp.float32) * _scale(q, sm_scale)).astype(q.dtype)


def _paged_arguments(q: Any, k: Any, v: Any, block_table: Any, lengths: Any) -> tuple[Any, ...]:
    """The paged kernels' arguments: q ``[b, h, n_q, d]`` as ``[b, h·n_q, d]`` (each head's n_q
    queries as query heads of its group, as `pallas_decode`), the pools ``[num_blocks,
    block_size, g, d]`` as ``[g, num_blocks, block_size, d]``, the table and the lengths int32.
    Contiguous keys ``[b, g, n_k, d]`` (no ``block_table``) are a pool of one block per batch row
    (row b's n_k keys in block b, every row full): the same arrays, transposed."""
    import jax.numpy as jnp

    b, h, n_q, d = q.shape
    if block_table is None:
        if k.shape[2] == 0:
            raise ValueError("a paged kernel needs page_size > 0: no keys (n_k = 0) cannot be paged")
        pools = [x.transpose(1, 0, 2, 3) for x in (k, v)]  # [g, b, n_k, d]: block b is row b
        block_table = jnp.arange(b, dtype=jnp.int32)[:, None]
        if lengths is None:
            lengths = jnp.full((b,), k.shape[2], dtype=jnp.int32)
    else:
        if lengths is None:
            raise TypeError("kv_lengths is required with block_table")
        pools = [x.transpose(2, 0, 1, 3) for x in (k, v)]
    return q.reshape(b, h * n_q, d), *pools, block_table.astype(jnp.int32), lengths.astype(jnp.int32)


def pallas_gpu_paged(q: Any, k: Any, v: Any, *, sm_scale: float | None = None, block_tables: Any = None,
                     lengths: Any = None) -> Any:  # q [b, h, n_q, d] (bhnd), pools -> [b, h, n_q, d]
    """``jax.experimental.pallas.ops.gpu.paged_attention.paged_attention`` in interpret mode, with
    ``k_splits=1`` and ``pages_per_compute_block=1`` (its defaults, 16 and 8, need a table width
    that is a multiple of 16, which no declaration of a target can say; `_paged_arguments`), q
    scaled first (`_prescaled`)."""
    from jax.experimental.pallas.ops.gpu import paged_attention

    b, h, n_q, _ = q.shape
    queries, k_pages, v_pages, table, kv_lengths = _paged_arguments(q, k, v, block_tables, lengths)
    out = paged_attention.paged_attention(_prescaled(queries, sm_scale), k_pages, v_pages, table, kv_lengths,
                                          k_splits=1, pages_per_compute_block=1, interpret=True)
    return out.reshape(b, h, n_q, v.shape[-1])


def pallas_tpu_paged(q: Any, k: Any, v: Any, *, sm_scale: float | None = None, page_indices: Any = None,
                     lengths: Any = None) -> Any:  # q [b, h, n_q, d] (bhnd), pools -> [b, h, n_q, d]
    """``jax.experimental.pallas.ops.tpu.paged_attention.paged_attention`` in TPU interpret mode,
    ``pages_per_compute_block=1`` (it has no default; 1 divides every table width), q scaled
    first (`_prescaled`); the arguments as `_paged_arguments`."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    b, h, n_q, _ = q.shape
    queries, k_pages, v_pages, table, kv_lengths = _paged_arguments(q, k, v, page_indices, lengths)
    out = paged_attention(_prescaled(queries, sm_scale), k_pages, v_pages, kv_lengths, table,
                          pages_per_compute_block=1)
    return out.reshape(b, h, n_q, v.shape[-1])


def _paged_declarations() -> dict[str, Any]:
    """What both paged kernels declare (read from their source, measured under the interpreters)."""
    return dict(
        dtypes=("float16", "float32", *dtypes.bfloat16_if_installed()),
        ndims=(4,),
        supports_scale=True,
        # a decoding step: q is [batch, heads, head_dim], one query per sequence, which sees every
        # key below its length; no causal mode
        causal_alignment=None,
        supports_gqa=True,  # "Number of Q heads must be divisible by number of KV heads"
        supports_kv_lengths=True,
        supports_paged_kv=True,
        # "head_dim of Q must be the same as that of K/V", "k_pages and v_pages must have the
        # same shape"
        equal_head_dims=True,
        # a sequence of length 0 gets zeros (measured: its pages are skipped)
        masked_rows="zeros",
        empty_keys="raise",
        compiles_per_shape=True,
        deadline_s=180.0,
    )


EMPTY_FLOAT16 = ("a sequence of length 0 gets 0 / (0 + eps), eps float32's cast to float16, where it is "
                 "subnormal and XLA:CPU flushes it to zero: NaN, not the zeros float32 and bfloat16 get")
"""The reason of ``pallas_gpu_paged``'s verified failure for an empty float16 sequence."""

READS_THE_TAIL = ("it multiplies the masked weights (0) of its last page's tail into that page's values: "
                  "a NaN value there, where no key of the sequence is, makes the output NaN")
"""The reason of ``pallas_gpu_paged``'s verified failures of the paged laws (docs/peers.md, "Pallas")."""

ADDS_ITS_MASK = ("it adds its mask (a finite -0.7·max) to the scores of its last page's tail and multiplies "
                 "their weights into the values there: a NaN key or value where no key of the sequence "
                 "is makes the output NaN")
"""The reason of ``pallas_tpu_paged``'s verified failures of the paged laws (docs/peers.md, "Pallas")."""


def gpu_paged_target(device: str = "cpu") -> Target:
    """The ``pallas_gpu_paged`` built-in target: `pallas_gpu_paged` (forward only)."""
    import jax.experimental.pallas.ops.gpu.paged_attention  # noqa: F401

    return wrap(FRAMEWORK, pallas_gpu_paged,
                name=f"jax {installed_version('jax')} pallas ops.gpu.paged_attention (interpret)",
                device=device,
                rename={"scale": "sm_scale", "block_table": "block_tables", "kv_lengths": "lengths"},
                # Found, verified, declared (docs/peers.md, "Pallas", with the replay lines): it
                # loads whole pages and masks the scores of the tail with jnp.where (a NaN key
                # there is harmless) but multiplies their 0 weights into the values; and a
                # sequence of length 0 ends as 0 / (0 + eps) with eps float32's, cast to float16,
                # where it is subnormal and XLA:CPU flushes it to zero: NaN.
                expected_failures={
                    "paged_reads_only_its_keys": READS_THE_TAIL,
                    "paged_matches_golden": READS_THE_TAIL,
                    "paged_block_size_invariant": READS_THE_TAIL,
                    "kv_lengths_zero_rows[float16]": EMPTY_FLOAT16,
                },
                **_paged_declarations())


# --- the TPU kernels: ops.tpu.* under the TPU interpreter ---------------------------------------------


def _tpu_interpreted(arrays: list[Array]) -> Any:
    """The context of a call of a TPU kernel: ``pltpu.force_tpu_interpret_mode()`` (every
    ``pallas_call`` traced within runs in TPU interpret mode, on the CPU), x64 for float64 as for
    any JAX call."""
    from jax.experimental.pallas import tpu as pltpu

    stack = contextlib.ExitStack()
    stack.enter_context(_jax_precision(arrays))
    stack.enter_context(pltpu.force_tpu_interpret_mode())
    return stack


def _tpu_grad(fn: Any, names: dict[str, str], extras: Any, device: str = "cpu") -> Any:
    """The jax adapter's ``grad_fn`` (``jax.vjp``), called in TPU interpret mode: the kernel's
    backward ``pallas_call`` s are traced when the pullback runs, so the whole call is within."""
    grad_fn = _jax_grad(fn, names, extras, device)

    @functools.wraps(grad_fn)
    def interpreted(*args: Any, **kwargs: Any) -> Any:
        with _tpu_interpreted([]):
            return grad_fn(*args, **kwargs)

    return interpreted


TPU = dataclasses.replace(FRAMEWORK, around=_tpu_interpreted, grad=_tpu_grad)
"""The jax adapter's record for the TPU kernels: each call (and each backward) in TPU interpret
mode."""


def _with_batch(x: Any, ndim: int) -> Any:  # (n, d) | (h, n, d) | (b, h, n, d) -> (b, h, n, d)
    return x.reshape((1,) * (4 - ndim) + x.shape)


def pallas_tpu_flash(q: Any, k: Any, v: Any, *, causal: bool = False, sm_scale: float | None = None,
                     cu_seqlens_q: Any = None, cu_seqlens_k: Any = None) -> Any:
    """``jax.experimental.pallas.ops.tpu.flash_attention.flash_attention`` in TPU interpret mode,
    its default ``BlockSizes`` (128 everywhere, ``block_b=1``), ``sm_scale`` 1/√d_k unless given
    (its own default is 1.0). Its layout is the suite's ``bhnd``; 2-D and 3-D inputs are read
    with leading axes of one (a reshape).

    Packed sequences (``cu_seqlens_q``, ``cu_seqlens_k``: 3-D inputs ``(heads, total, d)``) are
    passed as the kernel's ``SegmentIds(q, kv)``: each row's and each key's sequence number, which
    is what the offsets say, in the kernel's spelling."""
    from jax.experimental.pallas.ops.tpu import flash_attention as tpu

    ndim = q.ndim
    segments = None
    if cu_seqlens_q is not None:
        segments = tpu.SegmentIds(q=_sequence_ids(cu_seqlens_q, q.shape[-2])[None],
                                  kv=_sequence_ids(cu_seqlens_k, k.shape[-2])[None])
    out = tpu.flash_attention(*(_with_batch(x, ndim) for x in (q, k, v)), segment_ids=segments,
                              causal=causal, sm_scale=_scale(q, sm_scale))
    return out.reshape(q.shape[:-1] + v.shape[-1:])


def _sequence_ids(offsets: Any, n: int) -> Any:  # [b + 1] offsets -> [n] int32: each row's sequence
    import jax.numpy as jnp

    return (jnp.searchsorted(jnp.asarray(offsets), jnp.arange(n), side="right") - 1).astype(jnp.int32)


def tpu_flash_target(device: str = "cpu") -> Target:
    """The ``pallas_tpu_flash`` built-in target: `pallas_tpu_flash`, forward and backward (its
    ``custom_vjp``: the dK/dV and dQ kernels)."""
    import jax.experimental.pallas.ops.tpu.flash_attention  # noqa: F401

    return wrap(
        TPU, pallas_tpu_flash,
        name=f"jax {installed_version('jax')} pallas ops.tpu.flash_attention (TPU interpret)",
        device=device, grad=True,
        rename={"scale": "sm_scale"},
        dtypes=("float16", "float32", *dtypes.bfloat16_if_installed()),
        ndims=(2, 3, 4),
        supports_scale=True,
        causal_alignment="top_left",  # col_ids <= row_ids over the whole sequence
        # "Head count mismatch" (a ValueError): no grouped K/V heads
        supports_gqa=False,
        # "V model dimension unequal to KV model dimension unsupported" (NotImplementedError)
        equal_head_dims=True,
        # "head_dim should be a multiple of 128 if larger" (NotImplementedError), below 128 any
        # (any below 128: the widths declared are the powers of two and the multiples of 128)
        head_dims=(1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512),
        # block_q = block_k_major = block_k = 128: "block_q should be smaller or equal to
        # q_seq_len", "kv_seq_len should be divisible by block_k_major"
        seq_multiple=128,
        empty_keys="raise",
        supports_varlen=True,
        # A query whose packed sequence has no key sees none: its segment mask adds the finite
        # DEFAULT_MASK_VALUE (-0.7·float32's max) to every score, which then tie, so the row is the
        # plain mean of all the values (measured; the suite's "uniform", as the jax target's rows).
        masked_rows={"varlen": "uniform"},
        compiles_per_shape=True,
        deadline_s=180.0,
    )


def tpu_paged_target(device: str = "cpu") -> Target:
    """The ``pallas_tpu_paged`` built-in target: `pallas_tpu_paged` (forward only)."""
    import jax.experimental.pallas.ops.tpu.paged_attention  # noqa: F401

    return wrap(TPU, pallas_tpu_paged,
                name=f"jax {installed_version('jax')} pallas ops.tpu.paged_attention (TPU interpret)",
                device=device,
                rename={"scale": "sm_scale", "block_table": "page_indices", "kv_lengths": "lengths"},
                # Its K and V pages are cast to bfloat16 as they are loaded, whatever their dtype
                # (MultiPageAsyncCopyDescriptor.wait_and_get_loaded → _maybe_dequantize(...,
                # dtype=jnp.bfloat16)): float16 and float32 caches get bfloat16's accuracy
                # (measured 3.4e-3 from the golden in float32; docs/peers.md, "Pallas").
                computes={"float32": "bfloat16"},
                # Found, verified, declared (docs/peers.md, "Pallas", with the replay lines).
                expected_failures={
                    "paged_reads_only_its_keys": ADDS_ITS_MASK,
                    "paged_matches_golden": ADDS_ITS_MASK,
                    "paged_block_size_invariant": ADDS_ITS_MASK,
                },
                **(_paged_declarations() | {
                    # Not float16: computed in bfloat16 it would be declared `computes={"float16":
                    # "bfloat16"}`, and the laws then take bfloat16's range for float16 inputs
                    # (large_values draws values up to bfloat16's max / 4, kv_lengths_is_truncation
                    # scales hidden keys by bfloat16's 1e5, not float16's 10): inf inputs, a bug
                    # of the laws (docs/peers.md, "Pallas"), so float16 waits for its fix.
                    "dtypes": ("float32", *dtypes.bfloat16_if_installed())}))


# --- ops.tpu.splash_attention -----------------------------------------------------------------------


def pallas_splash(q: Any, k: Any, v: Any, *, causal: bool = False, sm_scale: float | None = None,
                  mask: Any = None) -> Any:  # (h, n_q, d_k), (g, n_k, d_k), (g, n_k, d_v) -> (h, n_q, d_v)
    """``jax.experimental.pallas.ops.tpu.splash_attention``'s ``make_splash_mha_single_device``
    in TPU interpret mode, its default ``BlockSizes`` (128), q scaled first (`_prescaled`: the
    kernel takes no scale). Its inputs are one sequence's ``[heads, n, d]`` (2-D inputs are read as
    one head). Its mask is the kernel's own argument, ``[heads, n_q, n_k]``: ``causal`` is its
    ``CausalMask`` (top-left), a ``mask=`` the boolean array (a dynamic mask), broadcast to the
    heads and ANDed with the causal one when both are given."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    ndim = q.ndim
    q, k, v = (x[None] if ndim == 2 else x for x in (q, k, v))
    h, n_q, n_k = q.shape[0], q.shape[1], k.shape[1]
    if mask is None:
        shape = (n_q, n_k)
        heads = splash.MultiHeadMask([splash.CausalMask(shape) if causal else splash.FullMask(shape)
                                      for _ in range(h)])
        kernel = splash.make_splash_mha_single_device(heads)
    else:
        keep = mask.reshape(mask.shape[-3:]) if mask.ndim > 3 else mask  # one sequence: leading axes of 1
        keep = jnp.broadcast_to(keep, (h, n_q, n_k))
        if causal:
            keep = keep & jnp.tril(jnp.ones((n_q, n_k), dtype=bool))
        kernel = splash.make_splash_mha_single_device(keep)
    out = kernel(_prescaled(q, sm_scale), k, v)
    return out[0] if ndim == 2 else out


def splash_target(device: str = "cpu") -> Target:
    """The ``pallas_splash`` built-in target: `pallas_splash`, forward and backward (its
    ``custom_vjp``)."""
    import jax.experimental.pallas.ops.tpu.splash_attention  # noqa: F401

    return wrap(
        TPU, pallas_splash,
        name=f"jax {installed_version('jax')} pallas ops.tpu.splash_attention (TPU interpret)",
        device=device, grad=True, rename={"scale": "sm_scale"},
        dtypes=("float16", "float32", *dtypes.bfloat16_if_installed()),
        ndims=(2, 3),  # one sequence: q [heads, n, d]
        supports_scale=True,
        supports_mask=True,
        causal_alignment="top_left",  # CausalMask: q_ids >= kv_ids
        # grouped K/V heads: query head i reads K/V head i // (h/g) (its MHA checks that "num_q_heads
        # % num_kv_heads" is 0, the message naming them the other way round)
        supports_gqa=True,
        # block_q = block_kv = block_kv_compute = 128
        seq_multiple=128,
        # Masked scores get a finite mask_value (-0.7·float32's max), and blocks its mask leaves
        # empty are skipped: a row with no visible key gets a mean of some values (measured: not
        # zeros, not the mean of all), which depends on the blocks its query block visits.
        # Nothing is promised, so nothing is checked; the gradient laws then keep off such rows.
        masked_rows="any",
        empty_keys="raise",
        compiles_per_shape=True,
        deadline_s=180.0,
        # Found, verified, declared (docs/peers.md, "Pallas", with the replay line).
        expected_failures={
            "empty_keys": "n_k = 0 fails the mask processing's `assert current_block_mask.size > 0`: an "
                          "AssertionError with no message, not a ValueError naming the length",
        },
    )


TARGETS = {"pallas_mha": mha_target, "pallas_decode": decode_target, "pallas_gpu_paged": gpu_paged_target,
           "pallas_tpu_flash": tpu_flash_target, "pallas_tpu_paged": tpu_paged_target,
           "pallas_splash": splash_target}
"""The built-in targets of this module (`spec.adapters.ADAPTERS` names them under ``jax``)."""
