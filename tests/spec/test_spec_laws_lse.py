"""The logsumexp laws (spec.laws.lse): two key blocks merged by their lse give the whole, and
a row that sees nothing is held to the lse its masked-row policy gives it."""

from __future__ import annotations

import math

import numpy as np
import pytest

import spec
from impl import attention
from spec import golden, registry
from spec.cases import Case
from spec.laws.lse import merge
from spec.target import Target


def test_merging_two_key_blocks_by_logsumexp_gives_the_full_attention():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((7, 4)), rng.standard_normal((7, 2))
    visible = np.ones((3, 7), dtype=bool)
    visible[1, :3] = False  # row 1 sees nothing in the first block
    visible[2] = False  # row 2 sees nothing at all
    full, _, full_lse = golden.forward(q, k, v, visible=visible, scale=0.5)
    a = golden.forward(q, k[:3], v[:3], visible=visible[:, :3], scale=0.5)
    b = golden.forward(q, k[3:], v[3:], visible=visible[:, 3:], scale=0.5)
    out, lse = merge(a[0], a[2], b[0], b[2])
    np.testing.assert_allclose(out, full, atol=1e-12)
    np.testing.assert_allclose(lse[:2], full_lse[:2], atol=1e-12)
    assert np.isneginf(lse[2]) and np.all(out[2] == 0)


def _finite_fill(q, k, v, *, causal=False, mask=None, return_lse=False):
    """An additive mask of −1e30 (JAX's choice): a row that sees nothing averages every value,
    and its lse is the fill's, −1e30 + log n_k, not −∞."""
    s = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    keep = np.ones(s.shape, dtype=bool) if mask is None else np.broadcast_to(mask, s.shape)
    if causal:
        keep = keep & np.tri(*s.shape[-2:], dtype=bool)
    s = np.where(keep, s, s.dtype.type(-1e30))
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - top)
    out = (e / e.sum(axis=-1, keepdims=True)) @ v
    lse = (top + np.log(e.sum(axis=-1, keepdims=True)))[..., 0]
    return (out, lse) if return_lse else out


def test_a_finite_fill_target_is_not_held_to_an_empty_rows_lse_of_minus_inf():
    """lse_matches_golden holds a row that the mask and the causal mask empty together to the lse
    of its masked-row policy: −∞ for zeros, not for a finite fill (masked_rows="uniform", as JAX's),
    where requiring −∞ would be a false alarm."""
    law = registry.LAWS["lse_matches_golden"]
    target = Target(_finite_fill, supports_mask=True, returns_lse=True, masked_rows="uniform")
    case = next(c for seed in range(100) if not (c := Case(  # query 0 sees key 0 alone, masked out
        dtype="float64", ndim=2, batch=1, heads=1, n_q=2, n_k=3, d_k=2, d_v=2, seed=seed, causal=True,
        mask="random")).mask_array()[0, 0])
    law.check(target, case)
    with pytest.raises(AssertionError, match=r"row \[0\] sees no key, so its lse must be -inf"):
        law.check(target.replace(masked_rows="zeros"), case)  # declared zeros, that lse is wrong


def plus_inf_lse(q, k, v, *, causal=False, mask=None, return_lse=False):
    out = attention(q, k, v, causal=causal, mask=mask, return_lse=return_lse)
    if not return_lse:
        return out
    out, lse = out
    return out, np.where(np.isneginf(lse), np.inf, lse)


@pytest.mark.parametrize(("declared", "ok"), [(math.inf, True), (-math.inf, False)])
def test_the_lse_of_an_empty_row_is_what_the_target_declares(declared, ok):
    target = spec.Target(plus_inf_lse, supports_mask=True, returns_lse=True, empty_lse=declared)
    report = spec.check(target, profile="quick", only=["lse_empty_row_as_declared", "lse_merge_split_keys",
                                                      "lse_matches_golden"])
    assert report.ok is ok, [(r.name, r.message) for r in report.failures]
