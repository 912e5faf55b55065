"""The laws of spec.properties_masks, registered for one test and then removed again, so that the
rest of the suite (e.g. the gallery's "every property has a bug it catches") sees the registry
spec itself builds."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest

from spec.properties import PROPERTIES


@pytest.fixture
def masks_laws() -> Iterator[ModuleType]:
    saved = dict(PROPERTIES)
    module = importlib.import_module("spec.properties_masks")
    module = importlib.reload(module)  # registers its laws again if an earlier test removed them
    try:
        yield module
    finally:
        PROPERTIES.clear()
        PROPERTIES.update(saved)
