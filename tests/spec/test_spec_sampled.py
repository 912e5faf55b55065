"""spec.sampled: the rows sampled are the edges promised; the oracle at those rows taken a block of
rows and slices at a time and put together (golden, expectation, backward) agrees with
spec.oracle's whole call, whatever the blocks. The oracle at rows itself, for every keyword:
tests/spec/test_spec_oracle_rows.py."""

from __future__ import annotations

import numpy as np
import pytest

from spec import oracle, sampled
from spec.builtin import load_target
from spec.inputs import Inputs

REFERENCE = load_target("reference")


def assert_rows_match(inputs: Inputs, rows: np.ndarray, align: str) -> None:
    out, _, lse = oracle.golden_of(inputs, align)
    got_out, got_lse = sampled.golden_rows(inputs, rows, align)
    np.testing.assert_allclose(got_out, out[..., rows, :], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(lse[..., rows]))
    finite = np.isfinite(lse[..., rows])
    np.testing.assert_allclose(got_lse[finite], lse[..., rows][finite], rtol=1e-12, atol=1e-14)


def test_sample_rows_has_the_first_last_tile_edges_and_powers_of_two():
    rows = sampled.sample_rows(70_000, limits=(128, 65_537), random=3, seed=1).tolist()
    assert rows == sorted(set(rows)) and rows[0] == 0 and rows[-1] == 69_999
    for t in (16, 32, 64, 128, 256):
        assert {t - 1, t, t + 1} <= set(rows)
    assert {65_535, 65_536, 65_537, 65_538, 32_767, 32_768} <= set(rows)
    assert len(rows) < 120
    assert sampled.sample_rows(1).tolist() == [0] and sampled.sample_rows(0).size == 0


def test_expected_rows_agree_with_the_oracles_expectation():
    """Baseline and golden at the rows are the full ones' rows; the floor is at most the full one."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((3, 2, n, 5)).astype(np.float16) for n in (40, 40, 40))
    inputs = Inputs(q, k, v, causal=True, scale=0.4, keywords={"window": (7, 0)})
    rows = sampled.sample_rows(40, random=4)
    want = oracle.expected(REFERENCE, inputs)
    got = sampled.expected_rows(REFERENCE, inputs, rows)
    np.testing.assert_allclose(got.out, want.out[..., rows, :], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(got.baseline, want.baseline[..., rows, :].astype(np.float64))
    assert 0 < got.floor <= want.floor
    np.testing.assert_array_equal(got.seen, want.seen[..., rows])
    assert got.compare(want.baseline[..., rows, :], REFERENCE.tolerance).ok
    assert not got.compare(want.baseline[..., rows, :] + 0.5, REFERENCE.tolerance).ok


@pytest.mark.parametrize("gqa", [False, True])
def test_the_sampled_backward_equals_the_full_one_for_an_upstream_zero_off_the_rows(gqa):
    rng = np.random.default_rng(8)
    g = 1 if gqa else 2
    q = rng.standard_normal((2, 2, 9, 4))
    k, v = rng.standard_normal((2, g, 9, 4)), rng.standard_normal((2, g, 9, 3))
    inputs = Inputs(q, k, v, causal=True, keywords={"softcap": 2.0, "kv_lengths": np.array([9, 6])})
    rows = np.array([0, 3, 8])
    d_out = sampled.upstream(inputs, rows)
    assert np.count_nonzero(np.abs(d_out).sum(axis=-1)) == 2 * 2 * 3
    want = oracle.gradients(REFERENCE, inputs, d_out)
    got = sampled.gradients_rows(REFERENCE, inputs, rows, d_out)
    for name in ("dq", "dk", "dv"):
        np.testing.assert_allclose(got.golden[name], want.golden[name], rtol=1e-10, atol=1e-13, err_msg=name)
        np.testing.assert_allclose(got.baseline[name], want.baseline[name], rtol=1e-12, atol=1e-14)
        assert np.all(got.entry_floors[name] <= want.entry_floors[name] + 1e-18)
        assert got.floors[name] == np.max(got.entry_floors[name], initial=0.0) <= want.floors[name] + 1e-18
    with pytest.raises(ValueError, match="zero outside"):
        sampled.gradients_rows(REFERENCE, inputs, rows, np.ones_like(d_out))


def test_blocks_of_a_few_rows_and_slices_give_the_same_rows(monkeypatch):
    """With blocks of 64 scores (a row or two, one slice, at a time) the rows, the expectation and
    the backward are those of one block."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 3, n, 4)) for n in (30, 30, 30))
    inputs = Inputs(q, k, v, causal=True, keywords={"window": (5, 2), "kv_lengths": np.array([30, 17])})
    rows = sampled.sample_rows(30, random=5)
    whole = sampled.expected_rows(REFERENCE, inputs, rows)
    d_out = sampled.upstream(inputs, rows)
    grads = sampled.gradients_rows(REFERENCE, inputs, rows, d_out)
    monkeypatch.setattr(sampled, "BLOCK_ENTRIES", 64)
    assert len(list(sampled.blocks(inputs, rows))) > 6
    assert_rows_match(inputs, rows, "bottom_right")
    small = sampled.expected_rows(REFERENCE, inputs, rows)
    np.testing.assert_allclose(small.out, whole.out, rtol=1e-13, atol=1e-15)  # BLAS's order may differ
    np.testing.assert_allclose(small.baseline, whole.baseline, rtol=1e-13, atol=1e-15)
    assert small.floor <= whole.floor
    again = sampled.gradients_rows(REFERENCE, inputs, rows, d_out)
    for name in ("dq", "dk", "dv"):
        np.testing.assert_allclose(again.golden[name], grads.golden[name], rtol=1e-13, atol=1e-15)
