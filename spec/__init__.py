"""spec — the laws of scaled dot-product attention as Hypothesis properties, runnable against any
implementation.

>>> import spec
>>> report = spec.check("reference", profile="quick", only=["rows_sum_to_one"])
>>> report.ok, [(r.name, r.status) for r in report.results]
(True, [('rows_sum_to_one', 'pass')])
"""

from spec import golden
from spec.builtin import BUILTIN, as_target, load_target
from spec.profiles import PROFILES
from spec.registry import LAW_MODULES, PROPERTIES, Property
from spec.report import Report, Result
from spec.runner import check, replay
from spec.target import Target, TargetError

__all__ = [
    "BUILTIN",
    "LAW_MODULES",
    "PROFILES",
    "PROPERTIES",
    "Property",
    "Report",
    "Result",
    "Target",
    "TargetError",
    "as_target",
    "check",
    "golden",
    "load_target",
    "replay",
]
