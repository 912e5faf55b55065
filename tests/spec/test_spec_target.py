"""spec.target.Target: every declaration is validated, naming the field (the dtypes and what needs
ml_dtypes, the gradients', the caches'), and means what it says in a check (causal alignment,
masked-row policies per cause, computes, queries within keys); layouts are translated both ways and
flags passed only when set."""

from __future__ import annotations

import math
import re
import sys

import numpy as np
import pytest

import spec
from impl import attention, causal_mask
from impl.grad import attention_backward
from spec import Target, TargetError, dtypes, load_target
from spec.runner import check


def test_plain_callable_gets_default_capabilities():
    target = spec.as_target(attention)
    assert target.dtypes == ("float32", "float64") and target.layout == "bhnd"
    assert target.causal_alignment == "top_left" and target.masked_rows == "zeros"
    assert not (target.supports_mask or target.supports_scale or target.supports_gqa)
    assert not target.has_gradients and target.tolerance == 2.0
    assert target.name == "impl.attention:attention"


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [("dtypes", ("int8",), "dtypes"), ("dtypes", ("nope",), "dtypes"), ("dtypes", (), "dtypes"),
     ("layout", "nhd", "layout"), ("masked_rows", "ones", "masked_rows"), ("ndims", (5,), "ndims"),
     ("causal_alignment", "left", "causal_alignment"), ("tolerance", 0.0, "tolerance"),
     ("deadline_s", -1.0, "deadline_s"), ("empty_keys", "zeros", "empty_keys")],
)
def test_bad_declaration_is_refused_naming_the_field(field, value, named):
    with pytest.raises(TargetError, match=named):
        Target(attention, **{field: value})


def test_target_fn_must_be_callable():
    with pytest.raises(TargetError, match="callable"):
        Target(3)  # type: ignore[arg-type]


def test_bnhd_layout_is_translated_both_ways():
    seen = {}

    def sequence_major(q, k, v, *, causal=False):
        seen["shape"] = q.shape
        return np.swapaxes(attention(np.swapaxes(q, 1, 2), np.swapaxes(k, 1, 2), np.swapaxes(v, 1, 2)), 1, 2)

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 7)))
    out = Target(sequence_major, layout="bnhd")(q, k, v)
    assert seen["shape"] == (2, 5, 3, 4)
    np.testing.assert_allclose(out, attention(q, k, v), rtol=1e-12)


def test_flags_are_passed_only_when_set():
    calls = []

    def bare(q, k, v):  # takes no keyword at all
        calls.append(1)
        return attention(q, k, v)

    x = np.ones((2, 2))
    Target(bare, causal_alignment=None)(x, x, x)
    assert calls == [1]


def test_replace_keeps_validation():
    target = load_target("reference").replace(tolerance=4.0)
    assert target.tolerance == 4.0
    with pytest.raises(TargetError):
        target.replace(layout="xyz")


# --- causal_alignment, masked_rows and computes: what each choice means --------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [([("float64", "float32")], "dict"), ({"float16": "float16"}, "not among the declared"),
     ({"float64": "float64"}, "narrower"), ({"float32": "float64"}, "narrower"),
     ({"float64": "int8"}, "narrower"),
     ({"float64": "nope"}, "dtype names")],
)
def test_bad_computes_is_refused_naming_the_field(value, message):
    with pytest.raises(TargetError, match="computes") as err:
        Target(attention, dtypes=("float32", "float64"), computes=value)
    assert message in str(err.value)


def test_new_choices_are_accepted_and_others_refused():
    t = Target(attention, causal_alignment="square_or_decoding", masked_rows="unmasked")
    assert t.alignment == "bottom_right" and t.causal_shape_ok(1, 7) and not t.causal_shape_ok(3, 7)
    with pytest.raises(TargetError, match="masked_rows"):
        Target(attention, masked_rows="unmask")


CAUSAL_LAWS = ["matches_golden", "causal_no_leak", "uniform_scores_average"]


def _sdpa_like(q, k, v, *, causal=False):
    # transformers' SDPA path: is_causal only when n_q > 1 (top-left); one query sees every key.
    return attention(q, k, v, causal=causal and q.shape[-2] > 1)


