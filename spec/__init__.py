"""spec — the laws of scaled dot-product attention as Hypothesis properties, runnable against any
implementation.

The package, one owner per thing (arrows: "imports"; none point back):

- ``golden``     float64 oracles (forward: out, weights, lse; backward) and their visibility builders
- ``dtypes``     bfloat16 detection, as_dtype, finfo, eps, tiny
- ``tolerance``  baseline in the target's dtype, floors, compare → Comparison      (→ golden, dtypes)
- ``target``     Target: declarations incl. the §2b keywords, layout translation     (→ dtypes)
- ``cases``      Case: a small replayable record → arrays, keywords, visibility     (→ golden, target)
- ``calling``    THE call path into a target (forward, lse, gradients), isolation   (→ target)
- ``registry``   Property, @law (marks only), LAW_MODULES, PROPERTIES               (→ cases, target)
- ``laws/``      _helpers (run, the one tolerance assertion, needs), _range (amplitudes at the
                 edge of a dtype's range, from finfo); core, masks, gradients, and one module
                 per keyword: bias, window, softcap, sinks   (→ calling, cases, golden, tolerance, registry)
- ``profiles``   every Hypothesis profile                                         (→ hypothesis)
- ``report``     Result/Report as data and the one renderer                        (→ tabulate)
- ``runner``     check, run_property, replay                  (→ registry, profiles, report, builtin)
- ``builtin``    names → targets; the only module importing impl          (→ target, impl, frameworks)
- ``frameworks`` torch/jax adapters, their declared Targets, from_torch/from_jax   (→ target, golden)
- ``peers``      ``python -m spec.peers``: the per-dtype table            (→ frameworks, runner)
- ``cli``, ``pytest_plugin``: the two other doors                        (→ runner, report, builtin)

>>> import spec
>>> report = spec.check("reference", profile="quick", only=["rows_sum_to_one"])
>>> report.ok, [(r.name, r.status) for r in report.results]
(True, [('rows_sum_to_one', 'pass')])
"""

from spec import golden
from spec.builtin import BUILTIN, as_target, load_target
from spec.frameworks import from_jax, from_torch
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
    "from_jax",
    "from_torch",
    "golden",
    "load_target",
    "replay",
]
