"""PyTorch: ``torch.nn.functional.scaled_dot_product_attention`` as the ``torch`` built-in target,
``spec.from_torch`` for any PyTorch function, and a ``grad_fn`` by autograd. (FlexAttention over a
paged cache is beside it, in `spec.adapters.torch_flex`.)

Each adapter takes NumPy arrays in the suite's layout — q ``[..., n_q, d_k]``, k ``[..., n_k, d_k]``,
v ``[..., n_k, d_v]`` with leading dims ``(batch, heads)``, ``(heads,)`` or none — converts them to
tensors (bit for bit, float16, bfloat16 and float8_e4m3fn included), calls PyTorch's own attention
and converts the result back. Nothing is computed here that PyTorch would compute itself, so a
failure of the suite is PyTorch's.

The declarations of `sdpa_target` are measured, not assumed (torch 2.13.0+cpu;
``tests/spec/test_spec_adapters.py`` re-measures the ones a new version could change): a query row
that sees no key gets zeros (a
boolean or a −inf float mask); ``causal`` with n_q ≠ n_k is top-left (query i sees j ≤ i);
``causal`` and ``mask`` are refused together, so the adapter ANDs them into one mask; grouped K/V
heads through ``enable_gqa=True`` (query head i reads K/V head i // (h/g)); d_v ≠ d_k runs (the math
kernel); float64 and bfloat16 (via ml_dtypes) run. Gradients: autograd through SDPA with every
keyword the target declares, and ``dbias``.

PyTorch's SDPA gave NaN for fully-masked rows in 2023 (pytorch/pytorch#103963); its math kernel
now zeroes them (``_safe_softmax``). A target can record such a known deviation with
``masked_rows="nan"`` — the suite then checks that the declared behaviour holds, never less.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from spec import dtypes
from spec.adapters import (
    Framework,
    differentiated,
    fold_masks,
    named_after,
    on_device,
    spelled,
    wrap,
)
from spec.target import Target

Array = np.ndarray

SPELLINGS = {"bias": "attn_mask", "dropout_p": "dropout_p"}
"""How PyTorch spells the suite's keyword arguments (SDPA's float ``attn_mask`` is the suite's
``bias=``)."""


_BITS = {dtypes.BFLOAT16: ("int16", "bfloat16"), dtypes.FLOAT8: ("uint8", "float8_e4m3fn")}
"""The ml_dtypes NumPy has only through ml_dtypes, by name: the integer of their width and torch's
dtype of the same name. ``torch.from_numpy`` and ``Tensor.numpy`` know neither: the bits cross as
that integer and are relabelled on the other side."""


def _to_torch(x: Array, device: Any = "cpu") -> Any:  # NumPy -> torch on device, same bits, its own memory
    import torch

    x = np.ascontiguousarray(x)
    bits = _BITS.get(x.dtype.name)  # by name: ``x.dtype == None`` is True for float64
    if bits is not None:  # bfloat16, float8_e4m3fn: move the bit patterns and relabel them
        t = torch.from_numpy(x.view(np.dtype(bits[0])).copy()).view(getattr(torch, bits[1]))
    else:
        t = torch.from_numpy(x.copy())
    return t if str(device) == "cpu" else t.to(device)  # a copy of the same bits


def _from_torch(t: Any) -> Array:  # torch (any device) -> NumPy, same bits
    import torch

    t = t.detach().cpu().contiguous()
    for name, (integer, torch_name) in _BITS.items():
        if t.dtype == getattr(torch, torch_name):
            if not dtypes.has_ml_dtypes():
                raise TypeError(f"a {torch_name} result needs ml_dtypes to become a NumPy array")
            return t.view(getattr(torch, integer)).numpy().view(dtypes.as_dtype(name))
    return t.numpy()


def torch_attention(
    q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, bias: Array | None = None, dropout_p: float | None = None,
    seed: int | None = None, device: str = "cpu",
) -> Array:  # [..., h, n_q, d_k], [..., g, n_k, d_k], [..., g, n_k, d_v] -> [..., h, n_q, d_v]
    """``torch.nn.functional.scaled_dot_product_attention`` on NumPy arrays (`_sdpa`), its
    tensors on ``device``."""
    bias_t = None if bias is None else _to_torch(np.asarray(bias).astype(np.asarray(q).dtype), device)
    out = _sdpa(*(_to_torch(np.asarray(x), device) for x in (q, k, v)), causal=causal, mask=mask, scale=scale,
                bias=bias_t, dropout_p=dropout_p, seed=seed)
    _synchronize(device)
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

    def hidden_as_minus_inf(visible: Any, bias: Any) -> Any:  # SDPA's own fill for a hidden key
        return torch.where(visible, bias, torch.tensor(-np.inf, dtype=bias.dtype, device=bias.device))

    # top-left causal, as SDPA's is_causal; the mask in its own memory (a read-only mask stays untouched)
    attn_mask, causal = fold_masks(mask, bias, causal=causal, n_q=q.shape[-2], n_k=k.shape[-2],
                                   native=lambda x: _to_torch(x, q.device), where=hidden_as_minus_inf)
    gqa = q.ndim >= 3 and k.ndim >= 3 and k.shape[-3] != q.shape[-3]
    seeded = [] if q.device.type == "cpu" else [q.device]  # the generators fork_rng saves and restores
    with warnings.catch_warnings(), torch.random.fork_rng(devices=seeded):
        # SDPA explains on each call why its flash kernel was not used (e.g. d_v ≠ d_k); noise here.
        warnings.filterwarnings("ignore", message=r".*(kernel not used|Flash attention requires)")
        if seed is not None:
            torch.manual_seed(seed)
        # bias is not renamed to attn_mask by `spelled`: it is folded with mask= and causal into
        # SDPA's one attn_mask above, which is more than a rename.
        dropout = spelled("torch", dropout_p=float(dropout_p or 0.0))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale,
                                              enable_gqa=gqa, **dropout)


def torch_attention_grad(
    q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, bias: Array | None = None, dropout_p: float | None = None,
    seed: int | None = None, device: str = "cpu",
) -> tuple[Array, Array, Array, dict[str, Array]]:  # [..., n_q, d_k], ..., d_out [..., n_q, d_v]
    """``(dq, dk, dv, {"dbias": ...})`` of `torch_attention` for the upstream gradient ``d_out``,
    by PyTorch's autograd through SDPA's own backward (``dbias`` when a bias is given: SDPA
    differentiates a float ``attn_mask``, summed over the axes it was broadcast along)."""
    dtype = np.asarray(q).dtype
    q_, k_, v_ = (_to_torch(np.asarray(x), device).requires_grad_() for x in (q, k, v))
    bias_ = None if bias is None else _to_torch(np.asarray(bias).astype(dtype), device).requires_grad_()
    out = _sdpa(q_, k_, v_, causal=causal, mask=mask, scale=scale, bias=bias_, dropout_p=dropout_p, seed=seed)
    out.backward(_to_torch(np.asarray(d_out), device))
    _synchronize(device)
    extras = {} if bias_ is None else {"dbias": _grad_of(bias_).astype(np.asarray(bias).dtype)}
    return _grad_of(q_), _grad_of(k_), _grad_of(v_), extras


def _grad_of(t: Any) -> Array:
    """A leaf tensor's gradient as NumPy (zeros where the output did not depend on it)."""
    import torch

    return _from_torch(t.grad if t.grad is not None else torch.zeros_like(t))




