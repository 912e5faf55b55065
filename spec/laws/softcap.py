"""Laws of ``softcap=c``: logit soft-capping (Gemma 2, FlashAttention's ``softcap``) — the
scaled scores ``s`` become ``c·tanh(s / c)`` before the bias and the masks, so they never exceed
c in magnitude and a hidden key stays hidden.

Each law needs ``supports_softcap``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from hypothesis import strategies as st

from spec import dtypes, tolerance
from spec.cases import Case, cases
from spec.laws._helpers import (
    assert_matches,
    assert_same,
    held_fixed,
    needs_keyword,
    pattern,
    run,
    same_bits,
    sees_any,
)
from spec.laws._range import at_edge
from spec.registry import law
from spec.target import Target

Array = np.ndarray

needs_softcap = needs_keyword("softcap")

CAPS = (1.0, 5.0, 20.0, 50.0)  # Gemma 2 caps attention logits at 50


@st.composite
def softcap_cases(draw: st.DrawFn, target: Target, **given: object) -> Case:
    """Cases with a cap c from :data:`CAPS` and scores of magnitude ~c (amplitude up
    to 4c), so the cap bends them."""
    case = draw(cases(target, n_max=48, values=("normal",), **given))  # type: ignore[arg-type]
    c = draw(st.sampled_from(CAPS))
    return dataclasses.replace(case, softcap=c, amplitude=draw(st.sampled_from((1.0, c, 4 * c))))


@law(strategy=lambda t: softcap_cases(t, masks=("none", "random"), scale=True), needs=needs_softcap)
def softcap_matches_golden(target: Target, case: Case) -> None:
    """With ``softcap=c`` the output equals the float64 golden of softmax(c·tanh(s/c))·V, s the
    scaled scores, within the tolerance policy.

    Catches: the cap applied before the scale (c·tanh(q·k/c)·scale); the cap written c·tanh(s)
    (without dividing by c); the cap applied after the mask, so −inf becomes −c and hidden keys
    get weight (see softcap_keeps_hidden_keys_hidden).
    """
    q, k, v = case.arrays()
    assert_matches(target, case, run(target, case, q, k, v), q, k, v,
                   what=f"with softcap={case.softcap:g}, the output")


@st.composite
def _huge_cases(draw: st.DrawFn, target: Target) -> Case:
    base = cases(target, pattern=True, n_max=48, values=("normal",))
    case = draw(at_edge(base, fractions=(0.01, 0.1, 0.5)))
    return dataclasses.replace(case, softcap=draw(st.sampled_from(CAPS)))


@law(strategy=_huge_cases, needs=needs_softcap, reads_pattern=True)
def softcap_bounds_scores(target: Target, case: Case) -> None:
    """Capped scores never exceed c in magnitude, however large the logits: with scores up to
    the edge of the dtype's range, every visible weight (read via V = I) is finite and within a
    factor e^(2c) of its row's largest, and the output matches the golden.

    Catches: tanh computed as (e^(2x) − 1)/(e^(2x) + 1), which overflows to inf/inf = NaN for
    large logits; a one-sided cap (only positive scores capped), which lets a very negative score
    vanish to weight 0 instead of e^(−2c) of the largest.
    """
    p, q, k = pattern(target, case)
    rows = sees_any(target, case)
    vis = case.visible(target)
    bad = rows[..., None] & ~np.isfinite(p)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"weight {list(at)} is {p[at]} with softcap={case.softcap:g} and scores "
                             f"of magnitude ~{case.amplitude:.3g}")
    c = float(case.softcap or 0)
    top = np.max(np.where(vis, p, 0.0), axis=-1, keepdims=True)
    # Each capped score lies in [−c, c]: no visible weight falls below e^(−2c) of the row's top,
    # less what rounding may take (relative eps·(scores up to 2c)); checked where that bound is a
    # normal number of the dtype with room to spare.
    work = target.precision(case.dtype)
    rel = target.tolerance * tolerance.weight_sum_slack(work, case.n_k, 4 * c)
    floor = top * math.exp(-2 * c) * (1 - rel)
    low = vis & rows[..., None] & (p < floor) & (floor >= 16 * dtypes.tiny(work))
    if low.any():
        at = tuple(int(i) for i in np.argwhere(low)[0])
        raise AssertionError(
            f"weight {list(at)} is {float(p[at]):.3g}, below e^(−2c) = {math.exp(-2 * c):.3g} of its "
            f"row's largest {float(top[at[:-1]][0]):.3g}: a score beyond −c survived softcap={c:g}")
    assert_matches(target, case, p, q, k, np.broadcast_to(np.eye(case.n_k, dtype=case.dtype),
                                                          (*case.kv_lead, case.n_k, case.n_k)),
                   what=f"with softcap={c:g} and huge scores, the pattern")


@law(strategy=lambda t: softcap_cases(t, masks=("random",), causal=(False, True), n_k_min=2),
     needs=lambda t: needs_softcap(t) or (None if t.supports_mask or t.causal_alignment
                                          else "needs mask= or a causal mode to hide keys"),
     requires="softcap= (supports_softcap) and mask= or a causal mode")
def softcap_keeps_hidden_keys_hidden(target: Target, case: Case) -> None:
    """A key hidden by the mask or the causal mask stays hidden after capping: the output
    matches the golden, and changing every hidden key and value (×1e3; ×10 in float16) leaves the
    rows bit-identical (within tolerance if the target declares exact_masking=False).

    Catches: the cap applied after masking, c·tanh(−inf/c) = −c, so every hidden key gets
    weight e^(−2c) relative to the top instead of 0 (the Gemma 2 order is cap, then mask).
    """
    q, k, v = case.arrays()
    vis = case.visible(target)
    out = run(target, case, q, k, v)
    assert_matches(target, case, out, q, k, v,
                   what=f"with softcap={case.softcap:g} and hidden keys, the output")
    # Change the keys one query cannot see; rows that see none of them must not move.
    row = int(case.rng(31).integers(0, case.n_q))
    changed = ~vis[..., row, :]  # [*lead, n_k]
    blind = held_fixed(target, case, ~(vis & changed[..., None, :]).any(axis=-1))  # [*lead, n_q]
    rng = case.rng(32)
    factor = 10.0 if case.dtype == "float16" else 1e3
    k2 = np.where(changed[..., None], (case.values_like(rng, k.shape) * factor).astype(case.dtype), k)
    v2 = np.where(changed[..., None], (case.values_like(rng, v.shape) * factor).astype(case.dtype), v)
    after = run(target, case, q, k2, v2)
    if target.exact_masking:
        bad = blind[..., None] & ~same_bits(out, after)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise AssertionError(f"with softcap={case.softcap:g}, changing keys hidden from query {at[-2]} "
                                 f"changed output {list(at)} from {float(out[at])!r} to {float(after[at])!r}")
    else:
        assert_matches(target, case, after, q, k, v, rows=blind,
                       what="after changing hidden keys, the output")


@law(strategy=lambda t: softcap_cases(t, masks=("none", "random")), needs=needs_softcap)
def softcap_far_above_is_no_cap(target: Target, case: Case) -> None:
    """A cap far above every score (c = 4·max|s|/√eps, where c·tanh(s/c) = s·(1 − s²/(3c²)) is s
    to within eps/48 relative) equals no cap, within tolerance.

    Catches: a cap that always applies tanh without the c factors (tanh(s), squashing every score
    into [−1, 1]); a softcap argument that turns on a different, less accurate code path.
    """
    q, k, v = case.arrays()
    s = np.abs(q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)).max(initial=0.0)
    far = float(max(1.0, 4 * s / np.sqrt(dtypes.eps(target.precision(case.dtype)))))
    plain = dataclasses.replace(case, softcap=None)
    out = run(target, case, q, k, v, softcap=far)
    assert_matches(target, plain, out, q, k, v, what=f"with softcap={far:.3g}, the output")
    assert_same(target, plain, run(target, plain, q, k, v), out, q, k, v,
                what=f"softcap={far:.3g} against no cap")
