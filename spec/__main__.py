"""``python -m spec``: the conformance suite's command line (`spec.cli`)."""

import sys

from spec.cli import main

sys.exit(main(sys.argv[1:]))
