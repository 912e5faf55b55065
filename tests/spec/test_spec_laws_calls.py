"""The helpers of the call laws (spec.laws.calls): a view holds the same values in another
memory layout."""

from __future__ import annotations

import numpy as np
import pytest

from spec.laws.calls import VIEWS, as_view


@pytest.mark.parametrize("kind", VIEWS)
def test_views_hold_the_same_values_in_another_layout(kind):
    x = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    view = as_view(x, kind)
    assert np.array_equal(view, x) and view.dtype == x.dtype
    assert not view.flags.c_contiguous


def test_as_view_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown view kind 'diagonal'"):
        as_view(np.zeros((2, 2)), "diagonal")
