"""JAX: ``jax.nn.dot_product_attention`` (XLA) as the ``jax`` built-in target, ``spec.from_jax`` for
any JAX function, and a ``grad_fn`` by ``jax.vjp``.

The adapter takes NumPy arrays in the suite's layout, makes jax arrays of them (the same bits:
bfloat16 is ml_dtypes' on both sides), calls JAX's own attention and reads the result back.
Nothing is computed here that JAX would compute itself, so a failure of the suite is JAX's.

The declarations of `dpa_target` are measured, not assumed (jax 0.10.2 on CPU;
``tests/spec/test_spec_adapters.py`` re-measures the ones a new version could change): a query row
that sees no key gets the plain mean of ALL the values (the mask is a finite −0.7·max, so the row's scores
tie); ``causal`` with n_q ≠ n_k is top-left; ``causal`` and ``mask`` are ANDed; grouped K/V heads
are native (query head i reads K/V head i // (h/g)); d_v ≠ d_k is refused, so the adapter calls it
once per d_k-wide slice of V (exact: output column c depends on V's column c alone); float64
inputs give float64 out (x64 enabled for the call) but logits and softmax run in float32, so
float64 is not declared; bfloat16 runs eagerly (under ``jax.jit`` the CPU dot refuses precision
BF16_BF16_F32, as F16_F16_F32 for float16).

Two findings, left failing or recorded rather than declared away (docs/peers.md): under
``jax.jit`` with d_k ≤ 2, XLA fuses q·kᵀ into the softmax's ``exp(s − max)`` and recomputes it
with a fused multiply-add, so scores ≳ 1e10 give NaN (``large_logits``; eagerly it is right);
and a row that an all −inf bias empties is NaN, which the backward spreads to dk and dv of every
key of that head.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import numpy as np

from spec import dtypes
from spec.adapters import Framework, check_mask, differentiated, named_after, on_device, spelled, wrap
from spec.target import Target

Array = np.ndarray

SPELLINGS = {"bias": "bias", "return_lse": "return_residual", "window": "local_window_size",
             "kv_lengths": "key_value_seq_lengths"}
"""How JAX spells the suite's keyword arguments."""


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
    # local_window_size, return_residual) are spelled as `SPELLINGS` says;
    # mask= and is_causal= are the suite's core arguments, not keywords.
    pieces = [
        dot_product_attention(
            qj, kj, padded[..., s * d_k:(s + 1) * d_k], mask=mask_j, scale=scale, is_causal=causal,
            implementation="xla", **spelled("jax", bias=bias_j, kv_lengths=lengths, window=window,
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
              None if mask is None else jnp.asarray(check_mask(mask)),
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
    window: tuple[int, int] | None = None, return_lse: bool = False, device: str = "cpu",
) -> Any:  # [..., h, n_q, d_k], [..., g, n_k, d_k], [..., g, n_k, d_v] -> [..., h, n_q, d_v] (, [..., n_q])
    """``jax.nn.dot_product_attention(implementation="xla")`` on NumPy arrays
    (`_jax_dot_product_attention`). float64 runs with x64 enabled for the call (JAX computes
    float32 otherwise). The keywords of docs/targets.md are JAX's own: ``bias`` → ``bias``
    (``[b, h, n_q, n_k]``), ``kv_lengths`` → ``key_value_seq_lengths`` (int32), ``window`` →
    ``local_window_size`` (top-left, as its causal mask), ``return_lse`` → ``return_residual``
    (its lse ``[b, n_q, h]``, natural log, float32). ``device``: where the arrays go.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    with _jax_precision([q]), _placed(device):
        arrays, static = _jax_arguments(q, k, v, mask, scale, bias, kv_lengths, window)
        got = _jax_core(jit=_jittable(q.dtype))(*arrays, causal=causal, lse=return_lse, **static)
    if return_lse:
        return np.array(got[0]), np.array(got[1])  # writable copies
    return np.array(got)


def jax_attention_grad(
    q: Array, k: Array, v: Array, d_out: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, bias: Array | None = None, kv_lengths: Array | None = None,
    window: tuple[int, int] | None = None, device: str = "cpu",
) -> tuple[Array, Array, Array, dict[str, Array]]:  # [..., n_q, d_k], ..., d_out [..., n_q, d_v]
    """``(dq, dk, dv, {"dbias": ...})`` of `jax_attention` for the upstream gradient ``d_out``:
    ``jax.vjp`` of the same call (`_jax_dot_product_attention`) in q, k, v and the bias, the other
    keywords held fixed. ``dbias`` (when a bias is given) in the bias's shape and dtype as passed,
    summed over the axes it was broadcast along."""
    import jax.numpy as jnp

    q, k, v, d_out = (np.asarray(x) for x in (q, k, v, d_out))
    with _jax_precision([q]), _placed(device):
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


def _placed(device: str) -> Any:
    """Within: new jax arrays on ``device`` (the default device on cpu)."""
    import jax

    return contextlib.nullcontext() if device == "cpu" else jax.default_device(_device(device))


def dpa_target(device: str = "cpu") -> Target:
    """The ``jax`` built-in target: ``jax.nn.dot_product_attention`` (XLA) on ``device``, as
    measured on CPU."""
    import jax

    _device(device)  # an unknown device is refused here, naming it
    where = "" if device == "cpu" else f" on {device}"
    return Target(
        on_device(jax_attention, device),
        name=f"jax {jax.__version__} nn.dot_product_attention{where}",
        # Not float64: JAX computes the logits and the softmax in float32 whatever the input, so a
        # float64 call is only float32-accurate (measured 1.4e-7 from the float64 golden) and fails
        # matches_golden; tests/spec/test_spec_adapters.py keeps that failure visible.
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
        # Each new shape is an XLA compilation (~1 s here, several under load), not a hang; eager
        # float16 and bfloat16 compile each operation per shape (1.3–1.8 s a new shape here), so
        # the cases come from the small grid of compile-once shapes.
        deadline_s=60.0,
        compiles_per_shape=True,
        # Found, verified, declared (docs/peers.md, with the replay lines): under jax.jit (float32 is
        # jitted here), XLA fuses q·kᵀ into the softmax's exp(s − max) and recomputes it with a
        # fused multiply-add, so scores near the edge of float32's range give NaN or inf; the same
        # call run eagerly is right.
        expected_failures={
            "large_logits[float32]": "XLA's jitted softmax recomputes s − max with a fused multiply-add: "
                                     "scores near float32's edge give NaN (eager is right)",
            "bottom_right_causal_mask[float32]": "the same fused recomputation, at the edge scores half its "
                                                 "examples draw: inf (eager is right)",
        },
        # jax.vjp of the same call: every keyword above reaches the backward, and the bias gets
        # its gradient (summed over the axes it was broadcast along). Measured: passes every
        # gradient law (float16, bfloat16, float32); a hidden key gets exactly zero dk, dv and
        # dbias. The all -inf bias row above is NaN in the backward too, and spreads NaN to dk
        # and dv of every key of its head (tests/spec/test_spec_adapters.py); no law draws that row, as
        # masked_rows="uniform" keeps the gradient laws off rows that see no key.
        grad_fn=on_device(jax_attention_grad, device),
        grad_extras=("dbias",),
    )



def _to_jax(x: Array, device: str = "cpu") -> Any:  # NumPy -> jax.Array on device, same bits
    import jax
    import jax.numpy as jnp

    # bfloat16 is ml_dtypes' on both sides
    return jnp.asarray(x) if device == "cpu" else jax.device_put(jnp.asarray(x), _device(device))


def _device(name: str) -> Any:
    """The jax device named ``cpu``, ``gpu``, ``tpu`` (its first) or ``gpu:1``."""
    import jax

    kind, _, index = name.partition(":")
    try:
        return jax.devices(kind)[int(index or 0)]
    except (RuntimeError, IndexError, ValueError) as e:
        raise ValueError(f"no jax device {name!r}: {e}") from None


def _from_jax(x: Any) -> Array:  # jax.Array -> NumPy, same bits, writable
    return np.array(x)



def from_jax(
    fn: Any, *, rename: dict[str, str] | None = None, name: str = "", grad: bool = False, device: str = "cpu",
    **declarations: Any,
) -> Target:
    """A target from a JAX attention function, in one line:
    ``spec.from_jax(jax.nn.dot_product_attention, layout="bnhd", rename={"causal": "is_causal"})``.

    As `from_torch`, with ``jax.Array`` s: the suite's NumPy arrays go in bit for bit (bfloat16
    is ml_dtypes' on both sides), float64 inputs run with x64 enabled for the call, and the results
    come back as NumPy arrays. Keywords are spelled as JAX spells them by default
    (`SPELLINGS`: ``window`` → ``local_window_size``, ``kv_lengths`` →
    ``key_value_seq_lengths``), ``rename`` overriding. ``grad=True`` builds ``grad_fn`` with
    ``jax.vjp`` of ``fn`` in q, k, v (and the input of each declared ``grad_extras``), the other
    keywords held fixed.
    """
    return wrap(FRAMEWORK, fn, rename=rename, name=name, grad=grad, device=device, **declarations)


def _jax_grad(fn: Any, names: dict[str, str], extras: Any, device: str = "cpu") -> Any:
    """``grad_fn`` for a JAX ``fn``: ``jax.vjp`` of ``fn`` in q, k, v and the declared extras'
    inputs, pulled back from ``d_out``, as NumPy arrays."""
    wanted = differentiated(extras)

    def grad_fn(q: Array, k: Array, v: Array, d_out: Array, **kwargs: Any) -> Any:
        import jax

        arrays = [np.asarray(x) for x in (q, k, v, d_out)]
        with _jax_precision(arrays):
            free = {key: _to_jax(x, device) for key, x in kwargs.items()
                    if key in wanted.values() and isinstance(x, np.ndarray) and x.dtype.kind == "f"}
            held = {names.get(key, key): _to_jax(x, device) if isinstance(x, np.ndarray) else x
                    for key, x in kwargs.items() if key not in free}

            def call(q: Any, k: Any, v: Any, free: dict[str, Any]) -> Any:
                return fn(q, k, v, **held, **{names.get(key, key): x for key, x in free.items()})

            _, pull = jax.vjp(call, *(_to_jax(x, device) for x in arrays[:3]), free)
            dq, dk, dv, d_free = pull(_to_jax(arrays[3], device))
        grads = (_from_jax(dq), _from_jax(dk), _from_jax(dv))
        if not wanted:
            return grads
        return (*grads, {extra: _from_jax(d_free[arg]) for extra, arg in wanted.items() if arg in d_free})

    return named_after(grad_fn, fn, "_grad")



# No synchronize (the record's default waits for nothing): a result is read back (`_from_jax`)
# only once it is computed.
FRAMEWORK = Framework(name="jax", to_native=_to_jax, to_numpy=_from_jax, spellings=SPELLINGS,
                      around=_jax_precision, grad=_jax_grad)

TARGETS = {"jax": dpa_target}
"""The built-in targets of this adapter (`spec.adapters.ADAPTERS` names them)."""
