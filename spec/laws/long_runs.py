"""Laws of long runs of calls, run at ``--profile judge`` alone (`spec.profiles.PROFILES`): a
kernel stays right after 64 calls in a row, and every output of a run of 100 calls matches the
golden.

Each example makes its whole run itself (a run does not rely on the calls of earlier examples,
so a failure replays), on small shapes, with a few inputs whose goldens are worked out once. The
laws of state a few calls show are `spec.laws.stateful`.
"""

from __future__ import annotations

from spec.call import call
from spec.cases import Case, cases
from spec.laws._helpers import assert_matches, run
from spec.laws.stateful import reseeded
from spec.registry import law
from spec.target import Target

N_MAX = 24  # the runs' lengths: many calls each, so small ones
WARM_UP = 63  # calls before the one judged: it is the 64th
RUN = 100  # calls in a long run, each judged
VARIANTS = 4  # inputs a long run takes in turn


@law(strategy=lambda t: cases(t, n_max=N_MAX, masks=("none", "random")))
def right_after_64_calls(target: Target, case: Case) -> None:
    """The 64th call in a row — after 63 calls of the same shape with other values — matches the
    golden.

    Catches: a kernel right for its first calls and wrong after them (a call counter, a pool of
    buffers that runs dry, state that grows until it overflows): a harness that checks the first
    few calls and times the rest sees only its right ones.
    """
    warm = reseeded(case, 100).inputs()
    for _ in range(WARM_UP):
        call(target, warm)
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"after {WARM_UP} calls, the {WARM_UP + 1}th call's output")


@law(strategy=lambda t: cases(t, n_max=N_MAX, masks=("none", "random")))
def long_run_matches_golden(target: Target, case: Case) -> None:
    """Every output of a run of 100 calls in a row — four inputs of the case's shape, in turn —
    matches the golden.

    Catches: a NaN or a wrong output every k-th call (k up to 100) that a check of a few calls
    misses; drift in state kept across calls (a running statistic, a cache that fills).
    """
    variants = [case.inputs(), *(reseeded(case, 110 + i).inputs() for i in range(1, VARIANTS))]
    for i in range(RUN):
        inputs = variants[i % VARIANTS]
        assert_matches(target, inputs, run(target, inputs),
                       what=f"call {i + 1} of a run of {RUN}: the output")
