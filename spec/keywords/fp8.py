"""Float8 KV caches (``k_descale=``, ``v_descale=``): k and v as float8_e4m3fn codes and scales.

Its declaration (`FP8`) and the functions it is made of; its laws are `spec.laws.cache`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from spec import dtypes
from spec.draws import BOOLEANS, pick
from spec.keywords.record import Keyword, Reads

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.target import Target

Array = np.ndarray


FLOAT8 = dtypes.FLOAT8
SCALE_RANGE = (-4.0, 2.0)
"""log₂ of the descales drawn: from 1/16 to 4, a factor of 64, per row and K/V head."""
EXPONENTS = st.floats(*SCALE_RANGE)
WIDE_RANGE = (8.0, 9.0)
"""log₂ of the descales of a cache past float16's range (`beyond_float16`): 256 to 512, with the
largest codes at `FILLED` of e4m3's 448, so the dequantized keys and values reach 86,016 to
229,376 — past float16's 65,504, where a kernel that dequantizes in float16 saturates or
overflows while the float32 it computes in holds them."""
WIDE_EXPONENTS = st.floats(*WIDE_RANGE)
FILLED = (0.75, 1.0)
"""The fractions of e4m3's largest code that the largest key and value codes reach, past float16."""


def descales(case: Case, scales: tuple) -> tuple[Array, Array]:  # -> k_descale, v_descale [batch, g] float32
    k_scales, v_scales = scales
    return np.asarray(k_scales, dtype=np.float32), np.asarray(v_scales, dtype=np.float32)


def quantize(case: Case, scales: tuple, k: Array, v: Array) -> tuple[Array, Array]:
    """The case's keys and values as float8 codes, ``x / descale`` rounded to e4m3 (clipped to its
    ±448: e4m3 has no infinity), so that the keys they mean are the case's, to 3 bits."""
    f8 = dtypes.as_dtype(FLOAT8)
    top = float(dtypes.finfo(f8).max)
    out = []
    for x, scale in zip((k, v), descales(case, scales), strict=True):
        codes = np.asarray(x, dtype=np.float64) / scale.astype(np.float64)[:, :, None, None]
        out.append(np.clip(codes, -top, top).astype(f8))
    return out[0], out[1]


def dequantize(k: Array, v: Array, k_descale: Array, v_descale: Array) -> tuple[Array, Array]:
    # [batch, g, n_k, d] float8, [batch, g] -> float64, exactly (a 4-bit code times a float32 scale)
    """What float8 codes mean: ``codes.astype(float32) · descale[b, g]``, in float64 (exact)."""
    def mean(codes: Array, scale: Array) -> Array:
        if codes.dtype.name != FLOAT8:
            raise ValueError(f"k_descale/v_descale come with {FLOAT8} k and v, got {codes.dtype}")
        return codes.astype(np.float64) * np.asarray(scale, dtype=np.float64)[:, :, None, None]

    return mean(k, k_descale), mean(v, v_descale)


def beyond_float16(target: Target, case: Case) -> bool:
    """Whether the case may hold dequantized keys and values past float16's range: its dtype, which
    the output has, and the dtype the target computes it in both reach further."""
    edge = float(dtypes.finfo("float16").max)
    return all(float(dtypes.finfo(d).max) > edge for d in (case.dtype, target.precision(case.dtype)))


def draw_scales(draw: st.DrawFn, target: Target, case: Case, *, wide: bool = True) -> Case:
    """A K and a V descale per batch row and K/V head, log-uniform over `SCALE_RANGE` (one K and one
    V value for every row and head for ``fp8_scale="tensor"``); with ``wide``, half the cases that
    may (`beyond_float16`) take them from `WIDE_RANGE` instead, with keys and values scaled so the
    largest codes fill e4m3's range (`FILLED`)."""
    g = case.kv_heads or case.heads
    past = wide and beyond_float16(target, case) and draw(BOOLEANS)
    exponents = WIDE_EXPONENTS if past else EXPONENTS

    def scale() -> float:
        return float(np.float32(2.0 ** draw(exponents)))

    if target.fp8_scale == "tensor":  # [batch, heads_kv], every entry the one value
        rows = [[(scale(),) * g] * case.batch for _ in range(2)]
    else:
        rows = [[tuple(scale() for _ in range(g)) for _ in range(case.batch)] for _ in range(2)]
    case = case.with_keyword("fp8", (tuple(rows[0]), tuple(rows[1])))
    if not past:
        return case
    top, fill = float(dtypes.finfo(FLOAT8).max), pick(draw, FILLED)
    k_least, v_least = (min(min(row) for row in scales) for scales in rows)
    return case.replace(k_max=fill * top * k_least, v_max=fill * top * v_least)  # no code past ±448


def float8_declared(target: Target) -> str | None:
    """A float8 cache needs ml_dtypes (its codes' dtype); ``fp8_kv_paged_only`` needs both caches."""
    if target.supports_fp8_kv and not dtypes.has_ml_dtypes():
        return ("Target supports_fp8_kv=True needs ml_dtypes (float8_e4m3fn), which is not "
                "installed: pip install ml-dtypes")
    if target.fp8_kv_paged_only and not (target.supports_fp8_kv and target.supports_paged_kv):
        return ("Target fp8_kv_paged_only=True needs supports_fp8_kv=True and "
                "supports_paged_kv=True (it says the float8 cache comes only paged)")
    return None


FP8 = Keyword(
    name="fp8",
    field="supports_fp8_kv",
    passes=("k_descale", "v_descale"),
    meaning="float32 [batch, heads_kv] each, 4-D inputs: k and v arrive as float8_e4m3fn codes (ml_dtypes), "
            "contiguous or paged, and mean k.astype(float32) · k_descale[b, g] (v likewise); the tolerance "
            "allows a kernel that rounds its weights to e4m3 for the P·V product (FlashAttention 3).",
    terms=(Reads(dequantize, weights_in=FLOAT8),),
    received=descales,
    draw=draw_scales,
    writes=quantize,
    ndims=(4,),
    check_target=float8_declared,
)
