"""Hypothesis settings profiles for this test suite, selected with ``--hypothesis-profile``
(defined with the suite's own profiles in `spec.profiles`)."""

import sys
from pathlib import Path

from spec.profiles import register_test_profiles

# tools/ (docs and mutation tooling) is the repository's, not an installed package; the gallery of
# broken and correct targets and the paged-cache helpers (tests/spec) serve every folder's tests
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(1, str(HERE / "spec"))

register_test_profiles()
