"""Targets: an attention implementation under test, and what it declares it can do.

Any callable ``f(q, k, v, *, causal=False)`` on NumPy arrays is a target as it is:

    q [..., n_q, d_k], k [..., n_k, d_k], v [..., n_k, d_v]  ->  [..., n_q, d_v]

with leading dims ``(batch, heads)`` or none, float32 and float64 inputs, and the causal mask
top-left aligned (query i sees keys j ≤ i, as PyTorch's ``is_causal``). :class:`Target` wraps
such a callable and declares whatever differs; a property that needs a capability the target does
not declare is skipped, and the report says which capability was missing.

A target's ``fn`` always receives NumPy arrays and may return anything ``np.asarray`` accepts.
Adapters for other frameworks (PyTorch, JAX) convert inside ``fn``.

Targets by name are resolved by :func:`spec.builtin.load_target`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from spec import dtypes as dt

Layout = Literal["bhnd", "bnhd"]
Alignment = Literal["top_left", "bottom_right", "square_or_decoding"]
MaskedRows = Literal["zeros", "nan", "uniform", "unmasked", "any"]
Isolation = Literal["thread", "caller", "process"]

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
    with a KV cache). The two agree when n_q = n_k. ``square_or_decoding``: defined only for
    n_q = n_k (top-left) and n_q = 1 (decoding: the query sees every key), as transformers' SDPA
    path (``is_causal`` only when n_q > 1); causal cases are then drawn only with those shapes.
    None: the target has no causal mode. A ``window=`` is aligned the same way."""
    masked_rows: MaskedRows = "zeros"
    """Output of a query row that sees no key at all: ``zeros`` (PyTorch's fused kernels,
    FlashAttention, :mod:`impl`), ``nan`` (a plain softmax over all -inf), ``uniform`` (the plain
    mean of the values: an additive finite mask such as -1e9), ``unmasked`` (the output the row
    would have without the mask: a finite fill that every score of the row shares, such as
    picoGPT's -1e10 in float64; checked to a score error of ``eps·FINITE_FILL``, see
    :data:`FINITE_FILL`), ``any`` (unspecified; not tested)."""
    exact_masking: bool = True
    """Masked keys contribute exactly nothing, so changing them leaves outputs bit-identical.
    False (e.g. an additive -1e4 mask): such changes are only required to stay within tolerance."""
    supports_gqa: bool = False
    """4-D k and v may have fewer heads g than q's h (h divisible by g); query head i reads K/V
    head ``i // (h // g)`` (grouped-query attention, PyTorch's ``enable_gqa``, JAX)."""
    computes: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)
    """Dtypes accepted but computed in a narrower one: ``{"float64": "float32"}`` says float64
    inputs are taken (and returned as float64) but computed in float32. Laws then allow the
    tolerance of the narrower dtype (baseline and floor computed in it), and reports name both
    ("float64 (computed in float32)"). Keys are declared dtypes; values are narrower float dtypes."""
    tolerance: float = 2.0
    """k in the tolerance policy: pass when ``max|out − golden| ≤ k·max|baseline − golden| +
    c·eps·max|golden|``, golden in float64, baseline a naive computation in the target's dtype."""
    deadline_s: float | None = None
    """Time limit for one call of ``fn``, in seconds; None uses the profile's."""
    grad_fn: Callable[..., Any] | None = None
    """Optional backward pass: ``grad_fn(q, k, v, d_out, *, causal=False)`` -> ``(dq, dk, dv)``,
    the gradients of ``sum(out · d_out)``, in the target's layout. None: no gradient properties."""
    # --- the keywords of real kernels (DESIGN §2b): each passed to fn only when declared -------
    supports_bias: bool = False
    """``fn`` takes ``bias=``: a float array broadcastable to ``[batch, heads, n_q, n_k]`` added to
    the scaled (and capped) scores before the softmax; ``-inf`` hides a key."""
    supports_window: bool = False
    """``fn`` takes ``window=(left, right)``: query i sees keys ``diag − left .. diag + right``,
    ``diag`` per ``causal_alignment``; ANDed with ``causal`` and ``mask``."""
    supports_softcap: bool = False
    """``fn`` takes ``softcap=c`` (> 0): scores become ``c·tanh(s / c)`` before bias and masks."""
    supports_sinks: bool = False
    """``fn`` takes ``sinks=`` ``[heads]`` (``[1]`` for 2-D inputs): one extra logit per query head in
    every row's softmax denominator, carrying no value."""
    supports_kv_lengths: bool = False
    """``fn`` takes ``kv_lengths=`` int ``[batch]`` (4-D inputs): keys at positions ≥ ``kv_lengths[b]``
    are hidden for batch row b."""
    supports_varlen: bool = False
    """``fn`` takes ``cu_seqlens_q=``, ``cu_seqlens_k=`` (packed sequences; 3-D inputs
    ``(heads, total, d)`` in ``bhnd``, ``(total, heads, d)`` in ``bnhd``)."""
    supports_dropout: bool = False
    """``fn`` takes ``dropout_p=`` and ``seed=``: dropout on the weights after the softmax, kept
    weights scaled by ``1/(1 − p)``; the same seed gives the same output."""
    returns_lse: bool = False
    """``fn`` takes ``return_lse=True`` and then returns ``(out, lse)``, ``lse [..., n_q]`` the
    natural-log logsumexp of each row's final scores (sinks included), ``-inf`` for an empty row."""
    deterministic: bool = True
    """Two identical calls give bit-identical outputs."""
    isolation: Isolation = "thread"
    """Where each call runs: ``thread`` (a worker thread, under the deadline), ``caller`` (the
    caller's thread, no deadline: for libraries that must be called from one thread) or
    ``process`` (a worker process; a crash or overrun is a failure and the run goes on)."""

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
        _check_choice("causal_alignment", self.causal_alignment,
                      ("top_left", "bottom_right", "square_or_decoding", None))
        _check_choice("masked_rows", self.masked_rows, ("zeros", "nan", "uniform", "unmasked", "any"))
        object.__setattr__(self, "computes", _check_computes(self.computes, self.dtypes))
        _check_choice("isolation", self.isolation, ("thread", "caller", "process"))
        for flag in (*KEYWORD_FIELDS.values(), "deterministic"):
            if not isinstance(getattr(self, flag), bool):
                raise TargetError(f"Target {flag} must be True or False, got {getattr(self, flag)!r}")
        if not self.ndims or any(r not in (2, 3, 4) for r in self.ndims):
            raise TargetError(f"Target ndims must be a non-empty subset of (2, 3, 4), got {self.ndims}")
        if not self.tolerance > 0:
            raise TargetError(f"Target tolerance must be positive, got {self.tolerance}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise TargetError(f"Target deadline_s must be positive or None, got {self.deadline_s}")

    @property
    def alignment(self) -> Literal["top_left", "bottom_right"]:
        """The diagonal the golden uses for ``causal`` and ``window``: ``square_or_decoding`` is
        bottom-right (top-left on square shapes, every key for one query), no causal mode top-left."""
        if self.causal_alignment in ("bottom_right", "square_or_decoding"):
            return "bottom_right"
        return "top_left"

    def causal_shape_ok(self, n_q: int, n_k: int) -> bool:
        """Whether the causal mode is defined for these lengths (always, except for
        ``square_or_decoding``: n_q = n_k or n_q = 1)."""
        return self.causal_alignment != "square_or_decoding" or n_q in (1, n_k)

    def precision(self, dtype: str) -> str:
        """The dtype inputs of ``dtype`` are computed in (``computes``; the dtype itself by default)."""
        return self.computes.get(dtype, dtype)

    def precision_text(self, dtype: str) -> str:
        """``dtype``, or ``"float64 (computed in float32)"`` when ``computes`` narrows it."""
        narrow = self.precision(dtype)
        return dtype if narrow == dtype else f"{dtype} (computed in {narrow})"

    @property
    def has_gradients(self) -> bool:
        return self.grad_fn is not None

    def replace(self, **changes: Any) -> Target:
        """A copy with some declarations changed: ``target.replace(tolerance=4.0)``."""
        return dataclasses.replace(self, **changes)

    def declares(self, keyword: str) -> bool:
        """Whether ``fn`` takes this keyword of DESIGN §2b (``bias``, ``window``, ...)."""
        return bool(getattr(self, KEYWORD_FIELDS[keyword]))

    def keywords(self, given: dict[str, Any]) -> dict[str, Any]:
        """The §2b keywords to pass: those given (not None), each refused unless declared."""
        out: dict[str, Any] = {}
        for name, value in given.items():
            if name not in KEYWORD_FIELDS:
                raise TargetError(f"unknown keyword {name!r}; the keywords are {', '.join(KEYWORD_FIELDS)}")
            if value is None or (name == "return_lse" and value is False):
                continue
            if not self.declares(name):
                raise TargetError(f"keyword {name}= needs {KEYWORD_FIELDS[name]}=True, "
                                  f"which target {self.name!r} does not declare")
            out[name] = value
        return out

    def __call__(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False,
        mask: np.ndarray | None = None, scale: float | None = None, **keywords: Any,
    ) -> Any:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v] (, lse [..., n_q])
        """Call ``fn`` on ``(..., n, d)`` arrays, translating the layout both ways.

        ``causal=``, ``mask=``, ``scale=`` and the §2b keywords (``bias``, ``window``, ``softcap``,
        ``sinks``, ``kv_lengths``, ``cu_seqlens_q``, ``cu_seqlens_k``, ``dropout_p``, ``seed``,
        ``return_lse``) are passed only when set, so a plain callable never sees them; a keyword
        the target does not declare is a :class:`TargetError`. With ``return_lse=True`` the
        result is ``(out, lse)`` (lse as ``fn`` returned it; its shape is checked by the caller).
        Packed (varlen) 3-D inputs are ``(heads, total, d)``; in ``bnhd`` ``fn`` sees
        ``(total, heads, d)``.
        """
        kwargs = self.keywords(keywords)
        if causal:  # a target without a causal mode need not take the argument at all
            kwargs["causal"] = True
        if mask is not None:
            kwargs["mask"] = mask
        if scale is not None:
            kwargs["scale"] = scale
        axes = self._layout_axes(q.ndim, packed="cu_seqlens_q" in kwargs)
        if axes:
            q, k, v = (np.ascontiguousarray(np.swapaxes(x, *axes)) for x in (q, k, v))
        got = self.fn(q, k, v, **kwargs)
        if kwargs.get("return_lse"):
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise TypeError(f"with return_lse=True the target must return (out, lse), "
                                f"got {type(got).__name__}")
            return self._from_layout(np.asarray(got[0]), axes), np.asarray(got[1])
        return self._from_layout(np.asarray(got), axes)

    def _layout_axes(self, ndim: int, *, packed: bool) -> tuple[int, int] | None:
        """The axes swapped between the suite's ``(..., heads, n, d)`` and ``bnhd``."""
        if self.layout != "bnhd":
            return None
        if ndim == 4:
            return (1, 2)
        if ndim == 3 and packed:
            return (0, 1)
        return None

    @staticmethod
    def _from_layout(out: np.ndarray, axes: tuple[int, int] | None) -> np.ndarray:
        if axes is not None and out.ndim == max(axes) + 2:
            return np.swapaxes(out, *axes)
        return out


