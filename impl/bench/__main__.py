import sys

from impl.bench.cli import main

sys.exit(main(sys.argv[1:]))
