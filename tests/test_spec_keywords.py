"""A keyword is declared once (spec.keywords.Keyword, in its law module) and everything reads the
declaration: what a declaration must hold, the table of declared keywords, and what the rest of the
suite reads from it (the gradient extras, the ranks a keyword is drawn at, the capability a law of
the keyword needs)."""

from __future__ import annotations

import typing

import pytest

import spec
from impl import attention
from spec import Target, registry
from spec import target as target_module
from spec.cases import Case, cases
from spec.keywords import Keyword, Leaves, Reads, Transforms, gradient_extras, registered
from spec.target import keyword_fields


def _keyword(**changes):
    given = dict(name="extra", field="supports_bias", passes=("extra",), meaning="m",
                 terms=(Leaves("a test keyword"),), received=lambda case, p: (p,))
    return Keyword(**(given | changes))


def test_a_keyword_without_terms_cannot_be_declared():
    with pytest.raises(ValueError, match="needs its terms"):
        _keyword(terms=())
    with pytest.raises(ValueError, match="needs its terms"):
        _keyword(terms=(lambda s: s,))


def test_a_transform_cannot_be_declared_without_its_baseline():
    with pytest.raises(TypeError, match="baseline"):
        Transforms(golden=lambda s, c: s, derivative=lambda s, c: 1.0)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="reason"):
        Leaves(" ")


def test_a_keyword_names_a_capability_field_of_target():
    with pytest.raises(ValueError, match="no keyword field 'supports_nothing'"):
        _keyword(field="supports_nothing")
    with pytest.raises(ValueError, match="no keyword field 'supports_mask'"):  # a core flag, not a keyword's
        _keyword(field="supports_mask")


def test_every_keyword_field_is_declared_by_one_keyword():
    """A keyword field of Target that no keyword declares would be a flag no law reads."""
    fields = [kw.field for kw in registered().values()]
    assert sorted(fields) == sorted(keyword_fields(Target))


def test_two_declarations_of_one_argument_are_refused(tmp_path, monkeypatch):
    (tmp_path / "twice.py").write_text(
        "from spec.keywords import Keyword, Leaves\n"
        "A = Keyword(name='a', field='supports_bias', passes=('bias',), meaning='m',\n"
        "            terms=(Leaves('x'),), received=lambda case, p: (p,))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="'bias' is passed by both keyword 'bias' and 'a'"):
        registry.collect_keywords(("spec.laws.bias", "twice"))


def test_two_keywords_with_sink_logits_are_refused():
    """The golden and the backward hold one sink logit per row: a second Sinks term would have
    been dropped without a word."""
    sinks = registered()["sinks"]
    before = dict(registered())
    twin = sinks.replace(name="more_sinks", passes=("more_sinks",))
    with pytest.raises(ValueError, match="'sinks', 'more_sinks' each declare a Sinks term"):
        registry.check_keywords(before | {"more_sinks": twin})
    assert registered() == before


def test_a_keyword_that_reads_k_and_v_and_draws_cases_must_write_them():
    with pytest.raises(ValueError, match="needs writes="):
        Keyword(name="pages", field="supports_paged_kv", passes=("pages",), meaning="m",
                terms=(Reads(lambda k, v: (k, v)),), received=lambda c, p: (p,), draw=lambda d, t, c: c)


def test_a_carried_argument_must_be_passed_by_a_keyword():
    from spec import registry

    before = dict(registered())
    odd = before["paged"].replace(name="odd", passes=("odd_table",), carries=("nothing_passes_this",))
    with pytest.raises(ValueError, match=r"carries \['nothing_passes_this'\], which no declared keyword"):
        registry.check_keywords(before | {"odd": odd})
    assert registered() == before


# --- what the rest of the suite reads from the declarations -----------------------------------


def test_gradient_extras_are_read_from_the_keywords_terms():
    extras = gradient_extras()
    assert {name: kw.passes[0] for name, kw in extras.items()} == {"dbias": "bias", "dsinks": "sinks"}


def test_a_keyword_is_drawn_only_at_its_ranks():
    with pytest.raises(ValueError, match="ndims must be a non-empty subset"):
        Keyword(name="x", field="supports_bias", passes=("x",), meaning="", terms=(Leaves("test"),),
                received=lambda case, p: (p,), ndims=(5,))
    kv_lengths = spec.keywords.registered()["kv_lengths"]
    assert kv_lengths.ndims == (4,) and spec.keywords.registered()["varlen"].ndims == (3,)
    from hypothesis import given, settings

    @settings(max_examples=20, deadline=None, database=None)
    @given(cases(spec.load_target("reference"), keywords=(kv_lengths,)))
    def drawn(case: Case) -> None:
        assert case.ndim == 4

    drawn()


KEYWORDS = sorted(registered())


def _laws(keyword: str) -> list[str]:
    field = registered()[keyword].field
    return [name for name, p in spec.PROPERTIES.items() if f"({field})" in p.requires]


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_keyword_laws_skip_a_target_without_the_capability(keyword):
    """A target that declares every other keyword (and masks) is skipped, naming this one's field."""
    field = registered()[keyword].field
    others = {kw.field: True for kw in registered().values() if kw.field != field}
    target = Target(attention, ndims=(2, 3, 4), supports_mask=True, **others)
    report = spec.check(target, profile="quick", only=_laws(keyword))
    assert report.results and all(r.status == "skip" and field in r.message for r in report.results)


def test_one_arrangement_names_each_layout_of_a_call():
    """Each arrangement of a call (`spec.target.Arrangement`, which `spec.keywords` imports) has its row
    in `spec.target.IN_LAYOUT` (the arrays that move with the layout), and every keyword's is one."""
    assert typing.get_args(target_module.Arrangement) == tuple(target_module.IN_LAYOUT)
    assert {k.arrangement for k in registered().values()} <= set(target_module.IN_LAYOUT)
