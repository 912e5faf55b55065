"""Context-parallel targets (`spec.RankTarget`): the layouts shard as docs/targets.md says; the rank laws
run on real gloo ranks, and only on such targets; a target declared ``in_process`` has its cheap laws
run on rank threads (and the process's own torch.distributed world stays its own); the built-in ring
conforms at world sizes 2 and 4, forward and backward; a rank that raises, hangs or dies is a
failure naming it; no process outlives a check. Each law's gallery bug is in
tests/spec/gallery/ranks.py (checked by test_spec_gallery)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import spec
from spec import rank_target
from spec.cli import main
from spec.laws.ranks import IN_PROCESS
from spec.rank_target import RankTarget, gather, positions, shard
from spec.target import TargetError

RANK_LAWS = [name for name, law in spec.LAWS.items() if law.family == "ranks"]
needs_gloo = pytest.mark.skipif(spec.LAWS["ranks_match_golden"].needs(RankTarget(print)) is not None,
                                reason="needs torch.distributed with gloo")


def children(of: int | None = None) -> set[int]:
    """The processes whose parent is ``of`` (this one by default), alive or not yet reaped, from /proc."""
    me, found = str(os.getpid() if of is None else of), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if fields[1] == me:
                found.add(int(entry))
    return found


# --- layouts


def test_the_layouts_shard_as_declared():
    assert [list(p) for p in positions(5, 2, "contiguous")] == [[0, 1, 2], [3, 4]]
    assert [list(p) for p in positions(2, 4, "contiguous")] == [[0], [1], [], []]
    assert [list(p) for p in positions(8, 2, "zigzag")] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert [list(p) for p in positions(8, 4, "zigzag")] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [list(p) for p in positions(5, 2, "striped")] == [[0, 2, 4], [1, 3]]


@pytest.mark.parametrize("layout", rank_target.LAYOUTS)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_gather_puts_every_shard_back_in_sequence_order(layout, world_size):
    x = np.random.default_rng(0).standard_normal((2, 3, 8 * world_size, 5))
    where = positions(x.shape[-2], world_size, layout)
    assert sorted(np.concatenate(where).tolist()) == list(range(x.shape[-2]))  # each token once
    assert np.array_equal(gather(shard(x, where), where, x.shape[-2]), x)


def test_a_zigzag_of_a_length_that_does_not_split_is_refused_naming_it():
    with pytest.raises(ValueError, match="multiple of 2·world_size = 4, got n=6"):
        positions(6, 2, "zigzag")
    with pytest.raises(ValueError, match="layout must be one of"):
        positions(4, 2, "diagonal")


@pytest.mark.parametrize(("declared", "field"), [
    ({"fn": 3}, "fn must be callable"),
    ({"fn": print, "world_sizes": 2}, "world_sizes"),
    ({"fn": print, "world_sizes": (0,)}, "world_sizes"),
    ({"fn": print, "layouts": ("zig",)}, "layouts"),
    ({"fn": print, "dtypes": ("int8",)}, "dtypes"),
    ({"fn": print, "returns_lse": 1}, "returns_lse"),
    ({"fn": print, "deadline_s": 0}, "deadline_s"),
    ({"fn": print, "grad_fn": 1}, "grad_fn"),
])
def test_a_bad_declaration_is_refused_naming_the_field(declared, field):
    with pytest.raises(TargetError, match=field):
        RankTarget(**declared)


# --- the ranks


def _rank_one_hangs(q, k, v, *, group, rank, layout, causal=False):
    if rank == 1:
        time.sleep(3600)
    return np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)


def _rank_one_dies(q, k, v, *, group, rank, layout, causal=False):
    if rank == 1:
        os._exit(3)
    return np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)


def _rank_one_raises(q, k, v, *, group, rank, layout, causal=False):
    if rank == 1:
        raise RuntimeError("no route to rank 0")
    return np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)


@needs_gloo
@pytest.mark.parametrize(("fn", "said"), [
    (_rank_one_hangs, "rank 1 did not return within the 2 s deadline"),
    (_rank_one_dies, "rank 1 of 2 died (exit status 3)"),
    (_rank_one_raises, "rank 1 of 2 raised RuntimeError: no route to rank 0"),
])
def test_a_rank_that_hangs_dies_or_raises_is_a_failure_naming_it_and_no_process_is_left(fn, said):
    before = children()
    start = time.monotonic()
    report = spec.check(RankTarget(fn, world_sizes=(2,), deadline_s=2), profile="quick",
                        only=["ranks_match_golden"])
    (result,) = report.results
    assert result.status == "fail" and said in result.message, result.message
    assert time.monotonic() - start < 60  # a hang stops the law at once: no shrinking through deadlines
    assert children() <= before  # every rank killed and reaped


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


HANGING_CHECK = """
import time
import spec
def hang(q, k, v, *, group, rank, layout, causal=False):
    time.sleep(3600)
