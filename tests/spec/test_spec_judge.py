"""spec.judge and spec.Verdict: the judge profile with the power guard on, a verdict a benchmark
can store (conforms, fails, incomplete), the laws run, each failure with its replay line, and the
time budget."""

from __future__ import annotations

import json
import time

import numpy as np

import spec
from spec import power
from spec.builtin import load_target

REFERENCE = load_target("reference")


def test_a_correct_kernel_conforms_at_the_judge_profile_with_its_power_table():
    verdict = spec.judge(REFERENCE, only=["matches_golden", "refilled_inputs_give_new_outputs",
                                          "right_after_64_calls"])
    assert verdict.verdict == "conforms" and verdict.ok
    data = json.loads(verdict.to_json())
    assert data["profile"] == "judge" and data["verdict"] == "conforms" and data["failures"] == []
    assert data["laws_run"] == ["matches_golden", "refilled_inputs_give_new_outputs", "right_after_64_calls"]
    assert set(data["power"]["kernels"]) == set(power.NAMES)  # the guard is on at this profile
    assert data["results"][0]["power"]  # matches_golden's cases reject trivial kernels


_kept: dict = {}


def buffer_cache(q, k, v, *, causal=False):
    """The stale output for the same buffers, refilled in place."""
    key = (q.__array_interface__["data"][0], k.__array_interface__["data"][0], causal)
    if key not in _kept:
        _kept[key] = np.asarray(REFERENCE.fn(q, k, v, causal=causal))
    return _kept[key].copy()


def test_a_cheat_fails_and_its_failure_carries_the_line_that_replays_it():
    verdict = spec.judge(buffer_cache, only=["refilled_inputs_give_new_outputs"])
    assert verdict.verdict == "fails" and not verdict.ok
    (failure,) = verdict.to_dict()["failures"]
    assert failure["law"] == "refilled_inputs_give_new_outputs"
    assert failure["reproduce"].startswith("python ") and "buffer_cache" in failure["reproduce"]
    assert failure["message"]


def test_a_spent_budget_makes_the_verdict_incomplete_never_conforms():
    def slow(q, k, v, *, causal=False):
        time.sleep(0.05)
        return REFERENCE.fn(q, k, v, causal=causal)

    verdict = spec.judge(slow, budget_s=1.0)
    assert verdict.verdict == "incomplete" and not verdict.ok and verdict.report.ok
    data = verdict.to_dict()
    assert data["complete"] is False and data["budget_s"] == 1.0
    assert data["seconds"] < 1.0 + 8.0  # one call past the budget at most, on a loaded machine