def test_square_or_decoding_target_conforms_and_the_others_do_not():
    good = Target(_sdpa_like, name="sdpa-like", causal_alignment="square_or_decoding")
    report = check(good, "quick", only=CAUSAL_LAWS)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    for alignment in ("top_left", "bottom_right"):
        bad = check(good.replace(causal_alignment=alignment), "ci", only=["matches_golden"])
        assert not bad.ok, alignment


def _pico(q, k, v, *, causal=False, mask=None):
    # picoGPT: a finite -1e10 added where hidden; a fully hidden row then behaves as unmasked.
    keep = np.ones((q.shape[-2], k.shape[-2]), dtype=bool) if mask is None else mask
    if causal:
        keep = keep & causal_mask(q.shape[-2], k.shape[-2])
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]) + np.where(keep, 0.0, -1e10)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def test_unmasked_policy_fits_a_finite_fill_and_nothing_else():
    pico = Target(_pico, name="pico", dtypes=("float64",), supports_mask=True, masked_rows="unmasked")
    (result,) = check(pico, "ci", only=["masked_rows_policy"]).results
    assert result.status == "pass", result.message
    (result,) = check(pico.replace(masked_rows="zeros"), "ci", only=["masked_rows_policy"]).results
    assert result.status == "fail"
    zeros = Target(attention, name="zeros", dtypes=("float64",), supports_mask=True, masked_rows="unmasked")
    (result,) = check(zeros, "ci", only=["masked_rows_policy"]).results
    assert result.status == "fail" and "nothing masked" in result.message


def _float64_in_float32(q, k, v, *, causal=False):
    out = attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), causal=causal)
    return out.astype(q.dtype)


def test_computes_narrower_gets_the_narrower_tolerance_and_says_so():
    narrow = Target(_float64_in_float32, name="f64-in-f32", dtypes=("float64",))
    (result,) = check(narrow, "ci", only=["matches_golden"]).results
    assert result.status == "fail"
    declared = narrow.replace(computes={"float64": "float32"})
    (result,) = check(declared, "ci", only=["matches_golden"]).results
    assert result.status == "pass", result.message
    assert "error ratio float64 (computed in float32)" in result.observed


def test_empty_keys_declaration_is_validated_and_defaults_to_either():
    assert spec.Target(attention).empty_keys == "either"  # an output or a refusal: a plain function's
    assert spec.Target(attention, empty_keys="compute").empty_keys == "compute"
    with pytest.raises(spec.TargetError, match="empty_keys"):
        spec.Target(attention, empty_keys="nan")


# --- declarations real libraries need: a masked-row policy per cause, computes ------------------


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


# --- dtypes, and what needs ml_dtypes -------------------------------------------------------------


@pytest.fixture
def without_ml_dtypes(monkeypatch):
    """A machine without ml_dtypes: its import fails, and the (once-only) detection is redone."""

    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now fails
    dtypes.has_bfloat16.cache_clear()
    yield
    dtypes.has_bfloat16.cache_clear()


def test_declaring_bfloat16_without_ml_dtypes_is_a_clear_target_error(without_ml_dtypes):
    with pytest.raises(TargetError, match="bfloat16, which needs ml_dtypes"):
        Target(attention, dtypes=("float32", "bfloat16"))
    assert "bfloat16" not in load_target("reference").dtypes  # built-ins declare it only when it exists
    assert Target(attention, dtypes=("float32",)).dtypes == ("float32",)


def test_unknown_dtypes_are_still_refused():
    pytest.importorskip("ml_dtypes")
    with pytest.raises(TargetError, match="bfloat16"):  # the message lists what is accepted
        Target(attention, dtypes=("float8",))


# --- gradient declarations -----------------------------------------------------------------------


