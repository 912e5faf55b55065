"""What a run of the suite costs: each example's arrays and expectations are made once, BLAS does
not spin on the suite's small arrays, and process isolation forks once per check."""

from __future__ import annotations

import os

import pytest

import spec
from impl import attention
from spec import oracle
from spec.cases import Case


def test_an_example_builds_its_arrays_and_its_expectation_once(monkeypatch):
    """Before: each example rebuilt its arrays and revalidated its keywords about six times."""
    drawn, expected, examples = [], [], []
    values_like, _expected = Case.values_like, oracle._expected
    monkeypatch.setattr(Case, "values_like", lambda self, *a: drawn.append(1) or values_like(self, *a))
    monkeypatch.setattr(oracle, "_expected", lambda *a: expected.append(1) or _expected(*a))

    def counted(q, k, v, *, causal=False):
        examples.append(1)
        return attention(q, k, v, causal=causal)

    report = spec.check(counted, profile="quick", only=["matches_golden"], isolation="caller")
    assert report.ok and examples
    assert len(drawn) == 3 * len(examples)  # q, k and v, once each
    assert len(expected) == len(examples)


def test_blas_runs_on_one_thread_during_a_check():
    """Before: BLAS kept one thread per core, which spin between the suite's small calls (about a
    third of a run's CPU time on two cores)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    seen = []

    def recording(q, k, v, *, causal=False):
        seen.extend(lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                    if lib["user_api"] == "blas")
        return attention(q, k, v, causal=causal)

    assert spec.check(recording, profile="quick", only=["rows_sum_to_one"]).ok
    assert seen and set(seen) == {1}


def test_process_isolation_forks_one_worker_per_check(monkeypatch):
    """Before: a fresh worker process per law (68 forks for the reference)."""
    import spec.isolation

    forks, fork = [], os.fork
    monkeypatch.setattr(spec.isolation.os, "fork", lambda: forks.append(1) or fork())
    target = spec.Target(attention, isolation="process")
    laws = ["output_shape_dtype", "rows_sum_to_one", "matches_golden"]
    report = spec.check(target, profile="quick", only=laws)
    assert report.ok and len(report.results) == 3
    assert len(forks) == 1


def test_thread_isolation_runs_a_checks_calls_in_one_thread_without_a_hand_off_each(monkeypatch):
    """Before: each call was handed to a worker thread and back (two wake-ups of a thread on the
    other core per call: about a tenth of a run's CPU time); run in a fresh thread per law instead,
    Hypothesis's per-thread set-up (a full garbage collection) cost as much again."""
    import threading

    import spec.isolation

    handed, with_deadline = [], spec.isolation.with_deadline
    monkeypatch.setattr(spec.isolation, "with_deadline",
                        lambda fn, s: handed.append(1) or with_deadline(fn, s))
    threads = set()

    def recording(q, k, v, *, causal=False):
        threads.add(threading.current_thread())
        return attention(q, k, v, causal=causal)

    report = spec.check(recording, profile="quick", only=["matches_golden", "causal_no_leak"])
    assert report.ok and threads
    assert handed == []
    assert len(threads) == 1 and threading.main_thread() not in threads  # one thread, kept between laws


def test_a_choice_with_one_option_costs_no_draw():
    """Before: a one-element ``sampled_from`` (``just``) was drawn for every default amplitude, mask
    and values choice, about 7,000 draws in ``spec check reference --profile ci``."""
    from spec.cases import pick

    def no_draw(strategy):
        raise AssertionError(f"drew {strategy!r}")

    assert pick(no_draw, ("none",)) == "none"
    seen = []
    assert pick(lambda s: seen.append(s) or "random", ("none", "random")) == "random" and len(seen) == 1


def test_score_variance_measures_fewer_heads_for_wide_heads_at_the_same_false_alarm_rate():
    """Before: 4,096 heads at every d_k, whose q and k cost 4,096·3·d_k normal draws an example."""
    from spec.laws import core

    for d_k in range(1, 129):
        n = core.score_samples(d_k)
        sigma = ((8 + 24 / d_k) / n) ** 0.5 / 2  # the estimate's standard deviation (the law's docstring)
        assert n % 64 == 0 and sigma <= core.SCORE_VARIANCE_BAND / core.SCORE_BAND_SIGMAS
        assert core.SCORE_VARIANCE_BAND / core.SCORE_BAND_SIGMAS < ((8 + 24 / d_k) / (n - 64)) ** 0.5 / 2
    assert core.score_samples(1) == 4096 and core.score_samples(128) == 1088


def test_the_long_boundary_square_is_float32_where_the_target_declares_it():
    """Before: the dtype rotation gave the 2,065 × 2,065 causal square float64, at about twice the
    cost of float32 for the target and the oracle alike."""
    from spec.builtin import load_target
    from spec.cases import LONG_TILE, boundary_cases

    reference = load_target("reference")
    (long,) = [c for c in boundary_cases(reference, long=True) if c.n_q > LONG_TILE]
    assert long.dtype == "float32" and long.causal and long.n_q == long.n_k
    half = reference.replace(dtypes=("float16", "bfloat16"))
    (long,) = [c for c in boundary_cases(half, long=True) if c.n_q > LONG_TILE]
    assert long.dtype in half.dtypes


def test_a_replace_that_changes_nothing_keeps_what_the_inputs_worked_out():
    """Before: ``run`` replaced ``return_lse=None`` on every call, and the copy worked out the keys'
    meaning, the keywords' terms and the geometry again."""
    inputs = Case(dtype="float32", ndim=2, batch=1, heads=1, n_q=3, n_k=4, d_k=2, d_v=2, seed=1).inputs()
    oracle.meaning(inputs)
    assert inputs.replace(return_lse=None) is inputs
    changed = inputs.replace(return_lse=True)
    assert changed is not inputs and changed.get("return_lse") is True and not changed.memo
    assert changed.replace(return_lse=None).get("return_lse") is None
