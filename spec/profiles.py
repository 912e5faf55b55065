"""Every Hypothesis profile in one place.

`PROFILES` are the suite's (``python -m spec check --profile``, ``spec.check(profile=)``,
``--attention-profile``): examples per law, derandomization, the per-call deadline.
`register_test_profiles` registers the settings profiles of this repository's own tests
(``pytest --hypothesis-profile=ci|dev|thorough``); ``tests/conftest.py`` calls it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings


@dataclass(frozen=True)
class Profile:
    max_examples: int  # per property
    derandomize: bool  # the same examples every run (CI), unless a seed is given
    deadline_s: float  # per call of the target


PROFILES = {
    "quick": Profile(max_examples=10, derandomize=True, deadline_s=5.0),
    "ci": Profile(max_examples=40, derandomize=True, deadline_s=10.0),
    "thorough": Profile(max_examples=400, derandomize=False, deadline_s=30.0),
}


def register_test_profiles() -> None:
    """The settings profiles of the repository's tests: ``ci`` derandomized so a CI run is
    repeatable; ``dev`` quick local runs; ``thorough`` before a release."""
    settings.register_profile(
        "ci", derandomize=True, max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.register_profile("dev", max_examples=20, deadline=None)
    settings.register_profile("thorough", max_examples=500, deadline=None)
