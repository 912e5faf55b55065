"""The test command of a mutation run: the conformance suite on the built-in targets, then impl's
own tests (IMPL_TESTS); exit 1 at the first failure (a mutant is killed as soon as anything notices
it), 0 when everything passes.

    python -m tools.mutation.suite [--first impl/flash.py]

The suite's two checks always run before impl's tests, so a mutant that only impl's tests kill is
one the suite's laws let through: the last line printed, ``killed by: CHECK``, says which check
noticed it (what `tools.mutation.run` records). ``--first`` only says which of the suite's two
targets leads (the one likeliest to notice a mutant of that file); a surviving mutant has always
been through every check.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

SUITE_PROFILE = "quick"
# impl's tests that the run adds to the suite: its mask builders against independent definitions,
# its argument checks (what the suite never passes: a bad dropout_p, say), flash's own tests
# (the tiled backward under a softcap or with non-finite inputs, which a grad_fn(q, k, v, d_out,
# causal=) cannot be asked for; no warning from its overflow fallback), and the paged caches'
# (flash's per-sequence diagonals, whose bounds go negative there: the suite's laws never got that far).
IMPL_TESTS = tuple(f"tests/impl/test_impl_{name}.py"
                   for name in ("masks", "attention", "layers", "leak", "flash", "cache"))
IMPL = "impl-tests"
KILLED_BY = "killed by: "


def spec_check(target: str) -> Callable[[], bool]:
    """``python -m spec check TARGET --profile quick``, stopping at the first failing law."""

    def check() -> bool:
        from spec.builtin import load_target
        from spec.runner import check_law, select

        loaded = load_target(target)
        for prop in select():
            result = check_law(prop, loaded, profile=SUITE_PROFILE, source=target)
            if result.status == "fail":
                print(f"{target}: {prop.name} fails: {result.message}")
                return False
        return True

    return check


def impl_tests() -> bool:
    """impl's own tests (IMPL_TESTS, the files that exist), stopping at the first failure."""
    files = [f for f in IMPL_TESTS if Path(f).exists()]
    if not files:
        return True
    import pytest

    code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "--hypothesis-profile=ci", *files])
    return code == 0


SUITE_CHECKS = ("reference", "flash")  # the suite's laws, one check a built-in target
CHECKS: dict[str, Callable[[], bool]] = {**{t: spec_check(t) for t in SUITE_CHECKS}, IMPL: impl_tests}
LEAD = {"impl/flash.py": "flash", "impl/attention.py": "reference", "impl/masks.py": "reference"}


def order(first: str | None) -> list[str]:
    """The checks: the suite's two (the one likeliest to notice a mutant of ``first``, a file or a
    target's name, leading), then impl's tests."""
    lead = first if first in SUITE_CHECKS else LEAD.get(first or "", "reference")
    return [lead, *(name for name in SUITE_CHECKS if name != lead), IMPL]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mutation.suite", description=__doc__)
    parser.add_argument("--first",
                        help="the mutated file or a target's name (only reorders the suite's checks)")
    args = parser.parse_args(argv)
    for name in order(args.first):
        try:
            ok = CHECKS[name]()
        except Exception as e:  # a mutant that breaks loading the target: noticed all the same
            print(f"{name}: {type(e).__name__}: {e}")
            ok = False
        if not ok:
            print(f"{KILLED_BY}{name}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
