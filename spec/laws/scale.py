"""The laws at scale: the sizes where kernels overflow, judged at sampled rows (``--profile scale``).

A whole class of public attention bugs appears only past sizes the other profiles never draw:
32-bit offsets that wrap (an illegal memory access in FlashAttention's backward at batch 10–15k,
Dao-AILab/flash-attention#1500; batch 8,300 × seqlen 1 × 16 heads, #2260; wrong results past 65K
keys, tile-ai/tilelang#330; packed batches of 190,485 tokens, Knowledgator/FlashDeBERTa#11; a
custom-mask kernel failing once batch·heads·n² > 2^31), launch grids past a dimension's limit
(65,535 blocks), and results that change with 350,000 keys (Dao-AILab/flash-attention#47). These
laws run a few calls each at the shapes of those reports (`spec.scale_plan`: the cases, the
memory budget, their inputs and the outputs the laws share), and judge them with the golden at
sampled rows (`spec.sampled`: first, last, tile and power-of-two edges, random; `spec.oracle` at
those rows), whose cost is linear in the rows checked.

The laws of this module run only at ``--profile scale`` (`spec.profiles.Profile.family`), and that
profile runs only them, each on its explicit cases (no drawn ones); the cases a target cannot run
(a capability, a limit, the memory budget) are named in each law's note and the report's header.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from hypothesis import strategies as st

from spec import context, oracle, sampled, tolerance
from spec.call import call, call_grad
from spec.cases import Case
from spec.inputs import Inputs
from spec.laws import _needs
from spec.laws._helpers import (
    assert_within_tolerance,
    first_true,
    perturbed,
    precision_text,
    same_bits,
    short,
)
from spec.laws.gradients import GRAD_FACTOR
from spec.registry import Need, law
from spec.scale_plan import Needle, inputs_of, name_of, needles_of, output, patient, plan, rows_of
from spec.target import Target

Array = np.ndarray


# --- the cases the laws run ------------------------------------------------------------------


def _note_skipped(target: Target, keep: set[str] | None = None) -> None:
    """The law's note names the scale cases not run for this target (the report's header says why)."""
    run = context.current()
    names = [p.name for p in plan(target) if p.case is None and (keep is None or p.name in keep)]
    if run is not None and names:
        run.note(f"not run: {', '.join(names)} (the header says why)")


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


def accumulator(target: Target, inputs: Inputs) -> str:
    """The dtype a correct kernel sums a row of these inputs in (`spec.tolerance.accumulator` of
    the dtype the target computes in): the scale laws' baseline is the textbook computation in it."""
    return tolerance.accumulator(target.precision(np.dtype(inputs.q.dtype).name))


def long_row_floor(target: Target, inputs: Inputs, rows: Array) -> float:
    """`spec.tolerance.long_row_floor` of the query ``rows`` of ``inputs``, in the dtype the target
    computes in."""
    return tolerance.long_row_floor(inputs.q[..., rows, :], inputs.k, inputs.v, scale=inputs.scale_value,
                                    dtype=target.precision(np.dtype(inputs.q.dtype).name))


# --- the laws --------------------------------------------------------------------------------


PLAIN = ("decode", "causal_square", "slices", "packed", "packed_decode", "elements_2^31")
"""The cases run as drawn (the ``needles`` case is `scale_needles_found`'s alone: unplanted, it is
a decode like ``decode``)."""


@law(strategy=_strategy(PLAIN), grid=_grid(PLAIN), needs=_needs_cases(PLAIN), scope="generic")
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
    _note_skipped(target, set(PLAIN))
    inputs, out = output(target, case)
    rows = rows_of(target, case, inputs)
    want = sampled.expected_rows(target, inputs, rows, baseline_in=accumulator(target, inputs))
    cmp = tolerance.compare(out[..., rows, :], want.out, want.baseline, rows=want.seen,
                            tolerance=target.tolerance, floor_=long_row_floor(target, inputs, rows),
                            dtype=inputs.q.dtype)
    assert_within_tolerance(cmp, dtype=precision_text(target, inputs),
                            what=f"at {name_of(target, case)} ({len(rows)} sampled rows: "
                                 f"{short(rows)}), the output")


