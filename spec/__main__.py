import sys

from spec.cli import main

sys.exit(main(sys.argv[1:]))
