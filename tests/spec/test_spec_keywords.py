"""A keyword is declared once (spec.keywords.Keyword, in its own module of spec.keywords) and
everything reads the declaration: what a declaration must hold, the table of declared keywords (in
the order draws and reports depend on), and what the rest of the suite reads from it (the gradient
extras, the ranks a keyword is drawn at, the capability a law of the keyword needs)."""

from __future__ import annotations

import typing

import pytest

import spec
from impl import attention
from spec import Target, keywords
from spec import target as target_module
from spec.cases import Case, cases
from spec.keywords import Keyword, Leaves, Reads, Transforms, gradient_extras, registered
from spec.target import TargetError, capability_names


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


def test_a_keyword_names_its_capability_supports_or_returns():
    for field in ("window", "supports_", "Supports_window", "supports window"):
        with pytest.raises(ValueError, match="must be named supports_… or returns_…"):
            _keyword(field=field)
    assert _keyword(field="returns_extra").field == "returns_extra"


DECLARATION_ORDER = ["bias", "alibi", "kv_lengths", "window", "softcap", "lse", "sinks", "varlen", "paged",
                     "fp8", "past_kv", "dropout", "chunk", "topk", "topk_blocks", "qv", "mask_mod",
                     "score_mod", "num_splits"]
"""The keywords in the order they were declared when the law modules declared them (the base of
the one-module-per-keyword move): the cases draw, write and the oracle reads them in this order,
so a change of it changes every run's draws."""


def test_keywords_are_declared_in_the_order_draws_depend_on():
    assert list(registered()) == DECLARATION_ORDER
    assert [m.rsplit(".", 1)[1] for m in keywords.KEYWORD_MODULES] == [
        "bias", "alibi", "kv_lengths", "window", "softcap", "lse", "sinks", "varlen", "paged", "fp8", "past",
        "dropout", "chunk", "topk", "topk_blocks", "qv", "mask_mod", "score_mod", "num_splits"]


def test_a_target_takes_every_keywords_capability_and_no_other():
    """A target's keyword capabilities are the keywords' own (no list of flags in Target to keep in
    step): each is a constructor keyword and an attribute, False unless declared."""
    assert list(capability_names()) == [kw.field for kw in registered().values()]
    plain = Target(attention)
    assert plain.capabilities == () and not any(getattr(plain, kw.field) for kw in registered().values())
    with pytest.raises(TypeError, match="unexpected keyword argument 'supports_windows'"):
        Target(attention, supports_windows=True)
    with pytest.raises(AttributeError, match="supports_windows"):
        plain.supports_windows  # noqa: B018
    with pytest.raises(TargetError, match="capabilities names 'supports_windows'"):
        Target(attention, capabilities=("supports_windows",))


def test_a_capability_is_declared_read_and_replaced_as_a_field():
    import dataclasses

    target = Target(attention, supports_window=True, returns_lse=True, supports_bias=False)
    assert target.supports_window and target.returns_lse and not target.supports_bias
    assert target.capabilities == ("supports_window", "returns_lse")  # in declaration order
    assert Target(attention, returns_lse=True, supports_window=True) == target
    changed = target.replace(supports_window=False, supports_bias=True)
    assert (changed.supports_window, changed.supports_bias, changed.returns_lse) == (False, True, True)
    assert dataclasses.replace(target, supports_sinks=True).capabilities == (
        "supports_window", "returns_lse", "supports_sinks")
    assert dataclasses.replace(target, name="x").capabilities == target.capabilities


def test_a_keyword_capability_cannot_be_a_field_of_target():
    """``supports_mask`` is a core flag of Target, not a keyword's: a keyword named so is refused."""
    clash = _keyword(field="supports_mask")
    with pytest.raises(ValueError, match="'supports_mask', which is a field of Target"):
        with keywords.declared(clash):
            Target(attention)
    assert Target(attention, supports_mask=True).supports_mask


def test_two_declarations_of_one_argument_are_refused(tmp_path, monkeypatch):
    (tmp_path / "twice.py").write_text(
        "from spec.keywords import Keyword, Leaves\n"
        "A = Keyword(name='a', field='supports_bias', passes=('bias',), meaning='m',\n"
        "            terms=(Leaves('x'),), received=lambda case, p: (p,))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="'bias' is passed by both keyword 'bias' and 'a'"):
        keywords.collect_keywords(("spec.keywords.bias", "twice"))


def test_two_keywords_with_sink_logits_are_refused():
    """The golden and the backward hold one sink logit per row: a second Sinks term would have
    been dropped without a word."""
    sinks = registered()["sinks"]
    before = dict(registered())
    twin = sinks.replace(name="more_sinks", passes=("more_sinks",))
    with pytest.raises(ValueError, match="'sinks', 'more_sinks' each declare a Sinks term"):
        keywords.check_keywords(before | {"more_sinks": twin})
    assert registered() == before


def test_a_keyword_that_reads_k_and_v_and_draws_cases_must_write_them():
    with pytest.raises(ValueError, match="needs writes="):
        Keyword(name="pages", field="supports_paged_kv", passes=("pages",), meaning="m",
                terms=(Reads(lambda k, v: (k, v)),), received=lambda c, p: (p,), draw=lambda d, t, c: c)


def test_a_carried_argument_must_be_passed_by_a_keyword():
    before = dict(registered())
    odd = before["paged"].replace(name="odd", passes=("odd_table",), carries=("nothing_passes_this",))
    with pytest.raises(ValueError, match=r"carries \['nothing_passes_this'\], which no declared keyword"):
        keywords.check_keywords(before | {"odd": odd})
    assert registered() == before


# --- what the rest of the suite reads from the declarations -----------------------------------


def test_gradient_extras_are_read_from_the_keywords_terms():
    extras = gradient_extras()
    assert {name: kw.passes[0] for name, kw in extras.items()} == {"dbias": "bias", "dsinks": "sinks",
                                                                     "dqv": "qv"}


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
    return [name for name, p in spec.LAWS.items() if f"({field})" in p.requires]


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_keyword_laws_skip_a_target_without_the_capability(keyword):
    """A target that declares every other keyword (and masks) is skipped, naming this one's field."""
    field = registered()[keyword].field
    others = {kw.field: True for kw in registered().values() if kw.field != field}
    target = Target(attention, ndims=(2, 3, 4), supports_mask=True, supports_scale=True, **others)
    report = spec.check(target, profile="quick", only=_laws(keyword))
    assert report.results and all(r.status == "skip" and field in r.message for r in report.results)


def test_one_arrangement_names_each_layout_of_a_call():
    """Each arrangement of a call (`spec.keywords.Arrangement`, the one `spec.target` imports) is a
    keyword's or dense, and has its arrays that move with the layout (`spec.keywords.in_layout`)."""
    arrangements = typing.get_args(keywords.Arrangement)
    assert target_module.Arrangement is keywords.Arrangement
    assert {k.arrangement for k in registered().values()} | {"dense"} == set(arrangements)
    assert all("q" in keywords.in_layout(a) for a in arrangements)
