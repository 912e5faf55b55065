"""Every Hypothesis profile in one place.

`PROFILES` are the suite's (``python -m spec check --profile``, ``spec.check(profile=)``,
``--attention-profile``): examples per law, derandomization, the per-call deadline, and what a
check at the profile sets up (`checking`: the one set-up of `spec.check`, the CLI and the pytest
door). `register_test_profiles` registers the settings profiles of this repository's own tests
(``pytest --hypothesis-profile=ci|dev|thorough``); ``tests/conftest.py`` calls it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from hypothesis import HealthCheck, settings

from spec import context, scale_plan
from spec.target import Target


@dataclass(frozen=True)
class Profile:
    max_examples: int  # per law
    derandomize: bool  # the same examples every run (CI), unless a seed is given
    deadline_s: float  # per call of the target
    family: str | None = None
    """The law family (`spec.registry.Law.family`) this profile runs alone, each law on its
    explicit cases only (its grid; nothing is drawn): ``scale``. Its laws run at no other profile.
    None: every law but those of such families."""
    adds: tuple[str, ...] = ()
    """Law families this profile runs besides every law of a profile without a ``family`` (each law
    on its drawn examples, as the others): ``judge`` adds ``long_runs``. A family some profile adds
    runs at no profile that does not."""
    power: bool = False
    """Judge the suite's own cases too, whatever the check asks (`spec.power`): ``judge``."""
    setup: Callable[[Target], AbstractContextManager[str]] | None = None
    """What a check of a target at this profile runs within, giving the report's header line for
    the profile (`spec.scale_plan.checking`: the outputs its laws share, the cases not run);
    None: nothing."""


PROFILES = {
    "quick": Profile(max_examples=10, derandomize=True, deadline_s=5.0),
    "ci": Profile(max_examples=40, derandomize=True, deadline_s=10.0),
    "thorough": Profile(max_examples=400, derandomize=False, deadline_s=30.0),
    "scale": Profile(max_examples=1, derandomize=True, deadline_s=900.0, family="scale",
                     setup=scale_plan.checking),
    "judge": Profile(max_examples=40, derandomize=True, deadline_s=10.0, adds=("long_runs",), power=True),
}
"""``scale``: the laws of `spec.laws.scale`, a few calls each at the sizes where kernels overflow
(``--memory GIB`` bounds them: `spec.scale_plan`). ``judge``: every law ``ci`` runs, as ``ci`` runs
it, and the long runs of `spec.laws.long_runs` (64 calls in a row, then 100 each judged), the
power guard on (`spec.power`), for a kernel that may cheat: with the stateful laws every profile
runs (`spec.laws.stateful`), state kept across calls cannot hide in its outputs."""


@contextlib.contextmanager
def checking(profile: str, target: Target, *, memory: float | None = None) -> Iterator[str]:
    """Within: a check of ``target`` at ``profile`` is set up, the same way for `spec.check` (and
    so the CLI) and for the pytest door: ``memory`` (GiB; None: not given, the profile's default)
    is the check's memory budget (`spec.context.memory`), and the profile's own set-up
    (`Profile.setup`) runs within it. Gives the report's header line for the profile ("" when it
    has none)."""
    with context.memory(None if memory is None else float(memory) * 2**30):
        setup = PROFILES[profile].setup
        if setup is None:
            yield ""
            return
        with setup(target) as header:
            yield header


def exclusive_families() -> set[str]:
    """The law families that run only at the profiles that name them (`Profile.family`,
    `Profile.adds`)."""
    return {p.family for p in PROFILES.values() if p.family is not None} | {
        family for p in PROFILES.values() for family in p.adds}


def running(family: str) -> list[str]:
    """The profiles at which a law of ``family`` runs: the profile that runs it alone, or every
    profile without a ``family`` (of those, only the ones that add it, for a family added)."""
    exclusive = exclusive_families()
    return [name for name, p in PROFILES.items()
            if (family == p.family if p.family is not None else family not in exclusive or family in p.adds)]


def runs_at(family: str, profile: str) -> str | None:
    """Why a law of ``family`` does not run at ``profile`` (None when it does)."""
    where = running(family)
    if profile in where:
        return None
    own = PROFILES[profile].family
    if own is not None:
        return f"runs at --profile {'|'.join(where)} (--profile {profile} runs the {own} laws alone)"
    return f"runs only at --profile {'|'.join(where)}"


def register_test_profiles() -> None:
    """The settings profiles of the repository's tests: ``ci`` derandomized so a CI run is
    repeatable; ``dev`` quick local runs; ``thorough`` before a release."""
    settings.register_profile(
        "ci", derandomize=True, max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.register_profile("dev", max_examples=20, deadline=None)
    settings.register_profile("thorough", max_examples=500, deadline=None)
