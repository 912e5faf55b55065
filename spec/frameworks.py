"""Framework targets: PyTorch's and JAX's scaled dot-product attention as targets of the suite.

(The per-dtype table that runs them is `spec.peers`.) At the end,
``torch_flex_paged_attention``: PyTorch's FlexAttention over a paged (and float8) KV cache, an
adapter with the paged-cache signature, not yet a target.

Each adapter takes NumPy arrays in the suite's layout — q ``[..., n_q, d_k]``, k ``[..., n_k, d_k]``,
v ``[..., n_k, d_v]`` with leading dims ``(batch, heads)``, ``(heads,)`` or none — converts them
to the framework's tensors (bit for bit, float16 and bfloat16 included), calls the framework's own
attention and converts the result back. Nothing is computed here that the framework would compute
itself, so a failure of the suite is the framework's.

The declarations in `torch_target` and `jax_target` are measured, not assumed
(torch 2.13.0+cpu and jax 0.10.2 on CPU; ``tests/test_peers.py`` re-measures the ones a
new version could change):

==========================  =================================  =====================================
behaviour                   torch SDPA (math and flash CPU)    jax.nn.dot_product_attention ('xla')
==========================  =================================  =====================================
query row seeing no key     zeros (bool or -inf float mask)    plain mean of ALL the values
                                                               (mask is a finite -0.7·max, so the
                                                               row's scores tie)
``causal`` with n_q ≠ n_k   top-left (query i sees j ≤ i)      top-left
``causal`` and ``mask``     refused together; the adapter      both accepted, ANDed
                            ANDs them into one mask
GQA (h query, g KV heads)   ``enable_gqa=True``; query head    native; query head i reads KV head
                            i reads KV head i // (h/g)         i // (h/g)
d_v ≠ d_k                   yes (math kernel)                  refused; the adapter calls it once
                                                               per d_k-wide slice of V (exact:
                                                               output column c depends on V's
                                                               column c alone)
float64                     yes                                float64 out (the adapter enables x64
                                                               for the call), but logits and
                                                               softmax run in float32: float32
                                                               accuracy, so float64 is not declared
bfloat16 (via ml_dtypes)    yes                                yes, called eagerly: under jax.jit
                                                               the CPU dot refuses precision
                                                               BF16_BF16_F32, as F16_F16_F32 for
                                                               float16
==========================  =================================  =====================================

gradients: autograd through SDPA (torch) and ``jax.vjp`` of the same call (jax), each with every
keyword its target declares and ``dbias``. Two JAX findings, left failing or recorded rather than
declared away (docs/peers.md): under ``jax.jit`` with d_k ≤ 2, XLA fuses q·kᵀ into the softmax's
``exp(s − max)`` and recomputes it with a fused multiply-add, so scores ≳ 1e10 give NaN
(``large_logits``; eagerly it is right); and a row that an all −inf bias empties is NaN, which the
backward spreads to dk and dv of every key of that head.

PyTorch's SDPA gave NaN for fully-masked rows in 2023 (pytorch/pytorch#103963); its math kernel
now zeroes them (``_safe_softmax``). A target can record such a known deviation with
``masked_rows="nan"`` — the suite then checks that the declared behaviour holds, never less.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any

import numpy as np

from spec import dtypes, golden
from spec.calling import declared_by
from spec.keywords import gradient_extras, registered
from spec.target import Target, _callable_name

Array = np.ndarray


def _bfloat16() -> np.dtype | None:
    """NumPy's bfloat16 (from ml_dtypes, which JAX installs), or None where it is not installed."""
    return dtypes.as_dtype(dtypes.BFLOAT16) if dtypes.has_bfloat16() else None


def _check_mask(mask: Any) -> Array:
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        # A float mask would be *added* to the scores by both frameworks: refuse, never reinterpret.
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {arr.dtype}")
    return arr


def library_names(library: str) -> dict[str, str]:
    """How ``library`` (``"torch"``, ``"jax"``, ...) spells the suite's keyword arguments, read from
    the keywords' declarations (`spec.keywords.Keyword.names`, which name a keyword's first
    argument): ``library_names("jax")["window"] == "local_window_size"``. The default renames of
    `from_torch` and `from_jax`, and the spellings the built-in wrappers pass, so a library's
    spelling is declared once, next to its keyword."""
    return {kw.passes[0]: kw.names[library] for kw in registered().values() if library in kw.names}


def _spelled(library: str, **arguments: Any) -> dict[str, Any]:
    """``arguments``, named as the suite names its keywords, renamed as ``library`` spells them
    (`library_names`; a keyword it does not spell keeps the suite's name)."""
    names = library_names(library)
    return {names.get(key, key): value for key, value in arguments.items()}


# ---------------------------------------------------------------------------------------- PyTorch


def _to_torch(x: Array) -> Any:  # NumPy -> torch, same bits, its own memory
    import torch

    x = np.ascontiguousarray(x)
    bf16 = _bfloat16()
    # (Not ``x.dtype == _bfloat16()``: np.dtype(None) is float64, so float64 == None is True.)
    if bf16 is not None and x.dtype == bf16:
        # torch.from_numpy knows no bfloat16: move the 16-bit patterns and relabel them.
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(x.copy())


