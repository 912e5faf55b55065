"""spec.runner: each law is run with Hypothesis, the boundary grid first; every outcome, however the
target misbehaves, is a Result (an exception, SystemExit: a failure; a missing capability: a skip);
the ci profile repeats its stream and a seed moves it; a failure carries a counterexample that
shows what the target received and a reproduction line that replays it."""

from __future__ import annotations

import json
import shlex
import sys

import numpy as np
import pytest

import spec
from impl import attention
from spec import Target
from spec.cases import Case
from spec.target import TargetError


def _only(target, name="matches_golden", **kw):
    (result,) = spec.check(target, profile="quick", only=[name], **kw).results
    return result


def test_a_target_that_raises_is_a_failure_naming_the_exception():
    def boom(q, k, v, *, causal=False):
        raise KeyError("no kernel for this shape")

    result = _only(boom)
    assert result.status == "fail" and "raised KeyError" in result.message


def test_a_target_that_exits_is_a_failure_not_the_end_of_the_suite():
    def quits(q, k, v, *, causal=False):
        raise SystemExit(3)

    result = _only(quits)
    assert result.status == "fail" and "SystemExit" in result.message


def test_a_failure_carries_a_counterexample_that_replays():
    def scaled_by_dk(q, k, v, *, causal=False):
        return attention(q, k, v, causal=causal, scale=1 / q.shape[-1])

    result = _only(scaled_by_dk, "scale_is_inv_sqrt_dk")
    example = result.counterexample.to_dict()  # as the JSON report has it
    assert example["shapes"]["q"][-1] == example["case"]["d_k"] >= 2
    # A closure cannot be loaded by name: the report says so instead of a line that cannot run.
    assert "spec.replay(" not in example["reproduce"] and "defined inside a function" in example["reproduce"]
    with pytest.raises(AssertionError, match="recovered scale"):
        spec.replay(scaled_by_dk, "scale_is_inv_sqrt_dk", **example["case"])
    spec.replay("reference", "scale_is_inv_sqrt_dk", **example["case"])  # the law holds for impl


def test_unknown_profile_and_law_are_value_errors():
    with pytest.raises(ValueError, match="profile"):
        spec.check("reference", profile="fast")
    with pytest.raises(ValueError, match="unknown law 'rows'"):
        spec.check("reference", only=["rows"])
    with pytest.raises(ValueError, match="max_examples"):
        spec.check("reference", max_examples=0)


def test_missing_capability_is_a_skip_with_the_reason():
    report = spec.check("flash", profile="quick", only=["mask_semantics", "gqa_matches_repeated_kv"])
    assert report.ok
    assert [r.status for r in report.results] == ["skip", "skip"]
    assert "supports_gqa" in report.results[0].message and "supports_mask" in report.results[1].message


def test_ci_profile_is_repeatable_and_seed_changes_the_stream():
    def counterexample(**kw):
        return _only(lambda q, k, v, causal=False: attention(q, k, v, scale=1.0), "scale_is_inv_sqrt_dk",
                     **kw).counterexample.case

    assert counterexample() == counterexample()
    assert counterexample(seed=1)["seed"] is not None


def test_boundary_grid_runs_first_in_every_profile():
    def wrong_at_2_by_3(q, k, v, *, causal=False, mask=None, scale=None):
        out = attention(q, k, v, causal=causal, mask=mask, scale=scale)
        return out + 1 if (q.shape[-2], k.shape[-2]) == (2, 3) else out

    target = spec.Target(wrong_at_2_by_3, supports_mask=True, supports_scale=True)
    report = spec.check(target, profile="quick", max_examples=1, only=["matches_golden"])
    (result,) = report.results
    assert result.status == "fail"
    assert (result.counterexample.case["n_q"], result.counterexample.case["n_k"]) == (2, 3)


# --- a failure shows what the target received, and replays it -----------------------------------


def _failure(target, law):
    (result,) = spec.check(target, profile="ci", only=[law]).results
    assert result.status == "fail", result.message
    return result.counterexample.to_dict()  # as the JSON report has it


def test_a_failure_shows_the_bias_the_target_received():
    sys.path.insert(0, "tests/spec")
    from gallery.bias import BROKEN

    (bug,) = [b for b in BROKEN if b.catches == "bias_matches_golden"]
    example = _failure(bug.target, "bias_matches_golden")
    assert "bias" in example["shapes"]
    case = Case.from_fields(**example["case"])
    assert example["shapes"]["bias"] == list(case.inputs().get("bias").shape)
    assert "bias" in example["arrays"]  # the shrunk case is small: every array is shown whole
    np.testing.assert_array_equal(example["arrays"]["bias"], case.inputs().get("bias"))


def test_replay_gives_the_target_exactly_what_the_failure_shows():
    sys.path.insert(0, "tests/spec")
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
    """A bnhd target's failure shows its arrays as it received them, (batch, n, heads, d), not in
    the suite's own layout."""
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


