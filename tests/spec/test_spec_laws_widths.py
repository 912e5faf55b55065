"""Draws inside the declared head sizes, and wide GQA groups: a target declaring head_dims gets the
cache and long-row laws at those widths (fewer keys where they are wide), and the GQA law meets
groups past 16 query heads that are not a multiple of 16."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gallery.core import gqa_decode_programs_of_16_heads, grouped

import spec
from spec.builtin import load_target
from spec.laws.cache import CACHE_ENTRIES
from spec.target import Target

Array = np.ndarray
WIDE_LAWS = ["causal_aligned_per_sequence", "long_rows_every_dtype"]


def _recording(target: Target, seen: list[tuple[int, int, int]]) -> Target:
    def fn(q: Array, k: Array, v: Array, **kw: Any) -> Any:
        lengths = kw.get("kv_lengths")  # a paged pool's keys are its sequences'
        seen.append((q.shape[-1], v.shape[-1], k.shape[-2] if lengths is None else int(np.max(lengths))))
        return target.fn(q, k, v, **kw)
    return target.replace(fn=fn)


@pytest.mark.parametrize("declared", [dict(head_dims=(64, 128), equal_head_dims=True),
                                      dict(head_dims=(32, 64, 128))], ids=["64-128-equal", "32-64-128"])
def test_the_cache_and_long_row_laws_run_inside_the_declared_head_sizes(declared):
    seen: list[tuple[int, int, int]] = []
    target = _recording(load_target("reference").replace(**declared), seen)
    report = spec.check(target, profile="ci", only=WIDE_LAWS)
    assert [r.status for r in report.results] == ["pass", "pass"], [(r.name, r.message)
                                                                     for r in report.results]
    assert {d for d_k, d_v, _ in seen for d in (d_k, d_v)} <= set(declared["head_dims"])
    assert any(d_k == 128 for d_k, _, _ in seen)
    if declared.get("equal_head_dims"):
        assert all(d_k == d_v for d_k, d_v, _ in seen)


def test_a_cache_case_holds_fewer_keys_where_heads_are_wide():
    seen: list[tuple[int, int, int]] = []
    target = _recording(load_target("reference").replace(head_dims=(128,), supports_kv_lengths=False), seen)
    (result,) = spec.check(target, profile="ci", only=["causal_aligned_per_sequence"]).results
    assert result.status == "pass", result.message
    assert seen and max(n_k for _, _, n_k in seen) <= CACHE_ENTRIES // 128  # a paged pool's keys, at most


def test_a_decode_kernel_whose_programs_take_16_query_heads_fails_the_gqa_law_on_its_wide_groups():
    """The gallery's decode kernel of 16-head programs is given the law's wide groups with one
    query each (its calls: 17, 34 and 60 query heads first), and fails; the correct grouped
    attention, declared the same, passes."""
    seen: list[tuple[int, int, int]] = []

    def recorded(fn: Any) -> Any:
        def call(q: Array, k: Array, v: Array, **kw: Any) -> Any:
            seen.append((q.shape[-3], k.shape[-3], q.shape[-2]))
            return fn(q, k, v, **kw)
        return call

    bad = Target(recorded(gqa_decode_programs_of_16_heads), name="gqa-16-head-programs", supports_gqa=True,
                 decode_only=True, ndims=(3, 4))
    (result,) = spec.check(bad, profile="ci", only=["gqa_matches_repeated_kv"]).results
    assert result.status == "fail", result.message
    assert seen[:2] == [(17, 1, 1), (34, 2, 1)]  # the grid's wide groups first, one query each
    seen.clear()
    (result,) = spec.check(bad.replace(fn=recorded(grouped), name="gqa"), profile="ci",
                           only=["gqa_matches_repeated_kv"]).results
    assert result.status == "pass", result.message
    assert seen[:3] == [(17, 1, 1), (34, 2, 1), (60, 3, 1)] and all(n_q == 1 for _, _, n_q in seen)
