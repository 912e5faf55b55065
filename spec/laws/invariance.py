"""Laws of the bit-exact invariances a target declares (``Target(invariant=(...))``): a sequence's
output owes nothing to the other sequences of its call.

Serving engines batch unrelated requests into one call, and a kernel that picks its tiling, its
split count or its reduction order from the whole call rounds each sequence differently as its
neighbours come and go: the same prompt then decodes to other tokens depending on who else was
served (vLLM's batch-invariant mode exists to forbid it). The laws here hold a target to what it
promises, bit for bit:

- ``batch``: a sequence's output in a call of several equals its output in a call of the same form
  (the same keywords: key lengths, a paged cache, packed sequences) holding it alone;
- ``position``: wherever it sits in the batch or the pack;
- ``neighbours``: whatever the other sequences' query and key lengths — each neighbour's length is
  moved by one, up and down, so the smallest change that breaks it is the one reported (any change
  of a length is a chain of such steps, and a chain that changes the bits has a step that does).

- ``splits``: whatever split count of those it takes (``num_splits=``, `spec.keywords.num_splits`)
  the call is made with.

The split counts have a law of their own besides, whatever a target promises: every count a target
takes matches the golden (`num_splits_matches_golden`: the count changes how the keys are
reduced, never what the output means).

A call's sequences (`sequences`) are the batch rows of a 4-D call (dense, with ``kv_lengths=``, or
over a paged cache) or the packed sequences of a 3-D one (``cu_seqlens_q=``/``cu_seqlens_k=``).
The fourth invariance, ``chunked_prefill``, is `spec.laws.cascade`'s (its law also holds a target
that does not declare it, to its tolerance).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec.cases import Case, between, cases, pick
from spec.inputs import Inputs
from spec.keywords.kv_lengths import KV_LENGTHS
from spec.keywords.num_splits import NUM_SPLITS, counts
from spec.keywords.paged import PAGED
from spec.keywords.varlen import VARLEN, offsets
from spec.laws import _needs
from spec.laws._helpers import assert_matches, assert_unchanged, first_true, run, same_bits
from spec.laws.pairs import companions, forward_keywords
from spec.registry import Need, law
from spec.target import Target

Array = np.ndarray

FORMS = ("dense", "kv_lengths", "paged", "varlen")
"""The forms of a call of several sequences: 4-D batch rows (plain, with ``kv_lengths=``, over a
paged cache) and packed sequences."""

LENGTH_FORMS = ("kv_lengths", "paged", "varlen")
"""The forms whose sequences have lengths of their own (the ``neighbours`` law's)."""

GROWN = 80
"""The random stream (`spec.cases.Case.rng`) of the rows a packed neighbour grows by."""


def declares(name: str) -> Need:
    """The target promises the invariance ``name`` (``Target.invariant``)."""

    def missing(t: Target) -> str | None:
        if name in t.invariant:
            return None
        return f"needs invariant=({name!r},) (target declares invariant={t.invariant})"

    return Need(missing, f"invariant {name!r} declared")


def takes(t: Target, form: str) -> bool:
    """Whether the target takes calls of ``form`` (`FORMS`)."""
    return {"dense": 4 in t.ndims, "kv_lengths": t.supports_kv_lengths and 4 in t.ndims,
            "paged": t.supports_paged_kv, "varlen": t.supports_varlen and 3 in t.ndims}[form]


def _takes_any(forms: tuple[str, ...], said: str) -> Need:
    def missing(t: Target) -> str | None:
        return None if any(takes(t, f) for f in forms) else f"needs {said}"

    return Need(missing, said)


# (said without the capabilities' names in brackets: the law needs one of them, not each)
several_sequences = _takes_any(FORMS, "4-D inputs or packed sequences (cu_seqlens_q=/cu_seqlens_k=)")
own_lengths = _takes_any(LENGTH_FORMS, "sequences of their own lengths: kv_lengths=, block_table= or "
                                       "cu_seqlens_q=/cu_seqlens_k=")


# --- a call's sequences ------------------------------------------------------------------------


def form_of(inputs: Inputs) -> str:
    """The form of a call (`FORMS`), read from the keywords it passes."""
    if inputs.get("cu_seqlens_q") is not None:
        return "varlen"
    if inputs.get("block_table") is not None:
        return "paged"
    return "kv_lengths" if inputs.get("kv_lengths") is not None else "dense"


def _packed(inputs: Inputs) -> tuple[list[int], list[int]]:
    return [int(x) for x in inputs.get("cu_seqlens_q")], [int(x) for x in inputs.get("cu_seqlens_k")]


def count(inputs: Inputs) -> int:
    """How many sequences the call holds."""
    return len(_packed(inputs)[0]) - 1 if form_of(inputs) == "varlen" else int(inputs.q.shape[0])


def sequences(inputs: Inputs) -> list[tuple[Array, Array, Array]]:
    """Each packed sequence's ``(q, k, v)``, ``[heads, n, d]`` each (3-D calls only)."""
    cu_q, cu_k = _packed(inputs)
    return [(inputs.q[:, cu_q[s]:cu_q[s + 1]], inputs.k[:, cu_k[s]:cu_k[s + 1]],
             inputs.v[:, cu_k[s]:cu_k[s + 1]]) for s in range(len(cu_q) - 1)]


def packed(inputs: Inputs, parts: list[tuple[Array, Array, Array]]) -> Inputs:
    """``inputs`` holding the packed sequences ``parts`` (each ``(q, k, v)``), in that order."""
    joined = [np.ascontiguousarray(np.concatenate([p[i] for p in parts], axis=-2)) for i in range(3)]
    return inputs.replace(q=joined[0], k=joined[1], v=joined[2],
                          cu_seqlens_q=np.asarray(offsets([p[0].shape[-2] for p in parts]), dtype=np.int64),
                          cu_seqlens_k=np.asarray(offsets([p[1].shape[-2] for p in parts]), dtype=np.int64))


def holding(inputs: Inputs, order: list[int]) -> Inputs:
    """The call of the same form holding the sequences ``order`` (indices into ``inputs``' own), in
    that order: one of them alone, or all of them moved. A paged cache keeps its pool: only the
    rows of the table and the lengths move."""
    if form_of(inputs) == "varlen":
        parts = sequences(inputs)
        return packed(inputs, [parts[s] for s in order])
    rows = np.asarray(order)
    changes: dict[str, Array] = {"q": inputs.q[rows]}
    if form_of(inputs) != "paged":
        changes |= {"k": inputs.k[rows], "v": inputs.v[rows]}
    if inputs.mask is not None and inputs.mask.ndim == 4 and inputs.mask.shape[0] > 1:
        changes["mask"] = inputs.mask[rows]
    for name in ("kv_lengths", "block_table"):
        if inputs.get(name) is not None:
            changes[name] = np.asarray(inputs.get(name))[rows]
    return inputs.replace(**{name: np.ascontiguousarray(x) for name, x in changes.items()})


def output_of(inputs: Inputs, out: Array, at: int) -> Array:  # -> [heads, n_q of the sequence, d_v]
    """The output rows of the sequence at position ``at`` of the call ``inputs``."""
    if form_of(inputs) == "varlen":
        cu_q, _ = _packed(inputs)
        return out[:, cu_q[at]:cu_q[at + 1]]
    return out[at]


def steps(case: Case, inputs: Inputs, neighbour: int) -> Iterator[tuple[str, Inputs]]:
    """Every call ``inputs`` becomes when one length of sequence ``neighbour`` moves by one, up or
    down (its key length; for packed sequences its query length too), each with its text
    ("key length 9 → 10"). A key length stays within the keys the call holds; a packed sequence
    grows by a row of new values, or loses its last."""
    form = form_of(inputs)
    if form in ("kv_lengths", "paged"):
        lengths = np.asarray(inputs.get("kv_lengths"))
        most = case.n_k
        for delta in (1, -1):
            new = int(lengths[neighbour]) + delta
            if 0 <= new <= most:
                moved = lengths.copy()
                moved[neighbour] = new
                yield f"key length {int(lengths[neighbour])} → {new}", inputs.replace(kv_lengths=moved)
        return
    parts = sequences(inputs)
    rng = case.rng(GROWN + neighbour)
    for axis, name in ((0, "query"), (1, "key")):
        for delta in (1, -1):
            q, k, v = parts[neighbour]
            now = (q, k)[axis].shape[-2]
            if now + delta < 0:
                continue
            if delta < 0:
                grown = (q[:, :-1], k, v) if axis == 0 else (q, k[:, :-1], v[:, :-1])
            else:
                def more(x: Array) -> Array:  # [h, n, d] -> [h, n + 1, d]: a row of new values
                    row = case.values_like(rng, (*x.shape[:-2], 1, x.shape[-1]))
                    return np.concatenate([x, row], axis=-2)
                grown = (more(q), k, v) if axis == 0 else (q, more(k), more(v))
            changed = [grown if s == neighbour else p for s, p in enumerate(parts)]
            yield f"{name} length {now} → {now + delta}", packed(inputs, changed)


# --- the comparison ----------------------------------------------------------------------------


def assert_same_bits(before: Array, after: Array, *, change: str, sequence: int) -> None:
    """Sequence ``sequence``'s output ``after`` a change equals ``before``, bit for bit (NaN equal to
    NaN, zeros of either sign equal); the failure names the change and the first entry it moved."""
    __tracebackhide__ = True
    if before.shape != after.shape:
        raise AssertionError(f"{change} changed the shape of sequence {sequence}'s output from "
                             f"{before.shape} to {after.shape}")
    at = first_true(~same_bits(before, after, what=f"sequence {sequence}'s output after {change}"))
    if at is not None:
        head, row, column = at if len(at) == 3 else (0, *at)
        raise AssertionError(f"{change} changed sequence {sequence}'s output at head {head}, row {row}, "
                             f"column {column}: {float(before[at])!r} → {float(after[at])!r}")


# --- the cases ---------------------------------------------------------------------------------


@st.composite
def batch_cases(draw: st.DrawFn, t: Target, *, forms: tuple[str, ...] = FORMS) -> Case:
    """A call of 2–4 sequences in one of ``forms`` the target takes: 4-D batch rows (with a random
    mask where it takes one), with key lengths of their own, over a paged cache, or packed."""
    form = pick(draw, tuple(f for f in forms if takes(t, f)))
    if form == "varlen":
        case = draw(cases(t, ndims=(3,), n_max=24, values=("normal",), keywords=(VARLEN,)))
        assume(len(case.param("varlen")[0]) >= 3)
        return case
    if form in ("kv_lengths", "paged"):
        keyword = KV_LENGTHS if form == "kv_lengths" else PAGED
        return draw(cases(t, ndims=(4,), n_max=24, values=("normal",), keywords=(keyword,)))
    masks = ("none", "random") if t.supports_mask else ("none",)
    case = draw(cases(t, ndims=(4,), n_max=24, values=("normal",), masks=masks, scale=True))
    return case if case.batch >= 2 else case.replace(batch=draw(between(2, 4)))


# --- the laws ----------------------------------------------------------------------------------


@law(strategy=batch_cases, needs=declares("batch") & several_sequences)
def batch_invariant(target: Target, case: Case) -> None:
    """For a target that declares ``invariant=("batch",)``: each sequence's output in a call of
    several is bit for bit its output in a call of the same form (the same keywords: key lengths, a
    paged cache, packing) holding it alone.

    Catches: a split-KV kernel that picks its split count from the batch size (more splits to fill
    the machine when the batch is small: vllm#51902, a decode row's bfloat16 output changed when the
    batch around it changed), so one request's answer depends on who else was served; a reduction
    over the whole batch's rows (a max or a sum of the batch) in place of each sequence's own.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    n = count(inputs)
    for s in range(n):
        alone = holding(inputs, [s])
        assert_same_bits(output_of(inputs, out, s), output_of(alone, run(target, alone), 0),
                         change=f"calling it alone (a {form_of(inputs)} call of 1 sequence, not {n})",
                         sequence=s)


@law(strategy=batch_cases, needs=declares("position") & several_sequences)
def position_invariant(target: Target, case: Case) -> None:
    """For a target that declares ``invariant=("position",)``: moving the sequences of a call around
    (every rotation of their order, in the batch or the pack) leaves each one's output bit for bit
    the same.

    Catches: work split unevenly over the batch (the last sequence given the idle workers and split
    further), so a sequence's rounding depends on where the scheduler placed it; a packed sequence's
    reduction aligned on the pack's tiles (its offset in the pack) instead of its own start.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    n = count(inputs)
    for shift in range(1, n):
        order = [(i + shift) % n for i in range(n)]  # position p holds sequence order[p]
        moved = holding(inputs, order)
        got = run(target, moved)
        for at, s in enumerate(order):
            assert_same_bits(output_of(inputs, out, s), output_of(moved, got, at),
                             change=f"moving it from position {s} to {at} of {n}", sequence=s)


@law(strategy=lambda t: batch_cases(t, forms=LENGTH_FORMS), needs=declares("neighbours") & own_lengths)
def neighbours_invariant(target: Target, case: Case) -> None:
    """For a target that declares ``invariant=("neighbours",)``: changing another sequence's query or
    key length by one, up or down (key lengths with ``kv_lengths=`` or a paged cache; both for
    packed sequences), leaves each other sequence's output bit for bit the same. A length that
    breaks it is reported as the smallest step that does ("neighbour 1's key length 9 → 10").

    Catches: vllm#51902 — with batch invariance on, one decode row's output changed when an unrelated
    prefill grew from 9 to 10 tokens (the tile scheduler switched); flash-attention#1570 — with a
    varlen KV cache, other sequences' outputs changed when one sequence's length changed; a split
    count or tile size chosen from the longest sequence of the call.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    n = count(inputs)
    for neighbour in range(n):
        for said, changed in steps(case, inputs, neighbour):
            got = run(target, changed)
            for s in (s for s in range(n) if s != neighbour):
                assert_same_bits(output_of(inputs, out, s), output_of(changed, got, s),
                                 change=f"neighbour {neighbour}'s {said}", sequence=s)


# --- split counts ------------------------------------------------------------------------------


@st.composite
def split_cases(draw: st.DrawFn, t: Target) -> Case:
    """A case with one of the split counts the target takes (`spec.keywords.num_splits.counts`), at a
    tile edge one time in `spec.cases.TILE_ODDS` (where a split's last tile is partial), and half the
    time one other keyword the target declares drawn with it (a window, a softcap, a paged cache ...):
    a split-KV kernel splits what the other keyword leaves it."""
    others = [kw for kw in forward_keywords(t) if kw.combines_with(NUM_SPLITS, t.ndims)]
    other = draw(st.sampled_from([None, None, *others])) if others else None
    masks = ("none", "random") if t.supports_mask else ("none",)
    if other is None:  # the tile edges' cases are drawn at ranks of their own: for the keyword alone
        return draw(cases(t, masks=masks, scale=True, tiles=True, keywords=(NUM_SPLITS,)))
    keywords = (NUM_SPLITS, other, *companions(t, (NUM_SPLITS, other)))
    return draw(cases(t, n_max=48, masks=masks, scale=True, keywords=keywords))


@law(strategy=split_cases, needs=_needs.keyword(NUM_SPLITS))
def num_splits_matches_golden(target: Target, case: Case) -> None:
    """With ``num_splits=n``, each of the counts the target declares, the output matches the float64
    golden (which the count does not change), alone or with another declared keyword.

    Catches: a split-KV combine that drops the last split when n_k is not a multiple of the split
    count (its keys never reach the output); splits that overlap at their edges (a key counted
    twice); a combine that weighs the splits by their row sums without their max shifts.
    """
    inputs = case.inputs()
    said = f"output with num_splits={inputs.get('num_splits')}"
    assert_matches(target, inputs, run(target, inputs), what=said)


@law(strategy=split_cases, needs=_needs.keyword(NUM_SPLITS) & declares("splits"))
def splits_invariant(target: Target, case: Case) -> None:
    """For a target that declares ``invariant=("splits",)``: the same call at each split count it
    takes (``num_splits_values``, else `spec.keywords.num_splits.COUNTS`) gives the same output, bit
    for bit; the failure names the two counts and the first entry that differs.

    Catches: a split-KV combine whose order of additions follows the split count (the splits'
    states merged in a tree or one by one as they finish), so that the batch-invariant mode that
    fixes the count still changes the bits when the count is configured otherwise; a kernel that
    promises one result for every count and silently picks its own (num_splits=0's heuristic).
    """
    inputs = case.inputs()
    taken = counts(target)
    first = run(target, inputs.replace(num_splits=taken[0]))
    for n in taken[1:]:
        assert_unchanged(target, inputs, first, run(target, inputs.replace(num_splits=n)), bitwise=True,
                         what=f"output with num_splits={n}", change=f"num_splits={taken[0]} → {n}")
