"""The adapter protocol: one module per framework, each declaring one `Framework` record, and the
one map of them (`ADAPTERS`).

A framework's module (``spec/adapters/<name>.py``) holds everything the suite knows of it, and
nothing outside the module learns its spellings: how its arrays are made from NumPy's and read
back, bit for bit (float16 and bfloat16 included); the context a call runs in; how it spells the
suite's keyword arguments; how a ``grad_fn`` is built for one of its functions (autograd,
``jax.vjp``); and its built-in targets, each declared with the capabilities measured on it.
`wrap` turns any function of a framework into a `spec.Target` through its record (what
``spec.from_torch`` and ``spec.from_jax`` are). Adding a framework is one module and one line of
`ADAPTERS`; the framework itself is imported only when one of its targets is asked for.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spec import dtypes
from spec.target import Target, TargetError, _callable_name

Array = np.ndarray


@dataclass(frozen=True)
class Framework:
    """What the suite needs of a framework, declared once in its adapter module."""

    name: str
    """The library's name, as ``rename`` defaults and the docs name it: ``torch``, ``jax``."""
    to_native: Callable[[Array, str], Any]
    """``to_native(x, device)``: a NumPy array as the framework's array on ``device``, the same
    bits (its own memory)."""
    to_numpy: Callable[[Any], Array]
    """The framework's array (on any device) as a writable NumPy array, the same bits."""
    synchronize: Callable[[str], None] = lambda device: None
    """``synchronize(device)``: wait for the work queued on ``device`` (a GPU runs asynchronously:
    the call's deadline is judged on its finished work)."""
    spellings: Mapping[str, str] = field(default_factory=dict)
    """The library's name for each suite keyword argument it spells differently: ``{"bias":
    "attn_mask"}``. The default renames of `wrap`, and the spellings its built-ins pass."""
    around: Callable[[list[Array]], Any] = lambda arrays: contextlib.nullcontext()
    """``around(arrays)``: the context a call on these NumPy arrays runs in (JAX: x64 for float64)."""
    grad: Callable[[Any, dict[str, str], Any, str], Callable[..., Any]] | None = None
    """``grad(fn, names, extras, device)``: a ``grad_fn`` for ``fn`` (called with the keywords
    renamed by ``names``, its arrays on ``device``), also returning the declared extra gradients
    (``extras``: ``("dbias",)``)."""


@dataclass(frozen=True)
class Adapter:
    """Where a framework's adapter lives, and what of it the rest of the suite may name without
    importing it: its built-in targets (each in the module whose ``TARGETS`` builds it: the
    adapter's own, unless another is named) and the package extra that installs the framework."""

    module: str
    targets: Mapping[str, str | None] = field(default_factory=dict)
    extra: str = ""


ADAPTERS: dict[str, Adapter] = {
    "torch": Adapter("spec.adapters.torch", {"torch": None, "torch_flex_paged": "spec.adapters.torch_flex",
                                             "torch_flex_topk": "spec.adapters.torch_flex_sparse",
                                             "torch_flex": "spec.adapters.torch_flex_mods",
                                             "torch_flex_compiled": "spec.adapters.torch_flex_mods"},
                     extra="torch"),
    "jax": Adapter("spec.adapters.jax", {"jax": None, **dict.fromkeys(
        ("pallas_mha", "pallas_decode", "pallas_gpu_paged", "pallas_tpu_flash", "pallas_tpu_paged",
         "pallas_splash"), "spec.adapters.pallas")}, extra="jax"),
    "mlx": Adapter("spec.adapters.mlx", {"mlx": None}, extra="mlx"),
    "onnx": Adapter("spec.adapters.onnx", {"onnxruntime": None, "onnx_reference": None}, extra="onnx"),
}
"""Every framework adapter, by library name: one line each."""

OTHER_SPELLINGS: dict[str, dict[str, str]] = {
    "flash_attn": {"window": "window_size", "return_lse": "return_attn_probs", "alibi_slopes": "alibi_slopes",
                   "softcap": "softcap", "block_table": "block_table", "k_descale": "k_descale",
                   "kv_lengths": "seqused_k", "cu_seqlens_q": "cu_seqlens_q", "dropout_p": "dropout_p"},
    "vllm": {"block_table": "block_tables", "sinks": "s_aux"},
    "xformers": {"bias": "attn_bias"},
    "transformers": {"sinks": "s_aux"},
}
"""How libraries the suite has no adapter for spell its keyword arguments (the keyword table of
docs/targets.md, and messages)."""


def module(library: str) -> Any:
    """The adapter module of ``library`` (imported here, not the framework: that waits for a call)."""
    if library not in ADAPTERS:
        raise KeyError(f"no adapter for {library!r}; the adapters are {', '.join(ADAPTERS)}")
    return importlib.import_module(ADAPTERS[library].module)


