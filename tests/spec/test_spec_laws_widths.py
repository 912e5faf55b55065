"""Draws inside the declared head sizes, and wide GQA groups: a target declaring head_dims gets the
cache and long-row laws at those widths (fewer keys where they are wide), and the GQA law meets
groups past 16 query heads that are not a multiple of 16."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import spec
from impl import attention
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


def _grouped(q: Array, k: Array, v: Array, *, causal: bool = False, per_program: int | None = None) -> Array:
    """Grouped-query attention over K/V heads repeated to the query heads. With ``per_program``
    (16), a decode kernel's programs: one per group where a group is at most that many heads,
    else that many query heads each, reading the K/V head of the program's first head for all of
    them (right where the group is a multiple of it; 34 heads over 2: heads 17–31 read K/V head 0)."""
    h, g = q.shape[-3], k.shape[-3]
    group = h // g
    heads = np.arange(h)
    if per_program is not None and group > per_program:
        heads = heads // per_program * per_program  # the program's first head, for all of them
    kv = heads // group
    return attention(q, k[..., kv, :, :], v[..., kv, :, :], causal=causal)


def test_a_kernel_whose_programs_take_16_query_heads_fails_the_gqa_law():
    bad = Target(lambda q, k, v, *, causal=False: _grouped(q, k, v, causal=causal, per_program=16),
                 name="gqa-16-head-programs", supports_gqa=True, ndims=(3, 4))
    (result,) = spec.check(bad, profile="ci", only=["gqa_matches_repeated_kv"]).results
    assert result.status == "fail", result.message
    good = bad.replace(fn=lambda q, k, v, *, causal=False: _grouped(q, k, v, causal=causal), name="gqa")
    (result,) = spec.check(good, profile="ci", only=["gqa_matches_repeated_kv"]).results
    assert result.status == "pass", result.message