@pytest.mark.parametrize(("declared", "words"), [
    ({"grad_extras": ("dbias",), "supports_bias": True, "grad_fn": None}, "needs a grad_fn"),
    ({"grad_extras": ("dq",)}, "the gradients the keywords define are dbias, dsinks"),
    ({"grad_extras": "dbias", "supports_bias": True}, "must be a tuple of names"),
    ({"grad_extras": ("dsinks",)}, "which needs supports_sinks=True"),
    ({"grad_takes_residuals": True}, "needs a grad_fn and returns_lse=True"),
    ({"grad_takes_residuals": 1, "returns_lse": True}, "must be True or False"),
])
def test_gradient_declarations_are_validated(declared, words):
    with pytest.raises(TargetError, match=re.escape(words)):
        Target(attention, **({"grad_fn": attention_backward} | declared))


# --- the declarations that go with caches ----------------------------------------------------------


def test_declaring_float8_caches_without_ml_dtypes_is_a_clear_target_error(without_ml_dtypes):
    with pytest.raises(TargetError, match="supports_fp8_kv=True needs ml_dtypes"):
        Target(attention, ndims=(4,), supports_fp8_kv=True)
    assert not spec.builtin.load_target("reference").supports_fp8_kv


def test_float8_only_paged_needs_both_declarations():
    pytest.importorskip("ml_dtypes")
    with pytest.raises(TargetError, match="fp8_kv_paged_only=True needs"):
        Target(attention, supports_fp8_kv=True, fp8_kv_paged_only=True)


def test_kv_lengths_alignment_is_a_causal_alignment():
    target = Target(attention, causal_alignment="kv_lengths")
    assert target.alignment == "kv_lengths"
    with pytest.raises(TargetError, match="causal_alignment must be one of"):
        Target(attention, causal_alignment="per_sequence")


def _defined_for_n_q_within_keys(q, k, v, *, causal=False, window=None, kv_lengths=None, **kw):
    """A mask utility that places query i at key i + L − n_q and refuses negative positions."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    if (causal or window is not None) and (n_q > n_k or (kv_lengths is not None and min(kv_lengths) < n_q)):
        raise ValueError(f"causal needs n_q <= every sequence's length, got n_q={n_q}, n_k={n_k}, "
                         f"kv_lengths={kv_lengths}")
    align = "kv_lengths" if kv_lengths is not None else "bottom_right"
    return attention(q, k, v, causal=causal, window=window, kv_lengths=kv_lengths, align=align, **kw)


WITHIN_KEYS = dict(causal_alignment="kv_lengths", supports_kv_lengths=True, supports_window=True,
                   ndims=(2, 3, 4))


def test_queries_within_keys_draws_only_the_shapes_a_target_defines():
    target = Target(_defined_for_n_q_within_keys, queries_within_keys=True, **WITHIN_KEYS)
    report = spec.check(target, profile="quick", seed=4)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    (rows,) = [r for r in report.results if r.name == "masked_rows_policy"]
    assert rows.status == "skip" and "queries_within_keys=True" in rows.message


def test_without_queries_within_keys_the_same_target_fails():
    target = Target(_defined_for_n_q_within_keys, **WITHIN_KEYS)
    report = spec.check(target, profile="quick", seed=4,
                        only=["kv_lengths_is_truncation", "masked_rows_policy", "causal_no_leak"])
    assert not report.ok and any("causal needs n_q" in r.message for r in report.failures)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("head_dims", (), "head_dims must be a non-empty tuple"), ("head_dims", 64, "head_dims must be"),
    ("seq_multiple", 0, "seq_multiple must be a positive integer"), ("max_seq", 1.5, "max_seq must be"),
    ("empty_lse", float("nan"), "empty_lse must be a float"),
    ("expected_failures", {"matches_golden[int8]": "x"}, "int8 is not among the declared dtypes"),
    ("expected_failures", {"matches_golden": ""}, "needs its reason"),
    ("expected_failures", {"bad key!": "x"}, "must be 'law' or 'law"),
])
def test_bad_declarations_are_refused_naming_the_field(field, value, message):
    with pytest.raises(TargetError, match=message):
        spec.Target(attention, **{field: value})


def test_max_seq_below_seq_multiple_is_refused():
    with pytest.raises(TargetError, match="max_seq=8 is below seq_multiple=16"):
        spec.Target(attention, seq_multiple=16, max_seq=8)
