"""The past-cache laws (spec.laws.past), without any framework: the golden of a call with a past is
the golden of the concatenation (causal queries continuing the past), the calling layer returns
and checks the presents (in a bnhd target's layout too), and the laws pass a NumPy target that
joins the cache as defined and reject ones that do not."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from impl import attention
from spec import oracle
from spec.call import call
from spec.cases import Case
from spec.inputs import Inputs
from spec.keywords.past import PAST, joined
from spec.target import Target, TargetFailed

PAST_LAWS = ["past_kv_matches_concatenation", "present_kv_is_concatenation"]
DECLARED = {"supports_past_kv": True, "supports_mask": True, "supports_scale": True, "supports_gqa": True,
            "ndims": (2, 3, 4)}


def numpy_past(q, k, v, *, causal=False, mask=None, past_key=None, past_value=None, order="past", **kw):
    """impl.attention on concat(past, k), causal queries at n_past + i (``order="new"``: the new
    keys first in the presents, a broken cache)."""
    if past_key is None:
        return attention(q, k, v, causal=causal, mask=mask, **kw)
    keys, values = np.concatenate([past_key, k], axis=-2), np.concatenate([past_value, v], axis=-2)
    if causal:
        n_past = past_key.shape[-2]
        seen = np.arange(keys.shape[-2]) <= np.arange(q.shape[-2])[:, None] + n_past
        mask = seen if mask is None else mask & seen
    out = attention(q, keys, values, mask=mask, **kw)
    if order == "new":
        return out, np.concatenate([k, past_key], axis=-2), np.concatenate([v, past_value], axis=-2)
    return out, keys, values


def _case(**changes):
    fields = dict(dtype="float32", ndim=4, batch=2, heads=4, kv_heads=2, n_q=3, n_k=7, d_k=5, d_v=6, seed=4)
    return Case.from_fields(**(fields | changes)).with_keyword("past_kv", 4)


def test_the_case_splits_its_keys_and_the_meaning_joins_them_exactly():
    case = _case()
    inputs = case.inputs()
    _, k, v = case.arrays()
    assert inputs.k.shape[-2] == 3 and inputs.get("past_key").shape[-2] == 4
    meant = oracle.meaning(inputs)
    assert np.array_equal(meant.k, k) and np.array_equal(meant.v, v)


def test_the_golden_is_the_concatenation_s_with_causal_queries_after_the_past():
    case = _case(causal=True)
    inputs = case.inputs()
    q, k, v = case.arrays()
    gold, _, _ = oracle.golden_of(inputs, "top_left")
    seen = np.arange(7) <= np.arange(3)[:, None] + 4  # query i sees keys j <= n_past + i
    want, _, _ = oracle.golden_of(Inputs(q, k, v, mask=seen), "top_left")
    np.testing.assert_array_equal(gold, want)
    top_left, _, _ = oracle.golden_of(Inputs(q, k, v, causal=True), "top_left")
    assert not np.allclose(gold, top_left)  # the past's diagonal is not the target's own


def test_joined_refuses_a_past_that_is_not_shaped_as_the_keys():
    k = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="past_key"):
        joined(k, k, np.zeros((2, 5, 3), np.float32), np.zeros((2, 5, 4), np.float32))
    with pytest.raises(ValueError, match="past_value"):
        joined(k, k, np.zeros((2, 5, 4), np.float32), np.zeros((2, 5, 4), np.float64))


def test_the_keyword_passes_both_and_draws_no_cases_for_other_laws():
    assert PAST.passes == ("past_key", "past_value") and PAST.field == "supports_past_kv"
    assert PAST.draw is None  # a call with a past returns a tuple: only the past laws pass one


def test_call_returns_the_presents_checked():
    inputs = _case().inputs()
    target = Target(numpy_past, **DECLARED)
    out, present_key, present_value = call(target, inputs)
    assert out.shape == (2, 4, 3, 6)
    assert present_key.shape == (2, 2, 7, 5) and present_value.shape == (2, 2, 7, 6)
    alone = Target(lambda q, k, v, **kw: numpy_past(q, k, v, **kw)[0], **DECLARED)
    with pytest.raises(TargetFailed, match="present_key, present_value"):
        call(alone, inputs)
    short = Target(lambda q, k, v, **kw: (numpy_past(q, k, v, **kw)[0], kw["past_key"], kw["past_value"]),
                   **DECLARED)
    with pytest.raises(TargetFailed, match="present_key of shape"):
        call(short, inputs)


def test_a_bnhd_target_gets_its_past_in_its_layout_and_returns_presents_in_it():
    def bnhd(q, k, v, *, past_key=None, past_value=None, **kw):
        assert past_key is None or past_key.shape[2:] == k.shape[2:]  # [batch, n_past, g, d], as k
        def swap(x):
            return None if x is None else np.swapaxes(x, 1, 2)

        got = numpy_past(swap(q), swap(k), swap(v), past_key=swap(past_key), past_value=swap(past_value),
                         **kw)
        return tuple(swap(x) for x in got) if isinstance(got, tuple) else swap(got)

    target = Target(bnhd, layout="bnhd", **(DECLARED | {"ndims": (4,)}))
    report = spec.check(target, profile="quick", only=PAST_LAWS)
    assert report.ok, [(r.name, r.message) for r in report.failures]


def test_the_laws_pass_a_cache_joined_as_defined():
    report = spec.check(Target(numpy_past, **DECLARED), profile="quick", only=PAST_LAWS, seed=5)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert {r.name for r in report.results if r.status == "pass"} == set(PAST_LAWS)


def test_the_presents_law_rejects_new_keys_first_and_the_output_law_does_not_see_it():
    broken = Target(lambda q, k, v, **kw: numpy_past(q, k, v, order="new", **kw), name="new first",
                    **DECLARED)
    report = spec.check(broken, profile="quick", only=PAST_LAWS, seed=5)
    status = {r.name: r.status for r in report.results}
    assert status == {"past_kv_matches_concatenation": "pass", "present_kv_is_concatenation": "fail"}


def test_the_laws_skip_a_target_without_a_past_cache():
    report = spec.check(Target(attention, supports_mask=True), profile="quick", only=PAST_LAWS)
    assert all(r.status == "skip" and "supports_past_kv" in r.message for r in report.results)