def _synchronize(device: str) -> None:
    """Wait for the work queued on ``device`` (CUDA and MPS run asynchronously)."""
    import torch

    kind = str(device).split(":", 1)[0]
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def sdpa_target(device: str = "cpu") -> Target:
    """The ``torch`` built-in target: SDPA with its tensors on ``device``, with the capabilities
    measured above (on CPU; a GPU's backends are checked one by one by tools/gpu_check.py)."""
    import torch

    torch.empty(0, device=device)  # an unknown or absent device is refused here, naming it
    where = "" if device == "cpu" else f" on {device}"
    return Target(
        on_device(torch_attention, device),
        name=f"torch {torch.__version__} scaled_dot_product_attention{where}",
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
        grad_fn=on_device(torch_attention_grad, device),
        grad_extras=("dbias",),
        # Measured on torch 2.13 (CPU): a causal 16,384-square in float32 and float16, 4-D, no mask,
        # grew the process's peak memory by 5 MB (its flash kernel's tiles), not the 1 GiB of scores.
        holds_scores=False,
    )



def from_torch(
    fn: Any, *, rename: dict[str, str] | None = None, name: str = "", grad: bool = False, device: str = "cpu",
    **declarations: Any,
) -> Target:
    """A target from a PyTorch attention function, in one line:
    ``spec.from_torch(F.scaled_dot_product_attention, rename={"causal": "is_causal", "mask": "attn_mask"})``.

    ``fn(q, k, v, **keywords)`` gets torch tensors made from the suite's NumPy arrays bit for bit
    (bfloat16, float16 and a float8_e4m3fn cache included: a target declaring ``supports_fp8_kv``
    gets ``torch.float8_e4m3fn`` k and v; masks, biases and lengths too) and returns a tensor (or, with
    ``return_lse=True``, a tuple), converted back bit for bit. ``rename`` maps the suite's keyword
    names (``causal``, ``mask``, ``scale``, ``bias``, ...) to ``fn``'s; by default each keyword
    is spelled as PyTorch spells it (`SPELLINGS`:
    ``bias`` → ``attn_mask``), and ``rename`` overrides that (``{"bias": "bias"}`` keeps the
    suite's name; a spelling ``rename`` gives to another keyword drops its default). ``declarations`` are
    `spec.Target`'s (``layout``, ``dtypes``, ``supports_mask``, ...); a keyword is passed
    only when declared, as for any target.

    ``grad=True`` also builds the target's ``grad_fn`` by autograd: q, k, v (and the input of each
    declared ``grad_extras``: ``bias`` for ``dbias``, ``sinks`` for ``dsinks``) require grad, ``fn``
    runs with the same keywords, and ``out.backward(d_out)`` gives the gradients.

    ``device`` (``"cuda"``, ``"cuda:1"``, ``"mps"``): where the tensors are made, the same bits
    (bfloat16 included); each call waits for the device (``torch.cuda.synchronize``) before its
    results come back as NumPy arrays, so its deadline is judged on finished work.
    """
    return wrap(FRAMEWORK, fn, rename=rename, name=name, grad=grad, device=device, **declarations)


