"""The suite's search at the edges (issue 15): tile-edge sizes derived from one tuple, the boundary
grid run first in every profile, and the empty_keys law with its declaration."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import find, settings

import spec
from impl import attention
from spec.cases import BOUNDARY, LONG_TILE, TILE_SIZES, boundary_cases, cases, tile_edges

QUICK_FIND = settings(max_examples=2000, database=None, derandomize=True)


def test_tile_edges_are_below_at_above_and_one_partial_tile_past_every_tile():
    edges = tile_edges()
    assert list(edges) == sorted(set(edges))
    for t in TILE_SIZES:
        assert {t - 1, t, t + 1, t + TILE_SIZES[0] + 1} <= set(edges)
    assert tile_edges((10,)) == (9, 10, 11, 21)


@pytest.mark.parametrize("n", [257, 255, 33, 17])
def test_tile_cases_reach_the_short_tile_edges(n):
    target = spec.load_target("reference")
    found = find(cases(target, tiles=True), lambda c: c.n_q == n and c.n_k != c.n_q, settings=QUICK_FIND)
    assert found.d_k <= 8 and found.heads == 1


def test_random_cases_stay_below_the_key_tile():
    target = spec.load_target("reference")
    with pytest.raises(Exception, match="No examples found"):
        find(cases(target, causal=(True,), tiles=True), lambda c: c.n_k > LONG_TILE, settings=QUICK_FIND)


def test_boundary_grid_covers_every_small_size_and_flag():
    target = spec.load_target("reference")
    grid = boundary_cases(target)
    want = {(n_q, n_k, c) for n_q in range(1, BOUNDARY + 1) for n_k in range(1, BOUNDARY + 1)
            for c in (False, True)}
    assert {(c.n_q, c.n_k, c.causal) for c in grid} == want and len(grid) == len(want)
    assert {c.dtype for c in grid} == set(target.dtypes)
    only = boundary_cases(target, causal=(True,), n_k_min=2, keep=lambda c: c.n_q <= c.n_k)
    assert only and all(c.causal and 2 <= c.n_k and c.n_q <= c.n_k for c in only)
    big = boundary_cases(target, tiles=True, long=True)
    assert {(257, 255), (255, 257)} <= {(c.n_q, c.n_k) for c in big}
    assert [c.n_q for c in big if c.n_q > LONG_TILE] == [LONG_TILE + 17]


def test_boundary_grid_runs_first_in_every_profile():
    def wrong_at_2_by_3(q, k, v, *, causal=False, mask=None, scale=None):
        out = attention(q, k, v, causal=causal, mask=mask, scale=scale)
        return out + 1 if (q.shape[-2], k.shape[-2]) == (2, 3) else out

    target = spec.Target(wrong_at_2_by_3, supports_mask=True, supports_scale=True)
    report = spec.check(target, profile="quick", max_examples=1, only=["matches_golden"])
    (result,) = report.results
    assert result.status == "fail"
    assert (result.counterexample.case["n_q"], result.counterexample.case["n_k"]) == (2, 3)


def test_empty_keys_declaration_is_validated_and_defaults_to_compute():
    assert spec.Target(attention).empty_keys == "compute"
    with pytest.raises(spec.TargetError, match="empty_keys"):
        spec.Target(attention, empty_keys="nan")


@pytest.mark.parametrize("name", ["reference", "flash"])
def test_builtin_targets_give_zeros_without_keys(name):
    report = spec.check(name, profile="quick", only=["empty_keys"])
    assert report.ok and report.results[0].status == "pass"
    out = spec.load_target(name)(np.ones((3, 2)), np.ones((0, 2)), np.ones((0, 5)))
    assert out.shape == (3, 5) and np.all(out == 0)


def test_a_refusal_must_be_a_clear_error():
    def refuses_vaguely(q, k, v, *, causal=False):
        if k.shape[-2] == 0:
            raise RuntimeError("")
        return attention(q, k, v, causal=causal)

    target = spec.Target(refuses_vaguely, empty_keys="raise")
    report = spec.check(target, profile="quick", only=["empty_keys"])
    assert report.results[0].status == "fail" and "ValueError or TypeError" in report.results[0].message