def _from_torch(t: Any) -> Array:  # torch -> NumPy, same bits
    import torch

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        bf16 = _bfloat16()
        if bf16 is None:
            raise TypeError("a bfloat16 result needs ml_dtypes to become a NumPy array")
        return t.view(torch.int16).numpy().view(bf16)
    return t.numpy()


def torch_attention(
    q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, bias: Array | None = None, dropout_p: float | None = None,
    seed: int | None = None,
) -> Array:  # [..., h, n_q, d_k], [..., g, n_k, d_k], [..., g, n_k, d_v] -> [..., h, n_q, d_v]
    """``torch.nn.functional.scaled_dot_product_attention`` on NumPy arrays (`_sdpa`)."""
    bias_t = None if bias is None else _to_torch(np.asarray(bias).astype(np.asarray(q).dtype))
    out = _sdpa(*(_to_torch(np.asarray(x)) for x in (q, k, v)), causal=causal, mask=mask, scale=scale,
                bias=bias_t, dropout_p=dropout_p, seed=seed)
    return _from_torch(out)


def _sdpa(q: Any, k: Any, v: Any, *, causal: bool, mask: Array | None, scale: float | None, bias: Any,
          dropout_p: float | None, seed: int | None) -> Any:  # torch tensors in, a torch tensor out
    """SDPA as the suite calls it. SDPA refuses ``attn_mask`` together with ``is_causal``; both mean
    the same visibility as the suite's (top-left causal ANDed with a boolean mask), so they are
    ANDed into one mask first. A float ``bias`` (a tensor in q's dtype, as SDPA requires) is SDPA's
    float ``attn_mask`` (added to the scaled scores); with a mask or ``causal`` too, hidden keys
    are folded into it as ``-inf`` by ``torch.where`` (so a bias that requires grad gets 0 there).
    ``dropout_p`` with ``seed``: SDPA draws its mask from torch's global generator, so the call
    seeds it (``torch.manual_seed``) inside ``torch.random.fork_rng``, leaving the caller's random
    state as it was; the forward and the backward's forward then drop the same weights. Grouped
    K/V heads (``g < h``) turn on ``enable_gqa``."""
    import torch
    import torch.nn.functional as F

    attn_mask: Any = None
    if mask is not None:
        attn_mask = _to_torch(_check_mask(mask))  # its own memory: a read-only mask stays untouched
    if causal and (mask is not None or bias is not None):
        causal_part = torch.from_numpy(golden.causal_visible(q.shape[-2], k.shape[-2]))
        attn_mask = causal_part if attn_mask is None else attn_mask & causal_part
        causal = False
    if bias is not None:
        attn_mask = bias if attn_mask is None else torch.where(attn_mask, bias, torch.tensor(-np.inf,
                                                                                            dtype=bias.dtype))
    gqa = q.ndim >= 3 and k.ndim >= 3 and k.shape[-3] != q.shape[-3]
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        # SDPA explains on each call why its flash kernel was not used (e.g. d_v ≠ d_k); noise here.
        warnings.filterwarnings("ignore", message=r".*(kernel not used|Flash attention requires)")
        if seed is not None:
            torch.manual_seed(seed)
        # bias is not renamed to attn_mask by `_spelled`: it is folded with mask= and causal into
        # SDPA's one attn_mask above, which is more than a rename.
        dropout = _spelled("torch", dropout_p=float(dropout_p or 0.0))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale,
                                              enable_gqa=gqa, **dropout)


def torch_attention_grad(
    q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, bias: Array | None = None, dropout_p: float | None = None,
    seed: int | None = None,
) -> tuple[Array, Array, Array, dict[str, Array]]:  # [..., n_q, d_k], ..., d_out [..., n_q, d_v]
    """``(dq, dk, dv, {"dbias": ...})`` of `torch_attention` for the upstream gradient ``d_out``,
    by PyTorch's autograd through SDPA's own backward (``dbias`` when a bias is given: SDPA
    differentiates a float ``attn_mask``, summed over the axes it was broadcast along)."""
    dtype = np.asarray(q).dtype
    q_, k_, v_ = (_to_torch(np.asarray(x)).requires_grad_() for x in (q, k, v))
    bias_ = None if bias is None else _to_torch(np.asarray(bias).astype(dtype)).requires_grad_()
    out = _sdpa(q_, k_, v_, causal=causal, mask=mask, scale=scale, bias=bias_, dropout_p=dropout_p, seed=seed)
    out.backward(_to_torch(np.asarray(d_out)))
    extras = {} if bias_ is None else {"dbias": _grad_of(bias_).astype(np.asarray(bias).dtype)}
    return _grad_of(q_), _grad_of(k_), _grad_of(v_), extras


def _grad_of(t: Any) -> Array:
    """A leaf tensor's gradient as NumPy (zeros where the output did not depend on it)."""
    import torch

    return _from_torch(t.grad if t.grad is not None else torch.zeros_like(t))


