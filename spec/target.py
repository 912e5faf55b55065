"""Targets: an attention implementation under test, and what it declares it can do.

Any callable ``f(q, k, v, *, causal=False)`` on NumPy arrays is a target as it is:

    q [..., n_q, d_k], k [..., n_k, d_k], v [..., n_k, d_v]  ->  [..., n_q, d_v]

with leading dims ``(batch, heads)`` or none, float32 and float64 inputs, and the causal mask
top-left aligned (query i sees keys j ≤ i, as PyTorch's ``is_causal``). :class:`Target` wraps
such a callable and declares whatever differs; a property that needs a capability the target does
not declare is skipped, and the report says which capability was missing.

A target's ``fn`` always receives NumPy arrays and may return anything ``np.asarray`` accepts.
Adapters for other frameworks (PyTorch, JAX) convert inside ``fn``.

Targets by name (:func:`load_target`):

- ``reference`` — :func:`impl.attention`; ``flash`` — :func:`impl.flash_attention`;
- ``torch``, ``jax`` — built by the zero-argument factories ``torch_target`` and ``jax_target``
  of :mod:`spec.peers`, imported only when asked for, so the suite needs neither framework;
- ``package.module:attr`` — any importable callable or :class:`Target` (an attribute path such
  as ``pkg.mod:Class.method`` works too).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from spec import dtypes as dt

Layout = Literal["bhnd", "bnhd"]
Alignment = Literal["top_left", "bottom_right"]
MaskedRows = Literal["zeros", "nan", "uniform", "any"]

FLOAT_DTYPES = ("float16", "float32", "float64", "bfloat16")


class TargetError(ValueError):
    """A target that cannot be loaded or is declared inconsistently (the CLI's exit 2)."""


@dataclass(frozen=True)
class Target:
    """An attention implementation under test, with the capabilities it declares.

    ``Target(fn)`` with no other argument declares exactly what a plain callable gets.
    """

    fn: Callable[..., Any]
    """``fn(q, k, v, *, causal=False[, mask=][, scale=])`` -> ``[..., n_q, d_v]`` array-like."""
    name: str = ""
    """Shown in reports; defaults to the callable's qualified name."""
    dtypes: tuple[str, ...] = ("float32", "float64")
    """NumPy dtype names the target accepts (from float16, float32, float64, bfloat16); each is
    tested. The output must have the input's dtype. bfloat16 is NumPy's from ``ml_dtypes``
    (``ml_dtypes.bfloat16``), which must be installed to declare it."""
    layout: Layout = "bhnd"
    """Axis order of 4-D inputs and output: ``bhnd`` = (batch, heads, n, d), as PyTorch's SDPA;
    ``bnhd`` = (batch, n, heads, d), as FlashAttention's and JAX's. 2-D inputs are (n, d) either
    way. A ``mask=`` is always ``[batch, heads, n_q, n_k]`` (or broadcastable to it)."""
    ndims: tuple[int, ...] = (2, 4)
    """Ranks of q/k/v the target accepts: 2 = (n, d), 3 = (heads, n, d), 4 = (batch, heads, n, d)."""
    supports_mask: bool = False
    """``fn`` takes ``mask=``: boolean, True = may attend, broadcastable to ``[..., n_q, n_k]``,
    ANDed with ``causal``."""
    supports_scale: bool = False
    """``fn`` takes ``scale=`` (a float multiplying the scores instead of ``1/√d_k``)."""
    causal_alignment: Alignment | None = "top_left"
    """What ``causal=True`` means: ``top_left`` (query i sees keys j ≤ i; PyTorch) or
    ``bottom_right`` (query i sees keys j ≤ i + n_k − n_q; FlashAttention ≥ 2.1, MLX, decoding
    with a KV cache). The two agree when n_q = n_k. None: the target has no causal mode."""
    masked_rows: MaskedRows = "zeros"
    """Output of a query row that sees no key at all: ``zeros`` (PyTorch's fused kernels,
    FlashAttention, :mod:`impl`), ``nan`` (a plain softmax over all -inf), ``uniform`` (the plain
    mean of the values: an additive finite mask such as -1e9), ``any`` (unspecified; not tested)."""
    exact_masking: bool = True
    """Masked keys contribute exactly nothing, so changing them leaves outputs bit-identical.
    False (e.g. an additive -1e4 mask): such changes are only required to stay within tolerance."""
    supports_gqa: bool = False
    """4-D k and v may have fewer heads g than q's h (h divisible by g); query head i reads K/V
    head ``i // (h // g)`` (grouped-query attention, PyTorch's ``enable_gqa``, JAX)."""
    tolerance: float = 2.0
    """k in the tolerance policy: pass when ``max|out − golden| ≤ k·max|baseline − golden| +
    c·eps·max|golden|``, golden in float64, baseline a naive computation in the target's dtype."""
    deadline_s: float | None = None
    """Time limit for one call of ``fn``, in seconds; None uses the profile's."""
    grad_fn: Callable[..., Any] | None = None
    """Optional backward pass: ``grad_fn(q, k, v, d_out, *, causal=False)`` -> ``(dq, dk, dv)``,
    the gradients of ``sum(out · d_out)``, in the target's layout. None: no gradient properties."""

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TargetError(f"Target fn must be callable, got {type(self.fn).__name__}")
        if not self.name:
            object.__setattr__(self, "name", _callable_name(self.fn))
        wants_bf16 = any(isinstance(d, str) and d == dt.BFLOAT16 for d in self.dtypes)
        if wants_bf16 and not dt.has_bfloat16():
            raise TargetError("Target dtypes include bfloat16, which needs ml_dtypes (not installed): "
                              "pip install ml-dtypes")
        try:
            dtypes = tuple(dt.as_dtype(d).name for d in self.dtypes)
        except TypeError:
            dtypes = ()
        if not dtypes or any(d not in FLOAT_DTYPES for d in dtypes):
            raise TargetError(
                f"Target dtypes must be a non-empty subset of {FLOAT_DTYPES}, got {self.dtypes!r}"
            )
        object.__setattr__(self, "dtypes", dtypes)
        _check_choice("layout", self.layout, ("bhnd", "bnhd"))
        _check_choice("causal_alignment", self.causal_alignment, ("top_left", "bottom_right", None))
        _check_choice("masked_rows", self.masked_rows, ("zeros", "nan", "uniform", "any"))
        if not self.ndims or any(r not in (2, 3, 4) for r in self.ndims):
            raise TargetError(f"Target ndims must be a non-empty subset of (2, 3, 4), got {self.ndims}")
        if not self.tolerance > 0:
            raise TargetError(f"Target tolerance must be positive, got {self.tolerance}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise TargetError(f"Target deadline_s must be positive or None, got {self.deadline_s}")

    @property
    def has_gradients(self) -> bool:
        return self.grad_fn is not None

    def replace(self, **changes: Any) -> Target:
        """A copy with some declarations changed: ``target.replace(tolerance=4.0)``."""
        return dataclasses.replace(self, **changes)

    def __call__(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False,
        mask: np.ndarray | None = None, scale: float | None = None,
    ) -> np.ndarray:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v]
        """Call ``fn`` on ``(..., n, d)`` arrays, translating the layout both ways.

        ``causal=``, ``mask=`` and ``scale=`` are passed only when set, so a plain callable never
        sees the last two.
        """
        kwargs: dict[str, Any] = {}
        if causal:  # a target without a causal mode need not take the argument at all
            kwargs["causal"] = True
        if mask is not None:
            kwargs["mask"] = mask
        if scale is not None:
            kwargs["scale"] = scale
        if self.layout == "bnhd" and q.ndim == 4:
            q, k, v = (np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in (q, k, v))
        out = np.asarray(self.fn(q, k, v, **kwargs))
        if self.layout == "bnhd" and q.ndim == 4 and out.ndim == 4:
            out = np.swapaxes(out, 1, 2)
        return out


def _check_choice(field: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise TargetError(f"Target {field} must be one of {choices}, got {value!r}")


def _callable_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}:{qualname}" if module else qualname


def _reference() -> Target:
    from impl import attention
    from impl.grad import attention_backward

    return Target(attention, name="reference", supports_mask=True, supports_scale=True,
                  dtypes=("float16", "float32", "float64", *_bfloat16_if_installed()), ndims=(2, 3, 4),
                  grad_fn=attention_backward)


def _flash() -> Target:
    from impl import flash_attention

    return Target(flash_attention, name="flash", supports_scale=True,
                  dtypes=("float16", "float32", "float64", *_bfloat16_if_installed()), ndims=(2, 3, 4))


def _bfloat16_if_installed() -> tuple[str, ...]:
    """impl computes bfloat16 in float32 and casts back, so it takes bfloat16 wherever NumPy has it."""
    return (dt.BFLOAT16,) if dt.has_bfloat16() else ()


def _peer(name: str) -> Callable[[], Target]:
    """The factory ``spec.peers:<name>_target``, looked up only when the target is asked for."""

    def build() -> Target:
        try:
            peers = importlib.import_module("spec.peers")
        except ModuleNotFoundError as e:
            if e.name != "spec.peers":
                raise TargetError(f"built-in target {name!r} needs {e.name}: "
                                  f"pip install 'attention-spec[{name}]'") from None
            raise TargetError(f"built-in target {name!r} is not available in this installation "
                              "(no module spec.peers)") from None
        factory = getattr(peers, f"{name}_target", None)
        if factory is None:
            raise TargetError(f"built-in target {name!r} is not available: spec.peers has no {name}_target")
        try:
            target = factory()
        except ModuleNotFoundError as e:
            raise TargetError(f"built-in target {name!r} needs {e.name or name}, which is not installed: "
                              f"pip install 'attention-spec[{name}]'") from None
        return as_target(target)

    return build


BUILTIN: dict[str, Callable[[], Target]] = {
    "reference": _reference,
    "flash": _flash,
    "torch": _peer("torch"),
    "jax": _peer("jax"),
}
"""Built-in targets by name; each entry builds its Target on demand."""


def as_target(obj: Any) -> Target:
    """A :class:`Target` as it is; any other callable as a target with default capabilities."""
    if isinstance(obj, Target):
        return obj
    if callable(obj):
        return Target(obj)
    raise TargetError(f"a target must be callable or a spec.Target, got {type(obj).__name__}")


def load_target(spec: str | Callable[..., Any] | Target) -> Target:
    """Resolve a built-in name, a ``module:attr`` string, a callable or a :class:`Target`.

    Raises :class:`TargetError` (one line, naming what was wrong) when nothing loads.
    """
    if not isinstance(spec, str):
        return as_target(spec)
    if spec in BUILTIN:
        return BUILTIN[spec]()
    if ":" not in spec:
        names = ", ".join(BUILTIN)
        raise TargetError(f"unknown target {spec!r}: give a built-in name ({names}) or module:attr")
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise TargetError(f"target {spec!r} must look like package.module:attr")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise TargetError(f"cannot import module {module_name!r} for target {spec!r}: {e}") from None
    except Exception as e:  # a module that fails while importing is the target's problem
        raise TargetError(f"importing {module_name!r} for target {spec!r} raised "
                          f"{type(e).__name__}: {e}") from None
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"module {module_name!r} has no attribute {attr_path!r}") from None
    target = as_target(obj)
    if target.name == _callable_name(target.fn) and not isinstance(obj, Target):
        target = target.replace(name=spec)
    return target
