"""The suite proves its own power: every broken implementation in the gallery (tests/spec/gallery) is
rejected by the property meant to catch it, the correct variants pass every property, and every
law, every keyword's laws among them, has a gallery bug it catches."""

from __future__ import annotations

import contextlib
import pkgutil

import gallery
import pytest
from gallery import BROKEN, CORRECT, FAMILIES

import spec
from spec import scale_plan
from spec.dtypes import has_ml_dtypes
from spec.keywords import registered
from spec.report import failure


def _sized(broken):
    return scale_plan.sized(broken.sizes) if broken.sizes is not None else contextlib.nullcontext()


# a broken implementation overflows or reads poisoned values on purpose (its bug: scores formed in
# float16, a finfo fill added to a score, a stale tail read), in the suite's call thread
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("broken", BROKEN, ids=[b.target.name for b in BROKEN])
def test_broken_implementation_is_rejected_by_its_property(broken):
    with _sized(broken):
        report = spec.check(broken.target, profile=broken.profile, only=[broken.catches])
    (result,) = report.results
    assert not report.ok
    assert result.status == "fail", f"{broken.catches} did not catch: {broken.bug}"
    assert result.counterexample is not None and result.message
    assert failure(result).count("reproduce:") == 1, failure(result)  # one line that replays, once


SCALE_BUGS = [b for b in BROKEN if b.profile == "scale"]


@pytest.mark.parametrize("broken", SCALE_BUGS, ids=[b.target.name for b in SCALE_BUGS])
def test_scale_bugs_pass_every_law_of_the_smaller_profiles(broken):
    """A scale bug starts past every size the other profiles draw: at ci (its boundary grid, the
    long causal square of 2,065 included, and drawn examples) it conforms, the scale laws not run."""
    report = spec.check(broken.target, profile="ci", max_examples=8, seed=5)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert not any(spec.LAWS[r.name.split("[")[0]].family == "scale" for r in report.results)
    assert sum(r.status == "pass" for r in report.results) >= 10


def test_scale_laws_run_only_at_the_scale_profile():
    """Named at another profile a scale law is skipped, saying where it runs."""
    (result,) = spec.check("reference", profile="quick", only=["scale_matches_golden"]).results
    assert result.status == "skip" and "--profile scale" in result.message


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


@pytest.mark.parametrize("law", list(spec.LAWS))
def test_every_law_has_a_gallery_bug_it_catches(law):
    """Every registered law, whatever module it lives in: some gallery bug is paired with it, and
    test_broken_implementation_is_rejected_by_its_property checks that the law rejects it."""
    module = spec.LAWS[law].check.__module__
    if "ml_dtypes" in spec.LAWS[law].requires and not has_ml_dtypes():
        pytest.skip(f"{law} needs ml_dtypes, and so do its gallery bugs (float8 caches)")
    if "torch.distributed" in spec.LAWS[law].requires and not gallery.ranks.HAS_RANKS:
        pytest.skip(f"{law} needs torch.distributed, and so do its gallery bugs (rings on gloo ranks)")
    assert any(b.catches == law for b in BROKEN), (
        f"no gallery bug for {law} ({module}): add a broken implementation it must reject to "
        f"tests/spec/gallery/<family>.py BROKEN")


def test_every_gallery_module_is_a_family():
    """A gallery module not listed in FAMILIES would have its bugs and variants silently unused."""
    # base and the _private helper modules hold no bugs or variants of their own
    modules = {m.name for m in pkgutil.iter_modules(gallery.__path__)
               if not m.name.startswith("_")} - {"base"}
    assert modules == {family.__name__.rsplit(".", 1)[1] for family in FAMILIES}
    assert all(b.catches in spec.LAWS for b in BROKEN), [b.catches for b in BROKEN
                                                               if b.catches not in spec.LAWS]


def test_every_property_states_its_law_and_a_bug():
    for prop in spec.LAWS.values():
        assert prop.statement and prop.catches.startswith("Catches"), prop.name


KEYWORDS = sorted(registered())


def _laws(keyword: str) -> list[str]:
    field = registered()[keyword].field
    return [name for name, p in spec.LAWS.items() if f"({field})" in p.requires]


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_every_keyword_law_has_a_gallery_bug(keyword):
    laws = _laws(keyword)
    assert laws, f"no law needs {keyword}"
    assert set(laws) <= {b.catches for b in BROKEN}, sorted(set(laws) - {b.catches for b in BROKEN})


def test_range_laws_have_float16_bugs():
    caught = {b.catches for b in BROKEN if "float16" in b.bug}
    assert {"large_logits", "masked_rows_policy"} <= caught
