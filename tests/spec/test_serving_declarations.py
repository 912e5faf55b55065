"""The serving declarations (`Target.causal_only`, `decode_only`, `keys_cover_queries`,
`self_attention_only`): a kernel of our own with each contract (tests/spec/serving_kernels.py),
refusing every call outside it, conforms with its declarations alone, fails without them, and a
broken variant of it still fails its law; the draws and grids never leave a declaration."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
import serving_kernels as sk  # tests/spec, on the path as pytest runs this file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spec
from spec import Target, TargetError
from spec.cases import Case, cases, limits_text, outside_limits
from spec.keywords import registered
from spec.laws.cache import cache_cases
from spec.laws.core import WIDE_GROUPS, _wide_groups
from spec.laws.past import past_cases
from spec.target import DECLARATIONS

SERVING = ("causal_only", "decode_only", "keys_cover_queries", "self_attention_only")

# kernel, its declarations (the serving one first), its broken variant and the law that catches it,
# the laws it must run (not skip) under its declarations
KERNELS: dict[str, tuple[Any, dict[str, Any], dict[str, bool], str, tuple[str, ...]]] = {
    "causal_only": (sk.causal_only, dict(causal_only=True), {"off_by_one": True}, "matches_golden",
                    ("matches_golden", "causal_no_leak")),
    "decode_only": (sk.decode_only, dict(decode_only=True, causal_alignment="bottom_right"),
                    {"drop_last": True}, "matches_golden",
                    ("matches_golden", "long_rows_every_dtype", "kv_permutation_invariance")),
    "keys_cover_queries": (sk.prefix_plus_new_keys,
                           dict(keys_cover_queries=True, causal_alignment="kv_lengths",
                                supports_kv_lengths=True),
                           {"stale_prefix": True}, "causal_aligned_per_sequence",
                           ("matches_golden", "kv_lengths_is_truncation", "causal_aligned_per_sequence",
                            "long_rows_every_dtype")),
    "self_attention_only": (sk.self_attention_only,
                            dict(self_attention_only=True, supports_varlen=True, ndims=(2, 3, 4)),
                            {"causal_leak": True}, "causal_no_leak",
                            ("matches_golden", "causal_no_leak", "varlen_is_each_sequence_alone",
                             "long_rows_every_dtype")),
}


def _target(name: str, *, declared: bool = True, **broken: bool) -> Target:
    fn, declarations, _, _, _ = KERNELS[name]
    given_ = {k: v for k, v in declarations.items() if declared or k != name}
    return Target(functools.partial(fn, **broken) if broken else fn, name=name, **given_)


@pytest.mark.parametrize("name", list(KERNELS))
def test_a_serving_kernel_conforms_with_its_declaration_alone(name):
    report = spec.check(_target(name), profile="ci", keep_going=True)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    ran = {r.name for r in report.results if r.status == "pass"}
    assert set(KERNELS[name][4]) <= ran, set(KERNELS[name][4]) - ran
    assert name in report.limits
    for r in report.results:  # a law the declarations rule out says which
        if r.status == "skip" and "declared limits" in r.message:
            assert name in r.message, (r.name, r.message)


@pytest.mark.parametrize("name", list(KERNELS))
def test_without_its_declaration_the_same_kernel_fails(name):
    report = spec.check(_target(name, declared=False), profile="ci",
                        only=["matches_golden", "rows_sum_to_one"], keep_going=True)
    assert not report.ok
    assert all("ValueError" in r.message for r in report.failures), [r.message for r in report.failures]


@pytest.mark.parametrize("name", list(KERNELS))
def test_a_broken_serving_kernel_still_fails_its_law(name):
    _, _, broken, law, _ = KERNELS[name]
    report = spec.check(_target(name, **broken), profile="ci", only=[law])
    assert [r.name for r in report.failures] == [law], [(r.name, r.status, r.message) for r in report.results]


def test_a_law_that_needs_what_a_declaration_rules_out_is_skipped_naming_it():
    report = spec.check(_target("decode_only"), profile="ci", only=["query_permutation_equivariance"])
    (result,) = report.results
    assert result.status == "skip" and "decode_only" in result.message
    report = spec.check(_target("keys_cover_queries"), profile="ci", only=["kv_lengths_zero_rows"])
    (result,) = report.results
    assert result.status == "skip" and "keys_cover_queries" in result.message


def _plain(q, k, v, **kw):
    raise AssertionError("never called: only drawn for")


DRAWN = dict(causal_alignment="kv_lengths", supports_kv_lengths=True, supports_varlen=True,
             supports_paged_kv=True, supports_past_kv=True, ndims=(2, 3, 4))


def _drawn(declaration: str, keyword: str) -> st.SearchStrategy[Case]:
    target = Target(_plain, **{declaration: True}, **DRAWN)
    if keyword == "past_kv":
        return past_cases(target).map(lambda c: (target, c))
    if keyword == "cache":  # the cache laws' decoding and chunked prefill
        return cache_cases(target).map(lambda c: (target, c))
    keywords = (registered()[keyword],) if keyword else ()
    return cases(target, keywords=keywords).map(lambda c: (target, c))


@pytest.mark.parametrize("declaration", SERVING)
@pytest.mark.parametrize("keyword", ["", "kv_lengths", "varlen", "paged", "past_kv", "cache"])
def test_every_draw_keeps_inside_the_declaration(declaration, keyword):
    @settings(max_examples=40, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(_drawn(declaration, keyword))
    def check(drawn):
        target, case = drawn
        assert outside_limits(target, case) == expected, case

    # a past cache adds keys to the call's own: never as many keys as queries (its laws are skipped)
    past_in_self_attention = (declaration, keyword) == ("self_attention_only", "past_kv")
    expected = "self_attention_only=True" if past_in_self_attention else None

    check()


@pytest.mark.parametrize("declaration", SERVING)
def test_the_wide_groups_grid_keeps_inside_the_declaration(declaration):
    """The GQA law's explicit cases (groups of 17, 17 and 20 query heads, built by hand) are made
    inside each declaration, so a decode or causal-only kernel meets them too."""
    target = Target(_plain, **{declaration: True}, supports_gqa=True, ndims=(3, 4),
                    causal_alignment="bottom_right")
    grid = _wide_groups(target)
    assert [(c.heads, c.kv_heads) for c in grid] == list(WIDE_GROUPS)
    assert all(outside_limits(target, c) is None for c in grid), grid


def test_each_declaration_of_the_table_is_a_target_field_with_its_default():
    """`DECLARATIONS` is read for what a target declares (a value other than its default): a record
    whose default drifted from the field's would call every target declared, or none."""
    defaults = {f.name: f.default for f in dataclasses.fields(Target)}
    assert {d.field for d in DECLARATIONS} >= set(SERVING)
    for declaration in DECLARATIONS:
        assert defaults[declaration.field] == declaration.default, declaration.field
        assert not declaration.declared(Target(_plain)), declaration.field


def test_the_declared_limits_header_names_each_declaration():
    for name in SERVING:
        extra = {"causal_alignment": "bottom_right"} if name == "causal_only" else {}
        assert name in limits_text(Target(_plain, **{name: True}, **extra))
    assert limits_text(Target(_plain)) == ""


@pytest.mark.parametrize(("given_", "message"), [
    (dict(causal_only="yes"), "causal_only must be True or False"),
    (dict(decode_only=1), "decode_only must be True or False"),
    (dict(causal_only=True, causal_alignment=None), "causal_only=True needs a causal mode"),
    (dict(decode_only=True, self_attention_only=True), "leaves one query over one key"),
    (dict(decode_only=True, seq_multiple=16), "seq_multiple=16 rules out"),
])
def test_contradictory_serving_declarations_are_refused(given_, message):
    with pytest.raises(TargetError, match=message):
        Target(_plain, **given_)


def test_compatible_serving_declarations_are_taken_together():
    target = Target(_plain, causal_only=True, decode_only=True, keys_cover_queries=True,
                    causal_alignment="bottom_right")
    assert limits_text(target) == "causal_only, keys_cover_queries, decode_only"
