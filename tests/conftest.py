"""Hypothesis settings profiles for this test suite, selected with ``--hypothesis-profile``
(defined with the suite's own profiles in :mod:`spec.profiles`)."""

from spec.profiles import register_test_profiles

register_test_profiles()
