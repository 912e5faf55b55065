"""Laws of a target's state across calls, each a few calls: the caller's own arrays refilled in
place give the new output, an output once returned is the caller's alone, inputs that agree on
every cheap fingerprint but differ elsewhere get their own outputs, and shapes interleaved are each
right.

A kernel may keep state between calls (a workspace, a plan per shape, a memo): these laws hold
whatever it keeps, and fail a kernel whose state shows in its outputs — the cheats of a benchmark
judged on a few calls (an output cached on the input buffers' identity or on a fingerprint of their
values; an output buffer recycled; an output that is an input's memory). Their long-run companions,
64 calls and more, are `spec.laws.long_runs` (``--profile judge``).

Where a law hands the target the caller's own arrays (``copy=False``, `own_arrays`) rather than
copies, it is said. A process-isolated target is called directly inside the law's worker process
(`spec.isolation.run_law`), so it receives those very arrays too; only after its worker crashed
does each call cross a pipe, as copies, and a law on identity then proves less.
"""

from __future__ import annotations

import numpy as np
from hypothesis import reject

from spec.call import call
from spec.cases import Case, admissible_lengths, cases, outside_limits
from spec.inputs import Inputs
from spec.keywords import in_layout
from spec.laws._helpers import assert_matches, first_true, same_bits
from spec.registry import law
from spec.target import Target

Array = np.ndarray

REFILLED = ("q", "k", "v")


def own_arrays(target: Target, inputs: Inputs) -> Inputs:
    """``inputs`` on writable arrays of the caller's own, laid out so that the target receives
    their very memory: for a ``bnhd`` target, q, k and v are suite-layout views of buffers in its
    layout (its layout translation's contiguous copy of such a view is the buffer itself, no copy)."""
    axes = target._layout_axes(inputs.q.ndim, packed=False)
    moved = in_layout("dense")

    def own(name: str, x: Array) -> Array:
        if axes is None or name not in moved:
            return np.array(x, copy=True)
        buffer = np.empty_like(np.swapaxes(x, *axes), order="C")  # contiguous in the target's layout
        view = np.swapaxes(buffer, *axes)
        view[...] = x
        return view

    return inputs.replace(**{name: own(name, x) for name, x in inputs.arrays().items()})


def refill(given: Inputs, values: Inputs, names: tuple[str, ...]) -> None:
    """Write ``values``' arrays ``names`` into ``given``'s, in place: the same arrays, their contents
    ``values``'."""
    held, new = given.arrays(), values.arrays()
    for name in names:
        np.copyto(held[name], new[name])


def reseeded(case: Case, stream: int) -> Case:
    """The case with other values (its seed drawn from its own ``stream``): the same shapes,
    flags and keywords."""
    return case.replace(seed=int(case.rng(stream).integers(0, 2**32)))


@law(strategy=lambda t: cases(t, masks=("none", "random")))
def refilled_inputs_give_new_outputs(target: Target, case: Case) -> None:
    """The caller's own arrays — not copies — refilled in place between two calls (the same q, k
    and v objects and memory; a drawn nonempty subset of them gets new values, the others are
    written again as they were) give the new values' output, each call matching the golden.

    Catches: a cache keyed on the input buffers' identity (``id(q)``, ``q.data_ptr()``) that
    returns the old contents' output when a training loop refills the same buffers; a cache keyed
    on some of the inputs only (refilled v, unchanged q and k: the stale output).
    """
    first = case.inputs()
    given = own_arrays(target, first)
    out = call(target, given, copy=False).astype(np.float64)
    assert_matches(target, first, out, what="the first call's output")
    picked = case.rng(60).permutation(len(REFILLED))[:int(case.rng(61).integers(1, len(REFILLED) + 1))]
    names = tuple(REFILLED[i] for i in sorted(picked))
    later = reseeded(case, 62).inputs()
    second = first.replace(**{name: getattr(later, name) for name in names})
    refill(given, second, tuple(given.arrays()))  # the others rewritten as they were: a target that
    # changed them is inputs_not_mutated's to name, not this law's
    out = call(target, given, copy=False).astype(np.float64)
    assert_matches(target, second, out, what=f"with {', '.join(names)} refilled in place, the output")


CALLS = 3  # calls whose outputs are kept and looked at again


