"""The test command of a mutation run: the conformance suite on the built-in targets, then impl's
own tests of its mask builders and argument checks (BUILDER_TESTS); exit 1 at the first failure
(a mutant is killed as soon as anything notices it), 0 when everything passes.

    python -m tools.mutation.suite [--first impl/flash.py]

``--first`` only reorders (the checks most likely to notice a mutant of that file run first);
a surviving mutant has always been through every check.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

SUITE_PROFILE = "quick"
BUILDER_TESTS = ("tests/test_masks.py", "tests/test_impl_edges.py")


def spec_check(target: str) -> Callable[[], bool]:
    """``python -m spec check TARGET --profile quick``, stopping at the first failing law."""

    def check() -> bool:
        from spec.builtin import load_target
        from spec.runner import run_property, select

        loaded = load_target(target)
        for prop in select():
            result = run_property(prop, loaded, profile=SUITE_PROFILE, source=target)
            if result.status == "fail":
                print(f"{target}: {prop.name} fails: {result.message}")
                return False
        return True

    return check


def builder_tests() -> bool:
    """impl's tests of the mask builders and of its argument checks (the files that exist)."""
    files = [f for f in BUILDER_TESTS if Path(f).exists()]
    if not files:
        return True
    import pytest

    code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "--hypothesis-profile=ci", *files])
    return code == 0


CHECKS: dict[str, Callable[[], bool]] = {
    "reference": spec_check("reference"),
    "flash": spec_check("flash"),
    "builders": builder_tests,
}
FIRST = {"impl/flash.py": "flash", "impl/masks.py": "builders", "impl/attention.py": "reference"}


def order(first: str | None) -> list[str]:
    """The checks, the one most likely to notice a mutant of ``first`` (a file, or a check's
    name) leading."""
    lead = first if first in CHECKS else FIRST.get(first or "", "reference")
    return [lead, *(name for name in CHECKS if name != lead)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mutation.suite", description=__doc__)
    parser.add_argument("--first", help="the mutated file or a check's name (only reorders the checks)")
    args = parser.parse_args(argv)
    for name in order(args.first):
        if not CHECKS[name]():
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
