"""The suite proves its own power: every broken implementation in the gallery is rejected by the
property meant to catch it, and the correct variants pass every property."""

from __future__ import annotations

import pytest
from gallery import BROKEN, CORRECT

import spec


@pytest.mark.parametrize("broken", BROKEN, ids=[b.target.name for b in BROKEN])
def test_broken_implementation_is_rejected_by_its_property(broken):
    report = spec.check(broken.target, profile="ci", only=[broken.catches])
    (result,) = report.results
    assert not report.ok
    assert result.status == "fail", f"{broken.catches} did not catch: {broken.bug}"
    assert result.counterexample is not None and result.message


@pytest.mark.parametrize("target", CORRECT, ids=[t.name for t in CORRECT])
@pytest.mark.parametrize("seed", [11, 12])
def test_correct_variant_passes_every_property(target, seed):
    report = spec.check(target, profile="quick", max_examples=6, seed=seed)
    assert report.ok, [(r.name, r.message, r.counterexample) for r in report.failures]
    assert any(r.status == "pass" for r in report.results)


@pytest.mark.parametrize("name", ["reference", "flash"])
def test_builtin_targets_conform(name):
    report = spec.check(name, profile="quick", seed=3)
    assert report.ok, [(r.name, r.message, r.counterexample) for r in report.failures]


def test_every_property_has_a_gallery_bug_it_catches():
    # The laws of spec.laws.core; modules that add laws (@law) test their own bugs.
    laws = {name for name, p in spec.PROPERTIES.items() if p.check.__module__ == "spec.laws.core"}
    caught = {b.catches for b in BROKEN}
    assert len(laws) >= 16 and laws <= caught, sorted(laws - caught)


def test_every_property_states_its_law_and_a_bug():
    for prop in spec.PROPERTIES.values():
        assert prop.law and prop.catches.startswith("Catches"), prop.name
