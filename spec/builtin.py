"""Targets by name — the one module of :mod:`spec` that imports :mod:`impl`.

- ``reference`` — :func:`impl.attention`; ``flash`` — :func:`impl.flash_attention`;
- ``torch``, ``jax`` — built by the zero-argument factories ``torch_target`` and ``jax_target``
  of :mod:`spec.frameworks`, imported only when asked for, so the suite needs neither framework;
- ``package.module:attr`` — any importable callable or :class:`~spec.Target` (an attribute path
  such as ``pkg.mod:Class.method`` works too).

The oracle (:mod:`spec.golden`) never imports :mod:`impl`: only this map does.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from spec import dtypes as dt
from spec.target import Target, TargetError, _callable_name


def _reference() -> Target:
    from impl import attention
    from impl.grad import attention_backward

    return Target(attention, name="reference", supports_mask=True, supports_scale=True,
                  dtypes=("float16", "float32", "float64", *dt.bfloat16_if_installed()), ndims=(2, 3, 4),
                  grad_fn=attention_backward, supports_gqa=True, supports_bias=True, supports_window=True,
                  supports_softcap=True, supports_sinks=True, supports_kv_lengths=True, supports_varlen=True,
                  supports_dropout=True, returns_lse=True)


def _flash() -> Target:
    from impl import flash_attention

    return Target(flash_attention, name="flash", supports_scale=True,
                  dtypes=("float16", "float32", "float64", *dt.bfloat16_if_installed()), ndims=(2, 3, 4))


def _framework(name: str) -> Callable[[], Target]:
    """The factory ``spec.frameworks:<name>_target``, looked up only when the target is asked for."""

    def build() -> Target:
        try:
            frameworks = importlib.import_module("spec.frameworks")
        except ModuleNotFoundError as e:
            if e.name != "spec.frameworks":
                raise TargetError(f"built-in target {name!r} needs {e.name}: "
                                  f"pip install 'attention-spec[{name}]'") from None
            raise TargetError(f"built-in target {name!r} is not available in this installation "
                              "(no module spec.frameworks)") from None
        factory = getattr(frameworks, f"{name}_target", None)
        if factory is None:
            raise TargetError(f"built-in target {name!r} is not available: "
                              f"spec.frameworks has no {name}_target")
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
    "torch": _framework("torch"),
    "jax": _framework("jax"),
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