@law(strategy=_strategy(PLAIN), grid=_grid(PLAIN), needs=_needs_cases(PLAIN))
def scale_finite_everywhere(target: Target, case: Case) -> None:
    """At every scale shape every output entry of every row is finite (each row sees a key), the
    output has the inputs' shape and dtype — the whole output, not only the sampled rows.

    Catches: a tile past an index wrap that is never written (uninitialised memory: NaN or garbage
    beyond the sampled rows); a float16 exponential sum that overflows to inf over 350,000 keys
    (inf/inf = NaN).
    """
    _note_skipped(target, set(PLAIN))
    inputs, out = output(target, case)
    assert out.dtype == inputs.q.dtype, f"output dtype is {out.dtype}, inputs are {inputs.q.dtype}"
    finite = np.isfinite(out)
    if (at := first_true(~finite)) is not None:
        raise AssertionError(f"at {name_of(target, case)}, output {list(at)} is {out[at]!r} "
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
    after = call(patient(target), perturbed(target, case, inputs, changed))
    bad = blind[..., None] & ~same_bits(before[..., rows, :], after[..., rows, :], rows=blind)
    if (at := first_true(bad)) is not None:
        row = int(rows[at[-2]])
        keys = short(np.flatnonzero(changed))
        raise AssertionError(f"at {name_of(target, case)}, changing keys {keys} "
                             f"moved output row {row} (entry {[*at[:-2], row, at[-1]]}) from "
                             f"{float(before[..., rows, :][at])!r} to {float(after[..., rows, :][at])!r}, "
                             "though it sees none of them")


NEEDLED = ("needles", "packed", "packed_decode", "elements_2^31")


def _needled(t: Target) -> list[Case]:
    """The cases of `NEEDLED` that hold a needle."""
    return [c for c in _grid(NEEDLED)(t) if needles_of(t, c)]


def _needled_strategy(t: Target) -> st.SearchStrategy[Case]:
    found = _needled(t)
    return st.sampled_from(found) if found else st.nothing()


@law(strategy=_needled_strategy, grid=_needled, needs=_needs_cases(NEEDLED), scope="generic")
def scale_needles_found(target: Target, case: Case) -> None:
    """Past each power of two where an index or offset wraps — keys 2^16, 2^17 and 2^18 of a long
    decode, token 2^17 of a packed batch, the last keys of a k and v of more than 2^31 elements —
    a key planted to dominate one row (its score q·k·scale 32, the row's others about 2·N(0, 1)
    at d_k = 64: its weight 1 − 2·10⁻⁸; `spec.scale_plan.Needle`) with a value no other key has
    is what that row reads: every output column but the weight sum within half the needle's
    value of it, and the row equal to the float64 golden within the tolerance policy (its floor
    counting each of the row's scores as the one product it is).

    Catches: a key index kept in 18 bits (key 2^18 read as key 0: the row that should read the
    needle averages ordinary values instead, about 0), where a diffuse row's mean over the wrong
    keys can equal its mean over the right ones within tolerance (Dao-AILab/flash-attention#47:
    results that change with 350,000 keys; in bfloat16 `scale_matches_golden` passes it); a
    packed row index kept in 17 bits; an element offset that wraps at 2^31; a tile past the
    wrap that is skipped (the needle dropped).
    """
    _note_skipped(target, set(NEEDLED))
    planted = needles_of(target, case)
    inputs = inputs_of(case, planted)
    rows = np.array(sorted({n.row for n in planted}))
    at = {int(r): i for i, r in enumerate(rows)}
    vis = oracle.visibility(target.alignment, inputs, rows)
    hidden = [n for n in planted if not vis[(*n.at, at[n.row], n.key)]]
    assert not hidden, (f"at {name_of(target, case)}, {', '.join(n.text() for n in hidden)}: the needle "
                        "is hidden from its row (a bug of the law)")
    weights = {n: _weight(inputs, n) for n in planted}
    weak = [n for n in planted if weights[n] < 0.99]
    assert not weak, f"at {name_of(target, case)}, {weak[0].text()}: the needle does not dominate its row " \
                     f"(weight {weights[weak[0]]:.3g}: a bug of the law)"
    out = call(patient(target), inputs)[..., rows, :]
    lost = [n for n in planted if not _reads(out[(*n.at, at[n.row])], n.value)]
    if lost:
        raise AssertionError(
            f"at {name_of(target, case)}, " + "; ".join(
                f"{n.text()} should read the needle's value {n.value:g} (its weight in the row "
                f"1 − {1 - weights[n]:.2g}): the row's output is "
                f"{_values_text(out[(*n.at, at[n.row])])}" for n in lost)
            + ": another key was read in the needle's place, or none")
    want = sampled.expected_rows(target, inputs, rows, baseline_in=accumulator(target, inputs))
    found = [(n, _needle_comparison(target, inputs, out, want, n, at[n.row])) for n in planted]
    missed = [f"{n.text()} (value {n.value:g}) read {float(out[(*n.at, at[n.row], 0)]):.4g}"
              for n, cmp in found if not cmp.ok]
    said = "; ".join(missed) if missed else ", ".join(n.text() for n in planted)
    assert_within_tolerance(max((cmp for _, cmp in found), key=lambda c: c.ratio),
                            dtype=precision_text(target, inputs),
                            what=f"at {name_of(target, case)}, the rows that should read the needles "
                                 f"({said}), the output")


def _reads(row: Array, value: float) -> bool:
    """The output row reads the needle: every column but the last (the weight sum) within
    value/2 of its value (NaN is not)."""
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.abs(row[:-1].astype(np.float64) - value) <= value / 2))


