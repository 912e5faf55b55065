"""The backward under the keywords (spec.laws.grad_keywords): every differentiable keyword
has a grid case where its gradient matters."""

from __future__ import annotations

import spec
from spec.laws.grad_keywords import keyword_grid, keyword_matters
from spec.laws.gradients import differentiable


def test_every_differentiable_keyword_has_a_grid_case_where_it_matters():
    reference = spec.load_target("reference")
    keywords = differentiable(reference)
    names = {"bias", "alibi", "window", "softcap", "sinks", "kv_lengths", "varlen", "chunk", "topk",
             "topk_blocks", "qv"}
    assert {kw.name for kw in keywords} == names
    grid = keyword_grid(reference)
    assert [next(iter(c.keywords)) for c in grid] == [kw.name for kw in keywords]
    assert all(keyword_matters(reference, c, kw) for c, kw in zip(grid, keywords, strict=True))
    assert {c.dtype for c in grid} == set(reference.dtypes)  # the dtypes taken in turn
