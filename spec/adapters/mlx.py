"""MLX: ``mlx.core.fast.scaled_dot_product_attention`` as the ``mlx`` built-in target,
``spec.from_mlx`` for any MLX function, and a ``grad_fn`` by ``mx.vjp``.

The adapter takes NumPy arrays in the suite's layout, makes ``mx.array`` s of them (the same bits:
float64 kept float64, bfloat16 moved as its 16-bit patterns and relabelled, since MLX reads no
ml_dtypes buffer), calls MLX's own attention and reads the result back. Nothing is computed here
that MLX would compute itself, so a failure of the suite is MLX's.

The declarations of `sdpa_target` are measured, not assumed (mlx 0.32.4, the ``mlx[cpu]`` wheel
on Linux; ``tests/spec/test_spec_adapters_mlx.py`` re-measures the ones a new version could change),
and checked against MLX's docstring and its source (``mlx/fast.cpp``): q, k and v are rank 4
alone, ``[B, N, T, D]`` (others are refused with ValueError); ``scale`` is a required float;
``mask="causal"`` is bottom-right ("the last query aligns with the last key"); ``mask=`` an array
is boolean (True = may attend) or additive (the suite's ``bias=``, added to the scaled scores),
broadcast to ``[B, N_q, T_q, T_kv]``, one of them a call; grouped K/V heads are native (query
head i reads K/V head i // (h/g)); ``sinks=`` are one logit per query head, in a dtype that
promotes to q's; d_v ≠ d_k runs. A boolean mask replaces a hidden score by the dtype's finfo.min,
so a query row that sees no key (causal with n_q > n_k, or a mask) gets the plain mean of all the
values; an all −inf additive row is NaN; no keys at all give zeros. The CPU backend has no fused
kernel (``force_fused=True`` raises there): the call runs MLX's own composition of ops
(``q·scale``, ``q·kᵀ`` in q's dtype, the softmax in float32, ``p·v``), which is what ran for
every figure here. float64 runs, computed to float32's accuracy (the softmax in float32: 5e-8
from the float64 golden), so it is declared as computed in float32.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from spec import dtypes
from spec.adapters import (
    Framework,
    differentiated,
    fold_masks,
    installed_version,
    named_after,
    numpy_bfloat16,
    on_device,
    wrap,
)
from spec.target import Target, _callable_name

Array = np.ndarray

SPELLINGS = {"sinks": "sinks"}
"""How MLX spells the suite's keyword arguments: ``sinks`` (and ``mask``, ``scale``) are its own
names. Its ``mask=`` also takes the suite's ``bias=`` (an additive mask), and ``causal`` is its
``mask="causal"``: each is more than a rename (one ``mask`` a call), so the built-in target folds
them (`_mlx_sdpa`), and a function of one's own does as it chooses."""


def _to_mlx(x: Array, device: str = "cpu") -> Any:  # NumPy -> mx.array, same bits, its own memory
    import mlx.core as mx

    # MLX's memory is one for its devices (the device is where the work runs: `_placed`).
    x = np.ascontiguousarray(x)
    bf16 = numpy_bfloat16()
    # (Not ``x.dtype == numpy_bfloat16()``: np.dtype(None) is float64, so float64 == None is True.)
    if bf16 is not None and x.dtype == bf16:
        # MLX reads no ml_dtypes buffer ("'bfloat16' is not a valid PEP 3118 buffer format"):
        # move the 16-bit patterns and relabel them.
        return mx.array(x.view(np.uint16)).view(mx.bfloat16)
    if x.dtype == np.float64:
        return mx.array(x, dtype=mx.float64)  # without dtype=, MLX makes float64 float32
    return mx.array(x)


def _from_mlx(x: Any) -> Array:  # mx.array -> NumPy, same bits, writable (np.array copies)
    import mlx.core as mx

    if x.dtype == mx.bfloat16:
        bf16 = numpy_bfloat16()
        if bf16 is None:
            raise TypeError("a bfloat16 result needs ml_dtypes to become a NumPy array")
        return np.array(x.view(mx.uint16)).view(bf16)
    return np.array(x)