def _weight(inputs: Inputs, n: Needle) -> float:
    """The needle's weight in its row, in float64 (each score of the row is one product: the row of
    q is zero but in column ``n.axis``), over every key of its slice, those the row does not see
    included: a lower bound of the weight it has."""
    q = float(inputs.q[n.at][n.row, n.axis])
    s = inputs.scale_value * q * inputs.k[n.at][:, n.axis].astype(np.float64)
    return float(1 / np.sum(np.exp(s - s[n.key])))


def _values_text(row: Array) -> str:
    shown = ", ".join(f"{float(x):.4g}" for x in row[:3])
    return f"[{shown}{', …' if row.shape[-1] > 3 else ''}]"


def _needle_comparison(target: Target, inputs: Inputs, out: Array, want: oracle.Expected, n: Needle,
                       row: int) -> tolerance.Comparison:
    """The needle's row against the golden. Its floor counts each of the row's scores as the one
    product it is (the row of q and the needle key are zero but in column ``n.axis``: a kernel
    rounds one product, not d_k of them, `spec.tolerance.long_row_floor` of that column); the
    floor of d_k products, (d_k + 2)·S·eps·max|V| with S = `NEEDLE_SCORE`, would excuse any
    output in bfloat16 (about 50 at d_k = 64)."""
    one = np.zeros(want.seen.shape, dtype=bool)
    one[(*n.at, row)] = True
    column = slice(n.axis, n.axis + 1)
    floor = tolerance.long_row_floor(inputs.q[n.at][n.row:n.row + 1, column], inputs.k[n.at][:, column],
                                     inputs.v[n.at],
                                     scale=inputs.scale_value,
                                     dtype=target.precision(np.dtype(inputs.q.dtype).name))
    return tolerance.compare(out, want.out, want.baseline, rows=one, tolerance=target.tolerance, floor_=floor,
                             dtype=inputs.q.dtype)


GRADIENTS = ("decode", "causal_square", "slices", "packed", "packed_decode")


@law(strategy=_strategy(GRADIENTS), grid=_grid(GRADIENTS), needs=_needs.gradients & _needs_cases(GRADIENTS),
     scope="generic")
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
    dq, dk, dv, _ = call_grad(patient(target), inputs, d_out)
    want = sampled.gradients_rows(target, inputs, rows, d_out, baseline_in=accumulator(target, inputs))
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        gold = want.golden[name]
        floor = float(np.max(want.floors[name], initial=0.0))
        cmp = tolerance.compare(got, gold, want.baseline[name], rows=np.ones(gold.shape[:-1], dtype=bool),
                                tolerance=GRAD_FACTOR * target.tolerance, floor_=floor, dtype=inputs.q.dtype)
        assert_within_tolerance(cmp, dtype=precision_text(target, inputs),
                                what=f"at {name_of(target, case)}, {name}",
                                against="the float64 golden backward")