def test_a_failure_shows_the_paged_cache_as_the_target_received_it():
    def ignores_the_table(q, k, v, *, block_table=None, kv_lengths=None, **kw):  # q [batch, n, heads, d]
        pool = np.swapaxes(k[: q.shape[0]], 1, 2)  # the first blocks, read as if contiguous
        values = np.swapaxes(v[: q.shape[0]], 1, 2)
        return np.swapaxes(attention(np.swapaxes(q, 1, 2), pool, values, **kw), 1, 2)

    target = Target(ignores_the_table, layout="bnhd", ndims=(4,), supports_paged_kv=True)
    (result,) = spec.check(target, profile="ci", only=["paged_matches_golden"]).results
    assert result.status == "fail"
    example = result.counterexample.to_dict()  # as the JSON report has it
    case = Case.from_fields(**example["case"])
    inputs = case.inputs()
    batch, heads, n_q, d_k = case.shapes()["q"]
    assert example["shapes"]["q"] == [batch, n_q, heads, d_k]
    assert example["shapes"]["k"] == list(inputs.k.shape) and len(inputs.k.shape) == 4
    assert example["shapes"]["block_table"] == list(inputs.get("block_table").shape)
    assert example["shapes"]["kv_lengths"] == [batch]


def test_a_non_finite_field_is_written_as_a_literal_that_replays():
    """``repr(inf)`` is ``inf``, no Python literal: a line holding it raised NameError when run."""
    import ast

    from spec.cases import Case
    from spec.registry import LAWS
    from spec.runner import counterexample

    case = Case(dtype="float64", ndim=2, batch=1, heads=1, n_q=1, n_k=2, d_k=1, d_v=1, seed=3,
                amplitude=float("inf"), keywords={"sinks": (float("-inf"),)})
    line = counterexample(LAWS["matches_golden"], case, None, "reference").reproduce
    code = shlex.split(line)[2]
    (call,) = [n for n in ast.walk(ast.parse(code))
               if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "replay"]
    given = {kw.arg: eval(compile(ast.Expression(kw.value), "<line>", "eval")) for kw in call.keywords}
    assert given["amplitude"] == float("inf") and given["sinks"] == (float("-inf"),)
    assert Case.from_fields(**given) == case


# --- what a check costs ------------------------------------------------------------------------------


def test_blas_runs_on_one_thread_during_a_check():
    """During a check BLAS runs on one thread, as the target sees it from inside its call
    (threadpoolctl's report): BLAS's threads spin between the suite's small calls, which took about
    a third of a run's CPU time on two cores."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    seen = []

    def recording(q, k, v, *, causal=False):
        seen.extend(lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                    if lib["user_api"] == "blas")
        return attention(q, k, v, causal=causal)

    assert spec.check(recording, profile="quick", only=["rows_sum_to_one"]).ok
    assert seen and set(seen) == {1}


def wrong_scale(q, k, v, *, causal=False):
    return attention(q * 1.01, k, v, causal=causal)


def test_an_expected_failure_is_xfail_and_the_run_conforms():
    target = spec.Target(wrong_scale, expected_failures={"matches_golden": "q scaled by 1.01"})
    report = spec.check(target, profile="quick", only=["matches_golden"])
    (result,) = report.results
    assert report.ok and result.status == "xfail" and result.expected == "q scaled by 1.01"
    assert json.loads(report.to_json())["results"][0]["status"] == "xfail"
    text = str(report)
    assert "XFAIL matches_golden: q scaled by 1.01" in text and "reproduce:" in text
    assert "1 xfail" in text.splitlines()[-1]


def test_a_stale_expected_failure_is_xpass_and_fails_the_run():
    target = spec.Target(attention, expected_failures={"matches_golden": "once wrong"})
    report = spec.check(target, profile="quick", only=["matches_golden"])
    (result,) = report.results
    assert not report.ok and result.status == "xpass"
    assert "XPASS matches_golden: declared an expected failure (once wrong), but the law holds" in str(report)


def test_an_expected_failure_in_one_dtype_runs_that_dtype_alone():
    def wrong_in_float32(q, k, v, *, causal=False):
        broken = wrong_scale if q.dtype == np.float32 else attention
        return broken(q, k, v, causal=causal)

    target = spec.Target(wrong_in_float32, expected_failures={"matches_golden[float32]": "float32 path"})
    report = spec.check(target, profile="quick", only=["matches_golden"])
    assert [(r.name, r.status) for r in report.results] == [("matches_golden[float32]", "xfail"),
                                                             ("matches_golden", "pass")]
    assert report.ok


def test_an_expected_failure_naming_no_law_is_refused():
    with pytest.raises(TargetError, match="'no_such_law' names no law"):
        spec.check(spec.Target(attention, expected_failures={"no_such_law": "x"}), profile="quick")
    with pytest.raises(TargetError, match=r"'causal_no_leek\[float32\]' names no law; did you mean "
                       r"'causal_no_leak' or 'grad_causal_no_leak'\?; see"):
        spec.check(spec.Target(attention, expected_failures={"causal_no_leek[float32]": "x"}),
                   profile="quick")


def test_a_misspelt_law_gets_did_you_mean():
    with pytest.raises(ValueError, match=r"unknown law 'causal_no_leek' \(did you mean 'causal_no_leak' or "
                       r"'grad_causal_no_leak'\?\), 'rows'; see"):
        spec.check("reference", only=["causal_no_leek", "rows"])
