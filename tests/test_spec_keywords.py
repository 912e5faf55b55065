"""A keyword is declared once (spec.keywords.Keyword, in its law module) and everything reads the
declaration: what a declaration must hold, what reads it, and the declarations real libraries
need (computes for every tolerance, a masked-row policy per cause)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

import spec
from impl import attention
from spec import oracle, registry
from spec.cases import Case
from spec.inputs import Inputs
from spec.keywords import Keyword, Leaves, Transforms, registered
from spec.laws.alibi import paper_slopes
from spec.target import Target, TargetError, keyword_fields


def _keyword(**changes):
    given = dict(name="extra", field="supports_bias", passes=("extra",), meaning="m",
                 terms=(Leaves("a test keyword"),), received=lambda case, p: (p,))
    return Keyword(**(given | changes))


def test_a_keyword_without_terms_cannot_be_declared():
    with pytest.raises(ValueError, match="needs its terms"):
        _keyword(terms=())
    with pytest.raises(ValueError, match="needs its terms"):
        _keyword(terms=(lambda s: s,))


def test_a_transform_cannot_be_declared_without_its_baseline():
    with pytest.raises(TypeError, match="baseline"):
        Transforms(golden=lambda s, c: s, derivative=lambda s, c: 1.0)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="reason"):
        Leaves(" ")


def test_a_keyword_names_a_capability_field_of_target():
    with pytest.raises(ValueError, match="no keyword field 'supports_nothing'"):
        _keyword(field="supports_nothing")
    with pytest.raises(ValueError, match="no keyword field 'supports_mask'"):  # a core flag, not a keyword's
        _keyword(field="supports_mask")


def test_every_keyword_field_is_declared_by_one_keyword():
    """A keyword field of Target that no keyword declares would be a flag no law reads."""
    fields = [kw.field for kw in registered().values()]
    assert sorted(fields) == sorted(keyword_fields(Target))


def test_two_declarations_of_one_argument_are_refused(tmp_path, monkeypatch):
    (tmp_path / "twice.py").write_text(
        "from spec.keywords import Keyword, Leaves\n"
        "A = Keyword(name='a', field='supports_bias', passes=('bias',), meaning='m',\n"
        "            terms=(Leaves('x'),), received=lambda case, p: (p,))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="'bias' is passed by both keyword 'bias' and 'a'"):
        registry.collect_keywords(("spec.laws.bias", "twice"))


def test_two_keywords_with_sink_logits_are_refused():
    """The golden and the backward hold one sink logit per row: a second Sinks term would have
    been dropped without a word."""
    sinks = registered()["sinks"]
    before = dict(registered())
    twin = sinks.replace(name="more_sinks", passes=("more_sinks",))
    with pytest.raises(ValueError, match="'sinks', 'more_sinks' each declare a Sinks term"):
        registry.check_keywords(before | {"more_sinks": twin})
    assert registered() == before


def test_a_law_states_its_needs_one_way():
    with pytest.raises(TypeError, match="needs must be a Need"):
        registry.law(needs=lambda t: None)  # type: ignore[arg-type]


def test_keyword_parameters_replay_by_name():
    fields = dict(dtype="float32", ndim=2, batch=1, heads=1, n_q=2, n_k=3, d_k=2, d_v=2, seed=0)
    case = Case.from_fields(**fields, window=(1, 2), bias=(0.5, ""))
    assert case == Case(**fields, keywords={"window": (1, 2), "bias": (0.5, "")})
    assert case.describe()["window"] == (1, 2) and Case.from_fields(**case.describe()) == case
    with pytest.raises(TypeError, match="no field or keyword 'windw'"):
        Case.from_fields(**fields, windw=(1, 2))


# --- ALiBi, declared in one module --------------------------------------------------------------


def test_alibi_by_hand_measures_from_the_bottom_right_diagonal():
    """n_q = 2, n_k = 3, slope 0.5: query i's diagonal key is i + 1, so the added terms are
    −0.5·[1, 0, 1] and −0.5·[2, 1, 0], whatever the target's causal alignment."""
    q, k, v = np.zeros((2, 1)), np.zeros((3, 1)), np.eye(3)
    inputs = Inputs(q, k, v, keywords={"alibi_slopes": np.array([0.5], np.float32)})
    for align in ("top_left", "bottom_right"):
        _, w, _ = oracle.golden_of(inputs, align)
        logits = np.log(w) - np.log(w).max(axis=-1, keepdims=True)
        np.testing.assert_allclose(logits, [[-0.5, 0.0, -0.5], [-1.0, -0.5, 0.0]], atol=1e-15)


def test_the_paper_slopes_for_heads_that_are_not_a_power_of_two():
    """8 heads: 2^-1 .. 2^-8; 12 heads: those of 8, then every other slope of 16 (2^-0.5, 2^-1.5, …)."""
    assert paper_slopes(8) == tuple(2.0 ** -(h + 1) for h in range(8))
    twelve = paper_slopes(12)
    assert twelve[:8] == paper_slopes(8)
    np.testing.assert_allclose(twelve[8:], [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5])