def torch_target() -> Target:
    """The ``torch`` built-in target: SDPA on CPU, with the capabilities measured above."""
    import torch

    return Target(
        torch_attention,
        name=f"torch {torch.__version__} scaled_dot_product_attention",
        # bfloat16 where ml_dtypes gives NumPy the dtype (measured: passes every law, as float16).
        dtypes=("float16", "float32", "float64", *dtypes.bfloat16_if_installed()),
        ndims=(2, 3, 4),
        supports_mask=True,
        supports_scale=True,
        causal_alignment="top_left",
        masked_rows="zeros",
        exact_masking=True,
        supports_gqa=True,
        # Measured: a float attn_mask is added to the scaled scores (float64: 7e-16 from the
        # golden), an all -inf row gives zeros; dropout after the softmax, kept weights ×1/(1 − p),
        # reproducible under torch.manual_seed (float16, bfloat16, float32, float64), and p = 0 is
        # bit-identical to no dropout. No lse: the public SDPA does not return it (only the private
        # aten._scaled_dot_product_flash_attention_for_cpu does).
        supports_bias=True,
        supports_dropout=True,
        # Generous, as for jax: on a loaded machine a slow first call is not a hang.
        deadline_s=60.0,
        # Autograd through SDPA: every keyword above reaches the backward, and a float attn_mask
        # gets its gradient (measured on torch 2.13: attn_mask.grad in every dtype, summed over its
        # broadcast axes); a seeded forward drops the same weights with or without requires_grad.
        grad_fn=torch_attention_grad,
        grad_extras=("dbias",),
    )


# -------------------------------------------------------------------------------------------- JAX


def _to_btnh(x: Any) -> Any:  # [n, d] | [h, n, d] | [b, h, n, d] -> [b, n, h, d] (NumPy or jax)
    if x.ndim == 2:
        return x[None, :, None, :]
    if x.ndim == 3:
        return x.swapaxes(0, 1)[None]
    if x.ndim == 4:
        return x.swapaxes(1, 2)
    raise ValueError(f"jax.nn.dot_product_attention takes (n, d), (h, n, d) or (b, h, n, d), got {x.shape}")


def _from_btnh(out: Any, ndim: int) -> Any:  # [b, n, h, d] -> the input's rank, heads before n
    if ndim == 2:
        return out[0, :, 0, :]
    if ndim == 3:
        return out[0].swapaxes(0, 1)
    return out.swapaxes(1, 2)


def _lse_from_btn(lse: Any, ndim: int) -> Any:  # [b, n_q, h] -> [..., n_q], heads before n
    if ndim == 2:
        return lse[0, :, 0]
    if ndim == 3:
        return lse[0].swapaxes(0, 1)
    return lse.swapaxes(1, 2)


