"""Context-parallel targets: `RankTarget`, the declaration of an attention that runs on every rank
of a ``torch.distributed`` group with its shard of the sequence; the layouts that shard a sequence
over the ranks; and the ranks themselves on the gloo backend: `RankPool`, real processes, and
`ThreadRanks`, threads of the suite's own process (PyTorch's in-process ranks).

    fn(q, k, v, *, group, rank, layout, causal=False, **keywords) -> out            [..., n_r, d_v]
                                                    (return_lse=True: (out, lse))  lse [..., n_r]
    grad_fn(q, k, v, d_out, *, group, rank, layout, causal=False, **keywords) -> (dq, dk, dv)

Each rank is given the NumPy shards of q, k and v along the token axis (−2) that its layout gives
it and returns its shard of the output (gradients: of its own q, k and v shards). Causal masking is
top-left on global positions. The suite starts the ranks once per world size (and host) and keeps
them for a whole check (`kept_ranks`); a rank that raises, hangs past the deadline or dies is a
failure naming it, after which every rank of that pool is ended, and a later call starts a fresh
pool. No rank process outlives the check (nor the process: ``atexit``, and each rank dies with its
parent).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import ctypes
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from spec.target import FLOAT_DTYPES, TargetError, TargetFailed, _callable_name

Array = np.ndarray

LAYOUTS = ("contiguous", "zigzag", "striped")
"""How a sequence of n tokens is sharded over W ranks: ``contiguous``, `np.array_split`
order (uneven n allowed, a rank may hold no token); ``zigzag``, 2W equal chunks, rank r holding
chunks r and 2W − 1 − r (PyTorch's head-tail load balancer; n a multiple of 2W); ``striped``,
token t on rank t mod W."""


@dataclass(frozen=True)
class RankTarget:
    """A context-parallel attention under test: ``fn`` runs on every rank of a group."""

    fn: Callable[..., Any]
    """``fn(q, k, v, *, group, rank, layout, causal=False, **keywords)``: this rank's shard of the output."""
    name: str = ""
    """Shown in reports; defaults to the callable's qualified name."""
    world_sizes: tuple[int, ...] = (2, 4)
    """The group sizes it runs at; each is tested."""
    layouts: tuple[str, ...] = LAYOUTS
    """The layouts (`LAYOUTS`) it takes; each is tested."""
    dtypes: tuple[str, ...] = ("float32", "float64")
    """NumPy dtype names of q, k, v it accepts; each is tested."""
    returns_lse: bool = False
    """True: called with ``return_lse=True`` it returns ``(out, lse)``, lse float32 (float64 for
    float64 inputs), natural log, −inf for a query that sees no key."""
    grad_fn: Callable[..., Any] | None = None
    """``grad_fn(q, k, v, d_out, *, group, rank, layout, causal=False)`` -> this rank's shards of
    ``(dq, dk, dv)``: the backward laws run when it is given."""
    supports_causal: bool = True
    """False: it has no causal mode (never called with ``causal=True``); the laws that need one are
    skipped, naming this declaration."""
    supports_uneven: bool = True
    """False: every call's n splits evenly over the ranks (no rank empty), as PyTorch's context
    parallelism needs; the law of uneven lengths and empty shards is skipped, naming this declaration."""
    supports_varlen: bool = False
    """True: it takes ``cu_seqlens_q=`` and ``cu_seqlens_k=`` (equal, int64, the whole sequence's
    document offsets, given to every rank): attention only within a document (packed sequences)."""
    deadline_s: float = 60.0
    """Seconds one call may take on every rank together; past it the call is a failure naming the
    ranks that did not return, and the pool is killed."""
    in_process: bool = False
    """True: the ranks share nothing but the group (no process-wide state of their own), so the
    laws that vary one thing about a sharding run them as threads of the suite's process
    (`ThreadRanks`); `ranks_match_golden` and the backward still run on real processes."""

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TargetError(f"RankTarget fn must be callable, got {type(self.fn).__name__}")
        if self.grad_fn is not None and not callable(self.grad_fn):
            raise TargetError(f"RankTarget grad_fn must be callable, got {type(self.grad_fn).__name__}")
        if not self.name:
            object.__setattr__(self, "name", _callable_name(self.fn))
        sizes = self.world_sizes
        if isinstance(sizes, int) or not sizes or not all(
                isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= 16 for w in sizes):
            raise TargetError("RankTarget world_sizes must be a non-empty tuple of integers 1..16, "
                              f"got {sizes!r}")
        object.__setattr__(self, "world_sizes", tuple(sizes))
        if isinstance(self.layouts, str) or not self.layouts or not all(x in LAYOUTS for x in self.layouts):
            raise TargetError(f"RankTarget layouts must be a non-empty tuple of {', '.join(LAYOUTS)}, "
                              f"got {self.layouts!r}")
        object.__setattr__(self, "layouts", tuple(self.layouts))
        if isinstance(self.dtypes, str) or not self.dtypes or not all(d in FLOAT_DTYPES for d in self.dtypes):
            raise TargetError(f"RankTarget dtypes must be a non-empty tuple of {', '.join(FLOAT_DTYPES)}, "
                              f"got {self.dtypes!r}")
        object.__setattr__(self, "dtypes", tuple(self.dtypes))
        for flag in ("returns_lse", "supports_causal", "supports_uneven", "supports_varlen", "in_process"):
            if not isinstance(getattr(self, flag), bool):
                raise TargetError(f"RankTarget {flag} must be True or False, got {getattr(self, flag)!r}")
        if isinstance(self.deadline_s, bool) or not isinstance(self.deadline_s, (int, float)) \
                or not math.isfinite(self.deadline_s) or self.deadline_s <= 0:
            raise TargetError("RankTarget deadline_s must be a positive number of seconds, "
                              f"got {self.deadline_s!r}")

    def replace(self, **changes: Any) -> RankTarget:
        """The same declaration with ``changes`` (validated again)."""
        return replace(self, **changes)


# --- layouts: which global positions each rank holds


def positions(n: int, world_size: int, layout: str) -> list[Array]:  # -> world_size × [n_r] int
    """The global token positions rank r holds, for each rank, in the order its shard holds them."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    every = np.arange(n)
    if layout == "contiguous":
        return np.array_split(every, world_size)
    if layout == "striped":
        return [every[r::world_size] for r in range(world_size)]
    if n % (2 * world_size):
        raise ValueError(f"a zigzag layout needs n a multiple of 2·world_size = {2 * world_size}, got n={n}")
    chunks = np.array_split(every, 2 * world_size)
    return [np.concatenate([chunks[r], chunks[2 * world_size - 1 - r]]) for r in range(world_size)]


def fits(n: int, world_size: int, layout: str) -> bool:
    """Whether ``layout`` can shard n tokens over ``world_size`` ranks (zigzag: n a multiple of 2W)."""
    return layout != "zigzag" or n % (2 * world_size) == 0


def shard(x: Array, where: list[Array]) -> list[Array]:  # [..., n, d] -> W × [..., n_r, d]
    """Each rank's shard of ``x`` along the token axis (−2)."""
    return [np.ascontiguousarray(np.take(x, p, axis=-2)) for p in where]


def gather(shards: list[Array], where: list[Array], n: int, *, axis: int = -2) -> Array:
    """The whole sequence from the ranks' shards (each at its positions along ``axis``)."""
    first = shards[0]
    shape = list(first.shape)
    shape[axis] = n
    whole = np.zeros(shape, dtype=np.result_type(*shards))
    for x, p in zip(shards, where, strict=True):
        index: list[Any] = [slice(None)] * whole.ndim
        index[axis] = p
        whole[tuple(index)] = x
    return whole


# --- the ranks


class RankLost(BaseException):
    """A rank hung past the deadline or died. A ``BaseException`` so that Hypothesis stops at once
    instead of shrinking (each try would start the ranks again and wait out another deadline)."""


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent dies (``PR_SET_PDEATHSIG``), so a rank
    never outlives a suite that was killed before it could reap it."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _as_numpy(x: Any) -> Any:
    """What a rank returned, as NumPy (a tuple element by element; a tensor detached)."""
    if isinstance(x, (tuple, list)):
        return type(x)(_as_numpy(y) for y in x)
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return x


def _raised(e: BaseException) -> str:
    """What a rank raised, and where: the innermost frame of its traceback."""
    where = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ is not None else []
    at = "".join(f" (at {os.path.basename(f.filename)}:{f.lineno} in {f.name})" for f in where)
    return f"{type(e).__name__}: {str(e)[:400]}{at}"


def _serve(conn: Connection, target: RankTarget, rank: int, world_size: int, store: Any,
           deadline_s: float) -> None:
    """A rank's loop: joins the gloo group through ``store``, runs each call until ``None``, then
    leaves the group (a closed pipe, a pool abandoned, ends it with `EOFError` instead)."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=deadline_s))
    group = dist.group.WORLD
    conn.send(("ready", None))  # the call's deadline starts once every rank has joined
    while (message := conn.recv()) is not None:
        which, arrays, keywords = message
        fn = target.fn if which == "forward" else target.grad_fn
        assert fn is not None  # a backward call is made only when grad_fn is declared
        try:
            reply: tuple[Any, ...] = ("ok", _as_numpy(fn(*arrays, group=group, rank=rank, **keywords)))
        except BaseException as e:  # every outcome goes back to the parent
            reply = ("error", _raised(e))
        try:
            conn.send(reply)
        except Exception as e:  # an unpicklable result
            conn.send(("error", f"returned {type(reply[1]).__name__}, which cannot be sent back: {e}"))
    dist.destroy_process_group()


def _reap(pid: int, *, kill: bool) -> int:
    """Wait for ``pid`` (SIGKILL when ``kill``, or when it has not left within 2 s); its exit code."""
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for _ in range(2000):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.001)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


_LIVE: set[RankPool] = set()
"""Every pool not yet closed, closed at exit (`_close_all`)."""


class Ranks:
    """``world_size`` ranks of one gloo group serving a target's calls, one pipe to each (the
    rank's end served by `_serve`), until `close`: `RankPool`'s processes or `ThreadRanks`'
    threads."""

    ended = ""
    """How a failure's message says the pool ended."""

    def __init__(self, target: RankTarget, world_size: int) -> None:
        self.target, self.world_size = target, world_size
        self.conns: list[Connection] = []  # the suite's end of each rank's pipe, in rank order
        self.closed = False
        self.joined = False

    def call(self, which: str, arrays: list[tuple[Array, ...]], keywords: dict[str, Any]) -> list[Any]:
        """Rank r called with ``arrays[r]`` and ``keywords`` (``which``: ``forward``, the target's
        fn, or ``backward``, its grad_fn); each rank's reply in rank order. A rank that raises is a
        `TargetFailed` naming it; one that hangs or dies, `RankLost`; either way the pool is closed.
        The first call first waits (up to the deadline again) for every rank to join the group."""
        if not self.joined:
            self._replies("join the gloo group")
            self.joined = True
        for conn, mine in zip(self.conns, arrays, strict=True):
            with contextlib.suppress(BrokenPipeError, OSError):  # a dead rank: found below
                conn.send((which, mine, keywords))
        return self._replies("return")

    def _replies(self, doing: str) -> list[Any]:
        """One message from every rank, within the deadline; see `call`."""
        replies: dict[int, Any] = {}
        end = time.monotonic() + self.target.deadline_s
        while len(replies) < self.world_size:
            waiting = {self.conns[r]: r for r in range(self.world_size) if r not in replies}
            ready = wait(list(waiting), timeout=max(0.0, end - time.monotonic()))
            if not ready:
                late = sorted(waiting.values())
                self.close(kill=True)
                raise RankLost(f"{_ranks(late)} did not {doing} within the {self.target.deadline_s:g} s "
                               f"deadline (world size {self.world_size}; {self.ended})")
            for one in ready:
                rank = waiting[one]  # type: ignore[index]
                try:
                    replies[rank] = self.conns[rank].recv()
                except (EOFError, OSError):
                    how = self._ended(rank)
                    self.close(kill=True)
                    raise RankLost(f"rank {rank} of {self.world_size} {how} during the call; "
                                   f"{self.ended}") from None
                if replies[rank][0] == "error":
                    self.close(kill=True)
                    raise TargetFailed(f"rank {rank} of {self.world_size} raised {replies[rank][1]}",
                                       raised=replies[rank][1])
        return [replies[r][1] for r in range(self.world_size)]

    def _ended(self, rank: int) -> str:
        """How rank ``rank``, whose pipe closed, ended."""
        raise NotImplementedError

    def close(self, *, kill: bool = False) -> None:
        """End every rank: ask each to leave, or, ``kill`` (after a failure), end them at once."""
        raise NotImplementedError


class RankPool(Ranks):
    """``world_size`` forked processes, each a rank of one gloo group (a FileStore in a folder of
    its own). Fork: the target is inherited (its functions need not pickle), and so is PyTorch,
    imported once here."""

    ended = "every rank's process was killed"

    def __init__(self, target: RankTarget, world_size: int) -> None:
        import torch.distributed  # noqa: F401  (imported once, before the fork, for every rank)

        from spec.isolation import _become_worker

        super().__init__(target, world_size)
        self.folder = tempfile.mkdtemp(prefix="spec-ranks-")
        store = os.path.join(self.folder, "store")
        self.pids: list[int] = []
        sys.stdout.flush()
        sys.stderr.flush()
        for rank in range(world_size):
            parent, child = Pipe()
            pid = os.fork()
            if pid == 0:  # the rank: never returns into the suite's code
                code = 0
                try:
                    parent.close()
                    for earlier in self.conns:
                        earlier.close()
                    _die_with_parent()
                    _become_worker()
                    import torch.distributed as dist

                    _serve(child, target, rank, world_size, dist.FileStore(store, world_size),
                           target.deadline_s)
                except BaseException:  # the pipe closed, the group failed, or the suite was interrupted
                    code = 70
                finally:
                    os._exit(code)
            child.close()
            self.pids.append(pid)
            self.conns.append(parent)
        _LIVE.add(self)

    def _ended(self, rank: int) -> str:
        """How rank ``rank``, whose pipe closed, ended: its exit status, once reaped."""
        code = _reap(self.pids[rank], kill=False)
        return f"died ({f'signal {signal.Signals(-code).name}' if code < 0 else f'exit status {code}'})"

    def close(self, *, kill: bool = False) -> None:
        """End every rank (asked to leave, or SIGKILL when ``kill``) and reap it; remove the store."""
        if self.closed:
            return
        self.closed = True
        _LIVE.discard(self)
        if not kill:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.send(None)
        for pid in self.pids:
            with contextlib.suppress(ChildProcessError):
                _reap(pid, kill=kill)
        for conn in self.conns:
            conn.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class ThreadRanks(Ranks):
    """``world_size`` threads of the suite's own process, each a rank of one gloo group (a
    HashStore in memory), serving the target's calls through the same pipes and messages as
    `RankPool`'s processes. Each rank thread has a ``torch.distributed`` world of its own (PyTorch's
    thread-local world, as its in-process test ranks have; every other thread keeps the process's
    world) and registers its group by name in a registry of its own (PyTorch's thread isolation,
    on while any such pool is open). A rank that raises is reported with the frame it raised in.
    A thread cannot be killed: a rank past the deadline is reported and abandoned, and one blocked
    in a collective leaves when gloo's timeout (the deadline) ends it."""

    ended = "every rank thread was abandoned"

    def __init__(self, target: RankTarget, world_size: int) -> None:
        import torch.distributed as dist

        _rank_worlds()
        _isolation(+1)
        super().__init__(target, world_size)
        self.failures: dict[int, str] = {}
        store = dist.HashStore()
        self.threads: list[threading.Thread] = []
        for rank in range(world_size):
            parent, child = Pipe()
            thread = threading.Thread(target=self._rank, args=(child, rank, store), daemon=True,
                                      name=f"spec-rank-{rank}-of-{world_size}")
            thread.start()
            self.threads.append(thread)
            self.conns.append(parent)

    def _rank(self, conn: Connection, rank: int, store: Any) -> None:
        _RANK_THREAD.rank = rank
        try:
            _serve(conn, self.target, rank, self.world_size, store, self.target.deadline_s)
        except BaseException as e:  # the group failed, or the pool was abandoned (its pipe closed)
            self.failures[rank] = _raised(e)
        finally:
            conn.close()

    def _ended(self, rank: int) -> str:
        self.threads[rank].join(timeout=1.0)
        return f"ended ({self.failures.get(rank, 'its thread left')})"

    def close(self, *, kill: bool = False) -> None:
        """Ask every rank to leave its group and wait for it; ``kill``: abandon the threads (their
        pipes closed: a rank still running ends when it next reads or writes one; one blocked in a
        collective, when gloo's timeout, the deadline, ends the collective: `_let_ranks_leave`)."""
        if self.closed:
            return
        self.closed = True
        if not kill:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.send(None)
            for thread in self.threads:
                thread.join(timeout=self.target.deadline_s)
        elif any(thread.is_alive() for thread in self.threads):
            _ABANDONED.append((time.monotonic() + self.target.deadline_s + 1.0, self.threads))
        for conn in self.conns:
            conn.close()
        _isolation(-1)


_ABANDONED: list[tuple[float, list[threading.Thread]]] = []
"""Abandoned rank threads, with the time by which gloo's timeout has ended any collective they
were in."""


@atexit.register
def _let_ranks_leave() -> None:
    """At exit, wait (at most until each abandoned pool's deadline has passed once more) for the
    rank threads still running: a thread inside a gloo collective while the interpreter exits
    aborts the process (``terminate called without an active exception``), so a check that
    reported a hung rank would exit 134 instead of 1. A rank hung in Python code is left as it is."""
    for by, threads in _ABANDONED:
        for thread in threads:
            thread.join(timeout=max(0.0, by - time.monotonic()))


_RANK_THREAD = threading.local()
"""``rank``: set in a `ThreadRanks` rank's thread."""
_ISOLATED = [0]
"""How many `ThreadRanks` pools are open (PyTorch's thread isolation is on while any is)."""
_ISOLATION_LOCK = threading.Lock()


def _rank_worlds() -> None:
    """Once: ``torch.distributed``'s world becomes one per `ThreadRanks` rank thread (PyTorch's
    `ThreadLocalWorld`, which its in-process test ranks run on), while every other thread keeps
    the world it had, so a process group the suite's caller made stays theirs."""
    import torch.distributed.distributed_c10d as c10d
    from torch.testing._internal.distributed.multi_threaded_pg import ThreadLocalWorld

    if isinstance(c10d._world, ThreadLocalWorld):
        return
    outside = c10d._world

    class RankWorlds(ThreadLocalWorld):
        def _get_world(self) -> Any:
            return super()._get_world() if hasattr(_RANK_THREAD, "rank") else outside

    c10d._world = RankWorlds()  # type: ignore[assignment, unused-ignore]


def _isolation(change: int) -> None:
    """Count a `ThreadRanks` pool opened (+1) or closed (−1); PyTorch's thread isolation (each
    thread's process groups registered by name apart) is on while the count is above 0."""
    import torch

    with _ISOLATION_LOCK:
        _ISOLATED[0] += change
        torch._C._distributed_c10d._set_thread_isolation_mode(_ISOLATED[0] > 0)  # type: ignore[attr-defined, unused-ignore]


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


@atexit.register
def _close_all() -> None:
    for pool in list(_LIVE):
        if pool.pids and os.getpid() not in pool.pids:  # in the suite's process, not a forked rank
            pool.close(kill=True)


_POOLS: contextvars.ContextVar[dict[tuple[int, bool], Ranks] | None] = contextvars.ContextVar(
    "spec_rank_pools", default=None)


@contextlib.contextmanager
def kept_ranks() -> Iterator[dict[tuple[int, bool], Ranks]]:
    """Pools started in this block are kept for it (one per world size and host, keyed
    ``(world_size, in_process)``) and closed when it ends, however it ends."""
    pools: dict[tuple[int, bool], Ranks] = {}
    token = _POOLS.set(pools)
    finished = False
    try:
        yield pools
        finished = True
    finally:
        _POOLS.reset(token)
        for pool in pools.values():  # rank threads leave their groups; processes are killed
            pool.close(kill=not (finished and isinstance(pool, ThreadRanks)))


def run_ranks(target: RankTarget, world_size: int, which: str, arrays: list[tuple[Array, ...]],
              keywords: dict[str, Any], *, in_process: bool = False) -> list[Any]:
    """One call on every rank (`Ranks.call`), on processes or, ``in_process``, on threads
    (`ThreadRanks`), in the pool kept by `kept_ranks` (started, or started again after a failure,
    as needed), or in a pool of its own outside one. Processes are forked only while no rank
    thread runs (open thread pools are closed first)."""
    pools = _POOLS.get()
    if pools is None:
        with kept_ranks():
            return run_ranks(target, world_size, which, arrays, keywords, in_process=in_process)
    pool = pools.get((world_size, in_process))
    if pool is None or pool.closed or pool.target is not target:
        if pool is not None:
            pool.close(kill=True)
        if not in_process:
            for other in pools.values():
                if isinstance(other, ThreadRanks):
                    other.close()
        pool = pools[(world_size, in_process)] = (ThreadRanks if in_process else RankPool)(target, world_size)
    return pool.call(which, arrays, keywords)