def _device(name: str) -> Any:
    """MLX's device named ``cpu`` or ``gpu`` (Metal on Apple silicon, CUDA with ``mlx[cuda]``),
    refused with ValueError where this MLX has none."""
    import mlx.core as mx

    kinds = {"cpu": mx.cpu, "gpu": mx.gpu}
    if name not in kinds:
        raise ValueError(f"no mlx device {name!r}: MLX's devices are 'cpu' and 'gpu'")
    if not mx.is_available(kinds[name]):
        raise ValueError(f"no mlx device {name!r}: this MLX ({installed_version('mlx')}) has no {name} "
                         "backend")
    return mx.Device(kinds[name])


def _placed(device: str) -> Any:
    """Within: MLX's work runs on ``device`` (its default stream there)."""
    import mlx.core as mx

    return mx.stream(_device(device))


def _synchronize(device: str) -> None:
    """Wait for the work queued on ``device``'s stream (MLX is lazy and asynchronous: a result
    read back by `_from_mlx` is evaluated first, and this waits for what was scheduled)."""
    import mlx.core as mx

    mx.synchronize(mx.default_stream(_device(device)))


def _mlx_sdpa(q: Any, k: Any, v: Any, *, causal: bool, mask: Array | None, scale: float | None,
              bias: Any, sinks: Any) -> Any:  # mx arrays in (mask: NumPy bool), an mx array out
    """``mx.fast.scaled_dot_product_attention`` as the suite calls it. MLX takes one ``mask``: the
    string ``"causal"`` (bottom-right), a boolean array or an additive one. So ``causal`` with a
    mask or a bias becomes its boolean array (bottom-right, as MLX aligns it, built here: the golden's
    own mask is not shared) ANDed with the mask; a ``bias`` (in q's dtype) is the additive mask, and
    where keys are also hidden (mask, causal) they get the dtype's finfo.min in it by ``mx.where`` (the value
    MLX's own boolean mask puts in place of a hidden score; the bias gets gradient 0 there).
    ``scale`` defaults to 1/√d_k (MLX requires one). ``sinks`` go in q's dtype (MLX refuses sinks
    whose type does not promote to the output's: float32 sinks for float16 q), inside the call, so
    that their gradient comes back in their own dtype."""
    import mlx.core as mx

    def hidden_as_finfo_min(visible: Any, bias: Any) -> Any:  # MLX's own fill for a hidden key
        return mx.where(visible, bias, mx.array(mx.finfo(q.dtype).min, q.dtype))

    # Bottom-right causal, as MLX's mask="causal". The fill is not −inf (torch's) but the value MLX's
    # own boolean mask puts in place of a hidden score: a hidden key counts the same with a bias as without.
    folded, causal = fold_masks(mask, None if bias is None else bias.astype(q.dtype), causal=causal,
                                n_q=q.shape[-2], n_k=k.shape[-2], bottom_right=True, native=mx.array,
                                where=hidden_as_finfo_min)
    given: Any = "causal" if causal else folded
    extra = {} if sinks is None else {"sinks": sinks.astype(q.dtype)}
    chosen = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=chosen, mask=given, **extra)


def mlx_attention(
    q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, bias: Array | None = None, sinks: Array | None = None, device: str = "cpu",
) -> Array:  # [b, h, n_q, d_k], [b, g, n_k, d_k], [b, g, n_k, d_v] -> [b, h, n_q, d_v]
    """``mx.fast.scaled_dot_product_attention`` on NumPy arrays (`_mlx_sdpa`), run on ``device``."""
    with _placed(device):
        arrays = [_to_mlx(np.asarray(x), device) for x in (q, k, v)]
        extras = [None if x is None else _to_mlx(np.asarray(x), device) for x in (bias, sinks)]
        out = _mlx_sdpa(*arrays, causal=causal, mask=mask, scale=scale, bias=extras[0], sinks=extras[1])
        got = _from_mlx(out)
    _synchronize(device)
    return got


