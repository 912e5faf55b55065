"""Laws of a past key/value cache passed beside the new keys (``past_key=``, ``past_value=``):
ONNX's ``Attention`` inputs of the same names, which return ``present_key`` and ``present_value``
beside the output — the cache a decoder hands to its next step.

A call with a past cache attends to the past keys followed by its own:

    K = concat(past_key, k), V = concat(past_value, v)  along the key axis   [..., g, n_past + n_k, d]

and returns ``(out, present_key, present_value)``, the presents exactly K and V, bit for bit (a
cache that rounds, reorders or drops a key poisons every later step). With ``causal=True`` the
call's queries continue the past: query i sits at position n_past + i, so it sees keys
j ≤ n_past + i (ONNX's offset-aligned causal mask, whatever the target's alignment without a past;
a bottom-right target agrees whenever the new keys are the queries' own, n_k = n_q, as in
decoding and chunked prefill — the laws draw causal calls only so).

The declaration (`PAST`, in `spec.keywords.past`) says how a case splits its keys into a past and
a call (``writes``) and how the oracle joins them again (its `spec.keywords.Reads` term), so the
golden is the concatenation's. It draws no cases of its own for other laws: a target returns a tuple with a
past, so only these laws pass one.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from spec import oracle
from spec.call import call
from spec.cases import Case, between, cases, pick
from spec.inputs import Inputs
from spec.keywords.past import PAST
from spec.laws import _needs
from spec.laws._helpers import (
    assert_empty_rows_follow_policy,
    assert_matches,
    assert_same,
    first_true,
    run,
    visible,
)
from spec.registry import law
from spec.target import Target

Array = np.ndarray


needs_past = _needs.keyword(PAST)


def _gqa_choices(t: Target) -> tuple[bool, ...]:
    return (False, True) if t.supports_gqa and 4 in t.ndims else (False,)


@st.composite
def past_cases(draw: st.DrawFn, t: Target) -> Case:
    """A case whose keys are split into a past of 1–24 and the call's own (at least one; the
    queries' own, n_k = n_q, when causal), with a mask over all of them where the target takes
    one, a scale, grouped K/V heads where it has them."""
    gqa = pick(draw, _gqa_choices(t))
    case = draw(cases(t, ndims=(4,) if gqa else (2, 3, 4), n_max=24, values=("normal",), gqa=gqa, scale=True,
                      masks=("none", "random") if t.supports_mask else ("none",)))
    n_past = draw(between(1, 24))
    n_new = case.n_q if case.causal else case.n_k
    return case.replace(n_k=n_past + n_new).with_keyword("past_kv", n_past)


def run_past(target: Target, inputs: Inputs) -> tuple[Array, Array, Array]:
    """``(out, present_key, present_value)`` of a call with a past cache: the output as float64,
    the presents as returned."""
    out, present_key, present_value = call(target, inputs)
    return out.astype(np.float64), present_key, present_value


def _concatenated(target: Target, inputs: Inputs) -> Inputs | None:
    """The same call on the concatenated keys and values, without the past: what each query sees
    kept by a mask (the past's causal diagonal is n_past + i, not the target's own), or None when
    that needs a mask the target does not take."""
    meant = oracle.meaning(inputs)
    plain = meant.replace(past_key=None, past_value=None)
    if not inputs.causal:
        return plain
    if not target.supports_mask:
        return None
    return plain.replace(causal=False, mask=np.ascontiguousarray(visible(target, inputs)))


@law(strategy=past_cases, needs=needs_past)
def past_kv_matches_concatenation(target: Target, case: Case) -> None:
    """A call with a past cache (``past_key=``, ``past_value=``: the case's first 1–24 keys and
    values) gives the output of the call on the concatenated keys and values — the float64 golden
    of concat(past, k) and concat(past, v), and the target's own call on them (within twice the
    tolerance), causal queries continuing the past (query i sees keys j ≤ n_past + i, passed as a
    mask to the concatenated call); rows that see no key hold the declared policy.

    Catches: a past cache ignored (the call attends to its own keys only); the past appended after
    the new keys, so that a causal query sees the wrong keys; causal queries aligned top-left on
    the concatenation (query i sees only the first i + 1 past keys).
    """
    inputs = case.inputs()
    out, _, _ = run_past(target, inputs)
    assert_empty_rows_follow_policy(target, inputs, out)
    n_past = case.param("past_kv")
    assert_matches(target, inputs, out, what=f"with a past cache of {n_past} keys, the output")
    plain = _concatenated(target, inputs)
    if plain is not None:
        assert_same(target, inputs, run(target, plain), out,
                    what=f"with a past cache of {n_past} keys against the call on the concatenation")


def _bits(x: Array) -> Array:
    x = np.ascontiguousarray(x)
    return x.view(f"u{x.dtype.itemsize}")


@law(strategy=past_cases, needs=needs_past)
def present_kv_is_concatenation(target: Target, case: Case) -> None:
    """The presents a call with a past cache returns are exactly the concatenations, bit for bit:
    ``present_key`` = concat(past_key, k) and ``present_value`` = concat(past_value, v) along the
    key axis, in the keys' dtype and layout — the cache the next step reads.

    Catches: the new keys prepended to the past (concat(k, past_key)); the present holding the
    past alone, or the new keys alone; keys and values swapped; a cache rounded through another
    dtype.
    """
    inputs = case.inputs()
    _, present_key, present_value = run_past(target, inputs)
    meant = oracle.meaning(inputs)
    for name, got, want in (("present_key", present_key, meant.k), ("present_value", present_value, meant.v)):
        same = _bits(got) == _bits(want)
        if (at := first_true(~same)) is not None:
            raise AssertionError(f"{name} {list(at)} is {float(got[at])!r}, but concat(past, new) there is "
                                 f"{float(want[at])!r} (a past of {case.param('past_kv')} keys, then the "
                                 f"call's {inputs.n_k})")
