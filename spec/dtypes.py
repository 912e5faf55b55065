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
    if not isinstance(dtype, str):
        return np.dtype(dtype)
    if dtype in ML_DTYPES and not has_ml_dtypes():
        raise TypeError(f"dtype {dtype} needs ml_dtypes, which is not installed: pip install ml-dtypes")
    return _named(dtype)


@functools.cache
def _named(name: str) -> np.dtype:  # as_dtype of a name, worked out once per name
    if name in ML_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def finfo(dtype: Any) -> Any:
    """Machine limits of a float dtype: ``ml_dtypes.finfo`` for bfloat16 and float8_e4m3fn,
    ``np.finfo`` otherwise (worked out once per dtype)."""
    return _finfo(as_dtype(dtype).name)


@functools.cache
def _finfo(name: str) -> Any:
    if name in ML_DTYPES:
        import ml_dtypes

        return ml_dtypes.finfo(as_dtype(name))
    return np.finfo(np.dtype(name))


def eps(dtype: Any) -> float:
    """The dtype's machine epsilon (distance from 1 to the next float)."""
    return float(finfo(dtype).eps)


def tiny(dtype: Any) -> float:
    """The smallest positive normal number of the dtype."""
    return float(finfo(dtype).tiny)


def bfloat16_if_installed() -> tuple[str, ...]:
    """``("bfloat16",)`` where NumPy has it, else ``()`` (for dtype declarations)."""
    return (BFLOAT16,) if has_bfloat16() else ()
