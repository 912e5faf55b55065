"""Laws of ``window=(left, right)``: query i sees keys ``diag − left .. diag + right``, where
``diag`` is i (top-left) or i + n_k − n_q (bottom-right), per the target's ``causal_alignment``
(per batch row, i + kv_lengths[b] − n_q, for ``kv_lengths`` and over a paged cache;
FlashAttention's ``window_size``, Mistral's sliding window); ANDed with ``causal`` and ``mask``.

Public off-by-one reports: transformers#39408 and vllm#3385.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec import oracle
from spec.cases import Case, cases
from spec.keywords.kv_lengths import KV_LENGTHS
from spec.keywords.window import WINDOW, window_visible
from spec.laws import _needs
from spec.laws._helpers import assert_hidden_unmoved, assert_matches, assert_same, run
from spec.registry import Need, law
from spec.target import Target

Array = np.ndarray


needs_window = _needs.keyword(WINDOW)


def window_cases(target: Target, **given: object) -> st.SearchStrategy[Case]:
    return cases(target, n_max=48, keywords=(WINDOW,), **given)  # type: ignore[arg-type]


@law(strategy=lambda t: window_cases(t, masks=("none", "random")), needs=needs_window)
def window_matches_golden(target: Target, case: Case) -> None:
    """With ``window=(left, right)`` every row that sees a key matches the float64 golden, whose
    query i sees keys diag − left ≤ j ≤ diag + right (ANDed with causal and mask=).

    Catches: a window of left + 1 or left − 1 keys (an off-by-one at its edge: transformers#39408,
    vllm#3385); left and right swapped.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with window={case.param('window')}, the output")


@law(strategy=lambda t: window_cases(t, masks=("none", "random"), n_k_min=2), needs=needs_window)
def window_no_leak(target: Target, case: Case) -> None:
    """Changing the keys and values outside one query's window (before diag − left and after
    diag + right) leaves every row that sees none of them bit-identical (within tolerance if the
    target declares exact_masking=False): nothing outside a window leaks in.

    Catches: a window edge off by one (key diag − left − 1 still seen, transformers#39408); a
    window applied to the scores' maximum but not to the sum, so hidden keys move the rounding.
    """
    inputs = case.inputs()
    window = case.param("window")
    row = int(case.rng(21).integers(0, case.n_q))
    outside = ~window_visible(oracle.geometry(target.alignment, inputs), window)[..., row, :]  # [n_k]
    assume(outside.any())
    assert_hidden_unmoved(target, case, inputs, outside,
                          what=f"changing keys outside window={window} of query {row}")


def _left_only(target: Target) -> bool:
    return target.window_sides == "left"


widened_by_causal = Need(
    lambda t: "needs a causal mode to widen a left-only window into no window (target declares "
              "window_sides='left' and causal_alignment=None)" if _left_only(t) and not t.causal_alignment
    else None,
    "a causal mode, for a left-only window (window_sides='left')")


@law(strategy=lambda t: window_cases(t, masks=("none", "random"),
                                     causal=(True,) if _left_only(t) else (False, True)),
     needs=needs_window & widened_by_causal)
def window_wider_than_sequence(target: Target, case: Case) -> None:
    """A window wider than the sequence on both sides (left, right ≥ n_q + n_k) equals no window
    (within tolerance; with causal, equals causal alone). For a target whose windows have a left
    side only (``window_sides="left"``) the window is ``(left ≥ n_q + n_k, 0)`` with causal, which
    equals causal alone.

    Catches: a window edge computed as a negative Python index (``k[i − left : i + right + 1]``
    with i − left < 0 slices from the end, or nothing); a "no window" sentinel (−1) confused
    with a window wider than the sequence.
    """
    left, right = case.param("window")
    wide = (case.n_q + case.n_k + left, 0 if _left_only(target) else case.n_q + case.n_k + right)
    inputs = case.inputs().replace(window=wide)
    out = run(target, inputs)
    assert_matches(target, inputs, out, what=f"with window={wide}, the output")
    plain = inputs.replace(window=None)
    assert_same(target, plain, run(target, plain), out, what=f"window={wide} against no window")


@st.composite
def _unequal_cases(draw: st.DrawFn, target: Target) -> Case:
    case = draw(window_cases(target, causal=(False, True), n_k_min=2))
    assume(case.n_q != case.n_k)
    return case


@law(strategy=_unequal_cases, needs=needs_window)
def window_alignment(target: Target, case: Case) -> None:
    """With n_q ≠ n_k the window is centred on the target's declared diagonal: i (top_left) or
    i + n_k − n_q (bottom_right, square_or_decoding, kv_lengths); the output matches that golden.

    Catches: a window aligned top-left while the causal mask is aligned bottom-right (or the
    reverse), so decoding with a KV cache slides every window by the cache length.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with window={case.param('window')} and n_q={case.n_q}, n_k={case.n_k} "
                        f"({target.alignment} diagonal), the output")


@law(strategy=lambda t: window_cases(t, causal=(True,)), needs=needs_window & _needs.causal_mode &
     _needs.not_declared("window_sides", "left", "a window with a right side"))
def window_with_causal(target: Target, case: Case) -> None:
    """``causal=True`` with ``window=(left, right)`` sees only the keys from diag − left to diag: it
    matches the golden, and equals ``window=(left, 0)`` with causal (the right side is cut by causal).

    Catches: a kernel that takes the window path and drops the causal mask (right > 0 then sees
    future keys); a causal mask and window composed with OR instead of AND.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    window = case.param("window")
    assert_matches(target, inputs, out, what=f"causal with window={window}, the output")
    cut = (window[0], 0)
    assert_same(target, inputs, out, run(target, inputs.replace(window=cut)),
                what=f"causal with window={window} against window={cut}")


@law(strategy=lambda t: cases(t, n_max=48, ndims=(4,), keywords=(KV_LENGTHS, WINDOW)),
     needs=needs_window & _needs.keyword(KV_LENGTHS) & _needs.ndim(4))
def window_with_kv_lengths(target: Target, case: Case) -> None:
    """A window together with ``kv_lengths`` hides what either hides: the output matches the
    golden, and changing the keys past each row's length moves no row.

    Catches: a sliding-window code path that builds its own mask and drops the key lengths (the
    padded keys inside the window are then attended); a window measured from the row's length
    instead of the declared diagonal.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    assert_matches(target, inputs, out, what=f"with window={case.param('window')} and kv_lengths, the output")
    past = np.arange(case.n_k) >= np.asarray(case.param("kv_lengths"))[:, None, None]  # [batch, 1, n_k]
    assert_hidden_unmoved(target, case, inputs, past, before=out, what="changing the keys past kv_lengths")
