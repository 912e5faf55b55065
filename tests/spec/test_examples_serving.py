"""The serving kernels of examples/serving_kernels.py (docs/targets.md, "Declare a serving kernel"):
each conforms with its declarations alone, the laws its declarations rule out skipped naming them,
and without any one of its declarations it fails, its calls refused (ValueError)."""

from __future__ import annotations

import pytest

import spec
from spec.target import DECLARATIONS, Target

pytest.importorskip("ml_dtypes")  # the paged kernel takes float8 caches
from examples import serving_kernels

KERNELS = ["causal", "decode", "chunked_prefill", "prefill", "paged"]
FAMILY = {"supports_window": "window", "supports_alibi": "alibi", "supports_fp8_kv": "cache",
          "supports_paged_kv": "cache"}
"""The family of the laws of the keyword each declaration of a keyword's form narrows."""


def _declared(target: Target) -> list[str]:
    return [d.field for d in DECLARATIONS if d.declared(target)]


def _laws(field: str) -> list[str]:
    """The laws that meet a declaration: its keyword's family, or the plain calls."""
    (declaration,) = [d for d in DECLARATIONS if d.field == field]
    if declaration.narrows is None:
        return ["matches_golden", "rows_sum_to_one"]
    return [name for name, law in spec.LAWS.items() if law.family == FAMILY[declaration.narrows]]


@pytest.mark.parametrize("name", KERNELS)
def test_each_serving_kernel_conforms_with_its_declarations(name):
    target = getattr(serving_kernels, name)
    report = spec.check(target, profile="quick")
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert report.limits == ", ".join(d.said(target) for d in DECLARATIONS if d.declared(target))
    assert sum(r.status == "pass" for r in report.results) >= 14
    for r in report.results:  # a law its declarations rule out says which
        if r.status == "skip" and "declared limits" in r.message:
            assert any(field in r.message for field in _declared(target)), (r.name, r.message)


@pytest.mark.parametrize(("name", "field"), [(name, field) for name in KERNELS
                                             for field in _declared(getattr(serving_kernels, name))])
def test_without_one_of_its_declarations_a_serving_kernel_fails_on_the_calls_it_refuses(name, field):
    target = getattr(serving_kernels, name)
    (declaration,) = [d for d in DECLARATIONS if d.field == field]
    report = spec.check(target.replace(**{field: declaration.default}), profile="quick", only=_laws(field))
    assert not report.ok, field
    assert all("raised ValueError" in r.message for r in report.failures), [r.message
                                                                             for r in report.failures]


def test_every_declaration_has_a_kernel():
    assert {field for name in KERNELS for field in _declared(getattr(serving_kernels, name))} == \
        {d.field for d in DECLARATIONS}