def mlx_attention_grad(
    q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, bias: Array | None = None, sinks: Array | None = None, device: str = "cpu",
) -> tuple[Array, Array, Array, dict[str, Array]]:  # [b, h, n_q, d_k], ..., d_out [b, h, n_q, d_v]
    """``(dq, dk, dv, {"dbias": ..., "dsinks": ...})`` of `mlx_attention` for the upstream gradient
    ``d_out``: ``mx.vjp`` of the same call (`_mlx_sdpa`) in q, k, v, the bias and the sinks given,
    the other keywords held fixed. ``dbias`` in the bias's shape (MLX's broadcast of it summed
    back) and dtype as passed, ``dsinks`` in the sinks'."""
    import mlx.core as mx

    named = {name: x for name, x in (("bias", bias), ("sinks", sinks)) if x is not None}
    with _placed(device):
        primals = [_to_mlx(np.asarray(x), device) for x in (q, k, v, *named.values())]

        def call(*arrays: Any) -> Any:
            given = dict(zip(named, arrays[3:], strict=True))
            return _mlx_sdpa(*arrays[:3], causal=causal, mask=mask, scale=scale, bias=given.get("bias"),
                             sinks=given.get("sinks"))

        d = _to_mlx(np.asarray(d_out).astype(np.asarray(q).dtype), device)
        _, grads = mx.vjp(call, primals, [d])
        got = [_from_mlx(g) for g in grads]
    _synchronize(device)
    extras = {f"d{name}": g.astype(np.asarray(named[name]).dtype)
              for name, g in zip(named, got[3:], strict=True)}
    return got[0], got[1], got[2], extras


def sdpa_target(device: str = "cpu") -> Target:
    """The ``mlx`` built-in target: ``mx.fast.scaled_dot_product_attention`` on ``device``, with
    the capabilities measured above (on the CPU)."""
    _device(device)  # an unknown or absent device is refused here, naming it
    where = "" if device == "cpu" else f" on {device}"
    return Target(
        on_device(mlx_attention, device),
        name=f"mlx {installed_version('mlx')} fast.scaled_dot_product_attention{where}",
        dtypes=("float16", "float32", "float64", *dtypes.bfloat16_if_installed()),
        # float64: the softmax runs in float32 whatever the input (MLX's docstring; measured 5e-8
        # from the float64 golden), so it is float32-accurate and judged as float32.
        computes={"float64": "float32"},
        ndims=(4,),
        supports_mask=True,
        supports_scale=True,
        causal_alignment="bottom_right",
        # A row that sees no key: the plain mean of all the values when a boolean mask or causal
        # empties it (each hidden score is finfo.min: the row's scores tie); NaN when an all −inf
        # bias does (MLX adds an additive mask as it is); zeros with no keys at all.
        masked_rows={"causal": "uniform", "mask": "uniform", "bias": "nan"},
        exact_masking=True,
        supports_gqa=True,
        supports_bias=True,
        supports_sinks=True,
        deadline_s=60.0,
        # Found, verified, declared (docs/peers.md, with the replay line): MLX takes sinks only in
        # a type that promotes to q's, so float16 q takes float16 sinks, and the law's float32
        # sink of 1.7e38 is +inf there: the row is NaN. At float16's own edge (±65504) MLX is right.
        expected_failures={
            "sinks_at_range_edge[float16]": "MLX takes sinks in q's dtype only (float16): a float32 sink "
                                            "beyond float16's range is +inf there, and its row NaN",
        },
        # mx.vjp of the same call: every keyword above reaches the backward; the bias and the
        # sinks get their gradients.
        grad_fn=on_device(mlx_attention_grad, device),
        grad_extras=("dbias", "dsinks"),
    )


