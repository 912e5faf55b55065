"""The laws at scale: the sizes where kernels overflow, judged at sampled rows (``--profile scale``).

A whole class of public attention bugs appears only past sizes the other profiles never draw:
32-bit offsets that wrap (an illegal memory access in FlashAttention's backward at batch 10–15k,
Dao-AILab/flash-attention#1500; batch 8,300 × seqlen 1 × 16 heads, #2260; wrong results past 65K
keys, tile-ai/tilelang#330; packed batches of 190,485 tokens, Knowledgator/FlashDeBERTa#11; a
custom-mask kernel failing once batch·heads·n² > 2^31), launch grids past a dimension's limit
(65,535 blocks), and results that change with 350,000 keys (Dao-AILab/flash-attention#47). These
laws run a few calls each at the shapes of those reports (`scale_cases`), and judge them with the
golden at sampled rows (`spec.sampled`: first, last, tile and power-of-two edges, random), whose
cost is linear in the rows checked.

The laws of this module run only at ``--profile scale`` (`spec.profiles.Profile.family`), and that
profile runs only them, each on its explicit cases (no drawn ones). Each case is run only if its
footprint (`footprint`: the inputs, held by the suite and copied for the call, the output, the
target's workspace as `spec.target.Target.holds_scores` declares it, and the golden's working
set) fits the memory budget (``--memory GIB``; default `default_budget`); the others are said in
the law's note, naming the budget. The shapes follow the target's limits (``seq_multiple`` rounds
each length up, ``max_seq`` leaves a case out, naming it; ``head_dims`` gives the width) and its
device (the target's own ``fn`` places the arrays).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from spec import context, dtypes, oracle, sampled, tolerance
from spec.call import call, call_grad
from spec.cases import Case
from spec.inputs import Inputs
from spec.laws import _needs
from spec.laws._helpers import assert_within_tolerance, perturbed, precision_text, same_bits
from spec.laws.gradients import GRAD_FACTOR
from spec.registry import Need, law
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
    """d_k = d_v of every case but ``elements`` and ``decode`` (64)."""


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


def _offsets(lengths: list[int]) -> tuple[int, ...]:
    return tuple(int(x) for x in np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]))


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
        packing = (_offsets([n] * count), _offsets([n] * count))
        found.append(Planned("packed", Case(dtype=dtype, ndim=3, batch=1, heads=1, n_q=n * count,
                                            n_k=n * count, d_k=width, d_v=width, seed=4, causal=True,
                                            keywords={"varlen": packing})))
        one = _length(target, 1)
        decoding = (_offsets([one] * count), _offsets([n] * count))
        found.append(Planned("packed_decode", Case(dtype=dtype, ndim=3, batch=1, heads=2, n_q=one * count,
                                                   n_k=n * count, d_k=width, d_v=width, seed=5, causal=corner,
                                                   keywords={"varlen": decoding})))
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


def _note_skipped(target: Target, keep: set[str] | None = None) -> None:
    """The law's note names the scale cases not run for this target (the report's header says why)."""
    run = context.current()
    names = [p.name for p in plan(target) if p.case is None and (keep is None or p.name in keep)]
    if run is not None and names:
        run.note(f"not run: {', '.join(names)} (the header says why)")


def name_of(target: Target, case: Case) -> str:
    """The name of the scale case ``case`` is, for ``target`` (for messages)."""
    return next((p.name for p in plan(target) if p.case == case), "a scale case")


def _needs_cases(keep: tuple[str, ...] | None = None) -> Need:
    def missing(t: Target) -> str | None:
        runs = [p for p in plan(t) if p.case is not None and (keep is None or p.name in keep)]
        if runs:
            return None
        said = "; ".join(f"{p.name}: {p.why}" for p in plan(t) if keep is None or p.name in keep)
        return f"no scale case can run ({said})"

    return Need(missing, "a scale case within the target's capabilities, limits and --memory")


def _grid(keep: tuple[str, ...] | None = None) -> Callable[[Target], list[Case]]:
    def grid(t: Target) -> list[Case]:
        return [p.case for p in plan(t) if p.case is not None and (keep is None or p.name in keep)]

    return grid


def _strategy(keep: tuple[str, ...] | None = None) -> Callable[[Target], st.SearchStrategy[Case]]:
    """The cases as a strategy: the profile runs only its explicit examples (the grid), so this is
    drawn only by a run that asks for generated ones (``--max-examples`` at another profile)."""
    def strategy(t: Target) -> st.SearchStrategy[Case]:
        found = _grid(keep)(t)
        return st.sampled_from(found) if found else st.nothing()

    return strategy


# --- the inputs ------------------------------------------------------------------------------


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


def inputs_of(case: Case) -> Inputs:
    """A scale case's arguments: q, k, v standard normal, drawn in float32 a block at a time from
    the case's seed and rounded to its dtype (`Case.arrays` draws in float64: at 2^31 values that
    is 16 GiB), q and k times √amplitude; the last value column 1 for every key, so that the
    output's last column is each row's weight sum, 1 (a wrong denominator shows there, whatever
    the values average to); with the case's keywords (packed sequences' offsets)."""
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
    v[..., -1] = 1
    for x in (q, k, v):
        x.flags.writeable = False
    return Inputs(q, k, v, causal=case.causal, keywords=case.received())


KEPT_BYTES = 2**29
"""The most bytes of inputs and outputs kept from one law to the next (`output`)."""
_KEPT: dict[tuple[int, Case], tuple[object, Inputs, Array]] = {}


def output(target: Target, case: Case) -> tuple[Inputs, Array]:
    """The case's inputs and the target's output for them. A deterministic target's are kept for
    the next laws of this module in the same check (the same bits: each case is called once for
    the forward laws), up to `KEPT_BYTES` in all, the oldest let go first (`forget`)."""
    key = (id(target.fn), case)
    kept = _KEPT.get(key)
    if kept is not None and kept[0] is target.fn and target.deterministic:
        return kept[1], kept[2]
    inputs = inputs_of(case)
    out = call(_long(target), inputs)
    size = sum(x.nbytes for x in (inputs.q, inputs.k, inputs.v, out))
    if size <= KEPT_BYTES:
        while _KEPT and size + sum(sum(x.nbytes for x in (i.q, i.k, i.v, o)) for _, i, o in _KEPT.values()) \
                > KEPT_BYTES:
            del _KEPT[next(iter(_KEPT))]
        _KEPT[key] = (target.fn, inputs, out)  # the fn held: its id is not reused while kept
    return inputs, out


def forget() -> None:
    """Let go of the outputs kept (`output`): a check at this profile ends."""
    _KEPT.clear()


def _long(target: Target) -> Target:
    """``target`` with its calls allowed the profile's deadline where it declares a shorter one (a
    deadline for the small sizes is no deadline for these)."""
    run = context.current()
    wanted = None if run is None else run.deadline
    if wanted is None or target.deadline_s is None or target.deadline_s >= wanted:
        return target
    return target.replace(deadline_s=wanted)


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


def accumulator(target: Target, inputs: Inputs) -> str:
    """The dtype a correct kernel sums a row in: float32 for float16 and bfloat16 inputs, the dtype
    it computes in otherwise. The scale laws' baseline is the textbook computation in it: a
    textbook softmax in float16 sums a diffuse row of 350,000 keys to inf (its denominator is past
    65,504), so a float16 baseline would excuse the very overflow these laws look for."""
    precision = target.precision(np.dtype(inputs.q.dtype).name)
    return "float32" if dtypes.as_dtype(precision).itemsize < 4 else precision


def long_row_floor(target: Target, inputs: Inputs, rows: Array) -> float:
    """The floor of `spec.tolerance.floor` with the weighted sum of the n_k values counted in the
    accumulator a correct kernel keeps: float32 for float16 and bfloat16 inputs, the dtype itself
    otherwise. The suite's floor counts √n_k·eps of the dtype for it (a sum in the dtype), which
    past a few thousand keys exceeds the output itself for the 16-bit dtypes (at 350,000 keys in
    float16, √n_k·eps ≈ 0.58 times max|V|) and would excuse exactly the float16 running sum these
    laws exist to catch; every kernel the suite names (FlashAttention, PyTorch's CPU kernels, XLA,
    `impl`) accumulates a 16-bit row in float32, whose √n_k·eps is 7·10⁻⁵ at 350,000 keys. The
    scores' rounding, (d_k + 2)·S·eps of the dtype, stays as it is."""
    precision = target.precision(np.dtype(inputs.q.dtype).name)
    eps, acc = dtypes.eps(precision), dtypes.eps(accumulator(target, inputs))
    q = np.abs(inputs.q[..., rows, :].astype(np.float64))
    k = np.abs(inputs.k.astype(np.float64))
    heads = q.shape[-3] if q.ndim >= 3 else 1
    if k.ndim >= 3 and k.shape[-3] != heads:
        k = np.repeat(k, heads // k.shape[-3], axis=-3)
    s_abs = inputs.scale_value * _max_products(q, k)
    vmax = float(np.max(np.abs(inputs.v.astype(np.float32)), initial=0.0))
    return eps * vmax * (4 + (inputs.d_k + 2) * s_abs) + acc * vmax * math.sqrt(inputs.n_k)


def _max_products(q: Array, k: Array) -> float:
    """max_ij Σ_l |q_il|·|k_jl| over every slice, a block of keys at a time."""
    top = 0.0
    for start in range(0, k.shape[-2], 2**16):
        top = max(top, float(np.max(q @ np.swapaxes(k[..., start:start + 2**16, :], -1, -2), initial=0.0)))
    return top


# --- the laws --------------------------------------------------------------------------------


@law(strategy=_strategy(), grid=_grid(), needs=_needs_cases())
def scale_matches_golden(target: Target, case: Case) -> None:
    """At the shapes of public overflow reports (a decode over 350,000 keys, a causal square of
    65,537, 132,800 slices of one query, 131,584 packed tokens with sequences past 2^17, k and v of
    more than 2^31 elements), the output at the sampled rows (first, last, tile and power-of-two
    edges, random; each packed sequence's ends) equals the float64 golden of those rows within the
    tolerance policy, its baseline and its floor's sum of n_k values in the float32 accumulator a
    correct kernel keeps for 16-bit inputs (`accumulator`, `long_row_floor`).

    Catches: an int32 offset that wraps (b·h·n·d mod 2^31: rows past the wrap read another slice's
    keys); a packed row index kept in 17 bits (sequences past 2^17 tokens read the first
    sequence's keys); a launch grid capped at 65,535 (slices past it left as zeros); a float16
    running sum over a long row (the denominator stops growing at 2^11: the output grows instead).
    """
    _note_skipped(target)
    inputs, out = output(target, case)
    rows = rows_of(target, case, inputs)
    want = sampled.expected_rows(target, inputs, rows, baseline_in=accumulator(target, inputs))
    cmp = tolerance.compare(out[..., rows, :], want.out, want.baseline, rows=want.seen,
                            tolerance=target.tolerance, floor_=long_row_floor(target, inputs, rows),
                            dtype=inputs.q.dtype)
    assert_within_tolerance(cmp, dtype=precision_text(target, inputs),
                            what=f"at {name_of(target, case)} ({len(rows)} sampled rows: "
                                 f"{sampled.short(rows)}), the output")


@law(strategy=_strategy(), grid=_grid(), needs=_needs_cases())
def scale_finite_everywhere(target: Target, case: Case) -> None:
    """At every scale shape every output entry of every row is finite (each row sees a key), the
    output has the inputs' shape and dtype — the whole output, not only the sampled rows.

    Catches: a tile past an index wrap that is never written (uninitialised memory: NaN or garbage
    beyond the sampled rows); a float16 exponential sum that overflows to inf over 350,000 keys
    (inf/inf = NaN).
    """
    _note_skipped(target)
    inputs, out = output(target, case)
    assert out.dtype == inputs.q.dtype, f"output dtype is {out.dtype}, inputs are {inputs.q.dtype}"
    finite = np.isfinite(out)
    if not finite.all():
        at = [int(i) for i in np.argwhere(~finite)[0]]
        raise AssertionError(f"at {name_of(target, case)}, output {at} is {out[tuple(at)]!r} "
                             f"({int(np.count_nonzero(~finite))} entries not finite)")


HIDDEN = ("causal_square", "packed", "packed_decode")


def _changed(case: Case, inputs: Inputs) -> Array:  # -> bool [n_k]
    """The keys the hidden-keys law changes: the second half of a causal square (the first half's
    rows see none of them); the first packed sequence's (every later sequence's rows, those past
    2^17 among them, see none)."""
    cu_k = inputs.get("cu_seqlens_k")
    j = np.arange(inputs.n_k)
    if cu_k is not None:
        return j < int(np.asarray(cu_k)[1])
    return j >= inputs.n_k // 2


@law(strategy=_strategy(HIDDEN), grid=_grid(HIDDEN), needs=_needs_cases(HIDDEN) & _needs.exact_masking)
def scale_hidden_keys_unmoved(target: Target, case: Case) -> None:
    """At the scale shapes that hide keys (the causal square of 65,537, the packed batches), changing
    keys and values that the sampled rows do not see (the square's second half; the first packed
    sequence) leaves those rows bit-identical.

    Catches: a packed row index that wraps at 2^17 (sequences past it read the first sequence's
    keys, which then move them); a causal mask compared in 16 bits (j ≤ i mod 2^16: rows past
    2^16 see the future).
    """
    _note_skipped(target, set(HIDDEN))
    inputs, before = output(target, case)
    rows = rows_of(target, case, inputs)
    changed = _changed(case, inputs)
    vis = oracle.visibility(target.alignment, inputs, rows)  # [*lead, r, n_k]
    blind = ~(vis & changed).any(axis=-1)
    assert blind.any(), f"no sampled row of {name_of(target, case)} is blind to the changed keys"
    after = call(_long(target), perturbed(target, case, inputs, changed))
    bad = blind[..., None] & ~same_bits(before[..., rows, :], after[..., rows, :])
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        row = int(rows[at[-2]])
        keys = sampled.short(np.flatnonzero(changed))
        raise AssertionError(f"at {name_of(target, case)}, changing keys {keys} "
                             f"moved output row {row} (entry {[*at[:-2], row, at[-1]]}) from "
                             f"{float(before[..., rows, :][at])!r} to {float(after[..., rows, :][at])!r}, "
                             "though it sees none of them")


GRADIENTS = ("decode", "causal_square", "slices", "packed", "packed_decode")


@law(strategy=_strategy(GRADIENTS), grid=_grid(GRADIENTS), needs=_needs.gradients & _needs_cases(GRADIENTS))
def scale_gradients_match_golden(target: Target, case: Case) -> None:
    """At the scale shapes (but the one of 2^31 elements), the gradients of Σ out ∘ dO for an
    upstream dO that is zero outside the sampled rows equal the float64 golden backward
    (`spec.sampled.gradients_rows`: dq at those rows, zero elsewhere, and dk, dv their sums over
    them) within the gradient tolerance (`spec.laws.gradients.GRAD_FACTOR` and the backward's
    floors, `spec.tolerance.grad_floors`).

    Catches: a backward whose dk/dv offsets wrap at 2^31 (Dao-AILab/flash-attention#1500: batch
    10–15k); a backward grid capped at 65,535 slices (their dq, dk, dv left as zeros).
    """
    _note_skipped(target, set(GRADIENTS))
    inputs = inputs_of(case)
    rows = rows_of(target, case, inputs)
    d_out = sampled.upstream(inputs, rows, seed=case.seed)
    dq, dk, dv, _ = call_grad(_long(target), inputs, d_out)
    want = sampled.gradients_rows(target, inputs, rows, d_out, baseline_in=accumulator(target, inputs))
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        gold = want.golden[name]
        floor = float(np.max(want.floors[name], initial=0.0))
        cmp = tolerance.compare(got, gold, want.baseline[name], rows=np.ones(gold.shape[:-1], dtype=bool),
                                tolerance=GRAD_FACTOR * target.tolerance, floor_=floor, dtype=inputs.q.dtype)
        assert_within_tolerance(cmp, dtype=precision_text(target, inputs),
                                what=f"at {name_of(target, case)}, {name}",
                                against="the float64 golden backward")


def header(target: Target) -> str:
    """What the report's header says of a scale run: the budget and the cases not run (a check at
    this profile starts: nothing kept from another, `forget`)."""
    forget()
    skipped = _not_run(target)
    return f"memory budget {gib(budget())}" + (f"; not run: {skipped}" if skipped else "")


__all__ = ["SIZES", "Sizes", "budget", "default_budget", "footprint", "forget", "header", "inputs_of", "plan",
           "scale_cases", "sized"]
