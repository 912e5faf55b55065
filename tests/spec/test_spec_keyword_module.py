"""A keyword is one module: a demonstration keyword declared here, in the test, and nowhere else —
its record (a capability, one argument, a draw, an added term) and nothing in spec's generic layers
(the target, the calling layer, the cases, the oracle, the golden) — is taken by a target, drawn by
the cases, applied by the oracle, and judged by a law defined here and by a built-in one.

``key_bias=`` (float ``[n_k]``): a bias per key, added to every query's score of that key."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from impl import attention
from spec import keywords, oracle
from spec.cases import Case, cases
from spec.keywords import Adds, Keyword
from spec.laws import _needs
from spec.laws._helpers import assert_matches, run
from spec.registry import LAWS, law
from spec.runner import check_law
from spec.target import Target

AMPLITUDES = (0.5, 2.0, 8.0)


def key_bias_draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """An amplitude: the bias is that times a standard normal per key."""
    return case.with_keyword("key_bias", draw(st.sampled_from(AMPLITUDES)))


KEY_BIAS = Keyword(
    name="key_bias",
    field="supports_key_bias",
    passes=("key_bias",),
    meaning="A float array [n_k]: added to every query's score of key j (a test's demonstration keyword).",
    terms=(Adds(lambda geo, bias: np.asarray(bias, dtype=np.float64)),),  # [n_k] broadcasts over the rows
    received=lambda case, amp: ((amp * case.rng(77).standard_normal(case.n_k)).astype(case.np_dtype),),
    draw=key_bias_draw,
)


@law(strategy=lambda t: cases(t, n_max=24, masks=("none", "random"), keywords=(KEY_BIAS,)),
     needs=_needs.keyword(KEY_BIAS))
def key_bias_matches_golden(target: Target, case: Case) -> None:
    """With ``key_bias=`` the output equals the float64 golden of softmax(scale·q·kᵀ + b)·V.

    Catches: a key bias ignored, or added to the wrong axis (per query).
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what="with key_bias=, the output")


def with_key_bias(q, k, v, *, causal=False, mask=None, key_bias=None, window=None):
    """impl.attention, the key bias passed as a bias of every row."""
    bias = None if key_bias is None else np.broadcast_to(key_bias, (*q.shape[:-1], k.shape[-2]))
    return attention(q, k, v, causal=causal, mask=mask, bias=bias, window=window)


def ignoring_key_bias(q, k, v, *, causal=False, mask=None, key_bias=None, window=None):
    """The bug: the key bias taken, and not applied."""
    return attention(q, k, v, causal=causal, mask=mask, window=window)


@pytest.fixture
def key_bias():
    with keywords.declared(KEY_BIAS) as table:
        yield table
    assert "key_bias" not in keywords.registered()  # gone when the block ends


def test_a_keyword_declared_outside_spec_is_registered_after_the_others(key_bias):
    assert list(key_bias)[-1] == "key_bias" and keywords.by_argument()["key_bias"] is KEY_BIAS
    target = Target(with_key_bias, supports_key_bias=True, supports_mask=True)
    assert target.supports_key_bias and target.capabilities == ("supports_key_bias",)
    assert not target.replace(supports_key_bias=False).supports_key_bias


def test_the_oracle_applies_its_term(key_bias):
    case = Case.from_fields(dtype="float64", ndim=2, batch=1, heads=1, n_q=3, n_k=4, d_k=2, d_v=2, seed=1,
                            key_bias=2.0)
    inputs = case.inputs()
    assert inputs.keywords["key_bias"].shape == (4,)
    gold, _, _ = oracle.golden_of(inputs, "top_left")
    plain, _, _ = oracle.golden_of(inputs.replace(key_bias=None), "top_left")
    assert not np.allclose(gold, plain)
    assert np.allclose(gold, attention(inputs.q, inputs.k, inputs.v, bias=np.broadcast_to(
        inputs.keywords["key_bias"], (3, 4))))


def test_a_law_of_the_test_holds_for_a_target_that_takes_it_and_fails_one_that_ignores_it(key_bias):
    prop = key_bias_matches_golden.__spec_law__  # type: ignore[attr-defined]
    good = Target(with_key_bias, supports_key_bias=True, supports_mask=True)
    assert check_law(prop, good, profile="quick").status == "pass"
    broken = check_law(prop, Target(ignoring_key_bias, supports_key_bias=True, supports_mask=True),
                          profile="quick")
    assert broken.status == "fail" and "with key_bias=, the output" in broken.message
    skipped = check_law(prop, Target(with_key_bias), profile="quick")
    assert skipped.status == "skip" and "supports_key_bias" in skipped.message


def test_the_built_in_pair_law_pairs_it_with_the_keywords_it_meets(key_bias):
    """`keyword_pairs_match_golden` reads the declarations: the new keyword drawn with a window, the
    golden of both applied, for a target that takes both."""
    pairs = LAWS["keyword_pairs_match_golden"]
    good = Target(with_key_bias, supports_key_bias=True, supports_window=True)
    assert check_law(pairs, good, profile="quick").status == "pass"
    broken = Target(ignoring_key_bias, supports_key_bias=True, supports_window=True)
    assert check_law(pairs, broken, profile="quick").status == "fail"
