"""Laws at the edges of the input space: no keys at all.

A batch padded to a common length, a cache not yet filled or a varlen sequence of length zero
hands a kernel n_k = 0. Nothing is visible to any query, so the output is what the target's
masked-row policy promises for a row that sees no key (`spec.Target.masked_rows`), or the
target declares that it refuses such input (`spec.Target.empty_keys`) and then says so with
an exception, never with a silent NaN.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st

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
    ``zeros`` and ``uniform`` (the empty sum), NaN for ``nan``. A target that declares
    ``empty_keys="raise"`` must instead raise ValueError or TypeError, with a message.

    Catches: an online softmax dividing its accumulator by a zero denominator (0/0 = NaN where
    zeros were promised); a row maximum taken without an initial value, which crashes on an empty
    axis; a target that declares it refuses n_k = 0 and returns NaN instead.
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
    out = call(target, inputs)
    assert out.dtype == inputs.q.dtype, (f"with no keys the output dtype is {out.dtype}, "
                                         f"inputs are {inputs.q.dtype}")
    policy = target.policy("no_keys")
    want = EMPTY_ROW.get(policy)
    if want is None:
        return
    got = out.astype(np.float64)
    ok = np.isnan(got) if want == "nan" else got == 0
    if (at := first_true(~ok)) is not None:
        raise AssertionError(f"with no keys (n_k = 0), output {list(at)} is {float(got[at])!r}; the target "
                             f"declares {policy!r} for rows that see no key (no_keys), so each must be "
                             f"{'NaN' if want == 'nan' else 'exactly 0'}")
