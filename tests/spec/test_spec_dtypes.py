"""spec.dtypes: eps and tiny, bfloat16's from ml_dtypes; and bfloat16 refused once ml_dtypes is
gone, even where its name was worked out before."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from spec import dtypes


def test_eps_and_tiny_come_from_ml_dtypes():
    BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    assert dtypes.eps("bfloat16") == 2.0**-7  # 8 significand bits
    assert dtypes.tiny("bfloat16") == 2.0**-126  # float32's exponent range
    assert dtypes.eps(BF16) == 2.0**-7
    assert dtypes.eps("float16") == 2.0**-10


def test_a_dtype_name_worked_out_before_ml_dtypes_went_is_still_refused(monkeypatch):
    """`spec.dtypes.as_dtype` works a name out once; the check that ml_dtypes is there is made
    on every call, so a cached bfloat16 does not outlive the detection."""
    pytest.importorskip("ml_dtypes")
    dtypes.as_dtype("bfloat16")  # worked out while ml_dtypes is importable
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    dtypes.has_bfloat16.cache_clear()
    try:
        with pytest.raises(TypeError, match="bfloat16 needs ml_dtypes"):
            dtypes.as_dtype("bfloat16")
        assert dtypes.as_dtype("float32") == np.dtype(np.float32)
    finally:
        dtypes.has_bfloat16.cache_clear()
