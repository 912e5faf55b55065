"""The cache laws (spec.laws.cache): a target receives a paged pool as it is in every layout, the
float8 laws skip without ml_dtypes and draw only paged cases for a target that takes float8 only
paged, every cache law has its gallery bug while the reference passes them all, and the paged
keyword passes the table and carries the lengths. (How the oracle reads a cache is in
test_spec_oracle.py; how cases write one, test_spec_cases.py.)"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from gallery.cache import CORRECT

import spec
from impl import attention
from spec.keywords import registered
from spec.target import Target

ml_dtypes = pytest.importorskip("ml_dtypes")
CACHE_LAWS = [name for name, p in spec.LAWS.items() if p.family == "cache"]


# --- what a target receives ------------------------------------------------------------------------


def _bnhd_reference(q, k, v, **kw):
    """impl.attention for q [batch, n, heads, d]: a paged pool is [num_blocks, block_size, g, d] as it is."""
    assert k.ndim == 4 and "block_table" in kw and k.shape[0] >= kw["block_table"].max() + 1
    return np.swapaxes(attention(np.swapaxes(q, 1, 2), k, v, **kw), 1, 2)


def test_a_bnhd_target_receives_the_pool_unswapped():
    target = Target(_bnhd_reference, layout="bnhd", ndims=(4,), supports_paged_kv=True, supports_scale=True)
    report = spec.check(target, profile="quick", only=["paged_matches_golden", "paged_block_size_invariant"])
    assert report.ok, [(r.name, r.message) for r in report.failures]


# --- the float8 laws without ml_dtypes, and a target that takes float8 only paged -------------------


def test_float8_laws_skip_without_ml_dtypes(monkeypatch):
    target = Target(attention, ndims=(4,), supports_fp8_kv=True)  # declared while ml_dtypes is there
    from spec import dtypes

    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    dtypes.has_bfloat16.cache_clear()
    try:
        report = spec.check(target, profile="quick", only=[n for n in CACHE_LAWS if n.startswith("fp8")])
    finally:
        dtypes.has_bfloat16.cache_clear()
    assert report.results and all(r.status == "skip" and "ml_dtypes" in r.message for r in report.results)


def test_float8_only_paged_draws_only_paged_float8_cases():
    seen = []

    def refuses_contiguous_float8(q, k, v, *, block_table=None, **kw):
        seen.append(block_table is not None)
        if kw.get("k_descale") is not None and block_table is None:
            raise ValueError("k_descale only with block_table")
        return attention(q, k, v, block_table=block_table, **kw)

    target = Target(refuses_contiguous_float8, ndims=(4,), supports_paged_kv=True, supports_fp8_kv=True,
                    fp8_kv_paged_only=True)
    report = spec.check(target, profile="quick", only=[n for n in CACHE_LAWS if n.startswith("fp8")])
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert seen and all(seen)


def test_every_cache_law_has_its_gallery_bug_and_the_reference_passes():
    sys.path.insert(0, "tests/spec")
    from gallery import cache

    assert {b.catches for b in cache.BROKEN} == set(CACHE_LAWS)
    report = spec.check("reference", profile="ci", only=CACHE_LAWS)
    assert report.ok and all(r.status == "pass" for r in report.results), [(r.name, r.message)
                                                                            for r in report.results]


# --- the paged keyword's declaration ---------------------------------------------------------------


def test_the_paged_keyword_passes_the_table_and_carries_the_lengths():
    kw = registered()["paged"]
    assert kw.passes == ("block_table",) and kw.carries == ("kv_lengths",) and kw.arrangement == "paged"
    assert kw.given({"block_table": 1, "kv_lengths": 2}) == (1, 2)
    assert kw.given({"kv_lengths": 2}) is None
    assert math.isnan(spec.laws.cache.fill_value("nan", np.dtype(np.float32)))


# --- float8 caches whose output is float16 ------------------------------------------------------


FLOAT64_FP8 = [t for t in CORRECT if t.name.startswith("fp8_float64")]
FP8_LAWS = ["keyword_pairs_match_golden", *(n for n in CACHE_LAWS if n.startswith("fp8"))]


@pytest.mark.parametrize("target", FLOAT64_FP8, ids=[t.name for t in FLOAT64_FP8])
def test_every_pair_grid_case_is_drawn_in_its_dtype_and_its_output_fits_it(target):
    """The pair grid takes the dtypes in turn and draws each case in its own: a float8 cache past
    float16's range was drawn for float32 and then run as float16, whose correct output is inf."""
    from spec import oracle
    from spec.laws.pairs import forward_pairs, pair_grid

    grid = pair_grid(target, forward_pairs)
    assert [c.dtype for c in grid] == [target.dtypes[i % len(target.dtypes)] for i in range(len(grid))]
    fp8 = [c for c in grid if "fp8" in c.keywords]
    assert {c.dtype for c in fp8} >= {"float16"}
    for case in fp8:
        meant = oracle.meaning(case.inputs())
        top = float(np.finfo(case.dtype).max)
        assert float(np.max(np.abs(meant.v))) <= top, case


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("target", FLOAT64_FP8, ids=[t.name for t in FLOAT64_FP8])
def test_a_float8_kernel_computing_in_float64_conforms_in_every_dtype(target, seed):
    """The kernel of the false alarm (float64 over the dequantized cache, the output in q's dtype,
    float16 included; contiguous and paged) conforms on the float8 laws and the keyword pairs under
    seeds 0-19 (the whole suite: the false-alarm sweep)."""
    report = spec.check(target, profile="ci", seed=seed, only=FP8_LAWS)
    assert report.ok, [(r.name, r.message) for r in report.failures]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_pool_order_sum_is_seen_at_every_seed_by_the_long_blocks_case(seed):
    """paged_block_order_invariant's explicit case (rows of 48 keys) shows a kernel that sums in
    the pool's physical order whatever the seed (drawn cases of a few keys alone may round alike:
    FlexAttention's eager path passed them at profile quick under seed 2); a kernel that reads in
    logical order stays bit-identical on it."""
    from gallery.cache import PAGED, physical_order

    bad = spec.Target(physical_order, name="physical_order", **PAGED)
    (result,) = spec.check(bad, "quick", seed=seed, max_examples=1,
                           only=["paged_block_order_invariant"]).results
    assert result.status == "fail" and result.counterexample.case["n_k"] == 48, result.message
    (result,) = spec.check("reference", "quick", seed=seed, only=["paged_block_order_invariant"]).results
    assert result.status == "pass"
