"""Every declared keyword (spec.keywords, read from its law module's declaration): each law that
needs it has a gallery bug it rejects, is skipped with the reason for a target without the
capability, and names the capability it needs."""

from __future__ import annotations

import pytest
from gallery import BROKEN

import spec
from impl import attention
from spec import Target
from spec.keywords import registered

KEYWORDS = sorted(registered())


def _laws(keyword: str) -> list[str]:
    field = registered()[keyword].field
    return [name for name, p in spec.PROPERTIES.items() if f"({field})" in p.requires]


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_every_keyword_law_has_a_gallery_bug(keyword):
    laws = _laws(keyword)
    assert laws, f"no law needs {keyword}"
    assert set(laws) <= {b.catches for b in BROKEN}, sorted(set(laws) - {b.catches for b in BROKEN})


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_keyword_laws_skip_a_target_without_the_capability(keyword):
    """A target that declares every other keyword (and masks) is skipped, naming this one's field."""
    field = registered()[keyword].field
    others = {kw.field: True for kw in registered().values() if kw.field != field}
    target = Target(attention, ndims=(2, 3, 4), supports_mask=True, **others)
    report = spec.check(target, profile="quick", only=_laws(keyword))
    assert report.results and all(r.status == "skip" and field in r.message for r in report.results)


def test_range_laws_have_float16_bugs():
    caught = {b.catches for b in BROKEN if "float16" in b.bug}
    assert {"large_logits", "masked_rows_policy"} <= caught
