"""The scale profile's plan: its cases at the sizes where kernels overflow, the memory budget they
are run within, their inputs, the outputs its laws share, and the report's header line for it.

The laws of `spec.laws.scale` run only at ``--profile scale`` (`spec.profiles.Profile.family`),
each on its explicit cases (`plan`; no drawn ones). Each case is run only if its footprint
(`footprint`: the inputs, held by the suite and copied for the call, the output, the target's
workspace as `spec.target.Target.holds_scores` declares it, and the golden's working set) fits
the memory budget (``--memory GIB``, ``--attention-memory GIB``; default `default_budget`); the
others are named in the report's header (`header`) and in each law's note. The shapes follow the
target's limits (``seq_multiple`` rounds each length up, ``max_seq`` leaves a case out, naming
it; ``head_dims`` gives the width) and its device (the target's own ``fn`` places the arrays).

A check at this profile is set up by `checking` (`spec.profiles.Profile.setup`), which
`spec.profiles.checking` enters for `spec.check`, the CLI and the pytest door alike: within it
the target's outputs are kept from one law to the next (`output`), and let go when it ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from spec import context, dtypes, sampled
from spec.call import call
from spec.cases import Case
from spec.inputs import Inputs
from spec.keywords.varlen import offsets
from spec.target import Target

Array = np.ndarray


# --- the sizes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """The shapes of the scale profile, each from a public report (the module docstring).
    Tests of the suite itself give smaller ones (`sized`)."""

    decode_keys: int = 350_000
    """One query over this many keys (Dao-AILab/flash-attention#47: results that change with 350,000)."""
    square: int = 65_537
    """A causal square of this many queries and keys: 2^16 + 1, one row past a 16-bit index, and
    batch·heads·n² = 4.3·10⁹ > 2^32 scores (tile-ai/tilelang#330, the custom-mask kernel)."""
    slices: tuple[int, int] = (8_300, 16)
    """(batch, heads) with n = 1: 132,800 slices, past a grid dimension of 65,535 (#2260)."""
    packed: tuple[int, int] = (512, 257)
    """(sequences, length) packed into one call: 131,584 tokens > 2^17, the last sequence starting
    at 131,327, past 2^17 (FlashDeBERTa#11's 190,485 tokens)."""
    elements: tuple[int, int, int] = (8, 4_194_305, 64)
    """(heads, keys, width) of a call whose k and v each hold more than 2^31 elements (2^31 + 512)."""
    width: int = 32
    """d_k = d_v of every case but ``elements``, ``decode`` and ``needles`` (64)."""
    needles: tuple[int, ...] = (2**16, 2**17, 2**18)
    """The key indices of the needles case: each the first index past a power of two where an offset
    kept in 16, 17 or 18 bits wraps (key 2^b read as key 0)."""
    needle_keys: int = 2**18 + 2**12
    """The needles case's keys: past its last needle by a tile of 4,096."""


SIZES = Sizes()
_SIZES: contextvars.ContextVar[Sizes] = contextvars.ContextVar("scale sizes", default=SIZES)


@contextlib.contextmanager
def sized(sizes: Sizes) -> Iterator[Sizes]:
    """Within: the scale cases have these ``sizes`` (the suite's own tests: small ones)."""
    token = _SIZES.set(sizes)
    try:
        yield sizes
    finally:
        _SIZES.reset(token)


def default_budget() -> float:
    """Bytes a scale case may need when no ``--memory`` is given: half the memory this machine has
    available now (``MemAvailable`` of /proc/meminfo; elsewhere half the physical memory, from
    ``os.sysconf``). A GPU's budget is its own: give ``--memory``."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / 2
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def budget() -> float:
    """The memory budget of this run in bytes: ``--memory`` (`spec.context.memory_budget`), else
    `default_budget`."""
    given = context.memory_budget()
    return default_budget() if given is None else given


def gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


# --- the cases -------------------------------------------------------------------------------


def _length(target: Target, n: int) -> int:
    """``n`` rounded up to a multiple of the target's ``seq_multiple``."""
    m = target.seq_multiple or 1
    return -(-n // m) * m


def _width(target: Target, wanted: int) -> int:
    """``wanted``, or the declared head size nearest it."""
    if target.head_dims is None:
        return wanted
    return min(target.head_dims, key=lambda w: (abs(w - wanted), w))


def _dtype(target: Target, *prefer: str) -> str:
    return next((d for d in prefer if d in target.dtypes), target.dtypes[0])


DIFFUSE = 1 / 16
"""The decode case's amplitude (`spec.cases.Case.amplitude`): its scores are 1/16 of unit ones."""


@dataclass(frozen=True)
class Planned:
    """A scale case by name, or why it is not run for this target (``why``: None when it is)."""

    name: str
    case: Case | None
    why: str | None = None


def plan(target: Target) -> list[Planned]:
    """Every scale case for ``target`` at the run's sizes, or why not: a capability it lacks, a
    limit it declares, the memory budget."""
    s = _SIZES.get()
    rank = 4 if 4 in target.ndims else max(target.ndims)
    corner = target.causal_alignment in ("bottom_right", "kv_lengths", "square_or_decoding")
    found: list[Planned] = []

    def dense(name: str, batch: int, heads: int, n_q: int, n_k: int, width: int, causal: bool,
              dtype: str, seed: int, amplitude: float = 1.0) -> None:
        if rank < 3 and batch * heads > 1:
            why = f"needs inputs of rank 3 or 4 (target declares ndims={target.ndims})"
            found.append(Planned(name, None, why))
            return
        lead_b, lead_h = (batch, heads) if rank == 4 else (1, batch * heads)
        found.append(Planned(name, Case(dtype=dtype, ndim=rank, batch=lead_b, heads=lead_h, n_q=n_q, n_k=n_k,
                                        d_k=width, d_v=width, seed=seed, causal=causal, amplitude=amplitude)))

    # a diffuse row, as a long context's is: scores of spread 1/16, so that Σ exp(s − max) ≈ 3·10⁵,
    # past float16's largest finite 65,504 (a denominator kept in float16 overflows)
    dense("decode", 1, 1, 1, _length(target, s.decode_keys), _width(target, 64), corner,
          _dtype(target, "float16", "bfloat16", "float32"), 1, amplitude=DIFFUSE)
    if target.causal_alignment is None:
        why = "needs a causal mode (target declares causal_alignment=None)"
        found.append(Planned("causal_square", None, why))
    else:
        n = _length(target, s.square)
        dense("causal_square", 1, 1, n, n, _width(target, s.width), True,
              _dtype(target, "float32", "float16"), 2)
    b, h = s.slices
    dense("slices", b, h, _length(target, 1), _length(target, 1), _width(target, s.width), False,
          _dtype(target, "float32", "float16"), 3)
    count, each = s.packed
    if not target.supports_varlen or 3 not in target.ndims:
        why = "needs cu_seqlens_q=/cu_seqlens_k= on 3-D inputs (target declares supports_varlen=" \
              f"{target.supports_varlen}, ndims={target.ndims})"
        found += [Planned("packed", None, why), Planned("packed_decode", None, why)]
    else:
        n = _length(target, each)
        width = _width(target, s.width)
        dtype = _dtype(target, "float32", "float16")
        packing = (offsets([n] * count), offsets([n] * count))
        found.append(Planned("packed", Case(dtype=dtype, ndim=3, batch=1, heads=1, n_q=n * count,
                                            n_k=n * count, d_k=width, d_v=width, seed=4, causal=True,
                                            keywords={"varlen": packing})))
        one = _length(target, 1)
        decoding = (offsets([one] * count), offsets([n] * count))
        found.append(Planned("packed_decode", Case(dtype=dtype, ndim=3, batch=1, heads=2, n_q=one * count,
                                                   n_k=n * count, d_k=width, d_v=width, seed=5, causal=corner,
                                                   keywords={"varlen": decoding})))
    # one decode row per needle (heads of one query each; rows of one slice for a 2-D target)
    count = len([p for p in s.needles if p < s.needle_keys])
    n_k = _length(target, s.needle_keys)
    needle_dtype = _dtype(target, "float16", "bfloat16", "float32")
    if rank >= 3:
        dense("needles", 1, count, _length(target, 1), n_k, _width(target, 64), corner, needle_dtype, 7)
    elif target.decode_only:
        found.append(Planned("needles", None, "needs inputs of rank 3 or 4 for one query a sequence (target "
                             f"declares decode_only=True, ndims={target.ndims})"))
    else:
        dense("needles", 1, 1, _length(target, count), n_k, _width(target, 64), corner, needle_dtype, 7)
    heads, keys, width = s.elements
    dense("elements_2^31", 1, heads, _length(target, 16), _length(target, keys), _width(target, width), False,
          _dtype(target, "float16", "bfloat16", "float32"), 6)
    return [_within(target, p) for p in found]


def _within(target: Target, p: Planned) -> Planned:
    """``p``, or why not: over a declared limit, or over the budget."""
    if p.case is None:
        return p
    c = p.case
    if target.max_seq is not None and max(c.n_q, c.n_k) > target.max_seq:
        return Planned(p.name, None, f"{max(c.n_q, c.n_k)} keys or queries, past max_seq={target.max_seq}")
    if target.head_dims is not None and c.d_k not in target.head_dims:
        return Planned(p.name, None, f"head_dims={target.head_dims}")
    need, have = footprint(target, c), budget()
    if need > have:
        return Planned(p.name, None, f"needs about {gib(need)}, over the memory budget of {gib(have)} "
                       "(--memory)")
    return p


GOLDEN_SLACK = 256 * 2**20
"""Bytes for the golden's blocks of slices beyond one slice's keys (`spec.sampled.BLOCK_ENTRIES`)."""


def footprint(target: Target, case: Case) -> float:
    """The bytes a case needs, estimated: its inputs three times (the suite's, the copy the call
    receives, the perturbed keys of the hidden-keys law), its output twice (the target's and the
    suite's float64), the target's workspace (every score in float32, three times over — the
    scores, their exponentials, the weights — and a boolean mask, where it holds its scores
    (`spec.target.Target.holds_scores`); else a float32 accumulator and logsumexp a row), and the
    golden's working set: one slice's keys and values in float64 and its sampled rows' scores."""
    item = dtypes.as_dtype(case.dtype).itemsize
    lead = case.batch * case.heads if case.ndim == 4 else case.heads
    inputs = item * lead * (case.n_q * case.d_k + case.n_k * (case.d_k + case.d_v))
    out = lead * case.n_q * case.d_v * (item + 8)
    if target.holds_scores:
        work = lead * case.n_q * case.n_k * (3 * 4 + 1)
    else:
        work = lead * case.n_q * (case.d_v + 2) * 4
    rows = len(sampled.sample_rows(case.n_q))
    gold = case.n_k * (case.d_k + case.d_v) * 8 + rows * case.n_k * 8 * 6 + GOLDEN_SLACK
    return float(3 * inputs + out + work + gold)


def scale_cases(target: Target) -> list[Case]:
    """The scale cases run for ``target`` (`plan`, those that fit)."""
    return [p.case for p in plan(target) if p.case is not None]


def _not_run(target: Target) -> str:
    return "; ".join(f"{p.name}: {p.why}" for p in plan(target) if p.case is None)


def name_of(target: Target, case: Case) -> str:
    """The name of the scale case ``case`` is, for ``target`` (for messages)."""
    return next((p.name for p in plan(target) if p.case == case), "a scale case")


def rows_of(target: Target, case: Case, inputs: Inputs) -> Array:
    """The rows checked: `spec.sampled.sample_rows` at the target's limits, with the first and the
    last row of the first, second and last packed sequences and of the one holding row 2^17."""
    extra: list[int] = []
    cu = inputs.get("cu_seqlens_q")
    if cu is not None:
        cu = np.asarray(cu)
        picks = {0, 1, len(cu) - 2, int(np.searchsorted(cu, 2**17, side="right") - 1)}
        for s in picks:
            if 0 <= s < len(cu) - 1 and cu[s + 1] > cu[s]:
                extra += [int(cu[s]), int(cu[s + 1] - 1)]
    limits = [x for x in (target.seq_multiple, target.max_seq) if x]
    return sampled.sample_rows(inputs.n_q, limits=limits, extra=extra, seed=case.seed)


# --- the inputs and the outputs --------------------------------------------------------------


DRAW_BLOCK = 2**24
"""Values drawn at a time: a case's arrays are drawn in float32, a block at a time, so that 2^31
values never pass through float64."""


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> Array:
    out = np.empty(shape, dtype=dtype)
    flat = out.reshape(-1)
    for start in range(0, flat.size, DRAW_BLOCK):
        stop = min(start + DRAW_BLOCK, flat.size)
        flat[start:stop] = rng.standard_normal(stop - start, dtype=np.float32).astype(dtype)
    return out


NEEDLE_SCORE = 32.0
"""A needle's score q·k·scale. Its row's other scores are about 2·N(0, 1) at d_k = 64 (their
Σ exp over 2^18 keys ≈ 2^18·e² ≈ 2·10⁶), so e^32 ≈ 8·10¹³ outweighs them by 10⁷: the row reads
the needle alone, to float32's precision."""


@dataclass(frozen=True)
class Needle:
    """A key planted to dominate one query row, with a value no other key has (`planted`): a kernel
    that reads another key in its place, or drops it, is wrong at that row by about the value."""

    at: tuple[int, ...]
    """The slice: an index into q's lead axes (and K/V's: the scale cases have no groups)."""
    row: int
    key: int
    value: float
    """Every value column of the needle's key but the last (the weight-sum column stays 1)."""
    axis: int
    """The one column of q's row and of the key that is not zero: needles of one slice are
    orthogonal, so each row's score with another row's needle is 0."""

    def text(self) -> str:
        power = f" (2^{self.key.bit_length() - 1})" if self.key and self.key & (self.key - 1) == 0 else ""
        at = f"slice {list(self.at)}, " if self.at else ""
        return f"{at}row {self.row} → key {self.key:,}{power}"


def needles_of(target: Target, case: Case) -> tuple[Needle, ...]:
    """The needles planted in ``case`` (none in a case not named below): in ``needles``, key 2^b
    for each power of `Sizes.needles`, each read by the last row of its own slice (a 2-D target:
    row m of the one slice); in ``packed`` and ``packed_decode``, the last token at a power of two
    (2^17 at the scale sizes), read by the last query of the sequence holding it; in
    ``elements_2^31``, the last key and the first whose offset in a ``bhnd`` k passes 2^31, read
    by rows 0 and 1 of the last slice."""
    name = name_of(target, case)
    lead = case.lead()
    slices = int(np.prod(lead, dtype=np.int64))
    last = tuple(int(i) for i in np.unravel_index(slices - 1, lead)) if lead else ()
    found: list[tuple[tuple[int, ...], int, int]] = []
    if name == "needles":
        keys = [p for p in _SIZES.get().needles if p < case.n_k]
        if slices >= len(keys):
            found = [(tuple(int(i) for i in np.unravel_index(m, lead)), case.n_q - 1, p)
                     for m, p in enumerate(keys)]
        else:
            found = [((), m, p) for m, p in enumerate(keys[:case.n_q])]
    elif name in ("packed", "packed_decode"):
        cu_q, cu_k = (np.asarray(x) for x in case.keywords["varlen"])
        if cu_k[-1] > 1:
            key = 1 << (int(cu_k[-1]) - 1).bit_length() - 1
            s = int(np.searchsorted(cu_k, key, side="right") - 1)
            if cu_q[s + 1] > cu_q[s]:
                found = [(last, int(cu_q[s + 1]) - 1, key)]
    elif name == "elements_2^31":
        found = [(last, 0, case.n_k - 1)]
        first = -(-2**31 // case.d_k) - (slices - 1) * case.n_k
        if 0 <= first < case.n_k - 1 and case.n_q > 1:
            found.append((last, 1, first))
    return tuple(Needle(at, row, key, value=4.0 + m, axis=m % case.d_k)
                 for m, (at, row, key) in enumerate(found))


def _plant(q: Array, k: Array, v: Array, needles: tuple[Needle, ...], scale: float) -> None:
    """Each needle's row of q and its key: a·e_axis, a² · scale = `NEEDLE_SCORE`; its value."""
    a = np.sqrt(NEEDLE_SCORE / scale)
    for n in needles:
        q[(*n.at, n.row)] = 0
        q[(*n.at, n.row, n.axis)] = a
        k[(*n.at, n.key)] = 0
        k[(*n.at, n.key, n.axis)] = a
        v[(*n.at, n.key)] = n.value


def inputs_of(case: Case, needles: tuple[Needle, ...] = ()) -> Inputs:
    """A scale case's arguments: q, k, v standard normal, drawn in float32 a block at a time from
    the case's seed and rounded to its dtype (`Case.arrays` draws in float64: at 2^31 values that
    is 16 GiB), q and k times √amplitude; the ``needles`` planted (`Needle`); the last value
    column 1 for every key, so that the output's last column is each row's weight sum, 1 (a wrong
    denominator shows there, whatever the values average to); with the case's keywords (packed
    sequences' offsets)."""
    rng = case.rng()
    dtype = case.np_dtype
    lead, kv_lead = case.lead(), case.kv_lead
    q = _values(rng, (*lead, case.n_q, case.d_k), dtype)
    k = _values(rng, (*kv_lead, case.n_k, case.d_k), dtype)
    v = _values(rng, (*kv_lead, case.n_k, case.d_v), dtype)
    if case.amplitude != 1.0:
        root = np.float32(np.sqrt(case.amplitude))
        for x in (q, k):
            for start in range(0, x.shape[-2], DRAW_BLOCK // max(1, x.shape[-1])):
                block = x[..., start:start + DRAW_BLOCK // max(1, x.shape[-1]), :]
                block[...] = (block.astype(np.float32) * root).astype(dtype)
    _plant(q, k, v, needles, 1 / np.sqrt(case.d_k))
    v[..., -1] = 1
    for x in (q, k, v):
        x.flags.writeable = False
    return Inputs(q, k, v, causal=case.causal, keywords=case.received())


KEPT_BYTES = 2**29
"""The most bytes of inputs and outputs kept from one law to the next (`output`)."""


class Outputs:
    """The outputs kept within one check (`checking`): by case, each with the ``fn`` that gave it
    (held, and compared by identity: a new function is never taken for one that was let go), its
    inputs and its output, up to `KEPT_BYTES` in all, the oldest let go first."""

    def __init__(self) -> None:
        self.kept: dict[Case, tuple[Callable[..., object], Inputs, Array]] = {}

    def get(self, target: Target, case: Case) -> tuple[Inputs, Array] | None:
        """The inputs and output kept for ``case`` from this very ``target.fn``, if any."""
        found = self.kept.get(case)
        if found is None or found[0] is not target.fn:
            return None
        return found[1], found[2]

    def keep(self, target: Target, case: Case, inputs: Inputs, out: Array) -> None:
        size = _bytes(inputs, out)
        if size > KEPT_BYTES:
            return
        self.kept.pop(case, None)
        while self.kept and size + sum(_bytes(i, o) for _, i, o in self.kept.values()) > KEPT_BYTES:
            del self.kept[next(iter(self.kept))]
        self.kept[case] = (target.fn, inputs, out)


def _bytes(inputs: Inputs, out: Array) -> int:
    return sum(x.nbytes for x in (inputs.q, inputs.k, inputs.v, out))


_OUTPUTS: contextvars.ContextVar[Outputs | None] = contextvars.ContextVar("scale outputs", default=None)


def output(target: Target, case: Case) -> tuple[Inputs, Array]:
    """The case's inputs and the target's output for them. A deterministic target's are kept for
    the next laws of the profile within the same check (`checking`: the same bits, so each case
    is called once for the forward laws); outside one, nothing is kept."""
    kept = _OUTPUTS.get()
    found = None if kept is None or not target.deterministic else kept.get(target, case)
    if found is not None:
        return found
    inputs = inputs_of(case)
    out = call(patient(target), inputs)
    if kept is not None:
        kept.keep(target, case, inputs, out)
    return inputs, out


def patient(target: Target) -> Target:
    """``target`` with its calls allowed the profile's deadline where it declares a shorter one (a
    deadline for the small sizes is no deadline for these)."""
    run = context.current()
    wanted = None if run is None else run.deadline
    if wanted is None or target.deadline_s is None or target.deadline_s >= wanted:
        return target
    return target.replace(deadline_s=wanted)


# --- the check -------------------------------------------------------------------------------


def header(target: Target) -> str:
    """What the report's header says of a scale run: the budget and the cases not run."""
    skipped = _not_run(target)
    return f"memory budget {gib(budget())}" + (f"; not run: {skipped}" if skipped else "")


@contextlib.contextmanager
def checking(target: Target) -> Iterator[str]:
    """Within: a check of ``target`` at this profile, its outputs kept from one law to the next
    (`output`) and let go at the end; gives its header line (`header`). The memory budget is
    already the check's (`spec.profiles.checking` sets it first)."""
    token = _OUTPUTS.set(Outputs())
    try:
        yield header(target)
    finally:
        _OUTPUTS.reset(token)


__all__ = ["NEEDLE_SCORE", "SIZES", "Needle", "Outputs", "Planned", "Sizes", "budget", "checking",
           "default_budget", "footprint", "header", "inputs_of", "name_of", "needles_of", "output", "patient",
           "plan", "rows_of", "scale_cases", "sized"]
