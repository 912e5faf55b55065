"""A past key/value cache (``past_key=``, ``past_value=``) and the presents returned with it.

Its declaration (`PAST`) and the functions it is made of; its laws are `spec.laws.past`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from spec.keywords.record import Geometry, Keyword, Reads, Realigns, Returns, not_floats

if TYPE_CHECKING:
    from spec.cases import Case
    from spec.inputs import Inputs

Array = np.ndarray


def joined(k: Array, v: Array, past_key: Array, past_value: Array) -> tuple[Array, Array]:
    # [..., g, n_k, d], [..., g, n_past, d] -> [..., g, n_past + n_k, d]
    """The keys and values a call with a past cache attends to: the past's, then its own."""
    for name, past, new in (("past_key", past_key, k), ("past_value", past_value, v)):
        past = np.asarray(past)
        if past.shape[:-2] != new.shape[:-2] or past.shape[-1] != new.shape[-1] or past.dtype != new.dtype:
            raise ValueError(f"{name} must be [..., heads_kv, n_past, d] in the keys' dtype, as the keys "
                             f"{new.dtype} {new.shape}; got {past.dtype} {past.shape}")
    return np.concatenate([past_key, k], axis=-2), np.concatenate([past_value, v], axis=-2)


def past_diagonal(geo: Geometry, past_key: Array, past_value: Array) -> Array:  # -> [n_q, 1]
    """The queries continue the past: query i's diagonal key is n_past + i."""
    return np.arange(geo.n_q)[:, None] + np.asarray(past_key).shape[-2]


def split(case: Case, n_past: int) -> tuple[Array, Array]:  # -> past_key, past_value [..., g, n_past, d]
    """The case's first ``n_past`` keys and values: the past cache."""
    _, k, v = case.arrays()
    return np.ascontiguousarray(k[..., :n_past, :]), np.ascontiguousarray(v[..., :n_past, :])


def after_past(case: Case, n_past: int, k: Array, v: Array) -> tuple[Array, Array]:
    """The call's own keys and values: the case's after the first ``n_past``."""
    return np.ascontiguousarray(k[..., n_past:, :]), np.ascontiguousarray(v[..., n_past:, :])


def presents_returned(meant: Inputs, returned: tuple[Array, ...], out_shape: tuple[int, ...]) -> str | None:
    """What is wrong with ``(present_key, present_value)`` as returned: each must be a float array
    of the shape and dtype of the keys (values) the call means, the past's then its own."""
    for name, x, like in zip(("present_key", "present_value"), returned, (meant.k, meant.v), strict=True):
        wrong = not_floats(x, f"with past_key= the target returned {name} as")
        if wrong is None and (x.shape != like.shape or x.dtype != like.dtype):
            wrong = (f"the target returned {name} of shape {x.shape} and dtype {x.dtype}, expected "
                     f"{like.shape} {like.dtype} (the past's keys then the call's)")
        if wrong is not None:
            return wrong
    return None


PAST = Keyword(
    name="past_kv",
    field="supports_past_kv",
    passes=("past_key", "past_value"),
    meaning="past_key [..., heads_kv, n_past, d_k] and past_value [..., heads_kv, n_past, d_v], in the keys' "
            "layout and dtype: the call attends to concat(past, k) and concat(past, v) along the key axis, "
            "and returns (out, present_key, present_value), the presents exactly those concatenations. "
            "With causal=True query i sees keys j <= n_past + i (it continues the past).",
    terms=(Reads(joined), Realigns(past_diagonal)),
    received=split,
    writes=after_past,
    excludes=("kv_lengths", "block_table"),
    in_layout=("past_key", "past_value"),
    returns=Returns(("present_key", "present_value"), "with past_key= and past_value=",
                    check=presents_returned, in_layout=True),
)
