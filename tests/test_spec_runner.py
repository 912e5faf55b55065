"""A misbehaving target is a reported failure, never a crash of the suite."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import spec
from impl import attention
from spec import Target
from spec.isolation import TargetHung, with_deadline


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


def test_a_target_returning_the_wrong_shape_is_reported_not_crashed_on():
    def first_row_only(q, k, v, *, causal=False):
        return attention(q, k, v, causal=causal)[..., :1, :]

    report = spec.check(first_row_only, profile="quick", only=["output_shape_dtype", "matches_golden"])
    assert [r.status for r in report.results] == ["fail", "fail"]
    assert all("returned shape" in r.message for r in report.results)


@pytest.mark.parametrize("returned", [None, "text", [[1, 2]]])
def test_a_target_returning_a_non_array_fails(returned):
    result = _only(lambda q, k, v, causal=False: returned, "output_shape_dtype")
    assert result.status == "fail"


def as_lists(q, k, v, *, causal=False):
    return attention(q, k, v, causal=causal).tolist()


def test_an_array_like_return_is_accepted():
    result = _only(spec.Target(as_lists, dtypes=("float64",)), "convex_combination")
    assert result.status == "pass", result.message


def test_a_list_is_not_silently_widened_to_float64():
    result = _only(spec.Target(as_lists, dtypes=("float32",)), "convex_combination")
    assert result.status == "fail"
    assert "returned its output as a list, which NumPy reads as float64" in result.message


def test_nan_output_fails_the_golden_comparison():
    result = _only(lambda q, k, v, causal=False: np.full_like(attention(q, k, v, causal=causal), np.nan))
    assert result.status == "fail" and "inf" in result.message


def test_a_hanging_target_fails_at_the_deadline_without_shrinking():
    def hang(q, k, v, *, causal=False):
        time.sleep(60)

    start = time.perf_counter()
    result = _only(Target(hang, deadline_s=0.2))
    assert result.status == "fail" and "deadline" in result.message
    assert result.examples == 1 and time.perf_counter() - start < 10


def test_a_target_that_swallows_exceptions_still_cannot_hang_the_suite():
    def stubborn(q, k, v, *, causal=False):
        while True:
            try:
                time.sleep(60)
            except Exception:
                pass

    result = _only(Target(stubborn, deadline_s=0.2))
    assert result.status == "fail" and "deadline" in result.message


def test_a_busy_loop_is_interrupted_not_left_spinning():
    spinning = []

    def spin(q, k, v, *, causal=False):
        spinning.append(threading.current_thread())
        while True:
            pass

    result = _only(Target(spin, deadline_s=0.2))
    assert result.status == "fail" and "deadline" in result.message
    (thread,) = spinning
    thread.join(5)  # interrupted at its next bytecode
    assert not thread.is_alive()


def test_deadline_works_off_the_main_thread():
    box = {}

    def run():
        try:
            with_deadline(lambda: time.sleep(60), 0.1)
        except TargetHung as e:
            box["error"] = e

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(10)
    assert "error" in box


def test_a_mutating_target_does_not_corrupt_other_properties():
    def mutating(q, k, v, *, causal=False):
        out = attention(q, k, v, causal=causal)
        q[...] = 0
        return out

    report = spec.check(mutating, profile="quick")
    assert [r.name for r in report.failures] == ["inputs_not_mutated"]


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


def test_unknown_profile_and_property_are_value_errors():
    with pytest.raises(ValueError, match="profile"):
        spec.check("reference", profile="fast")
    with pytest.raises(ValueError, match="unknown property 'rows'"):
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


def test_the_scale_law_fails_a_pattern_with_no_finite_weight():
    """With no finite weight there is no scale to recover: the law fails rather than passing empty."""
    def inf_everywhere(q, k, v, *, causal=False):
        return np.full((*q.shape[:-1], v.shape[-1]), np.inf, dtype=q.dtype)

    (result,) = spec.check(inf_everywhere, profile="quick", only=["scale_is_inv_sqrt_dk"]).results
    assert result.status == "fail" and "is inf for the pattern" in result.message
