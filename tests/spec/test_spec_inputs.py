"""spec.inputs.Inputs: one call's arguments, and what has been worked out from them kept with them."""

from __future__ import annotations

from spec import oracle
from spec.cases import Case


def test_a_replace_that_changes_nothing_keeps_what_the_inputs_worked_out():
    """``replace`` that changes nothing (removing a keyword not passed, as every plain call does
    with ``return_lse=None``) gives the same Inputs, what it has worked out included; a copy would
    work out the keys' meaning, the keywords' terms and the geometry again on every call."""
    inputs = Case(dtype="float32", ndim=2, batch=1, heads=1, n_q=3, n_k=4, d_k=2, d_v=2, seed=1).inputs()
    oracle.meaning(inputs)
    assert inputs.replace(return_lse=None) is inputs
    changed = inputs.replace(return_lse=True)
    assert changed is not inputs and changed.get("return_lse") is True and not changed.memo
    assert changed.replace(return_lse=None).get("return_lse") is None
