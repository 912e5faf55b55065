"""The laws of state across calls (spec.laws.stateful, spec.laws.long_runs) and the judge profile:
a twin agrees with its original on every cheap fingerprint and differs elsewhere, the caller's own
arrays reach the target as its memory (in a bnhd layout and in a worker process too), a second
shape stays inside the target's limits, and the judge profile runs every ci law and the long runs."""

from __future__ import annotations

import numpy as np
import pytest
from gallery import stateful

import spec
from spec import Target
from spec.call import call
from spec.cases import Case, outside_limits
from spec.laws.stateful import SAMPLED, other_shape, own_arrays, refill, twin
from spec.profiles import PROFILES, runs_at
from spec.registry import LAWS

CASE = Case(dtype="float32", ndim=4, batch=2, heads=3, n_q=5, n_k=7, d_k=4, d_v=6, seed=3)


def _power(n: int, p: int) -> int:
    """How many times p divides n."""
    return 0 if n % p else 1 + _power(n // p, p)


STRIDES = [s for s in range(2, 50) if s == np.prod([p ** _power(s, p) for p in SAMPLED])]
"""Every stride made of the primes of SAMPLED, below 50: a twin leaves each one's sample alone."""


def _fingerprints(x: np.ndarray) -> tuple:
    flat = x.reshape(-1)
    return (x.shape, x.dtype, flat[0], flat[-1], tuple(np.sort(flat)),
            *(tuple(flat[::s]) for s in STRIDES))


@pytest.mark.parametrize("shape", [(13,), (4, 9), (2, 3, 5, 7)])
def test_a_twin_agrees_on_every_cheap_fingerprint_and_differs_elsewhere(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    found = twin(x, np.random.default_rng(1))
    assert found is not None and found.shape == x.shape and found.dtype == x.dtype
    assert _fingerprints(found) == _fingerprints(x)
    assert np.count_nonzero(found != x) == 2


def test_no_twin_where_no_two_elements_at_free_indices_differ():
    rng = np.random.default_rng(0)
    assert twin(np.arange(12.0), rng) is None  # only index 1 is free of the samples below 13
    assert twin(np.ones((4, 9)), rng) is None  # every element equal
    assert twin(np.arange(13.0), rng) is not None  # indices 1 and 11


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_the_callers_own_arrays_are_the_memory_the_target_reads(layout):
    seen = {}

    def recording(q, k, v, *, causal=False):
        seen.update(q=q, k=k, v=v)
        return np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)  # in either layout

    target = Target(recording, layout=layout, ndims=(4,))
    given = own_arrays(target, CASE.inputs())
    call(target, given, copy=False)
    for name in ("q", "k", "v"):
        assert np.shares_memory(seen[name], getattr(given, name)), name
    other = Case(**{**CASE.describe(), "seed": 4}).inputs()
    before = given.q
    refill(given, other, ("q", "v"))
    assert given.q is before and np.array_equal(given.q, other.q) and np.array_equal(given.v, other.v)
    assert np.array_equal(given.k, CASE.inputs().k)


@pytest.mark.parametrize("declared", [
    {}, {"seq_multiple": 16}, {"decode_only": True}, {"self_attention_only": True},
    {"keys_cover_queries": True, "max_seq": 20}, {"compiles_per_shape": True},
    {"causal_alignment": "square_or_decoding"},
])
def test_the_second_shape_is_another_the_target_takes(declared):
    target = Target(stateful.plain, **declared)
    n_q, n_k = (1, 16) if declared.get("decode_only") or declared.get("seq_multiple") else (5, 5)
    if declared.get("seq_multiple"):
        n_q = 16
    case = CASE.replace(n_q=n_q, n_k=n_k, causal=True)
    assert outside_limits(target, case) is None
    found = other_shape(target, case)
    assert found is not None and (found.n_q, found.n_k) != (case.n_q, case.n_k)
    assert outside_limits(target, found) is None and target.causal_shape_ok(found.n_q, found.n_k)


def test_no_second_shape_where_the_limits_admit_one_shape():
    target = Target(stateful.plain, decode_only=True, max_seq=1)
    assert other_shape(target, CASE.replace(n_q=1, n_k=1)) is None


def test_the_judge_profile_runs_every_ci_law_and_the_long_runs():
    ci = {name for name, p in LAWS.items() if runs_at(p.family, "ci") is None}
    judge = {name for name, p in LAWS.items() if runs_at(p.family, "judge") is None}
    long_runs = {name for name, p in LAWS.items() if p.family == "long_runs"}
    stateful_laws = {name for name, p in LAWS.items() if p.family == "stateful"}
    assert long_runs == {"right_after_64_calls", "long_run_matches_golden"}
    assert judge == ci | long_runs and not ci & long_runs
    assert stateful_laws and stateful_laws <= ci
    assert all(runs_at("long_runs", p) == "runs only at --profile judge" for p in ("quick", "ci", "thorough"))
    assert PROFILES["judge"].max_examples == PROFILES["ci"].max_examples and PROFILES["judge"].derandomize


def test_a_long_run_law_named_at_another_profile_is_skipped_saying_where_it_runs():
    (result,) = spec.check("reference", profile="ci", only=["long_run_matches_golden"]).results
    assert result.status == "skip" and "--profile judge" in result.message


def test_a_process_isolated_target_receives_the_callers_arrays_too():
    """In process isolation the law runs in the check's worker process, calling the target there:
    a cache on the buffers' addresses meets the refilled buffers and is caught."""
    target = Target(stateful.buffer_identity_cache, name="by_buffer_in_a_process", isolation="process")
    (result,) = spec.check(target, profile="quick", only=["refilled_inputs_give_new_outputs"]).results
    assert result.status == "fail" and "refilled in place" in result.message


def test_a_target_that_zeroes_its_inputs_is_named_by_inputs_not_mutated_alone():
    """The refill law hands over the caller's arrays, and writes every one of them again before its
    second call (the new values, or the old where none are new): the zeroed arrays are not read, and
    the one failure is inputs_not_mutated's, the law named for the bug."""
    target = Target(stateful.zeroes_its_inputs, name="zeroes_its_inputs")
    report = spec.check(target, profile="ci", only=["refilled_inputs_give_new_outputs", "inputs_not_mutated"])
    assert {r.name: r.status for r in report.results} == {"refilled_inputs_give_new_outputs": "pass",
                                                           "inputs_not_mutated": "fail"}