def from_mlx(
    fn: Any, *, rename: dict[str, str] | None = None, name: str = "", grad: bool = False, device: str = "cpu",
    **declarations: Any,
) -> Target:
    """A target from an MLX attention function, in one line:
    ``spec.from_mlx(lambda q, k, v, causal=False, scale=None: mx.fast.scaled_dot_product_attention(q, k, v,
    scale=scale or q.shape[-1] ** -0.5, mask="causal" if causal else None), ndims=(4,), supports_scale=True,
    causal_alignment="bottom_right")``.

    As `from_torch`, with ``mx.array`` s: the suite's NumPy arrays go in bit for bit (float64 stays
    float64; bfloat16 crosses as its 16-bit patterns), and the results (an array, or a tuple of
    them) come back as writable NumPy arrays, the same bits. Keywords keep the suite's names
    (`SPELLINGS`), ``rename`` mapping them to ``fn``'s. ``grad=True`` builds ``grad_fn`` with
    ``mx.vjp`` of ``fn`` in q, k, v (and the input of each declared ``grad_extras``: ``bias`` for
    ``dbias``, ``sinks`` for ``dsinks``), the other keywords held fixed.

    ``device`` (``"cpu"``, ``"gpu"``): where ``fn``'s work runs (``mx.stream``: MLX's arrays
    live in memory its devices share); each call waits for that stream before its results come
    back, so its deadline is judged on finished work.
    """
    _device(device)  # an unknown or absent device is refused here, naming it
    named = name or (_callable_name(fn) if callable(fn) else "")
    return wrap(FRAMEWORK, _run_on(fn, device), rename=rename, name=named, grad=grad, device=device,
                **declarations)


def _run_on(fn: Any, device: str) -> Any:
    """``fn`` with its work on ``device``'s stream (its name kept, for reports); anything not
    callable as it is, for `wrap` to refuse."""
    if not callable(fn):
        return fn

    @functools.wraps(fn)
    def placed(*args: Any, **kwargs: Any) -> Any:
        with _placed(device):
            return fn(*args, **kwargs)

    return placed


def _mlx_grad(fn: Any, names: dict[str, str], extras: Any, device: str = "cpu") -> Any:
    """``grad_fn`` for an MLX ``fn``: ``mx.vjp`` of ``fn`` in q, k, v and the declared extras'
    inputs, pulled back from ``d_out``, as NumPy arrays."""
    wanted = differentiated(extras)

    def grad_fn(q: Array, k: Array, v: Array, d_out: Array, **kwargs: Any) -> Any:
        import mlx.core as mx

        free = [key for key, x in kwargs.items()
                if key in wanted.values() and isinstance(x, np.ndarray) and x.dtype.kind == "f"]
        held = {names.get(key, key): _to_mlx(x, device) if isinstance(x, np.ndarray) else x
                for key, x in kwargs.items() if key not in free}
        with _placed(device):
            primals = [_to_mlx(np.asarray(x), device) for x in (q, k, v)] + [_to_mlx(kwargs[key], device)
                                                                              for key in free]

            def call(*arrays: Any) -> Any:
                given = {names.get(key, key): x for key, x in zip(free, arrays[3:], strict=True)}
                return fn(*arrays[:3], **held, **given)

            _, grads = mx.vjp(call, primals, [_to_mlx(np.asarray(d_out), device)])
            got = [_from_mlx(g) for g in grads]
        _synchronize(device)
        if not wanted:
            return tuple(got[:3])
        d_free = dict(zip(free, got[3:], strict=True))
        return (*got[:3], {extra: d_free[arg] for extra, arg in wanted.items() if arg in d_free})

    return named_after(grad_fn, fn, "_grad")


FRAMEWORK = Framework(name="mlx", to_native=_to_mlx, to_numpy=_from_mlx, spellings=SPELLINGS,
                      synchronize=_synchronize, grad=_mlx_grad)

TARGETS = {"mlx": sdpa_target}
"""The built-in targets of this adapter (`spec.adapters.ADAPTERS` names them)."""