def _jax_dot_product_attention(
    q: Any, k: Any, v: Any, mask: Any, scale: Any, bias: Any, lengths: Any, *, causal: bool,
    window: tuple[int, int] | None, lse: bool,
) -> Any:  # jax arrays [..., h, n_q, d_k], [..., g, n_k, d_k], [..., g, n_k, d_v] -> [..., h, n_q, d_v]
    """``jax.nn.dot_product_attention(implementation="xla")`` on jax arrays in the suite's layout,
    traceable: `jax_attention` calls it, `jax_attention_grad` differentiates it with ``jax.vjp``
    (so the transposes, broadcasts and V slices below are differentiated too, and a bias
    broadcast here gets its gradient summed back to its own shape).

    JAX wants ``[batch, n, heads, d]`` and equal widths ``d_v = d_k``: the arrays are transposed,
    and for ``d_v ≠ d_k`` JAX is called once per ``d_k``-wide slice of V (the last one
    zero-padded): output column c is the weighted sum of V's column c alone, so the slices are
    exact, and the scale is still JAX's own."""
    import jax
    import jax.numpy as jnp

    # Any: its overloads want a literal return_residual, and lse is a bool chosen at run time
    dot_product_attention: Any = jax.nn.dot_product_attention
    ndim = q.ndim
    qj, kj, vj = _to_btnh(q), _to_btnh(k), _to_btnh(v)
    batch = np.broadcast_shapes(qj.shape[:1], kj.shape[:1], vj.shape[:1])
    qj, kj, vj = (jnp.broadcast_to(x, batch + x.shape[1:]) for x in (qj, kj, vj))
    b, n_q, h, d_k = qj.shape
    n_k, d_v = vj.shape[1], vj.shape[3]
    full = (b, h, n_q, n_k)
    mask_j = None if mask is None else jnp.broadcast_to(mask, full)
    bias_j = None if bias is None else jnp.broadcast_to(bias, full)
    n_slices = max(1, -(-d_v // d_k))
    padded = jnp.pad(vj, ((0, 0), (0, 0), (0, 0), (0, n_slices * d_k - d_v)))
    # The keywords that JAX only spells differently (bias, key_value_seq_lengths,
    # local_window_size, return_residual) are spelled as their declarations say (`_spelled`);
    # mask= and is_causal= are the suite's core arguments, not keywords.
    pieces = [
        dot_product_attention(
            qj, kj, padded[..., s * d_k:(s + 1) * d_k], mask=mask_j, scale=scale, is_causal=causal,
            implementation="xla", **_spelled("jax", bias=bias_j, kv_lengths=lengths, window=window,
                                               return_lse=lse))
        for s in range(n_slices)
    ]
    outs = [p[0] if lse else p for p in pieces]
    out = _from_btnh(jnp.concatenate(outs, axis=-1)[..., :d_v], ndim)
    if lse:
        return out, _lse_from_btn(pieces[0][1], ndim)
    return out


def _jax_arguments(
    q: Array, k: Array, v: Array, mask: Array | None, scale: float | None, bias: Array | None,
    kv_lengths: Array | None, window: tuple[int, int] | None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The suite's NumPy arguments as `_jax_dot_product_attention` takes them: q, k, v, the mask
    (checked boolean), the scale and the bias (in q's dtype, as JAX adds it), the key lengths
    (int32) as jax arrays; the window as a static pair of ints."""
    import jax.numpy as jnp

    def jax_or_none(x: Any, dtype: Any) -> Any:
        return None if x is None else jnp.asarray(np.asarray(x).astype(dtype))

    dtype = q.dtype
    arrays = (jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
              None if mask is None else jnp.asarray(_check_mask(mask)),
              None if scale is None else jnp.asarray(scale, dtype=dtype),
              jax_or_none(bias, dtype), jax_or_none(kv_lengths, np.int32))
    return arrays, {"window": None if window is None else (int(window[0]), int(window[1]))}


def _jax_precision(arrays: list[Array]) -> Any:
    """float64 inputs: x64 enabled for the call (JAX would otherwise make them float32)."""
    import jax

    return jax.enable_x64(True) if any(x.dtype == np.float64 for x in arrays) else contextlib.nullcontext()


def jax_attention(
    q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, bias: Array | None = None, kv_lengths: Array | None = None,
    window: tuple[int, int] | None = None, return_lse: bool = False,
) -> Any:  # [..., h, n_q, d_k], [..., g, n_k, d_k], [..., g, n_k, d_v] -> [..., h, n_q, d_v] (, [..., n_q])
    """``jax.nn.dot_product_attention(implementation="xla")`` on NumPy arrays
    (`_jax_dot_product_attention`). float64 runs with x64 enabled for the call (JAX computes
    float32 otherwise). The keywords of docs/targets.md are JAX's own: ``bias`` → ``bias``
    (``[b, h, n_q, n_k]``), ``kv_lengths`` → ``key_value_seq_lengths`` (int32), ``window`` →
    ``local_window_size`` (top-left, as its causal mask), ``return_lse`` → ``return_residual``
    (its lse ``[b, n_q, h]``, natural log, float32).
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    with _jax_precision([q]):
        arrays, static = _jax_arguments(q, k, v, mask, scale, bias, kv_lengths, window)
        got = _jax_core(jit=_jittable(q.dtype))(*arrays, causal=causal, lse=return_lse, **static)
    if return_lse:
        return np.array(got[0]), np.array(got[1])  # writable copies
    return np.array(got)


def jax_attention_grad(
    q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, bias: Array | None = None, kv_lengths: Array | None = None,
    window: tuple[int, int] | None = None,
) -> tuple[Array, Array, Array, dict[str, Array]]:  # [..., n_q, d_k], ..., d_out [..., n_q, d_v]
    """``(dq, dk, dv, {"dbias": ...})`` of `jax_attention` for the upstream gradient ``d_out``:
    ``jax.vjp`` of the same call (`_jax_dot_product_attention`) in q, k, v and the bias, the other
    keywords held fixed. ``dbias`` (when a bias is given) in the bias's shape and dtype as passed,
    summed over the axes it was broadcast along."""
    import jax.numpy as jnp

    q, k, v, d_out = (np.asarray(x) for x in (q, k, v, d_out))
    with _jax_precision([q]):
        arrays, static = _jax_arguments(q, k, v, mask, scale, bias, kv_lengths, window)
        grad = _jax_grad_core(jit=_jittable(q.dtype))
        dq, dk, dv, dbias = grad(*arrays, jnp.asarray(d_out.astype(q.dtype)), causal=causal, **static)
    extras = {} if bias is None else {"dbias": np.array(dbias).astype(np.asarray(bias).dtype)}
    return np.array(dq), np.array(dk), np.array(dv), extras


def _jittable(dtype: np.dtype) -> bool:
    """Under jit, float16 and bfloat16 fail on CPU: JAX asks dot_general for precision F16_F16_F32
    (BF16_BF16_F32) and falls back only when that raises at once, as it does eagerly but not at
    jit's later lowering ("Algorithm not supported by the ElementalIrEmitter"), so they run eagerly."""
    return dtype.itemsize > 2


@functools.cache
def _jax_core(jit: bool) -> Any:
    """`_jax_dot_product_attention`, under ``jax.jit`` if asked: one XLA compilation per shape
    instead of one per operation (measured 1.2 s against 3.7 s per new shape on this CPU). The
    scale is traced, so a new scale= does not recompile."""
    import jax

    core = _jax_dot_product_attention
    return jax.jit(core, static_argnames=("causal", "window", "lse")) if jit else core


@functools.cache
def _jax_grad_core(jit: bool) -> Any:
    """The pullback of `_jax_dot_product_attention` in q, k, v and the bias, applied to ``d_out``
    (``jax.vjp``), under ``jax.jit`` if asked (as `_jax_core`)."""
    import jax

    def grad(q: Any, k: Any, v: Any, mask: Any, scale: Any, bias: Any, lengths: Any, d_out: Any, *,
             causal: bool, window: tuple[int, int] | None) -> Any:
        def forward(q: Any, k: Any, v: Any, bias: Any) -> Any:
            return _jax_dot_product_attention(q, k, v, mask, scale, bias, lengths, causal=causal,
                                              window=window, lse=False)

        _, pull = jax.vjp(forward, q, k, v, bias)
        return pull(d_out)

    return jax.jit(grad, static_argnames=("causal", "window")) if jit else grad


def jax_target() -> Target:
    """The ``jax`` built-in target: ``jax.nn.dot_product_attention`` on CPU (XLA), as measured."""
    import jax

    return Target(
        jax_attention,
        name=f"jax {jax.__version__} nn.dot_product_attention",
        # Not float64: JAX computes the logits and the softmax in float32 whatever the input, so a
        # float64 call is only float32-accurate (measured 1.4e-7 from the float64 golden) and fails
        # matches_golden; tests/test_peers.py keeps that failure visible.
        # bfloat16 (where ml_dtypes is installed, as it is with jax) runs eagerly, as float16 does.
        dtypes=("float16", "float32", *dtypes.bfloat16_if_installed()),
        ndims=(2, 3, 4),
        supports_mask=True,
        supports_scale=True,
        causal_alignment="top_left",
        # A row with no visible key gets the plain mean of all n_k values (measured, see above).
        masked_rows="uniform",
        exact_masking=True,
        supports_gqa=True,
        # Measured against the golden (float32, ~2e-7): bias is added to the scaled scores;
        # key_value_seq_lengths hides keys j >= L per batch row (L = 0: the plain mean of all the
        # values, as masked_rows="uniform" says); local_window_size=(left, right) is top-left
        # aligned, with and without is_causal; return_residual is the natural-log lse. An
        # all -inf bias row gives NaN. A row that sees no key has a finite lse (-2.4e38, from
        # the finite mask fill), not -inf: with masked_rows="uniform" such a row is not empty.
        supports_bias=True,
        supports_kv_lengths=True,
        supports_window=True,
        returns_lse=True,
        # Each new shape is an XLA compilation (~1 s here, several under load), not a hang.
        deadline_s=60.0,
        # jax.vjp of the same call: every keyword above reaches the backward, and the bias gets
        # its gradient (summed over the axes it was broadcast along). Measured: passes every
        # gradient law (float16, bfloat16, float32); a hidden key gets exactly zero dk, dv and
        # dbias. The all -inf bias row above is NaN in the backward too, and spreads NaN to dk
        # and dv of every key of its head (tests/test_peers.py); no law draws that row, as
        # masked_rows="uniform" keeps the gradient laws off rows that see no key.
        grad_fn=jax_attention_grad,
        grad_extras=("dbias",),
    )


# ------------------------------------------------------------------------------ wrapping a function


def _check_rename(rename: dict[str, str] | None) -> dict[str, str]:
    if rename is None:
        return {}
    if not isinstance(rename, dict) or not all(isinstance(x, str) for x in (*rename, *rename.values())):
        raise TypeError(f"rename must be a dict of keyword names to keyword names, got {rename!r}")
    passed = declared_by()  # the keywords a target's fn may receive
    unknown = sorted(set(rename) - set(passed))
    if unknown:
        raise ValueError(f"rename names {', '.join(map(repr, unknown))}, which the suite never passes; "
                         f"its keywords are {', '.join(passed)}")
    shared = sorted({to for to in rename.values() if list(rename.values()).count(to) > 1})
    if shared:
        raise ValueError(f"rename gives {', '.join(map(repr, shared))} to more than one keyword")
    return dict(rename)


def _renames(library: str, rename: dict[str, str] | None) -> dict[str, str]:
    """The adapter's renames: ``library``'s own spellings (`library_names`), then the user's
    ``rename``, which wins — a keyword it renames, and a spelling it gives to another keyword
    (``{"mask": "attn_mask"}`` for SDPA), drop the default."""
    given = _check_rename(rename)
    defaults = {key: to for key, to in library_names(library).items()
                if key not in given and to not in given.values()}
    return defaults | given


def _wrap(fn: Any, to: Any, back: Any, names: dict[str, str], around: Any) -> Any:
    """``fn`` taking NumPy arrays: array arguments converted by ``to``, keywords renamed (``names``), results
    (an array, or a tuple of them) converted by ``back``; ``around(arrays)`` is a context the call
    runs in."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")

    def wrapped(q: Array, k: Array, v: Array, **kwargs: Any) -> Any:
        arrays = [np.asarray(x) for x in (q, k, v)]
        with around(arrays):
            given = {names.get(key, key): to(x) if isinstance(x, np.ndarray) else x
                     for key, x in kwargs.items()}
            got = fn(*(to(x) for x in arrays), **given)
            return tuple(back(x) for x in got) if isinstance(got, (tuple, list)) else back(got)

    wrapped.__name__ = wrapped.__qualname__ = getattr(fn, "__name__", type(fn).__name__)
    wrapped.__module__ = getattr(fn, "__module__", __name__)
    return wrapped


def _differentiated(extras: Any) -> dict[str, str]:
    """The keyword argument each declared extra gradient is the gradient of (``dbias`` -> ``bias``);
    names the keywords do not define are left to `Target`'s validation, which names them."""
    known = gradient_extras()
    names = extras if isinstance(extras, (tuple, list)) else ()
    return {name: known[name].passes[0] for name in names if name in known}


def _grad_target(fn: Any, wrapped: Any, grad_fn: Any, name: str, declarations: dict[str, Any]) -> Target:
    if "grad_fn" in declarations:
        raise TypeError("give grad=True or grad_fn=, not both")
    return Target(wrapped, name=name or _callable_name(fn), grad_fn=grad_fn, **declarations)


def from_torch(
    fn: Any, *, rename: dict[str, str] | None = None, name: str = "", grad: bool = False, **declarations: Any
) -> Target:
    """A target from a PyTorch attention function, in one line:
    ``spec.from_torch(F.scaled_dot_product_attention, rename={"causal": "is_causal", "mask": "attn_mask"})``.

    ``fn(q, k, v, **keywords)`` gets torch tensors made from the suite's NumPy arrays bit for bit
    (bfloat16 and float16 included; masks, biases and lengths too) and returns a tensor (or, with
    ``return_lse=True``, a tuple), converted back bit for bit. ``rename`` maps the suite's keyword
    names (``causal``, ``mask``, ``scale``, ``bias``, ...) to ``fn``'s; by default each keyword
    is spelled as PyTorch spells it (its declaration's ``names["torch"]``, `library_names`:
    ``bias`` → ``attn_mask``), and ``rename`` overrides that (``{"bias": "bias"}`` keeps the
    suite's name; a spelling ``rename`` gives to another keyword drops its default). ``declarations`` are
    `spec.Target`'s (``layout``, ``dtypes``, ``supports_mask``, ...); a keyword is passed
    only when declared, as for any target.

    ``grad=True`` also builds the target's ``grad_fn`` by autograd: q, k, v (and the input of each
    declared ``grad_extras``: ``bias`` for ``dbias``, ``sinks`` for ``dsinks``) require grad, ``fn``
    runs with the same keywords, and ``out.backward(d_out)`` gives the gradients.
    """
    names = _renames("torch", rename)
    wrapped = _wrap(fn, _to_torch, _from_torch, names, lambda arrays: contextlib.nullcontext())
    if not grad:
        return Target(wrapped, name=name or _callable_name(fn), **declarations)
    return _grad_target(fn, wrapped, _torch_grad(fn, names, declarations.get("grad_extras", ())), name,
                        declarations)


def _torch_grad(fn: Any, names: dict[str, str], extras: Any) -> Any:
    """``grad_fn`` for a torch ``fn``: the gradients of ``Σ fn(q, k, v, **keywords) ∘ d_out`` by
    autograd, as NumPy arrays, with the declared extras' in a dict."""
    wanted = _differentiated(extras)

    def grad_fn(q: Array, k: Array, v: Array, d_out: Array, **kwargs: Any) -> Any:
        leaves = [_to_torch(np.asarray(x)).requires_grad_() for x in (q, k, v)]
        inputs: dict[str, Any] = {}
        for key, x in kwargs.items():
            if isinstance(x, np.ndarray):
                x = _to_torch(x)
                if key in wanted.values() and x.is_floating_point():
                    x.requires_grad_()
            inputs[key] = x
        out = fn(*leaves, **{names.get(key, key): x for key, x in inputs.items()})
        out.backward(_to_torch(np.asarray(d_out)))
        grads = tuple(_grad_of(t) for t in leaves)
        if not wanted:
            return grads
        return (*grads, {extra: _grad_of(inputs[arg]) for extra, arg in wanted.items() if arg in inputs})

    grad_fn.__name__ = grad_fn.__qualname__ = f"{getattr(fn, '__name__', type(fn).__name__)}_grad"
    return grad_fn


def _to_jax(x: Array) -> Any:  # NumPy -> jax.Array, same bits (bfloat16 is ml_dtypes' in both)
    import jax.numpy as jnp

    return jnp.asarray(x)


def _from_jax(x: Any) -> Array:  # jax.Array -> NumPy, same bits, writable
    return np.array(x)


def from_jax(
    fn: Any, *, rename: dict[str, str] | None = None, name: str = "", grad: bool = False, **declarations: Any
) -> Target:
    """A target from a JAX attention function, in one line:
    ``spec.from_jax(jax.nn.dot_product_attention, layout="bnhd", rename={"causal": "is_causal"})``.

    As `from_torch`, with ``jax.Array`` s: the suite's NumPy arrays go in bit for bit (bfloat16
    is ml_dtypes' on both sides), float64 inputs run with x64 enabled for the call, and the results
    come back as NumPy arrays. Keywords are spelled as JAX spells them by default
    (``names["jax"]``: ``window`` → ``local_window_size``, ``kv_lengths`` →
    ``key_value_seq_lengths``), ``rename`` overriding. ``grad=True`` builds ``grad_fn`` with
    ``jax.vjp`` of ``fn`` in q, k, v (and the input of each declared ``grad_extras``), the other
    keywords held fixed.
    """
    names = _renames("jax", rename)
    wrapped = _wrap(fn, _to_jax, _from_jax, names, _jax_precision)
    if not grad:
        return Target(wrapped, name=name or _callable_name(fn), **declarations)
    return _grad_target(fn, wrapped, _jax_grad(fn, names, declarations.get("grad_extras", ())), name,
                        declarations)


def _jax_grad(fn: Any, names: dict[str, str], extras: Any) -> Any:
    """``grad_fn`` for a JAX ``fn``: ``jax.vjp`` of ``fn`` in q, k, v and the declared extras'
    inputs, pulled back from ``d_out``, as NumPy arrays."""
    wanted = _differentiated(extras)

    def grad_fn(q: Array, k: Array, v: Array, d_out: Array, **kwargs: Any) -> Any:
        import jax

        arrays = [np.asarray(x) for x in (q, k, v, d_out)]
        with _jax_precision(arrays):
            free = {key: _to_jax(x) for key, x in kwargs.items()
                    if key in wanted.values() and isinstance(x, np.ndarray) and x.dtype.kind == "f"}
            held = {names.get(key, key): _to_jax(x) if isinstance(x, np.ndarray) else x
                    for key, x in kwargs.items() if key not in free}

            def call(q: Any, k: Any, v: Any, free: dict[str, Any]) -> Any:
                return fn(q, k, v, **held, **{names.get(key, key): x for key, x in free.items()})

            _, pull = jax.vjp(call, *(_to_jax(x) for x in arrays[:3]), free)
            dq, dk, dv, d_free = pull(_to_jax(arrays[3]))
        grads = (_from_jax(dq), _from_jax(dk), _from_jax(dv))
        if not wanted:
            return grads
        return (*grads, {extra: _from_jax(d_free[arg]) for extra, arg in wanted.items() if arg in d_free})

    grad_fn.__name__ = grad_fn.__qualname__ = f"{getattr(fn, '__name__', type(fn).__name__)}_grad"
    return grad_fn


# ------------------------------------------------------------- PyTorch FlexAttention over a paged cache


@functools.cache
def _flex(compiled: bool) -> Any:
    """``flex_attention``, under ``torch.compile`` if asked (one compilation per new shape)."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if compiled else flex_attention


def _float8_to_torch(x: Array) -> Any:  # ml_dtypes float8_e4m3fn -> torch.float8_e4m3fn, same bits
    import torch

    return torch.from_numpy(np.ascontiguousarray(x).view(np.uint8).copy()).view(torch.float8_e4m3fn)


def torch_flex_paged_attention(
    q: Array, k_cache: Array, v_cache: Array, *, causal: bool = False, kv_lengths: Array,
    block_table: Array, k_descale: Array | None = None, v_descale: Array | None = None,
    window: tuple[int, int] | None = None, scale: float | None = None, compiled: bool = True,
) -> Array:  # [b, h, n_q, d_k], pools [num_blocks, block_size, g, d] -> [b, h, n_q, d_v]
    """PyTorch's FlexAttention over a paged KV cache, through ``torch.nn.attention.experimental``'s
    ``PagedAttention`` (its page table and ``convert_logical_block_mask``), on NumPy arrays.

    The pools become FlexAttention's one-row caches ``[1, g, num_blocks · block_size, d]``;
    ``PagedAttention``'s page table is ``block_table``'s used entries and its physical → logical map
    their inverse. The mask is written over logical positions — ``kv_idx < kv_lengths[b]``, and for
    ``causal``/``window`` the diagonal of row b at ``q_idx + kv_lengths[b] − n_q`` (aligned per
    sequence) — and ``convert_logical_block_mask`` turns it into a block mask over physical blocks.
    Grouped K/V heads (``g < h``) turn on ``enable_gqa``.

    ``compiled=True`` runs ``torch.compile(flex_attention)``: the fused, block-sparse kernel, which
    visits only the blocks in the block mask. ``compiled=False`` is FlexAttention's eager path,
    which (its own warning says) is an unfused implementation over the whole score matrix: every
    physical position of the pool, masked afterwards.

    Float8 (``k_descale``, ``v_descale`` ``[batch, g]``): FlexAttention has no float8 cache. The
    adapter moves the e4m3 bits into ``torch.float8_e4m3fn`` and lets torch widen them to q's dtype
    (exact), applies K's scale as a ``score_mod`` (``score · k_descale[b, h // (h/g)]``: the same
    as scaling the keys) and multiplies the output by V's (the same as scaling the values, up to
    rounding). Those two products are the adapter's arithmetic, not a kernel's.

    Measured on torch 2.13.0+cpu (``tests/test_frameworks_cache.py`` re-measures it): both paths
    agree with the reference within float32 rounding, per-sequence causal and window included, and
    a row that sees no key gets zeros. Neither keeps out of what a sequence does not own: the eager
    path reads the whole pool (a NaN in a block nobody owns makes every output NaN); the compiled
    kernel (inductor's C++ ``cpp_fused_flex_attention``) skips the blocks outside the block mask
    but reads the values in the tail of a sequence's last block, where a masked weight of 0 times
    a NaN value makes that sequence's output NaN (a NaN key in the tail is harmless: its score is
    masked). Compiling takes ~15 s per new shape on this machine's CPU.

    A sequence may not list one physical block twice (``PagedAttention`` maps each physical block
    of a row to one logical block).
    """
    import torch
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask

    q = np.asarray(q)
    table, lengths = np.asarray(block_table), np.asarray(kv_lengths)
    batch, heads, n_q, _ = q.shape
    num_blocks, block_size, g = k_cache.shape[:3]
    float8 = k_descale is not None
    q_dtype = _to_torch(q[:0]).dtype  # q's dtype as torch names it (bfloat16 included)

    def pool(x: Array) -> Any:  # [num_blocks, block_size, g, d] -> [1, g, num_blocks · block_size, d]
        t = _float8_to_torch(x).to(q_dtype) if float8 else _to_torch(x)
        return t.permute(2, 0, 1, 3).reshape(1, g, num_blocks * block_size, x.shape[-1])

    used = [-(-int(n) // block_size) for n in lengths]  # blocks holding each sequence's keys
    paged = PagedAttention(num_blocks, block_size, batch, device="cpu")
    for b, count in enumerate(used):
        rows = torch.from_numpy(table[b, :count].astype(np.int64))
        paged.page_table[b, :count] = rows
        paged.physical_to_logical[b, rows] = torch.arange(count)
    kv_len = torch.from_numpy(lengths.astype(np.int64))

    def logical_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        keep = kv_idx < kv_len[b]
        diag = q_idx + kv_len[b] - n_q
        if causal:
            keep = keep & (kv_idx <= diag)
        if window is not None:
            keep = keep & (kv_idx >= diag - window[0]) & (kv_idx <= diag + window[1])
        return keep

    logical_len = max([*used, 1]) * block_size
    logical = create_block_mask(logical_mask, batch, None, n_q, logical_len, device="cpu",
                                BLOCK_SIZE=(128, block_size))
    block_mask = paged.convert_logical_block_mask(logical, kv_len=kv_len)
    score_mod = None
    if float8:
        k_scale = torch.from_numpy(np.asarray(k_descale, dtype=np.float32))
        group = heads // g

        def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return score * k_scale[b, h // group]

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*flex_attention called without torch.compile")
        out = _flex(compiled)(_to_torch(q), pool(k_cache), pool(v_cache), score_mod=score_mod,
                              block_mask=block_mask, scale=scale, enable_gqa=g != heads)
    if float8:
        v_scale = torch.from_numpy(np.asarray(v_descale, dtype=np.float32))  # [batch, g]
        out = out * v_scale.repeat_interleave(heads // g, dim=1)[:, :, None, None].to(out.dtype)
    return _from_torch(out)


def torch_flex_paged(
    q: Array, k: Array, v: Array, *, causal: bool = False, block_table: Array | None = None,
    kv_lengths: Array | None = None, k_descale: Array | None = None, v_descale: Array | None = None,
    window: tuple[int, int] | None = None, scale: float | None = None,
) -> Array:  # [b, h, n_q, d_k], pools [num_blocks, block_size, g, d] (or contiguous) -> [b, h, n_q, d_v]
    """`torch_flex_paged_attention` (eager) as a target's ``fn``: a paged call as it is, and
    contiguous keys ``[b, g, n_k, d]`` as a pool of one block per batch row (block b holds row b's
    n_k keys, every row full), so the suite's other laws run through the same kernel."""
    if block_table is None:
        batch, n_k = k.shape[0], k.shape[2]
        if n_k == 0:
            raise ValueError("a paged cache needs block_size > 0: no keys (n_k = 0) cannot be paged")
        k, v = (np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in (k, v))  # [b, n_k, g, d]: b blocks
        block_table = np.arange(batch, dtype=np.int32)[:, None]
        kv_lengths = np.full(batch, n_k, dtype=np.int32)
    if kv_lengths is None:
        raise TypeError("kv_lengths is required with block_table")
    return torch_flex_paged_attention(q, k, v, causal=causal, kv_lengths=kv_lengths, block_table=block_table,
                                      k_descale=k_descale, v_descale=v_descale, window=window, scale=scale,
                                      compiled=False)


def torch_flex_paged_target() -> Target:
    """The ``torch_flex_paged`` built-in target: FlexAttention's eager path over a paged (and
    float8) cache, as `torch_flex_paged_attention` declares it. Causal and the window are aligned
    per sequence over a cache (the suite's paged laws expect it) and bottom-right over contiguous
    keys (each row full: kv_lengths = n_k). The compiled kernel is not the built-in: ~15 s of
    compilation per new shape would make a run of the suite take hours on a CPU."""
    import torch

    return Target(
        torch_flex_paged, name=f"torch {torch.__version__} flex_attention (eager) over a paged cache",
        dtypes=("float32", "float64"), ndims=(4,), supports_scale=True, causal_alignment="bottom_right",
        masked_rows="zeros", supports_gqa=True, supports_window=True, empty_keys="raise",
        supports_paged_kv=True, supports_fp8_kv=dtypes.has_ml_dtypes(),
        fp8_kv_paged_only=dtypes.has_ml_dtypes(), deadline_s=60.0,
    )