def framework(library: str) -> Framework:
    """The `Framework` record of ``library``."""
    record: Framework = module(library).FRAMEWORK
    return record


def spellings(library: str) -> dict[str, str]:
    """How ``library`` spells the suite's keyword arguments it names differently: its adapter's
    declaration, else `OTHER_SPELLINGS`."""
    if library in ADAPTERS:
        return dict(framework(library).spellings)
    return dict(OTHER_SPELLINGS.get(library, {}))


def every_spelling() -> dict[str, dict[str, str]]:
    """Each library's spellings (`spellings`), by library: the adapters' first."""
    return {library: spellings(library) for library in [*ADAPTERS, *OTHER_SPELLINGS]}


def spelled(library: str, **arguments: Any) -> dict[str, Any]:
    """``arguments``, named as the suite names its keywords, renamed as ``library`` spells them
    (a keyword it does not spell keeps the suite's name)."""
    names = spellings(library)
    return {names.get(key, key): value for key, value in arguments.items()}


def check_mask(mask: Any) -> Array:
    """A ``mask=`` as the frameworks take it: boolean, never reinterpreted."""
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        # A float mask would be *added* to the scores by the frameworks: refuse, never reinterpret.
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {arr.dtype}")
    return arr


# --- what the framework modules share --------------------------------------------------------------


def numpy_bfloat16() -> np.dtype | None:
    """NumPy's bfloat16 (from ml_dtypes), or None where it is not installed."""
    return dtypes.as_dtype(dtypes.BFLOAT16) if dtypes.has_bfloat16() else None


def installed_version(distribution: str) -> str:
    """The installed version of ``distribution``, from its package metadata (MLX's type stubs
    declare no ``mlx.core.__version__``; for a released jax it is ``jax.__version__``)."""
    from importlib.metadata import version

    return version(distribution)


def named_after(wrapper: Any, fn: Any, suffix: str = "") -> Any:
    """``wrapper``, named as ``fn`` (else as its type) with ``suffix``, for reports: ``sdpa_grad``."""
    wrapper.__name__ = wrapper.__qualname__ = f"{getattr(fn, '__name__', type(fn).__name__)}{suffix}"
    return wrapper


def on_device(fn: Any, device: str) -> Any:
    """``fn`` with ``device=device`` given (its name kept, for reports); ``fn`` itself on the CPU,
    its default."""
    if device == "cpu":
        return fn
    return functools.update_wrapper(functools.partial(fn, device=device), fn)


def fold_masks(mask: Any, bias: Any, *, causal: bool = False, n_q: int = 0, n_k: int = 0,
               bottom_right: bool = False, native: Callable[[Array], Any] = lambda x: x,
               where: Callable[[Any, Any], Any]) -> tuple[Any, bool]:
    """The one mask of a framework that takes one (SDPA's ``attn_mask``, MLX's ``mask``, ONNX's
    ``attn_mask``) for the suite's ``mask=``, ``causal`` and ``bias=``; and whether ``causal`` is
    still to be passed as the framework's own flag.

    Visibility is a NumPy boolean: ``mask`` (checked boolean), ANDed — when ``causal`` comes with a
    mask or a bias — with the causal mask of ``n_q`` queries and ``n_k`` keys, top-left or
    ``bottom_right``, built here (``np.tri``: the golden's own mask is not shared); the causal flag
    is then spent. ``native`` makes the framework's array of it. A ``bias`` (the framework's array
    already, in its dtype) is the one mask where nothing is hidden, and otherwise
    ``where(visible, bias)``: the bias where a key is visible, the framework's fill elsewhere (a
    selection, no arithmetic, so a bias that requires grad gets 0 there)."""
    visible = None if mask is None else check_mask(mask)
    if causal and (mask is not None or bias is not None):
        diagonal = n_k - n_q if bottom_right else 0  # bottom-right: key j ≤ i + n_k − n_q
        triangle = np.tri(n_q, n_k, diagonal, dtype=bool)
        visible = triangle if visible is None else visible & triangle
        causal = False
    if visible is not None:
        visible = native(visible)
    if bias is None:
        return visible, causal
    return (bias if visible is None else where(visible, bias)), causal


# --- wrapping a framework's function ---------------------------------------------------------------


