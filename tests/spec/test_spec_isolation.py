"""spec.isolation, where a target's calls run (docs/targets.md). In ``process`` mode a target that
crashes (SIGSEGV, os._exit) or hangs in C is that law's failure, its worker is killed and reaped,
and the run goes on; in ``thread`` mode a call past its deadline is interrupted (or abandoned when
stuck in C) and fails the law, never the suite; ``caller`` runs each call in the caller's thread.

The targets below are importable (``test_spec_isolation:segfault_when_causal``) for the CLI test.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import inspect
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import spec
from impl import attention
from spec import isolation
from spec.call import call
from spec.cli import main
from spec.inputs import Inputs
from spec.isolation import TargetHung, with_deadline, workers
from spec.target import Target, TargetFailed

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "spec")])}
LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
CAUSAL = ["causal_no_leak"]
PLAIN = ["kv_permutation_invariance", "query_permutation_equivariance"]  # never causal


def segfault_when_causal(q, k, v, *, causal=False):
    if causal:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return attention(q, k, v, causal=causal)


def exits_when_causal(q, k, v, *, causal=False):
    if causal:
        os._exit(3)
    return attention(q, k, v, causal=causal)


def _q_k_v():
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((3, 2)) for _ in range(3))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _only(target, name="matches_golden", **kw):
    (result,) = spec.check(target, profile="quick", only=[name], **kw).results
    return result


# --- process isolation: a crash or a hang is that law's failure, and the run goes on --------------


def test_a_segfault_fails_that_law_naming_the_signal_and_the_run_goes_on():
    """A SIGSEGV in a process-isolated target fails the law that met it, naming the signal, and the
    other laws still run: in the suite's own process the same crash would end the whole run."""
    target = Target(segfault_when_causal, isolation="process")
    report = spec.check(target, profile="quick", only=PLAIN + CAUSAL)
    by_name = {r.name: r for r in report.results}
    assert [r.name for r in report.results] == PLAIN + CAUSAL  # the report is complete
    assert all(by_name[name].status == "pass" for name in PLAIN)
    broken = by_name["causal_no_leak"]
    assert broken.status == "fail"
    assert broken.message.startswith("the target crashed with SIGSEGV (signal 11)")
    assert broken.counterexample is not None and broken.counterexample.case["causal"] is True