KEYWORD_FIELDS: dict[str, str] = {
    "bias": "supports_bias",
    "window": "supports_window",
    "softcap": "supports_softcap",
    "sinks": "supports_sinks",
    "kv_lengths": "supports_kv_lengths",
    "cu_seqlens_q": "supports_varlen",
    "cu_seqlens_k": "supports_varlen",
    "dropout_p": "supports_dropout",
    "seed": "supports_dropout",
    "return_lse": "returns_lse",
}
"""Each keyword of DESIGN §2b and the Target field that declares it."""


FINITE_FILL = 1e10
"""The largest finite fill ``masked_rows="unmasked"`` allows for (picoGPT's -1e10): a fully masked
row's scores all move by it, so each is off by up to ``eps·FINITE_FILL`` after rounding."""


def _check_computes(computes: Any, dtypes: tuple[str, ...]) -> dict[str, str]:
    """``computes``: a dict from declared dtypes to strictly narrower float dtypes."""
    if not isinstance(computes, dict):
        raise TargetError(f"Target computes must be a dict such as {{'float64': 'float32'}}, "
                          f"got {type(computes).__name__}")
    out: dict[str, str] = {}
    for given, used in computes.items():
        try:
            given_name, used_name = dt.as_dtype(given).name, dt.as_dtype(used).name
        except TypeError:
            raise TargetError(f"Target computes must map dtype names to dtype names, got "
                              f"{given!r}: {used!r}") from None
        if given_name not in dtypes:
            raise TargetError(f"Target computes names {given_name}, which is not among the declared "
                              f"dtypes {dtypes}")
        if used_name not in FLOAT_DTYPES or not dt.eps(used_name) > dt.eps(given_name):
            raise TargetError(f"Target computes must map {given_name} to a narrower float dtype, "
                              f"got {used_name!r}")
        out[given_name] = used_name
    return out


def _check_choice(field: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise TargetError(f"Target {field} must be one of {choices}, got {value!r}")


def _callable_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}:{qualname}" if module else qualname
