"""What the project's command lines share: a bad command line is one line on stderr and exit status 2.

``python -m impl`` (and ``impl.bench``, ``impl.recall``), ``python -m spec`` and ``python -m calc``
build their parsers from `Parser` and their argument types from the builders here; their ``main``
catches `UsageError`, prints ``<prog>: error: <message>`` to stderr and returns 2 (`fail`) —
never a usage dump or a traceback.

It also holds the one BLAS limiter (`cmdline.blas.one_thread_blas`: BLAS on one thread, for a
while), which `spec`'s runner, `impl.flash`'s worker threads and `impl.bench`'s one-thread timings
share; it imports threadpoolctl only when first used.

A package of its own that imports only the standard library, so that every package may import it
at no cost: `spec` may not import `impl`, and ``python -m calc`` starts without NumPy (``import
impl`` imports NumPy, ``import spec`` NumPy and Hypothesis).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import NoReturn


class UsageError(Exception):
    """A command line that cannot run; the message is the one line the user sees."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, raising `UsageError` where argparse would print its usage and exit."""

    def error(self, message: str) -> NoReturn:  # one line instead of usage + error + exit
        raise UsageError(message)


def fail(prog: str, message: object) -> int:
    """Say ``<prog>: error: <message>`` on stderr; the exit status of a bad command line, 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def int_at_least(low: int, *, lead: str = "expected") -> Callable[[str], int]:
    """An argparse type: an integer ≥ ``low``, refused with a message naming what was expected:
    ``"<lead> a positive integer, got '0'"`` (each command keeps its own ``lead``: the bench, the
    recall and spec say "expected", calc "must be")."""
    expected = {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer ≥ {low}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"{lead} {expected}, got {text!r}")
        return value

    return parse


def positive_number(refusal: str, *, unparsed: str | None = None) -> Callable[[str], float]:
    """An argparse type: a finite number > 0, refused with ``"<refusal>, got '<text>'"``, or with
    ``unparsed`` in place of ``refusal`` when the text is no number at all (if given)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{unparsed or refusal}, got {text!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{refusal}, got {text!r}")
        return value

    return parse


def seconds_between(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: seconds from ``low`` to ``high``, both included (NaN refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected seconds between {low:g} and {high:g}, got {text!r}")
        return value

    return parse


def check_output_dir(flag: str, path: str | os.PathLike[str]) -> None:
    """Refuse an output file whose directory does not exist, before any work is done."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise UsageError(f"{flag}: no such directory for {str(path)!r}")