# --- the report shows what the target received ----------------------------------------------------


def _failure(target, law):
    (result,) = spec.check(target, profile="ci", only=[law]).results
    assert result.status == "fail", result.message
    return result.counterexample.to_dict()  # as the JSON report has it


def test_a_failure_shows_the_bias_the_target_received():
    sys.path.insert(0, "tests")
    from gallery.bias import BROKEN

    (bug,) = [b for b in BROKEN if b.catches == "bias_matches_golden"]
    example = _failure(bug.target, "bias_matches_golden")
    assert "bias" in example["shapes"]
    case = Case.from_fields(**example["case"])
    assert example["shapes"]["bias"] == list(case.inputs().get("bias").shape)
    assert "bias" in example["arrays"]  # the shrunk case is small: every array is shown whole
    np.testing.assert_array_equal(example["arrays"]["bias"], case.inputs().get("bias"))


def test_replay_gives_the_target_exactly_what_the_failure_shows():
    sys.path.insert(0, "tests")
    from gallery.bias import BROKEN

    (bug,) = [b for b in BROKEN if b.catches == "bias_matches_golden"]
    example = _failure(bug.target, "bias_matches_golden")
    received = []

    def recording(q, k, v, **kwargs):
        received.append({"q": q, "k": k, "v": v} | kwargs)
        return bug.target.fn(q, k, v, **kwargs)

    with pytest.raises(AssertionError):
        spec.replay(bug.target.replace(fn=recording), "bias_matches_golden", **example["case"])
    last = received[-1]
    assert {name: list(np.shape(last[name])) for name in example["shapes"]} == example["shapes"]
    for name, shown in example["arrays"].items():
        np.testing.assert_array_equal(last[name], shown)
    assert {name: last[name] for name in example["keywords"]} == example["keywords"]


def test_a_failure_shows_the_arrays_in_the_layout_the_target_received_them():
    """Before: a bnhd target was shown (batch, heads, n, d) shapes, which it never received."""
    def wrong_in_bnhd(q, k, v, *, causal=False):  # q [batch, n_q, heads, d]
        return np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)

    target = Target(wrong_in_bnhd, layout="bnhd", ndims=(4,))
    example = _failure(target, "matches_golden")
    case = Case.from_fields(**example["case"])
    batch, heads, n_q, d_k = case.shapes()["q"]
    assert example["shapes"]["q"] == [batch, n_q, heads, d_k]
    q = np.asarray(example["arrays"]["q"])
    np.testing.assert_array_equal(q, np.swapaxes(case.arrays()[0], 1, 2))


def test_a_failure_shows_the_keys_the_law_gave_the_target():
    """uniform_scores_average gives the target all-equal keys, not the case's: the report shows those."""
    def first_value_only(q, k, v, *, causal=False):  # right for one key, wrong from two on
        return np.broadcast_to(v[..., :1, :], (*q.shape[:-1], v.shape[-1])).copy()

    example = _failure(Target(first_value_only, ndims=(2,)), "uniform_scores_average")
    k = np.asarray(example["arrays"]["k"])
    assert k.shape[-2] >= 2 and (k == k[..., :1, :]).all()
    assert not (np.asarray(Case.from_fields(**example["case"]).arrays()[1]) == k).all()


# --- declarations real libraries need ---------------------------------------------------------------


def _flash_reference(q, k, v, *, causal=False, mask=None, kv_lengths=None, window=None):
    """FlashAttention's own reference semantics: a row emptied by the causal or window mask gives
    zeros; one emptied by key padding or mask= gives NaN (its softmax over all −inf)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    local = np.ones((n_q, n_k), bool) if not causal else j <= i
    if window is not None:
        local = local & (j >= i - window[0]) & (j <= i + window[1])
    keep = np.broadcast_to(local, (*q.shape[:-2], n_q, n_k))
    if mask is not None:
        keep = keep & mask
    if kv_lengths is not None:
        keep = keep & (j < np.asarray(kv_lengths)[:, None, None, None])
    out = attention(q, k, v, mask=keep)
    empty_here = ~keep.any(axis=-1) & local.any(axis=-1)
    return np.where(empty_here[..., None], np.nan, out).astype(q.dtype)


FLASH_DECLARED = dict(ndims=(2, 3, 4), supports_mask=True, supports_kv_lengths=True, supports_window=True)


@pytest.mark.parametrize("law", ["masked_rows_policy", "kv_lengths_zero_rows"])
def test_a_masked_row_policy_per_cause_describes_flash_attentions_reference(law):
    per_cause = Target(_flash_reference, masked_rows={"mask": "nan", "kv_lengths": "nan"}, **FLASH_DECLARED)
    (result,) = spec.check(per_cause, profile="ci", only=[law]).results
    assert result.status == "pass", result.message
    one_policy = Target(_flash_reference, masked_rows="zeros", **FLASH_DECLARED)
    (result,) = spec.check(one_policy, profile="ci", only=[law]).results
    assert result.status == "fail" and "expected exact zeros" in result.message


def test_a_masked_row_policy_names_known_causes():
    with pytest.raises(TargetError, match="names the cause 'padding'"):
        Target(attention, masked_rows={"padding": "nan"})
    with pytest.raises(TargetError, match=r"masked_rows\['mask'\] must be one of"):
        Target(attention, masked_rows={"mask": "zero"})


def _in_float32(q, k, v, *, return_lse=False, **kw):
    """Takes float64 and computes it in float32, as JAX's attention does."""
    got = attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), return_lse=return_lse,
                    **kw)
    if return_lse:
        return got[0].astype(q.dtype), got[1].astype(q.dtype)
    return got.astype(q.dtype)