@law(strategy=lambda t: cases(t, masks=("none", "random")))
def outputs_unchanged_and_unshared(target: Target, case: Case) -> None:
    """An output, once returned, is the caller's alone: it shares no memory with that call's
    inputs (the caller's own arrays, ``np.shares_memory``) nor with an earlier output, and it
    holds the same bits after two more calls (same shape, other values).

    Catches: an output buffer allocated once and reused (the next call overwrites an array already
    returned, so a model's cached activations change under it); an output that is an input's
    memory (a single-key shortcut returning v itself: the caller's next write to v changes it); an
    output returned before the work writing it has finished.
    """
    kept: list[tuple[Array, Array]] = []  # each output, and a copy of its bits when returned
    for i in range(CALLS):
        given = own_arrays(target, (case if i == 0 else reseeded(case, 70 + i)).inputs())
        out = call(target, given, copy=False)
        for name, x in given.arrays().items():
            assert not np.shares_memory(out, x), f"call {i + 1}'s output shares memory with its input {name}"
        for j, (earlier, _) in enumerate(kept):
            assert not np.shares_memory(out, earlier), (
                f"call {i + 1}'s output shares memory with the output of call {j + 1}")
        kept.append((out, out.copy()))
    for j, (out, bits) in enumerate(kept):
        was, now = bits.astype(np.float64), out.astype(np.float64)
        at = first_true(~same_bits(was, now, what=f"call {j + 1}'s output, after {CALLS} calls"))
        if at is not None:
            raise AssertionError(f"the output of call {j + 1} changed after it was returned: entry "
                                 f"{list(at)} was {was[at]!r}, is {now[at]!r} after {CALLS} calls")


SAMPLED = (2, 3, 5, 7)
"""A twin leaves each strided sample ``x.flat[::s]`` alone for every s whose prime factors are these
(2 to 10, 12, 14, 15, ...): neither of its swapped indices is a multiple of one."""


def twin(x: Array, rng: np.random.Generator) -> Array | None:  # [...] -> same shape
    """``x`` with two of its elements swapped: equal to ``x`` on every cheap fingerprint — shape,
    dtype, first and last element, the strided samples of `SAMPLED`, and everything of its values
    as a set (sum up to the order of summing, mean, norm, min, max) — and different elsewhere; None
    when no two elements at such indices differ."""
    flat = np.array(x).reshape(-1)
    spots = np.arange(1, max(flat.size - 1, 1))
    spots = spots[np.all([spots % p != 0 for p in SAMPLED], axis=0)] if spots.size else spots
    if spots.size < 2:
        return None
    i = int(spots[rng.integers(0, spots.size)])
    differ = spots[flat[spots] != flat[i]]
    if differ.size == 0:
        return None
    j = int(differ[rng.integers(0, differ.size)])
    flat[i], flat[j] = flat[j], flat[i]
    return flat.reshape(x.shape)


@law(strategy=lambda t: cases(t, n_k_min=4, masks=("none", "random")))
def fingerprint_twins_each_match_golden(target: Target, case: Case) -> None:
    """Inputs equal on every cheap fingerprint — shapes, first and last elements, sums, strided
    samples — but different elsewhere (two interior elements of each of q, k and v swapped: `twin`)
    get their own outputs: called one after the other, each matches its golden.

    Catches: a cache of the last output keyed on a cheap fingerprint of the inputs (shapes, a few
    elements, a checksum) — it returns the first inputs' output for their twin.
    """
    inputs = case.inputs()
    rng = case.rng(80)
    twins = {name: found for name in REFILLED if (found := twin(getattr(inputs, name), rng)) is not None}
    if not twins:
        reject()  # too small, or too uniform, for a twin that differs
    other = inputs.replace(**twins)
    assert_matches(target, inputs, call(target, inputs).astype(np.float64), what="the first inputs' output")
    assert_matches(target, other, call(target, other).astype(np.float64), what=f"then, for its twin "
                   f"({', '.join(twins)} with two interior elements swapped), the output")


def other_shape(target: Target, case: Case) -> Case | None:
    """The case at other lengths (n_q, n_k) the target takes — inside its declared limits, its
    causal mode defined there — with values of its own; None when no such lengths are found."""
    rng = case.rng(90)
    lengths = admissible_lengths(target, 1, max(case.n_q, case.n_k) + 16) or tuple(range(1, 33))
    for _ in range(16):
        a, b = (int(x) for x in rng.choice(lengths, size=2))
        # as the serving declarations need some of them: n_q kept (decode), n_q = n_k, or any
        n_q, n_k = [(case.n_q, a), (a, a), (a, case.n_k), (a, b)][int(rng.integers(0, 4))]
        if (n_q, n_k) == (case.n_q, case.n_k) or (case.causal and not target.causal_shape_ok(n_q, n_k)):
            continue
        found = reseeded(case, 91).replace(n_q=n_q, n_k=n_k)
        if outside_limits(target, found) is None:
            return found
    return None


@law(strategy=lambda t: cases(t, masks=("none", "random")))
def interleaved_shapes_match_golden(target: Target, case: Case) -> None:
    """Calls at two shapes interleaved — shape a, shape b, shape a, shape b, each call with values
    of its own — each match the golden, as each shape alone does.

    Catches: a kernel right only at one shape (a launch grid or a plan made for the first shape
    it met and kept); state from one shape leaking into another (a workspace sized for the last
    call, a plan cache keyed on fewer dimensions than it depends on).
    """
    b = other_shape(target, case)
    if b is None:
        reject()
    order = [case, b, reseeded(case, 92), reseeded(b, 93)]
    for i, each in enumerate(order):
        inputs = each.inputs()
        assert_matches(target, inputs, call(target, inputs).astype(np.float64),
                       what=f"call {i + 1} of {len(order)} (n_q={each.n_q} n_k={each.n_k}, shapes "
                            f"interleaved), the output")
