"""Laws at the edges of the input space: no keys at all.

A batch padded to a common length, a cache not yet filled or a varlen sequence of length zero
hands a kernel n_k = 0. Nothing is visible to any query, so the output is what the target's
masked-row policy promises for a row that sees no key (`spec.Target.masked_rows`), or the
target refuses such input with an exception, never with a silent NaN. By default
(``empty_keys="either"``) both are kept, and the law's note says which the target did: a plain
textbook softmax refuses (NumPy's row maximum over an empty axis raises), and that is a clear
answer, not a bug. ``empty_keys="compute"`` promises the output; ``"raise"`` a ValueError or
TypeError.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st

from spec import context
from spec.call import call
from spec.cases import Case, cases
from spec.laws._helpers import first_true
from spec.registry import law
from spec.target import Target, TargetFailed

Array = np.ndarray

# What a row over no keys holds under each masked-row policy: zeros, uniform and unmasked agree
# (the weighted sum of no values is the empty sum, 0: a finite mask or fill over no keys leaves no
# weights at all); nan: the plain softmax's 0/0; any: not tested.
EMPTY_ROW = {"zeros": "zeros", "uniform": "zeros", "unmasked": "zeros", "nan": "nan"}


def _empty_key_cases(t: Target) -> st.SearchStrategy[Case]:
    """Cases as drawn for every law (shapes, dtypes, causal), then with the keys removed (and the
    causal mode, for a target that defines it only for n_q ≤ n_k: `Target.queries_within_keys`)."""
    return cases(t, n_max=64).map(lambda c: dataclasses.replace(
        c, n_k=0, causal=c.causal and not t.queries_within_keys))


@law(strategy=_empty_key_cases)
def empty_keys(target: Target, case: Case) -> None:
    """With no keys (n_k = 0) the output has shape (..., n_q, d_v) and the inputs' dtype, and each
    row is what the target's masked-row policy gives a row that sees no key: exact zeros for
    ``zeros`` and ``uniform`` (the empty sum), NaN for ``nan``; or the target refuses the call by
    raising an exception (by default either; ``empty_keys="compute"``: the output;
    ``empty_keys="raise"``: ValueError or TypeError, with a message).

    Catches: an online softmax dividing its accumulator by a zero denominator (0/0 = NaN where
    zeros were promised); an early return of ``zeros_like(q)`` (width d_k, not d_v); a row maximum
    taken without an initial value, which crashes on an empty axis, in a target that promises to
    compute; a target that declares it refuses n_k = 0 and returns NaN instead.
    """
    inputs = case.inputs()
    if target.empty_keys == "raise":
        try:
            out = call(target, inputs)
        except TargetFailed as e:
            cause = e.__cause__
            assert isinstance(cause, ValueError | TypeError) and str(cause).strip(), (
                f"with no keys the target (empty_keys='raise') must raise ValueError or TypeError with a "
                f"message; {e}"
            )
            return
        raise AssertionError(f"the target declares empty_keys='raise' but returned an output of shape "
                             f"{out.shape} for n_k = 0 (first entries {out.reshape(-1)[:3]!r})")
    try:
        out = call(target, inputs)
    except TargetFailed as e:
        if e.raised is None:  # a crash, an output of the wrong shape: no refusal
            raise
        if target.empty_keys == "compute":
            raise TargetFailed(f"{e}; the target declares empty_keys='compute' (an output for n_k = 0)",
                               raised=e.raised) from e.__cause__
        _say(target, f"refused n_k = 0 with {_shown(e.raised)}")
        return
    assert out.dtype == inputs.q.dtype, (f"with no keys the output dtype is {out.dtype}, "
                                         f"inputs are {inputs.q.dtype}")
    policy = target.policy("no_keys")
    want = EMPTY_ROW.get(policy)
    if want is None:
        _say(target, "returned an output for n_k = 0 (its values not checked: no_keys policy 'any')")
        return
    got = out.astype(np.float64)
    ok = np.isnan(got) if want == "nan" else got == 0
    if (at := first_true(~ok)) is not None:
        raise AssertionError(f"with no keys (n_k = 0), output {list(at)} is {float(got[at])!r}; the target "
                             f"declares {policy!r} for rows that see no key (no_keys), so each must be "
                             f"{'NaN' if want == 'nan' else 'exactly 0'}")
    _say(target, f"returned {'NaN rows' if want == 'nan' else 'zeros'} for n_k = 0")


def _say(target: Target, text: str) -> None:
    """Under ``empty_keys="either"``: say in the law's note what the target did with no keys
    (each outcome once, however many examples had it)."""
    run = context.current()
    if target.empty_keys != "either":
        return
    kind = text.split(" ", 1)[0]  # "refused" or "returned": the first of each kind is said
    if run is not None and not any(note.split(" ", 1)[0] == kind for note in run.notes):
        run.note(text)


def _shown(raised: str, width: int = 100) -> str:
    """An exception as ``Type: message``, its first line, at most ``width`` characters."""
    line = raised.strip().splitlines()[0] if raised.strip() else raised
    return line if len(line) <= width else line[:width - 1] + "…"