target = spec.RankTarget(hang, world_sizes=(2,), deadline_s=600)
spec.check(target, profile="quick", only=["ranks_match_golden"])
"""


@needs_gloo
def test_the_ranks_die_with_a_suite_that_is_killed():
    """A suite killed (SIGKILL: no finally, no atexit) while its ranks hang: the ranks die too."""
    import signal
    import subprocess
    import sys

    suite = subprocess.Popen([sys.executable, "-c", HANGING_CHECK])
    try:
        for _ in range(600):  # its two ranks started, within 60 s
            ranks = children(of=suite.pid)
            if len(ranks) >= 2:
                break
            time.sleep(0.1)
        assert len(ranks) == 2, ranks
        time.sleep(1)  # both in the call, hanging
    finally:
        os.kill(suite.pid, signal.SIGKILL)
        suite.wait()
    for _ in range(100):
        if not any(alive(pid) for pid in ranks):
            break
        time.sleep(0.1)
    assert not any(alive(pid) for pid in ranks), f"ranks {ranks} outlived the suite"


def _counting_starts(monkeypatch) -> list[tuple[str, int]]:
    """Every pool started from now on, as (``processes`` or ``threads``, world size)."""
    started: list[tuple[str, int]] = []
    for kind, cls in (("processes", rank_target.RankPool), ("threads", rank_target.ThreadRanks)):
        def counting(self, target, world_size, *, kind=kind, real=cls.__init__):
            started.append((kind, world_size))
            real(self, target, world_size)

        monkeypatch.setattr(cls, "__init__", counting)
    return started


@needs_gloo
def test_the_ranks_are_started_once_per_world_size_for_the_whole_check(monkeypatch):
    started = _counting_starts(monkeypatch)
    before = children()
    ring = spec.builtin.load_rank_target("ring").replace(in_process=False)
    report = spec.check(ring, profile="quick", seed=2, only=["ranks_match_golden", "ranks_invariant"])
    assert report.ok, [(r.name, r.message) for r in report.failures]
    # two laws, dozens of calls, each world size started once
    assert sorted(started) == [("processes", 2), ("processes", 4)]
    assert children() <= before and not rank_target._LIVE


# --- ranks in the suite's process


@needs_gloo
@pytest.mark.parametrize("law", RANK_LAWS)
def test_a_target_declared_in_process_runs_the_cheap_laws_on_threads_and_the_rest_on_processes(
        monkeypatch, law):
    started = _counting_starts(monkeypatch)
    report = spec.check("ring", profile="quick", seed=3, only=[law])
    assert report.ok, [(r.name, r.message) for r in report.failures]
    host = "threads" if law in IN_PROCESS else "processes"
    assert sorted(started) == [(host, 2), (host, 4)], started
    assert not [t for t in threading.enumerate() if t.name.startswith("spec-rank-")]  # every thread left


def _all_reduced(q, k, v, *, group, rank, layout, causal=False):
    import torch
    import torch.distributed as dist

    x = torch.from_numpy(np.ascontiguousarray(q))
    dist.all_reduce(x, group=group)
    return x.numpy()


@needs_gloo
def test_rank_threads_and_rank_processes_return_the_same_shards():
    from spec.adapters.torch_ring import ring_attention

    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 2, 24, 8)) for _ in range(3))
    where = positions(24, 4, "zigzag")
    arrays = list(zip(shard(q, where), shard(k, where), shard(v, where), strict=True))
    target = RankTarget(ring_attention, in_process=True)
    with rank_target.kept_ranks():
        threads = rank_target.run_ranks(target, 4, "forward", arrays, {"layout": "zigzag", "causal": True},
                                        in_process=True)
        processes = rank_target.run_ranks(target, 4, "forward", arrays, {"layout": "zigzag", "causal": True})
    for a, b in zip(threads, processes, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert not np.array_equal(threads[0], threads[1])  # each rank its own shard


_RELEASE = threading.Event()


def _thread_one_hangs(q, k, v, *, group, rank, layout, causal=False):
    if rank == 1:
        _RELEASE.wait(120)  # let go by the test, so that no thread is left behind
    return _all_reduced(q, k, v, group=group, rank=rank, layout=layout)


def _thread_one_raises(q, k, v, *, group, rank, layout, causal=False):
    if rank == 1:
        raise RuntimeError("no route to rank 0")
    return _all_reduced(q, k, v, group=group, rank=rank, layout=layout)


@needs_gloo
@pytest.mark.parametrize(("fn", "said"), [
    (_thread_one_hangs, "ranks 0, 1 did not return within the 2 s deadline (world size 2; every rank "
                        "thread was abandoned)"),
    (_thread_one_raises, "rank 1 of 2 raised RuntimeError: no route to rank 0 (at test_spec_ranks.py:"),
])
def test_a_rank_thread_that_hangs_or_raises_is_a_failure_naming_it(fn, said):
    """Rank 0 waits in the all-reduce for rank 1, so both are late; a rank that raises is named with
    the frame it raised in; the next call starts fresh threads and returns."""
    _RELEASE.clear()
    target = RankTarget(fn, world_sizes=(2,), deadline_s=2, in_process=True)
    arrays = [(np.full((1, 3, 2), float(r)),) * 3 for r in range(2)]
    start = time.monotonic()
    with rank_target.kept_ranks():
        with pytest.raises((rank_target.RankLost, spec.target.TargetFailed)) as failed:
            rank_target.run_ranks(target, 2, "forward", arrays, {"layout": "contiguous"}, in_process=True)
        assert said in str(failed.value), str(failed.value)
        assert time.monotonic() - start < 30
        _RELEASE.set()
        fine = RankTarget(_all_reduced, world_sizes=(2,), deadline_s=30, in_process=True)
        got = rank_target.run_ranks(fine, 2, "forward", arrays, {"layout": "contiguous"}, in_process=True)
    assert [float(x.ravel()[0]) for x in got] == [1.0, 1.0]
    for _ in range(300):  # the abandoned threads leave once let go and their pipes are closed
        if not [t for t in threading.enumerate() if t.name.startswith("spec-rank-")]:
            break
        time.sleep(0.1)
    assert not [t for t in threading.enumerate() if t.name.startswith("spec-rank-")]


@needs_gloo
def test_the_processs_own_torch_distributed_group_is_untouched_by_rank_threads(tmp_path):
    """A caller inside a torch.distributed job of its own (a group of one here) checks a target on
    rank threads: its group is the same group after the check, and still works."""
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        mine = dist.group.WORLD
        report = spec.check("ring", profile="quick", seed=1, only=["ranks_invariant"])
        assert report.ok, [(r.name, r.message) for r in report.failures]
        assert dist.group.WORLD is mine and dist.get_world_size() == 1 and dist.get_rank() == 0
        # still registered by name (the rank threads registered and unregistered theirs apart)
        assert dist.distributed_c10d._resolve_process_group(mine.group_name) is mine
        x = torch.ones(3)
        dist.all_reduce(x)
        assert x.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()


@needs_gloo
@pytest.mark.parametrize("seed", [1, 2])
def test_the_builtin_ring_conforms_at_world_sizes_2_and_4_forward_and_backward(seed):
    report = spec.check("ring", profile="quick", seed=seed)
    assert [r.name for r in report.results] == RANK_LAWS
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert all(r.status == "pass" for r in report.results), [(r.name, r.message) for r in report.results]


def test_an_attention_target_runs_no_rank_law_unless_named_and_then_skips_it():
    report = spec.check("reference", profile="quick", only=["rows_sum_to_one", "ranks_match_golden"])
    statuses = {r.name: (r.status, r.message) for r in report.results}
    assert statuses["ranks_match_golden"] == ("skip", "needs a context-parallel target (a spec.RankTarget)")
    assert not set(RANK_LAWS) & {law.name for law in spec.runner.select(None) if law.family != "ranks"}


def test_an_attention_law_named_for_a_rank_target_is_skipped_saying_why():
    (result,) = spec.check(RankTarget(print), profile="quick", only=["rows_sum_to_one"]).results
    assert result.status == "skip" and "context-parallel target" in result.message


@needs_gloo
def test_a_failure_replays_with_its_line():
    from spec.adapters.torch_ring import RingParts, ring_target

    broken = ring_target(RingParts(mask_padding=False), name="padded")
    (result,) = spec.check(broken, profile="quick", only=["ranks_uneven_and_empty"]).results
    assert result.status == "fail"
    case = result.counterexample.case
    with pytest.raises(AssertionError, match="world size"):
        spec.replay(broken, "ranks_uneven_and_empty", **case)
    assert spec.replay("ring", "ranks_uneven_and_empty", **case) is None  # the right ring holds there


@needs_gloo
def test_the_cli_checks_the_ring_and_refuses_attention_options(capsys):
    assert main(["check", "ring", "--profile", "quick", "--only", "ranks_causal_balanced"]) == 0
    capsys.readouterr()
    assert main(["check", "ring", "--isolation", "process"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "context-parallel target 'ring'" in err[0]


def test_ring_is_no_attention_target():
    with pytest.raises(TargetError, match="context-parallel target"):
        spec.load_target("ring")


@needs_gloo
def test_torchs_context_parallel_conforms_as_declared_and_fails_where_docs_say():
    """PyTorch's context_parallel on the CPU: non-causal on SDPA's math backend it matches the golden
    at world sizes 2 and 4 and every layout; causal, every rank raises PyTorch #147793's error, and
    lengths that do not split evenly over the ranks fail, so it declares supports_uneven=False
    (docs/targets.md has the replay lines)."""
    from spec.builtin import load_rank_target

    target = load_rank_target("torch_cp")
    report = spec.check(target, profile="quick", seed=1, only=["ranks_match_golden", "ranks_invariant",
                                                               "ranks_causal_balanced"])
    assert {r.name: r.status for r in report.results} == {
        "ranks_match_golden": "pass", "ranks_invariant": "pass", "ranks_causal_balanced": "skip"}
    (causal,) = spec.check(target.replace(supports_causal=True), profile="quick",
                           only=["ranks_causal_balanced"]).results
    assert causal.status == "fail" and "got mixed torch.Tensor and DTensor" in causal.message
    (skipped,) = spec.check(target, profile="quick", only=["ranks_uneven_and_empty"]).results
    assert skipped.status == "skip" and "supports_uneven=False" in skipped.message
    (uneven,) = spec.check(target.replace(supports_uneven=True), profile="quick",
                           only=["ranks_uneven_and_empty"]).results
    assert uneven.status == "fail"


def test_a_target_without_a_causal_mode_is_never_called_causal():
    from hypothesis import given, settings

    from spec.laws.ranks import rank_cases

    @settings(max_examples=30, database=None)
    @given(rank_cases(RankTarget(print, supports_causal=False)))
    def never_causal(case):
        assert not case.causal

    never_causal()


@needs_gloo
def test_a_rank_target_in_a_file_is_checked_by_the_command_line(tmp_path):
    """``python -m spec check path.py:attr`` in a real process: the rank laws run on it, by its name."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "cp.py").write_text("import spec\nfrom spec.adapters.torch_ring import ring_attention\n\n"
                                    "target = spec.RankTarget(ring_attention, world_sizes=(2,), "
                                    "layouts=('striped',))\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "spec", "check", f"{tmp_path / 'cp.py'}:target",
                           "--profile", "quick", "--only", "ranks_causal_balanced", "ranks_invariant"],
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()
            if line.startswith("ranks_")}
    assert rows == {"ranks_causal_balanced": "pass"}
    skipped = "needs two shardings (target declares one world size and one layout): ranks_invariant"
    assert skipped in done.stdout


HUNG_THREAD_CHECK = """
import time
import spec
from spec.adapters.torch_ring import ring_attention

def hangs(q, k, v, *, group, rank, layout, causal=False, **keywords):
    if rank == 1:  # hung in Python, while rank 0 waits for its block inside a gloo collective
        time.sleep(3600)
    return ring_attention(q, k, v, group=group, rank=rank, layout=layout, causal=causal, **keywords)

target = spec.RankTarget(hangs, world_sizes=(2,), deadline_s=2, in_process=True)
"""


@needs_gloo
def test_a_check_whose_rank_thread_hung_exits_with_its_verdict(tmp_path):
    """A rank thread abandoned inside a gloo collective while the interpreter exits aborts the
    process (``terminate called without an active exception``, exit 134); the suite waits at exit
    until gloo's timeout has ended it, so the command exits 1, its verdict, within seconds."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "hung.py").write_text(HUNG_THREAD_CHECK, encoding="utf-8")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "spec", "check", f"{tmp_path / 'hung.py'}:target",
                           "--profile", "quick", "--only", "ranks_invariant"],
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "terminate called" not in done.stderr
    assert "did not return within the 2 s deadline" in done.stdout
    assert time.monotonic() - start < 60