@pytest.mark.parametrize("law", ["lse_matches_golden", "large_logits", "large_values",
                                 "lse_merge_split_keys"])
def test_computes_applies_to_every_tolerance_and_to_the_drawn_amplitudes(law):
    """A correct float32 computation declared for float64 passes the lse laws (the lse allowance
    is float32's) and the range laws (scores and values drawn to float32's edge, not float64's)."""
    target = Target(_in_float32, dtypes=("float64",), computes={"float64": "float32"}, returns_lse=True)
    (result,) = spec.check(target, profile="ci", only=[law]).results
    assert result.status == "pass", result.message


def test_without_the_computes_declaration_the_same_target_fails():
    """The declaration is what makes the difference: the same function held to float64 fails."""
    (result,) = spec.check(Target(_in_float32, dtypes=("float64",), returns_lse=True), profile="ci",
                           only=["lse_matches_golden"]).results
    assert result.status == "fail"


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
    """Before: lse_matches_golden required −∞ for a row the mask and the causal mask empty
    together, whatever the masked-row policy: a false alarm on JAX (masked_rows="uniform")."""
    law = registry.PROPERTIES["lse_matches_golden"]
    target = Target(_finite_fill, supports_mask=True, returns_lse=True, masked_rows="uniform")
    case = next(c for seed in range(100) if not (c := Case(  # query 0 sees key 0 alone, masked out
        dtype="float64", ndim=2, batch=1, heads=1, n_q=2, n_k=3, d_k=2, d_v=2, seed=seed, causal=True,
        mask="random")).mask_array()[0, 0])
    law.check(target, case)
    with pytest.raises(AssertionError, match=r"row \[0\] sees no key, so its lse must be -inf"):
        law.check(target.replace(masked_rows="zeros"), case)  # declared zeros, that lse is wrong


def test_the_cli_runs_the_same_check_as_python(monkeypatch, capsys):
    import spec.cli

    seen = {}
    real = spec.runner.check

    def spy(target, *args, **kwargs):
        seen["target"] = target
        return real(target, *args, **kwargs)

    monkeypatch.setattr(spec.cli, "check", spy)
    assert spec.cli.main(["check", "reference", "--profile", "quick", "--only", "rows_sum_to_one"]) == 0
    assert seen["target"].name == "reference"
    capsys.readouterr()


def test_every_keyword_argument_reaches_the_oracle_by_its_declaration():
    """The oracle knows no keyword by name: a call with every keyword that changes the maths
    matches a loop over the definition only through the declarations."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, n, 3)) for n in (3, 4, 4))
    slopes = np.array([0.25, 0.5], np.float32)
    bias = rng.standard_normal((2, 3, 4))
    inputs = Inputs(q, k, v, scale=0.5, keywords={"bias": bias, "alibi_slopes": slopes, "softcap": 2.0,
                                                   "sinks": np.array([0.1, -0.2])})
    out, _, _ = oracle.golden_of(inputs)
    want = np.zeros_like(out)
    for h in range(2):
        for i in range(3):
            s = [2.0 * math.tanh(0.5 * float(q[h, i] @ k[h, j]) / 2.0) + bias[h, i, j]
                 - slopes[h] * abs(i + 1 - j) for j in range(4)]
            z = sum(math.exp(x) for x in s) + math.exp([0.1, -0.2][h])
            want[h, i] = sum(math.exp(x) / z * v[h, j] for j, x in enumerate(s))
    np.testing.assert_allclose(out, want, rtol=1e-6)  # slopes are float32 in the golden too


def test_a_declared_keyword_is_the_keyword_arguments_the_calling_layer_accepts():
    passed = spec.signature.declared_by()
    for kw in registered().values():
        assert all(passed[arg] == f"{kw.field}=False" for arg in kw.passes)
