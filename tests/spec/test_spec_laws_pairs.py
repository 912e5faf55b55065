"""Keywords two at a time (spec.laws.pairs): which pairs a target is checked under, and that each is
met in every profile."""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import spec
from spec.builtin import load_target
from spec.keywords import registered
from spec.laws.pairs import forward_pairs, gradient_pairs, named, pair_grid, pairs

KEYWORDS = registered()


def names(found):
    return {named(pair) for pair, _ in found}


def test_pairs_that_one_call_cannot_take_are_left_out():
    reference = load_target("reference")
    found = names(forward_pairs(reference))
    # ranks apart, one carrying the other, or a bias shaped by n_k beside a cache
    apart = {"kv_lengths + varlen", "varlen + paged", "kv_lengths + paged", "bias + paged", "varlen + fp8"}
    assert not apart & found
    assert {"bias + softcap", "alibi + softcap", "softcap + varlen", "window + paged", "paged + fp8"} <= found
    assert not any("dropout" in n or "lse" in n for n in found)  # their golden is not the output's


@pytest.mark.parametrize("name", ["reference", "flash"])
@pytest.mark.parametrize("which", [forward_pairs, gradient_pairs])
def test_every_pair_has_a_grid_case_that_draws_both(name, which):
    target = load_target(name)
    drawn = which(target)
    grid = pair_grid(target, which)
    assert len(grid) == len(drawn) > 0
    for (pair, _), case in zip(drawn, grid, strict=True):
        # (a paged cache carries kv_lengths)
        assert {kw.name for kw in pair} <= set(case.keywords), (named(pair), case.keywords)


def test_the_counts_of_pairs_drawn_in_every_profile():
    """What the closing note states: the pairs each built-in target is checked under."""
    names = ("reference", "flash", *(["torch"] if importlib.util.find_spec("torch") else []))
    counts = {name: (len(forward_pairs(load_target(name))), len(gradient_pairs(load_target(name))))
              for name in names}
    reference = load_target("reference")
    reference_forward = [kw for kw in KEYWORDS.values()
                         if kw.draw is not None and kw.name != "dropout" and getattr(reference, kw.field)]
    combined = sum(a.combines_with(b) for a, b in itertools.combinations(reference_forward, 2))
    assert counts["reference"][0] == combined
    assert counts.get("torch", (0, 0)) == (0, 0)  # torch's SDPA takes one keyword that pairs: none
    report = spec.check("flash", profile="quick", only=["keyword_pairs_match_golden"])
    assert report.results[0].examples >= counts["flash"][0]


def test_a_keyword_that_resizes_the_case_is_drawn_first():
    """ALiBi's slopes are drawn per batch row; key lengths then choose the batch: drawn after them,
    the slopes had the batch of before ([1, heads] for three rows)."""
    reference = load_target("reference")
    strategy = {named(pair): s for pair, s in forward_pairs(reference)}["alibi + kv_lengths"]

    @settings(max_examples=60, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def sized(case):
        slopes = case.inputs().get("alibi_slopes")
        assert np.shape(slopes) in ((case.heads,), (case.batch, case.heads)), (np.shape(slopes), case)

    sized()


def test_a_paged_case_draws_no_mask():
    reference = load_target("reference")
    strategy = {named(pair): s for pair, s in forward_pairs(reference)}["window + paged"]

    @settings(max_examples=40, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def unmasked(case):
        assert case.mask == "none" and case.inputs().mask is None

    unmasked()


def test_a_float8_cache_taken_only_paged_pairs_with_a_paged_cache():
    flash = load_target("flash")
    assert flash.fp8_kv_paged_only
    assert all(KEYWORDS["paged"] in pair for pair in pairs(flash, [KEYWORDS[n] for n in ("alibi", "fp8")]))
