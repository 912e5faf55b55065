"""MkDocs hook: expand the ``<!-- generate: NAME -->`` markers of a page (see tools/docgen.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.docgen import expand


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return expand(markdown)
