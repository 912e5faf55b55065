"""Hypothesis settings profiles for this test suite, selected with ``--hypothesis-profile``."""

from hypothesis import HealthCheck, settings

# ci: derandomized so a CI run is repeatable; dev: quick local runs; thorough: before a release.
settings.register_profile(
    "ci", derandomize=True, max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=20, deadline=None)
settings.register_profile("thorough", max_examples=500, deadline=None)
