"""Float dtypes the suite knows: float16, float32, float64 and bfloat16, and float8_e4m3fn for
float8 KV caches.

bfloat16 is NumPy's from ``ml_dtypes`` (which JAX installs; 8 significand bits, eps = 2⁻⁷,
float32's range), and so is float8_e4m3fn (4 significand bits, eps = 2⁻³, largest 448, no
infinities: an overflow is NaN). Whether ml_dtypes is available is decided here, once; ``eps``
and ``tiny`` come from ``ml_dtypes.finfo`` for those two and ``np.finfo`` otherwise.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

BFLOAT16 = "bfloat16"
FLOAT8 = "float8_e4m3fn"
ML_DTYPES = (BFLOAT16, FLOAT8)  # the names NumPy knows only through ml_dtypes


@functools.cache
def has_bfloat16() -> bool:
    """Whether ``ml_dtypes`` (NumPy's bfloat16) is importable (found out once)."""
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    return True


def has_ml_dtypes() -> bool:
    """Whether ``ml_dtypes`` is importable: NumPy then has bfloat16 and float8_e4m3fn."""
    return has_bfloat16()


def as_dtype(dtype: Any) -> np.dtype:
    """``np.dtype(dtype)``, with the names "bfloat16" and "float8_e4m3fn" resolved through
    ``ml_dtypes`` (NumPy knows them only once ml_dtypes is imported)."""
    if isinstance(dtype, str) and dtype in ML_DTYPES:
        if not has_ml_dtypes():
            raise TypeError(f"dtype {dtype} needs ml_dtypes, which is not installed: "
                            "pip install ml-dtypes")
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, dtype))
    return np.dtype(dtype)


def finfo(dtype: Any) -> Any:
    """Machine limits of a float dtype: ``ml_dtypes.finfo`` for bfloat16 and float8_e4m3fn,
    ``np.finfo`` otherwise."""
    dt = as_dtype(dtype)
    if dt.name in ML_DTYPES:
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
