"""ALiBi's slopes (spec.laws.alibi): the paper's, for head counts that are powers of two and
for those that are not."""

from __future__ import annotations

import numpy as np

from spec.laws.alibi import paper_slopes


def test_the_paper_slopes_for_heads_that_are_not_a_power_of_two():
    """8 heads: 2^-1 .. 2^-8; 12 heads: those of 8, then every other slope of 16 (2^-0.5, 2^-1.5, …)."""
    assert paper_slopes(8) == tuple(2.0 ** -(h + 1) for h in range(8))
    twelve = paper_slopes(12)
    assert twelve[:8] == paper_slopes(8)
    np.testing.assert_allclose(twelve[8:], [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5])
