"""spec.cases: the search at the edges (tile-edge sizes derived from one tuple, the boundary grid of
every small size and flag), the shapes a declaration allows, values representable in the case's
dtype, cases that replay by their fields, and caches written so that they read back to their own
keys."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import find, given, settings

import spec
from impl import attention
from spec import Target, oracle
from spec.cases import (
    BOUNDARY,
    LONG_TILE,
    SHAPE_GRID,
    SHAPE_WIDTHS,
    TILE_SIZES,
    Case,
    boundary_cases,
    cases,
    edges_for,
    outside_limits,
    tile_edges,
)

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


def test_keyword_parameters_replay_by_name():
    fields = dict(dtype="float32", ndim=2, batch=1, heads=1, n_q=2, n_k=3, d_k=2, d_v=2, seed=0)
    case = Case.from_fields(**fields, window=(1, 2), bias=(0.5, ""))
    assert case == Case(**fields, keywords={"window": (1, 2), "bias": (0.5, "")})
    assert case.describe()["window"] == (1, 2) and Case.from_fields(**case.describe()) == case
    with pytest.raises(TypeError, match="no field or keyword 'windw'"):
        Case.from_fields(**fields, windw=(1, 2))


@settings(max_examples=60, database=None)
@given(cases(Target(attention, causal_alignment="square_or_decoding"), causal=(True,)))
def test_square_or_decoding_draws_only_the_defined_shapes(case):
    assert case.causal and case.n_q in (1, case.n_k)


def test_cases_draw_representable_bfloat16_values():
    BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    for values in ("normal", "ints"):
        case = Case(dtype="bfloat16", ndim=4, batch=2, heads=2, n_q=5, n_k=7, d_k=9, d_v=3, seed=1,
                    values=values, amplitude=10.0)
        for x in case.arrays():
            assert x.dtype == BF16
            wide = x.astype(np.float64)
            assert np.array_equal(wide.astype(BF16).astype(np.float64), wide)
            assert np.all(np.isfinite(wide))


# --- cases write caches that read back to their own keys -----------------------------------------


def _paged_case(**keywords):
    fields = dict(dtype="float32", ndim=4, batch=2, heads=2, n_q=3, n_k=7, d_k=4, d_v=2, seed=5)
    return Case(**fields, keywords={"kv_lengths": (7, 2), "paged": (3, "nan")} | keywords)


def test_a_paged_case_reads_back_to_its_own_keys_and_poisons_the_rest():
    case = _paged_case()
    inputs = case.inputs()
    pool, table = inputs.k, inputs.get("block_table")
    assert pool.shape[1:] == (3, 2, 4) and table.dtype == np.int32 and table.shape == (2, 3)
    read = oracle.meaning(inputs)
    k = case.arrays()[1]
    np.testing.assert_array_equal(read.k[0, :, :7], k[0, :, :7])
    np.testing.assert_array_equal(read.k[1, :, :2], k[1, :, :2])
    assert (read.k[1, :, 2:] == 0).all()
    owned = 3 + 1  # ceil(7 / 3) + ceil(2 / 3) blocks, and 1 or 2 spare ones, all NaN where unowned
    assert pool.shape[0] > owned and np.isnan(pool).sum() == (pool.shape[0] * 3 - 9) * 2 * 4
    assert len({*table[0].tolist(), table[1, 0]}) == 4  # the sequences' blocks are distinct
    assert Case.from_fields(**case.describe()) == case


def test_a_float8_case_quantizes_to_its_keys_within_three_bits():
    FLOAT8 = pytest.importorskip("ml_dtypes").float8_e4m3fn
    case = Case(dtype="float32", ndim=4, batch=2, heads=2, n_q=3, n_k=5, d_k=4, d_v=2, seed=6,
                keywords={"fp8": (((0.25, 2.0), (1.0, 0.0625)), ((4.0, 0.5), (0.125, 1.0)))})
    inputs = case.inputs()
    assert inputs.k.dtype == FLOAT8 and inputs.get("k_descale").dtype == np.float32
    read = oracle.meaning(inputs)
    k = case.arrays()[1].astype(np.float64)
    np.testing.assert_allclose(read.k, k, rtol=2 ** -4, atol=2.0 ** -10 * 2)  # e4m3: 3 bits
    assert Case.from_fields(**case.describe()) == case


# --- what drawing costs ------------------------------------------------------------------------------


def test_a_choice_with_one_option_costs_no_draw():
    """``pick`` returns a sole option without drawing it: a one-element ``sampled_from`` (``just``)
    costs Hypothesis as much as a real choice, and a case makes several (amplitude, mask, values),
    thousands of draws over a check."""
    from spec.cases import pick

    def no_draw(strategy):
        raise AssertionError(f"drew {strategy!r}")

    assert pick(no_draw, ("none",)) == "none"
    seen = []
    assert pick(lambda s: seen.append(s) or "random", ("none", "random")) == "random" and len(seen) == 1


def test_the_long_boundary_square_is_float32_where_the_target_declares_it():
    """The 2,065 × 2,065 causal square of the boundary grid is float32 where the target declares
    float32, whatever the dtype rotation gives its size: float64 would cost the target and the
    oracle about twice as much; a target without float32 gets one of its own dtypes."""
    from spec.builtin import load_target

    reference = load_target("reference")
    (long,) = [c for c in boundary_cases(reference, long=True) if c.n_q > LONG_TILE]
    assert long.dtype == "float32" and long.causal and long.n_q == long.n_k
    half = reference.replace(dtypes=("float16", "bfloat16"))
    (long,) = [c for c in boundary_cases(half, long=True) if c.n_q > LONG_TILE]
    assert long.dtype in half.dtypes


def fussy(q, k, v, *, causal=False, mask=None, scale=None):
    """A kernel that refuses what a FlashAttention-style kernel refuses: lengths that are not
    multiples of 16, head sizes other than 8 and 16, d_v ≠ d_k."""
    n_q, n_k, d_k, d_v = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    if n_q % 16 or n_k % 16:
        raise ValueError(f"sequence lengths must be multiples of 16, got {n_q}, {n_k}")
    if d_k not in (8, 16) or d_v != d_k:
        raise ValueError(f"head dims must be equal and 8 or 16, got {d_k}, {d_v}")
    return attention(q, k, v, causal=causal, mask=mask, scale=scale)


LIMITS = {"seq_multiple": 16, "head_dims": (8, 16), "equal_head_dims": True}


FUSSY = spec.Target(fussy, name="fussy", supports_mask=True, supports_scale=True, ndims=(2, 3, 4),
                    empty_keys="compute", **LIMITS)


def test_a_kernel_with_shape_limits_conforms_when_it_declares_them():
    report = spec.check(FUSSY, profile="quick", seed=1)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    passed = {r.name for r in report.results if r.status == "pass"}
    # the laws that read the pattern through V = I (d_v = n_k) read it in blocks of d_k columns
    assert {"matches_golden", "rows_sum_to_one", "scale_is_inv_sqrt_dk", "causal_no_leak"} <= passed
    skipped = {r.name: r.message for r in report.results if r.status == "skip"}
    assert "seq_multiple=16" in skipped["score_variance"]  # one query against two keys: not drawable


def test_the_same_kernel_undeclared_fails_on_what_it_refuses():
    undeclared = spec.Target(fussy, name="fussy undeclared", supports_mask=True, supports_scale=True)
    (result,) = spec.check(undeclared, profile="quick", only=["matches_golden"]).results
    assert result.status == "fail" and "must be" in result.message


@pytest.mark.parametrize("law", ["matches_golden", "causal_no_leak", "mask_semantics", "rows_sum_to_one"])
def test_every_call_of_a_law_stays_inside_the_limits(law):
    seen = []

    def recording(q, k, v, **kw):
        seen.append((q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]))
        return fussy(q, k, v, **kw)

    report = spec.check(FUSSY.replace(fn=recording), profile="quick", only=[law])
    assert report.ok and seen
    assert all(n_q % 16 == 0 and n_k % 16 == 0 and d_k in (8, 16) and d_v == d_k
               for n_q, n_k, d_k, d_v in seen)


def test_the_boundary_grid_and_the_tile_edges_are_multiples():
    grid = boundary_cases(FUSSY, tiles=True, long=True)
    assert grid and all(outside_limits(FUSSY, c) is None for c in grid)
    assert {(c.n_q, c.n_k) for c in grid} >= {(16, 16), (16, 32), (32, 32)}
    assert max(c.n_k for c in grid) == 2080  # the long causal square of 2,065, rounded up to a multiple of 16
    assert all(n % 16 == 0 for n in edges_for(FUSSY)) and 256 in edges_for(FUSSY)
    capped = FUSSY.replace(max_seq=64)
    assert all(c.n_q <= 64 and c.n_k <= 64 for c in boundary_cases(capped, tiles=True, long=True))


def test_the_report_header_lists_the_limits():
    report = spec.check(FUSSY, profile="quick", only=["output_shape_dtype"])
    assert str(report).startswith("declared limits: head_dims=(8, 16), equal_head_dims, seq_multiple=16\n")
    assert json.loads(report.to_json())["limits"] == "head_dims=(8, 16), equal_head_dims, seq_multiple=16"


def _shapes_met(**declared):
    shapes: set = set()

    def recording(q, k, v, *, causal=False, mask=None, scale=None):
        shapes.add((q.shape, k.shape, v.shape))
        return attention(q, k, v, causal=causal, mask=mask, scale=scale)

    target = spec.Target(recording, ndims=(2, 3, 4), supports_mask=True, supports_scale=True, **declared)
    return target, shapes


def test_a_target_that_compiles_per_shape_is_drawn_from_the_grid():
    target, shapes = _shapes_met(compiles_per_shape=True)
    laws = ["matches_golden", "causal_no_leak", "rows_sum_to_one", "mask_semantics",
            "kv_permutation_invariance"]
    assert spec.check(target, profile="ci", only=laws).ok
    assert {n for q, k, v in shapes for n in (q[-2], k[-2])} <= set(SHAPE_GRID)
    assert {len(q) for q, _, _ in shapes} == {4}  # the target's highest rank alone
    assert {q[-1] for q, _, _ in shapes} <= set(SHAPE_WIDTHS)


def test_a_whole_run_that_compiles_per_shape_meets_fewer_than_half_the_shapes():
    """Laws that build their own cases (long rows, two keys, no keys) add their few shapes."""
    grid, few = _shapes_met(compiles_per_shape=True)
    free, many = _shapes_met()
    assert spec.check(grid, profile="ci").ok and spec.check(free, profile="ci").ok
    assert len(few) * 2 < len(many), (len(few), len(many))
