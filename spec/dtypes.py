"""Float dtypes the suite knows: float16, float32, float64 and bfloat16.

bfloat16 is NumPy's from ``ml_dtypes`` (which JAX installs; 8 significand bits, eps = 2⁻⁷,
float32's range). Whether it is available is decided here, once; ``eps`` and ``tiny`` come from
``ml_dtypes.finfo`` for bfloat16 and ``np.finfo`` otherwise.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

BFLOAT16 = "bfloat16"


@functools.cache
def has_bfloat16() -> bool:
    """Whether ``ml_dtypes`` (NumPy's bfloat16) is importable (found out once)."""
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    return True


def as_dtype(dtype: Any) -> np.dtype:
    """``np.dtype(dtype)``, with the name "bfloat16" resolved through ``ml_dtypes`` (NumPy knows
    the name only once ml_dtypes is imported)."""
    if isinstance(dtype, str) and dtype == BFLOAT16:
        if not has_bfloat16():
            raise TypeError("dtype bfloat16 needs ml_dtypes, which is not installed: "
                            "pip install ml-dtypes")
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def finfo(dtype: Any) -> Any:
    """Machine limits of a float dtype: ``ml_dtypes.finfo`` for bfloat16, ``np.finfo`` otherwise."""
    dt = as_dtype(dtype)
    if dt.name == BFLOAT16:
        import ml_dtypes

        return ml_dtypes.finfo(dt)
    return np.finfo(dt)


def eps(dtype: Any) -> float:
    """The dtype's machine epsilon (distance from 1 to the next float)."""
    return float(finfo(dtype).eps)


def tiny(dtype: Any) -> float:
    """The smallest positive normal number of the dtype."""
    return float(finfo(dtype).tiny)


def bfloat16_if_installed() -> tuple[str, ...]:
    """``("bfloat16",)`` where NumPy has it, else ``()`` (for dtype declarations)."""
    return (BFLOAT16,) if has_bfloat16() else ()
