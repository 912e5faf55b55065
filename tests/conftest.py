"""Hypothesis settings profiles for this test suite, selected with ``--hypothesis-profile``
(defined with the suite's own profiles in `spec.profiles`)."""

import sys
from pathlib import Path

from spec.profiles import register_test_profiles

# tools/ (docs and mutation tooling) is the repository's, not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

register_test_profiles()
