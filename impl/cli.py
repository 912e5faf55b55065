"""What this project's command lines share: a bad command line is one line and exit status 2.

``python -m impl.bench``, ``python -m impl.recall`` and ``python -m spec`` build their parsers
from `Parser`; their ``main`` catches `UsageError`, prints
``<prog>: error: <message>`` to stderr and returns 2 — never a usage dump or a traceback.
(``python -m calc`` keeps its own copy of these few lines so that its start-up does not import
NumPy.)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import NoReturn


class UsageError(Exception):
    """A command line that cannot run; the message is the one line the user sees."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line instead of usage + error + exit
        raise UsageError(message)


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer ≥ ``low``, refused with a message naming what was expected."""
    expected = {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer ≥ {low}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def check_output_dir(flag: str, path: str | os.PathLike[str]) -> None:
    """Refuse an output file whose directory does not exist, before any work is done."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise UsageError(f"{flag}: no such directory for {str(path)!r}")
