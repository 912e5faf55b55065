"""Split-KV decoding's split count (``num_splits=n``): each row's keys cut into n parts, each attended
to on its own and the parts merged by their logsumexps.

Real kernels: FlashAttention's ``flash_attn_with_kvcache(..., num_splits=)`` (0 picks a count by a
heuristic, 1 splits nothing, n splits in n), FlashInfer's split-KV decode, vLLM's batch-invariant mode
(which fixes the count). The split count changes only the order the keys' partial sums are added in:
the output means the same for every count, so the golden ignores it (a `Leaves` term) and every
count must match it within the tolerance. Bit for bit the counts differ (the merge rounds), unless the
target promises otherwise: ``invariant=("splits",)``, `spec.laws.invariance.splits_invariant`.

A target declares that it takes the keyword, ``Target(fn, supports_num_splits=True)``, and, where
it takes some counts only, which (a tuple of ints ≥ 1, as ``head_dims`` lists the widths taken):
``num_splits_values=(1, 2, 4)``; None, any count, drawn from `COUNTS`. A case draws one of them.
Its declaration (`NUM_SPLITS`); its laws are `spec.laws.invariance`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from spec.keywords.record import Keyword, Leaves

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target


COUNTS = (1, 2, 3, 4, 8)
"""The split counts drawn for a target that takes any (``num_splits_values=None``): no split, two
and three near-equal ones (three leaves a remainder for most key counts), and more splits than a
short row has keys (empty splits, which the combine must leave out)."""


def check_values(given: Any) -> tuple[int, ...] | None:
    """``num_splits_values``: None (any count), or a non-empty tuple (or list) of integers ≥ 1, in the
    order given, each once; ValueError naming the field otherwise (a bool or a bare integer is
    refused)."""
    if given is None:
        return None
    ok = isinstance(given, (tuple, list)) and len(given) > 0 and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in given)
    if not ok:
        raise ValueError(f"num_splits_values must be None (any count) or a non-empty tuple of integers >= 1 "
                         f"(the split counts the target takes, e.g. (1, 2, 4)), got {given!r}")
    return tuple(dict.fromkeys(int(n) for n in given))


def counts(target: Target) -> tuple[int, ...]:
    """The split counts a case draws for ``target``: its ``num_splits_values``, or `COUNTS`."""
    return target.num_splits_values or COUNTS


def check_target(target: Target) -> str | None:
    """What is inconsistent in a target's split counts: ``num_splits_values`` needs
    ``supports_num_splits`` (it says which counts the keyword takes)."""
    values = target.num_splits_values
    if values is not None and not target.supports_num_splits:
        return f"Target num_splits_values={values!r} needs supports_num_splits=True (it says which counts)"
    return None


def draw(draw: st.DrawFn, target: Target, case: Case) -> Case:
    """One of the split counts the target takes (`counts`)."""
    return case.with_keyword("num_splits", draw(st.sampled_from(counts(target))))


NUM_SPLITS = Keyword(
    name="num_splits",
    field="supports_num_splits",
    passes=("num_splits",),
    meaning="num_splits=n, an int >= 1 (one of the target's num_splits_values, where it declares "
            "them): each row's keys are cut into n splits, each attended to on its own, the splits "
            "merged by their logsumexps (split-KV decoding: FlashAttention's "
            "flash_attn_with_kvcache(num_splits=), FlashInfer's split-KV decode). The output means "
            "the same for every n; invariant=('splits',) promises it bit for bit.",
    terms=(Leaves("the split count changes only the order the keys' partial results are added in: the "
                  "golden is the same for every count, which every count must match"),),
    received=lambda case, n: (int(n),),
    draw=draw,
    check_target=check_target,
)