def wrap(record: Framework, fn: Any, *, rename: dict[str, str] | None = None, name: str = "",
         grad: bool = False, device: str = "cpu", **declarations: Any) -> Target:
    """A target from a framework's attention function: ``fn(q, k, v, **keywords)`` receives the
    framework's arrays made from the suite's NumPy arrays bit for bit (masks, biases and lengths
    too) and returns one (or, with ``return_lse=True``, a tuple), converted back bit for bit.
    Keywords are spelled as the framework spells them (`Framework.spellings`), ``rename``
    overriding (a spelling ``rename`` gives to another keyword drops its default).
    ``declarations`` are `spec.Target`'s. ``grad=True`` also builds the target's ``grad_fn``
    through the framework's own differentiation (`Framework.grad`), with the input of each
    declared ``grad_extras`` differentiated too. ``device``: where the arrays go (``"cuda"``);
    each call waits for the device's work to finish before it returns, so its deadline is
    judged on finished work."""
    if not isinstance(device, str) or not device:
        raise TypeError(f"device must be a device name such as 'cpu' or 'cuda', got {device!r}")
    names = _renames(record, rename)
    wrapped = _wrapped(fn, record, names, device)
    if not grad:
        return Target(wrapped, name=name or _callable_name(fn), **declarations)
    if "grad_fn" in declarations:
        raise TypeError("give grad=True or grad_fn=, not both")
    if record.grad is None:
        raise TypeError(f"the {record.name} adapter builds no grad_fn: give grad_fn=")
    grad_fn = record.grad(fn, names, declarations.get("grad_extras", ()), device)
    return Target(wrapped, name=name or _callable_name(fn), grad_fn=grad_fn, **declarations)


def _check_rename(rename: dict[str, str] | None) -> dict[str, str]:
    from spec.signature import declared_by  # the keywords a target's fn may receive

    if rename is None:
        return {}
    if not isinstance(rename, dict) or not all(isinstance(x, str) for x in (*rename, *rename.values())):
        raise TypeError(f"rename must be a dict of keyword names to keyword names, got {rename!r}")
    passed = declared_by()
    unknown = sorted(set(rename) - set(passed))
    if unknown:
        raise ValueError(f"rename names {', '.join(map(repr, unknown))}, which the suite never passes; "
                         f"its keywords are {', '.join(passed)}")
    shared = sorted({to for to in rename.values() if list(rename.values()).count(to) > 1})
    if shared:
        raise ValueError(f"rename gives {', '.join(map(repr, shared))} to more than one keyword")
    return dict(rename)


def _renames(record: Framework, rename: dict[str, str] | None) -> dict[str, str]:
    """The renames of a wrapped function: the framework's own spellings, then the user's
    ``rename``, which wins — a keyword it renames, and a spelling it gives to another keyword
    (``{"mask": "attn_mask"}`` for SDPA), drop the default."""
    given = _check_rename(rename)
    defaults = {key: to for key, to in record.spellings.items()
                if key not in given and to not in given.values()}
    return defaults | given


def _wrapped(fn: Any, record: Framework, names: dict[str, str], device: str) -> Any:
    """``fn`` taking NumPy arrays: array arguments converted to the framework's on ``device``,
    keywords renamed (``names``), the device synchronized, results (an array, or a tuple of them)
    converted back, in the framework's context for the call."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    back = record.to_numpy

    def to(x: Array) -> Any:
        return record.to_native(x, device)

    def wrapped(q: Array, k: Array, v: Array, **kwargs: Any) -> Any:
        arrays = [np.asarray(x) for x in (q, k, v)]
        with record.around(arrays):
            given = {names.get(key, key): to(x) if isinstance(x, np.ndarray) else x
                     for key, x in kwargs.items()}
            got = fn(*(to(x) for x in arrays), **given)
            record.synchronize(device)
            return tuple(back(x) for x in got) if isinstance(got, (tuple, list)) else back(got)

    named_after(wrapped, fn)
    wrapped.__module__ = getattr(fn, "__module__", __name__)
    return wrapped


def differentiated(extras: Any) -> dict[str, str]:
    """The keyword argument each declared extra gradient is the gradient of (``dbias`` -> ``bias``);
    names the keywords do not define are left to `Target`'s validation, which names them."""
    from spec.keywords import gradient_extras

    known = gradient_extras()
    names = extras if isinstance(extras, (tuple, list)) else ()
    return {name: known[name].passes[0] for name in names if name in known}


def factory(target: str) -> Callable[..., Target]:
    """The zero-argument factory of the built-in ``target`` (the ``TARGETS`` entry of the module
    that declares it, imported here); the framework itself is imported when it is called."""
    for adapter in ADAPTERS.values():
        if target in adapter.targets:
            where = importlib.import_module(adapter.targets[target] or adapter.module)
            found: Callable[..., Target] = where.TARGETS[target]
            return found
    raise KeyError(f"no built-in framework target {target!r}")


def builtin(library: str, target: str, device: str = "cpu") -> Target:
    """The built-in target ``target`` of ``library``'s adapter (its module's ``TARGETS``), built
    when asked for, its arrays on ``device``; a framework that is not installed is a `TargetError`
    saying what to install."""
    adapter = ADAPTERS[library]
    try:
        return factory(target)(device=device)
    except ModuleNotFoundError as e:
        raise TargetError(f"built-in target {target!r} needs {e.name or library}, which is not installed: "
                          f"pip install 'attention-spec[{adapter.extra or library}]'") from None
