"""spec — the laws of scaled dot-product attention as Hypothesis properties, runnable against any
implementation.

The package, one owner per thing (arrows: "imports"; none point back):

- ``golden``     float64 engine from terms (forward: out, weights, lse; backward), causal builders
- ``dtypes``     bfloat16 detected once, as_dtype, finfo, eps, tiny
- ``tolerance``  baseline in the target's dtype, floors, compare → Comparison      (→ golden, dtypes)
- ``target``     Target: declarations, one field per keyword, layout translation     (→ dtypes)
- ``keywords``   Keyword: a keyword declared once, and its terms                (→ golden, target)
- ``inputs``     Inputs: one call's arguments as the target receives them
- ``oracle``     golden, baseline, floor, visibility of an Inputs, and its gradients, from the terms
                                                    (→ golden, tolerance, keywords, inputs, target)
- ``cases``      Case: a small replayable record → its Inputs                 (→ keywords, inputs)
- ``calling``    THE call path into a target (forward, lse, gradients), isolation
                                                            (→ golden, keywords, inputs)
- ``registry``   Property, @law (marks only), Need, LAW_MODULES, PROPERTIES     (→ cases, keywords)
- ``laws/``      _helpers (run, the one tolerance assertion, the one no-leak assertion), _needs,
                 _range (amplitudes at the edge of a dtype's range, from finfo); core, masks,
                 gradients, and one module per keyword, holding its declaration: bias, alibi,
                 window, softcap, sinks, lengths, dropout, lse; grad_keywords (the backward under
                 the keywords)                              (→ calling, cases, oracle, registry)
- ``profiles``   every Hypothesis profile                                         (→ hypothesis)
- ``report``     Result/Report as data and the one renderer                        (→ tabulate)
- ``runner``     check, run_property, replay                  (→ registry, profiles, report, builtin)
- ``builtin``    names, files → targets, and back; the only module importing impl (→ target, impl, frameworks)
- ``frameworks`` torch/jax adapters, their declared Targets, from_torch/from_jax (grad=True: autograd,
                 jax.vjp)                                        (→ target, calling, keywords)
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
