"""The keyword law families (bias, window, softcap, sinks): each law has a gallery bug it
rejects, needs its Target capability (skipped with the reason otherwise), and says its law."""

from __future__ import annotations

import pytest
from gallery import BROKEN

import spec
from impl import attention
from spec import Target

FAMILIES = ("bias", "window", "softcap", "sinks")
FIELDS = {"bias": "supports_bias", "window": "supports_window", "softcap": "supports_softcap",
          "sinks": "supports_sinks"}


def _laws(family: str) -> list[str]:
    return [name for name, p in spec.PROPERTIES.items() if p.family == family]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_keyword_law_has_a_gallery_bug(family):
    laws = _laws(family)
    assert len(laws) >= 4
    assert set(laws) <= {b.catches for b in BROKEN}, sorted(set(laws) - {b.catches for b in BROKEN})


@pytest.mark.parametrize("family", FAMILIES)
def test_keyword_laws_skip_a_target_without_the_capability(family):
    report = spec.check(Target(attention, ndims=(2, 3, 4)), profile="quick", only=_laws(family))
    assert all(r.status == "skip" and FIELDS[family] in r.message for r in report.results)


@pytest.mark.parametrize("family", FAMILIES)
def test_keyword_laws_name_their_capability(family):
    for name in _laws(family):
        assert FIELDS[family] in spec.PROPERTIES[name].requires, name


def test_range_laws_have_float16_bugs():
    caught = {b.catches for b in BROKEN if "float16" in b.bug}
    assert {"large_logits", "masked_rows_policy"} <= caught
