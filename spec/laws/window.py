"""Laws of ``window=(left, right)``: query i sees keys ``diag − left .. diag + right``, where
``diag`` is i (top-left) or i + n_k − n_q (bottom-right), per the target's ``causal_alignment``
(FlashAttention's ``window_size``, Mistral's sliding window); ANDed with ``causal`` and ``mask``.

Each law needs ``supports_window``. Public off-by-one reports: transformers#39408 and vllm#3385.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec.cases import Case, cases
from spec.laws._helpers import assert_matches, assert_same, held_fixed, needs_keyword, run, same_bits
from spec.registry import law
from spec.target import Target

Array = np.ndarray

needs_window = needs_keyword("window")


def sides(n: int) -> st.SearchStrategy[int]:
    """One side of a window: mostly small (0..4, where off-by-ones live), sometimes up to n + 2."""
    return st.one_of(st.integers(0, 4), st.integers(0, n + 2))


@st.composite
def window_cases(draw: st.DrawFn, target: Target, **given: object) -> Case:
    """Cases with a window, on shapes the target's alignment defines (square_or_decoding: n_q = n_k
    or n_q = 1)."""
    case = draw(cases(target, n_max=48, **given))  # type: ignore[arg-type]
    assume(target.causal_shape_ok(case.n_q, case.n_k))
    return dataclasses.replace(case, window=(draw(sides(case.n_k)), draw(sides(case.n_k))))


@law(strategy=lambda t: window_cases(t, masks=("none", "random")), needs=needs_window)
def window_matches_golden(target: Target, case: Case) -> None:
    """With ``window=(left, right)`` every row that sees a key matches the float64 golden, whose
    query i sees keys diag − left ≤ j ≤ diag + right (ANDed with causal and mask=).

    Catches: a window of left + 1 or left − 1 keys (an off-by-one at its edge: transformers#39408,
    vllm#3385); left and right swapped.
    """
    q, k, v = case.arrays()
    assert_matches(target, case, run(target, case, q, k, v), q, k, v,
                   what=f"with window={case.window}, the output")


@law(strategy=lambda t: window_cases(t, masks=("none", "random"), n_k_min=2), needs=needs_window)
def window_no_leak(target: Target, case: Case) -> None:
    """Changing the keys and values outside one query's window (before diag − left and after
    diag + right) leaves every row that sees none of them bit-identical (within tolerance if the
    target declares exact_masking=False): nothing outside a window leaks in.

    Catches: a window edge off by one (key diag − left − 1 still seen, transformers#39408); a
    window applied to the scores' maximum but not to the sum, so hidden keys move the rounding.
    """
    q, k, v = case.arrays()
    assert case.window is not None
    rng = case.rng(21)
    row = int(rng.integers(0, case.n_q))
    diag = row + (case.n_k - case.n_q if target.alignment == "bottom_right" else 0)
    left, right = case.window
    outside = (np.arange(case.n_k) < diag - left) | (np.arange(case.n_k) > diag + right)  # [n_k]
    assume(outside.any())
    factor = 10.0 if case.dtype == "float16" else 1e3
    where = outside[:, None]
    k2 = np.where(where, (case.values_like(rng, k.shape) * factor).astype(case.dtype), k)
    v2 = np.where(where, (case.values_like(rng, v.shape) * factor).astype(case.dtype), v)
    blind = held_fixed(target, case, np.asarray(~(case.visible(target) & outside).any(axis=-1)))  # [..., n_q]
    before, after = run(target, case, q, k, v), run(target, case, q, k2, v2)
    if target.exact_masking:
        bad = blind[..., None] & ~same_bits(before, after)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise AssertionError(
                f"changing keys outside window={case.window} of query {row} (keys < {diag - left} and "
                f"> {diag + right}) changed output {list(at)} from {float(before[at])!r} to "
                f"{float(after[at])!r}, though query {at[-2]} sees none of them")
    else:
        assert_matches(target, case, after, q, k, v, rows=blind,
                       what=f"after changing keys outside window={case.window}, the output")


@law(strategy=lambda t: window_cases(t, masks=("none", "random")), needs=needs_window)
def window_wider_than_sequence(target: Target, case: Case) -> None:
    """A window wider than the sequence on both sides (left, right ≥ n_q + n_k) equals no window
    (within tolerance; with causal, equals causal alone).

    Catches: a window edge computed as a negative Python index (``k[i − left : i + right + 1]``
    with i − left < 0 slices from the end, or nothing); a "no window" sentinel (−1) confused
    with a window wider than the sequence.
    """
    q, k, v = case.arrays()
    wide = (case.n_q + case.n_k + case.window[0] if case.window else 0,
            case.n_q + case.n_k + case.window[1] if case.window else 0)
    plain = dataclasses.replace(case, window=None)
    out = run(target, case, q, k, v, window=wide)
    assert_matches(target, plain, out, q, k, v, what=f"with window={wide}, the output")
    assert_same(target, plain, run(target, plain, q, k, v), out, q, k, v,
                what=f"window={wide} against no window")


@st.composite
def _unequal_cases(draw: st.DrawFn, target: Target) -> Case:
    case = draw(window_cases(target, causal=(False, True), n_k_min=2))
    assume(case.n_q != case.n_k)
    return case


@law(strategy=_unequal_cases, needs=needs_window)
def window_alignment(target: Target, case: Case) -> None:
    """With n_q ≠ n_k the window is centred on the target's declared diagonal: i (top_left) or
    i + n_k − n_q (bottom_right, square_or_decoding); the output matches that golden.

    Catches: a window aligned top-left while the causal mask is aligned bottom-right (or the
    reverse), so decoding with a KV cache slides every window by the cache length.
    """
    q, k, v = case.arrays()
    assert_matches(target, case, run(target, case, q, k, v), q, k, v,
                   what=f"with window={case.window} and n_q={case.n_q}, n_k={case.n_k} "
                        f"({target.alignment} diagonal), the output")


@law(strategy=lambda t: window_cases(t, causal=(True,)),
     needs=lambda t: needs_window(t) or (None if t.causal_alignment else "needs a causal mode"),
     requires="window= (supports_window) and a causal mode")
def window_with_causal(target: Target, case: Case) -> None:
    """``causal=True`` with ``window=(left, right)`` sees only the keys from diag − left to diag: it
    matches the golden, and equals ``window=(left, 0)`` with causal (the right side is cut by causal).

    Catches: a kernel that takes the window path and drops the causal mask (right > 0 then sees
    future keys); a causal mask and window composed with OR instead of AND.
    """
    q, k, v = case.arrays()
    assert case.window is not None
    out = run(target, case, q, k, v)
    assert_matches(target, case, out, q, k, v, what=f"causal with window={case.window}, the output")
    cut = (case.window[0], 0)
    assert_same(target, case, out, run(target, case, q, k, v, window=cut), q, k, v,
                what=f"causal with window={case.window} against window={cut}")
