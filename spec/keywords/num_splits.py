"""Split-KV decoding's split count (``num_splits=n``): each row's keys cut into n parts, each attended
to on its own and the parts merged by their logsumexps.

Real kernels: FlashAttention's ``flash_attn_with_kvcache(..., num_splits=)`` (0 picks a count by a
heuristic, 1 splits nothing, n splits in n), FlashInfer's split-KV decode, vLLM's batch-invariant mode
(which fixes the count). The split count changes only the order the keys' partial sums are added in:
the output means the same for every count, so the golden ignores it (a `Leaves` term) and every
count must match it within the tolerance. Bit for bit the counts differ (the merge rounds), unless the
target promises otherwise: ``invariant=("splits",)``, `spec.laws.invariance.splits_invariant`.

A target declares the counts it takes, a tuple of ints ≥ 1 (a split count is a value set, not a
switch): ``Target(fn, supports_num_splits=True, num_splits_values=(1, 2, 4))``; a case draws one
of them. Its declaration (`NUM_SPLITS`); its laws are `spec.laws.invariance`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from spec.keywords.record import Keyword, Leaves

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target


def check_values(given: Any) -> tuple[int, ...]:
    """``num_splits_values``: a tuple (or list) of integers ≥ 1, in the order given, each once; ValueError
    naming the field otherwise (a bool or a bare integer is refused)."""
    ok = isinstance(given, (tuple, list)) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in given)
    if not ok:
        raise ValueError(f"num_splits_values must be a tuple of integers >= 1 (the split counts the target "
                         f"takes, e.g. (1, 2, 4)), got {given!r}")
    return tuple(dict.fromkeys(int(n) for n in given))


def check_target(target: Target) -> str | None:
    """What is inconsistent between ``supports_num_splits`` and ``num_splits_values``: each needs the
    other (a target that takes the keyword says which counts)."""
    values = target.num_splits_values
    if target.supports_num_splits and not values:
        return ("Target supports_num_splits=True needs num_splits_values, the split counts it takes "
                "(e.g. num_splits_values=(1, 2, 4))")
    if values and not target.supports_num_splits:
        return f"Target num_splits_values={values!r} needs supports_num_splits=True (it says which counts)"
    return None


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """One of the split counts the target declares (``num_splits_values``)."""
    return case.with_keyword("num_splits", draw(st.sampled_from(target.num_splits_values)))


NUM_SPLITS = Keyword(
    name="num_splits",
    field="supports_num_splits",
    passes=("num_splits",),
    meaning="num_splits=n, one of the target's num_splits_values (ints >= 1): each row's keys are cut "
            "into n splits, each attended to on its own, the splits merged by their logsumexps "
            "(split-KV decoding: FlashAttention's flash_attn_with_kvcache(num_splits=), FlashInfer's "
            "split-KV decode). The output means the same for every n; invariant=('splits',) promises "
            "it bit for bit.",
    terms=(Leaves("the split count changes only the order the keys' partial results are added in: the "
                  "golden is the same for every count, which every count must match"),),
    received=lambda case, n: (int(n),),
    draw=draw,
    check_target=check_target,
)