def _torch_grad(fn: Any, names: dict[str, str], extras: Any, device: str = "cpu") -> Any:
    """``grad_fn`` for a torch ``fn``: the gradients of ``Σ fn(q, k, v, **keywords) ∘ d_out`` by
    autograd, as NumPy arrays, with the declared extras' in a dict."""
    wanted = differentiated(extras)

    def grad_fn(q: Array, k: Array, v: Array, d_out: Array, **kwargs: Any) -> Any:
        leaves = [_to_torch(np.asarray(x), device).requires_grad_() for x in (q, k, v)]
        inputs: dict[str, Any] = {}
        for key, x in kwargs.items():
            if isinstance(x, np.ndarray):
                x = _to_torch(x, device)
                if key in wanted.values() and x.is_floating_point():
                    x.requires_grad_()
            inputs[key] = x
        out = fn(*leaves, **{names.get(key, key): x for key, x in inputs.items()})
        out.backward(_to_torch(np.asarray(d_out), device))
        _synchronize(device)
        grads = tuple(_grad_of(t) for t in leaves)
        if not wanted:
            return grads
        return (*grads, {extra: _grad_of(inputs[arg]) for extra, arg in wanted.items() if arg in inputs})

    return named_after(grad_fn, fn, "_grad")



FRAMEWORK = Framework(name="torch", to_native=_to_torch, to_numpy=_from_torch, spellings=SPELLINGS,
                      synchronize=_synchronize, grad=_torch_grad)

TARGETS = {"torch": sdpa_target}
"""The built-in targets of this adapter (`spec.adapters.ADAPTERS` names them)."""
