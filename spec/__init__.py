"""spec — the laws of scaled dot-product attention as Hypothesis properties, runnable against any
implementation.

Importing ``spec`` (or any of its modules below the laws: ``spec.golden``, ``spec.target``, ...)
loads nothing else: the names below are loaded when first used, the laws are collected from
`spec.registry.LAW_MODULES` and the keyword declarations from `spec.keywords.KEYWORD_MODULES` when
first asked for (a target loads the declarations, never a law). The modules,
each with one job (its docstring's first line), are mapped in docs/architecture.md.

>>> import spec
>>> report = spec.check("reference", profile="quick", only=["rows_sum_to_one"])
>>> report.ok, [(r.name, r.status) for r in report.results]
(True, [('rows_sum_to_one', 'pass')])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "golden": "spec.golden",
    "BUILTIN": "spec.builtin", "as_target": "spec.builtin", "load_target": "spec.builtin",
    "from_torch": "spec.adapters.torch", "from_jax": "spec.adapters.jax", "from_mlx": "spec.adapters.mlx",
    "from_onnx": "spec.adapters.onnx",
    "PROFILES": "spec.profiles",
    "LAW_MODULES": "spec.registry", "LAWS": "spec.registry", "Law": "spec.registry",
    "Report": "spec.report", "Result": "spec.report", "Counterexample": "spec.report",
    "check": "spec.runner", "replay": "spec.runner",
    "judge": "spec.verdict", "Verdict": "spec.verdict",
    "Target": "spec.target", "TargetError": "spec.target",
    "MergeTarget": "spec.merge_target",
    "RankTarget": "spec.rank_target",
}
"""Where each public name lives: loaded on first use (PEP 562), so that ``import spec.golden`` —
which imports this package first — needs NumPy alone."""

__all__ = sorted(_WHERE)

_DEPRECATED = {"PROPERTIES": "LAWS", "Property": "Law"}
"""Old names, kept for one release: each warns (DeprecationWarning) and gives the new one."""

if TYPE_CHECKING:  # the names, for type checkers and editors
    from spec import golden  # noqa: F401
    from spec.adapters.jax import from_jax  # noqa: F401
    from spec.adapters.mlx import from_mlx  # noqa: F401
    from spec.adapters.onnx import from_onnx  # noqa: F401
    from spec.adapters.torch import from_torch  # noqa: F401
    from spec.builtin import BUILTIN, as_target, load_target  # noqa: F401
    from spec.merge_target import MergeTarget  # noqa: F401
    from spec.profiles import PROFILES  # noqa: F401
    from spec.rank_target import RankTarget  # noqa: F401
    from spec.registry import LAW_MODULES, LAWS, Law  # noqa: F401
    from spec.report import Counterexample, Report, Result  # noqa: F401
    from spec.runner import check, replay  # noqa: F401
    from spec.target import Target, TargetError  # noqa: F401
    from spec.verdict import Verdict, judge  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        import warnings

        warnings.warn(f"spec.{name} is deprecated: use spec.{_DEPRECATED[name]}", DeprecationWarning,
                      stacklevel=2)
        return __getattr__(_DEPRECATED[name])
    if name not in _WHERE:
        raise AttributeError(f"module 'spec' has no attribute {name!r}")
    module = importlib.import_module(_WHERE[name])
    value = module if name == "golden" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