def test_the_cli_overrides_isolation_and_exits_1_after_a_segfault():
    """A target declared with the default thread isolation, run with --isolation process."""
    run = subprocess.run(
        [sys.executable, "-m", "spec", "check", "--only", "kv_permutation_invariance", "causal_no_leak",
         "test_spec_isolation:segfault_when_causal", "--profile", "quick", "--isolation", "process"],
        capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    assert run.returncode == 1, run.stderr
    assert "SIGSEGV (signal 11)" in run.stdout and "1 passed, 1 failed" in run.stdout


def test_a_call_stuck_in_c_is_killed_at_the_deadline_and_its_worker_is_gone(tmp_path):
    pids = tmp_path / "pids"

    def stuck(q, k, v, *, causal=False):
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        LIBC.sleep(1000)  # in C: no Python instruction for an async exception to land on
        return attention(q, k, v)

    start = time.perf_counter()
    report = spec.check(Target(stuck), profile="quick", only=["matches_golden"], isolation="process",
                        deadline=0.5)
    took = time.perf_counter() - start
    (result,) = report.results
    assert result.status == "fail" and "did not return within the 0.5 s deadline" in result.message
    assert took < 30
    seen = {int(line) for line in pids.read_text().split()}
    assert seen and os.getpid() not in seen
    assert all(_gone(pid) for pid in seen)  # killed and reaped: no orphan, no zombie


def test_os_exit_in_the_target_is_a_failure_naming_the_status():
    report = spec.check(Target(exits_when_causal, isolation="process"), profile="quick",
                        only=PLAIN[:1] + CAUSAL)
    first, second = report.results
    assert first.status == "pass"
    assert second.status == "fail" and "ended its worker process with exit status 3" in second.message


def test_shrinking_a_crash_restarts_the_worker_a_bounded_number_of_times(monkeypatch):
    monkeypatch.setattr(isolation, "MAX_CRASHES", 2)  # Hypothesis calls a failing case at least twice

    def long_rows_crash(q, k, v, *, causal=False):
        if k.shape[-2] > 1 and q.shape[-1] != 3:  # the boundary grid (d_k = 3) passes: a drawn case crashes
            ctypes.string_at(0)
        return attention(q, k, v, causal=causal)

    (result,) = spec.check(Target(long_rows_crash, isolation="process"), profile="ci",
                           only=["matches_golden"]).results
    assert result.status == "fail" and result.message.startswith("the target crashed with SIGSEGV")
    assert result.message.endswith("(2 crashes: not called again)")


def test_process_mode_sees_mutation_of_the_callers_arrays():
    def mutating(q, k, v, *, causal=False):
        out = attention(q, k, v, causal=causal)
        q[...] = 0
        return out

    report = spec.check(Target(mutating, isolation="process"), profile="quick",
                        only=["inputs_not_mutated", "matches_golden"])
    assert [r.status for r in report.results] == ["fail", "pass"]
    assert "changed its input q" in report.results[0].message


def test_exceptions_come_back_from_the_worker_also_unpicklable_ones():
    class Unpicklable(Exception):
        def __reduce__(self):
            raise pickle.PicklingError("no")

    def raises_value_error(q, k, v):
        raise ValueError("bad shapes")

    def raises_unpicklable(q, k, v):
        raise Unpicklable("held a lock")

    q, k, v = _q_k_v()
    for fn, text in [(raises_value_error, "the target raised ValueError: bad shapes"),
                     (raises_unpicklable, "the target raised Unpicklable: held a lock")]:
        with workers(), pytest.raises(TargetFailed, match=text):
            call(Target(fn, isolation="process"), Inputs(q, k, v), deadline=30.0)


def test_the_worker_runs_in_another_process_and_serves_every_call_of_a_run():
    pids = []

    def where(q, k, v):
        return np.full((q.shape[0], v.shape[1]), float(os.getpid()))

    target = Target(where, isolation="process")
    q, k, v = _q_k_v()
    with workers():
        pids = [int(call(target, Inputs(q, k, v), deadline=30.0)[0, 0]) for _ in range(3)]
    assert len(set(pids)) == 1 and pids[0] != os.getpid()
    assert _gone(pids[0])  # leaving workers() reaped it
    outside = int(call(target, Inputs(q, k, v), deadline=30.0)[0, 0])  # outside a run: a one-off fork
    assert outside != os.getpid() and _gone(outside)


def test_workers_are_reaped_on_keyboard_interrupt():
    def where(q, k, v):
        return np.full((q.shape[0], v.shape[1]), float(os.getpid()))

    target = Target(where, isolation="process")
    q, k, v = _q_k_v()
    pid = []
    with pytest.raises(KeyboardInterrupt), workers():
        pid.append(int(call(target, Inputs(q, k, v), deadline=30.0)[0, 0]))
        raise KeyboardInterrupt
    assert pid and _gone(pid[0])


def test_cli_and_plugin_refuse_bad_isolation_and_deadline(capsys):
    assert main(["check", "reference", "--isolation", "fork"]) == 2
    assert main(["check", "reference", "--deadline", "0"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'fork'" in err and "expected a positive number of seconds, got '0'" in err


def test_torch_in_process_mode_after_the_parent_used_its_thread_pool():
    """A forked child inherits torch's OpenMP pool without its threads, so its first parallel region
    would hang (every law failing at the deadline): the worker sets torch to one thread, and a
    process-isolated check passes after the parent has used the pool."""
    torch = pytest.importorskip("torch")
    a = torch.ones(256, 256)
    assert float((a @ a).sum()) == 256.0**3  # runs the intra-op pool in this process
    report = spec.check("torch", profile="quick", max_examples=5, only=["matches_golden", "causal_no_leak"],
                        isolation="process", deadline=20.0)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert torch.get_num_threads() >= 1 and all(r.examples >= 5 for r in report.results)


def test_a_one_off_worker_sends_mutations_back_too():
    def mutating(q, k, v):
        q[...] = 0
        return attention(q, k, v)

    q, k, v = _q_k_v()
    call(Target(mutating, isolation="process"), Inputs(q, k, v), deadline=30.0,
         copy=False)  # outside workers()
    assert not q.any()


def test_process_isolation_runs_each_law_in_its_worker_without_a_round_trip_per_call(tmp_path):
    """A law's whole run happens in the check's worker process, which calls the target directly: a
    round trip to a worker per call (pickling, a pipe, two wake-ups) would cost about a fifth of the
    run's CPU time. Seen from the target: every call is made in the run's worker
    (``isolation.in_run_worker``), and that is one process, reaped at the end."""
    calls = tmp_path / "calls"

    def where(q, k, v, *, causal=False):
        with open(calls, "a") as f:
            f.write(f"{os.getpid()} {int(isolation.in_run_worker())}\n")
        return attention(q, k, v, causal=causal)

    report = spec.check(Target(where, isolation="process"), profile="quick",
                        only=["matches_golden", "causal_no_leak"])
    assert report.ok and all(r.examples >= 10 for r in report.results)
    seen = [line.split() for line in calls.read_text().splitlines()]
    assert all(direct == "1" for _, direct in seen)  # none came through a round trip
    pids = {int(pid) for pid, _ in seen}
    assert len(pids) == 1 and os.getpid() not in pids and _gone(pids.pop())  # one worker, reaped


def test_a_crash_that_the_rerun_call_by_call_does_not_repeat_is_still_a_failure(tmp_path):
    """The law's run crashes its worker once; run again call by call it passes: a failure all
    the same (intermittent), never a pass."""
    crashed = tmp_path / "crashed"

    def crashes_once(q, k, v, *, causal=False):
        if causal and not crashed.exists():
            crashed.touch()
            ctypes.string_at(0)
        return attention(q, k, v, causal=causal)

    (result,) = spec.check(Target(crashes_once, isolation="process"), profile="quick",
                           only=["causal_no_leak"]).results
    assert crashed.exists()
    assert result.status == "fail" and result.counterexample is None
    assert result.message.startswith("the target crashed with SIGSEGV in a run of this law in its worker "
                                     "process, but not when the law was run again")


def test_after_its_worker_crashed_a_run_goes_call_by_call(tmp_path):
    """Each crash is met once: the law whose run crashed the worker is run again call by call,
    and so are the laws after it, instead of a run in a fresh worker that crashes again first.
    Seen from the target: the calls made in a run's worker (``isolation.in_run_worker``) are all
    in one process, the one the first crash ended."""
    calls = tmp_path / "calls"

    def segfault_when_causal_noted(q, k, v, *, causal=False):
        with open(calls, "a") as f:
            f.write(f"{os.getpid()} {int(isolation.in_run_worker())}\n")
        return segfault_when_causal(q, k, v, causal=causal)

    report = spec.check(Target(segfault_when_causal_noted, isolation="process"), profile="quick",
                        only=PLAIN[:1] + CAUSAL + ["matches_golden"])
    by_name = {r.name: r for r in report.results}
    assert by_name[PLAIN[0]].status == "pass"
    for name in [*CAUSAL, "matches_golden"]:  # matches_golden draws causal cases too
        assert by_name[name].message.startswith("the target crashed with SIGSEGV (signal 11)")
    seen = [line.split() for line in calls.read_text().splitlines()]
    assert len({pid for pid, in_run in seen if in_run == "1"}) == 1  # one run worker for the check
    assert any(in_run == "0" for _, in_run in seen)  # after the crash: call by call


def test_process_isolation_forks_one_worker_per_check(tmp_path):
    """A process-isolated check runs all its laws in one worker process, forked once: a worker per
    law would cost a fork and a worker's start for each of the dozens of laws of a check. The forks
    are counted by the process ids the target sees."""
    pids = tmp_path / "pids"

    def where(q, k, v, *, causal=False):
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        return attention(q, k, v, causal=causal)

    laws = ["output_shape_dtype", "rows_sum_to_one", "matches_golden"]
    report = spec.check(Target(where, isolation="process"), profile="quick", only=laws)
    assert report.ok and len(report.results) == 3
    seen = {int(line) for line in pids.read_text().split()}
    assert len(seen) == 1 and os.getpid() not in seen


# --- thread and caller isolation: the deadline of a call, the thread it runs in -------------------


def test_thread_mode_is_unchanged_it_runs_in_this_process_on_another_thread():
    seen = []

    def where(q, k, v):
        seen.append((os.getpid(), threading.current_thread()))
        return attention(q, k, v)

    q, k, v = _q_k_v()
    call(Target(where), Inputs(q, k, v), deadline=30.0)
    assert seen[0][0] == os.getpid() and seen[0][1] is not threading.current_thread()
    with pytest.raises(TargetHung):
        call(Target(lambda q, k, v: time.sleep(5)), Inputs(q, k, v), deadline=0.2)


def test_caller_isolation_runs_in_the_callers_thread():
    threads = []

    def fn(q, k, v):
        threads.append(threading.current_thread())
        return attention(q, k, v)

    q, k, v = _q_k_v()
    call(Target(fn, isolation="caller"), Inputs(q, k, v), deadline=5.0)
    call(Target(fn), Inputs(q, k, v), deadline=5.0)
    assert threads[0] is threading.current_thread() and threads[1] is not threading.current_thread()


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


def _called_from_a_law() -> bool:
    """Whether a law's own code is on the stack of this call: the call was made in the thread
    running the law, not handed to another thread."""
    laws = {p.check.__code__ for p in spec.LAWS.values()}
    frame = inspect.currentframe()
    while frame is not None and frame.f_code not in laws:
        frame = frame.f_back
    return frame is not None


def test_thread_isolation_runs_a_checks_calls_in_one_thread_without_a_hand_off_each():
    """Thread isolation runs each law in one watched thread, kept from law to law, and makes the
    law's calls there: handing each call to another thread and back wakes a thread on the other
    core twice a call (about a tenth of a run's CPU time), and a fresh thread per law costs
    Hypothesis's per-thread set-up (a full garbage collection) as much again. Seen from the target:
    the thread it runs in, and the law on its own calling stack."""
    threads, direct = set(), []

    def recording(q, k, v, *, causal=False):
        threads.add(threading.current_thread())
        direct.append(_called_from_a_law())
        return attention(q, k, v, causal=causal)

    report = spec.check(recording, profile="quick", only=["matches_golden", "causal_no_leak"])
    assert report.ok and direct and all(direct)  # no call was handed off
    assert len(threads) == 1 and threading.main_thread() not in threads  # one thread, kept between laws
