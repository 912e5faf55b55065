"""The empty_keys law (spec.laws.edges): no keys give zeros of the output's shape, or a
refusal that says what is wrong."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from impl import attention


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
