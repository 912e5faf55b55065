"""Laws of the backward pass under the keywords of real kernels: the gradients under each
keyword a target declares (and the gradients of its extra inputs, ``dbias`` and ``dsinks``), keys
hidden by every cause, and dropout's kept set.

``grad_fn`` receives every keyword its forward receives (`spec.target.Target.grad_fn`); the golden
backward is composed from the keywords' declarations (`spec.oracle.gradients`), so a keyword
declared with terms is covered here without a line of its own. The core laws of the backward,
and the assertion every law here uses, are in `spec.laws.gradients`.
"""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from spec import oracle
from spec.call import call_grad
from spec.cases import Case, cases, one_of
from spec.inputs import Inputs
from spec.keywords import Keyword, Restricts
from spec.keywords.bias import BIAS
from spec.keywords.dropout import DROPOUT
from spec.keywords.sinks import SINKS
from spec.laws import _needs
from spec.laws._helpers import first_true, pattern_inputs, run_pattern, visible
from spec.laws.gradients import (
    N_MAX,
    assert_gradients_match,
    differentiable,
    empty_rows_give_zeros,
    grad_cases,
    unseen_keys,
    upstream,
    zero_rows_only,
)
from spec.registry import Need, law
from spec.target import Target

Array = np.ndarray

needs_keywords = Need(
    lambda t: None if differentiable(t) else
    "needs a keyword that changes the gradients (target declares none of bias, window, softcap, sinks, ...)",
    "a declared keyword that changes the gradients")


def keyword_cases(target: Target, keyword: Keyword) -> st.SearchStrategy[Case]:
    """Gradient cases drawing ``keyword``, with mask=, scale= and grouped K/V heads where taken."""
    return grad_cases(target, keywords=(keyword,), masks=("none", "random"), scale=True,
                      gqa=target.supports_gqa)


def _one_keyword(target: Target) -> st.SearchStrategy[Case]:
    """One of the target's keywords that change the gradients, drawn on a gradient case (each
    keyword's strategy made once: one built afresh for each example is validated afresh)."""
    branches = tuple(keyword_cases(target, kw) for kw in differentiable(target))

    @st.composite
    def one(draw: st.DrawFn) -> Case:
        return one_of(draw, branches)  # one choice of branch, as sampling the keywords was

    return one()


def keyword_matters(target: Target, case: Case, keyword: Keyword) -> bool:
    """Whether ``keyword`` moves the case's golden output by more than 1% of its size (so it moves
    the gradients too): a case where it matters, on at least two queries, two keys and two widths."""
    if min(case.n_q, case.n_k, case.d_k) < 2:
        return False
    inputs = case.inputs()
    given = oracle.golden_of(inputs, target.alignment)[0]
    plain = oracle.golden_of(inputs.replace(**dict.fromkeys(keyword.passes)), target.alignment)[0]
    moved = float(np.max(np.abs(given - plain), initial=0.0))
    return moved > 0.01 * float(np.max(np.abs(given), initial=0.0))


GRID_TRIES = 100
"""Cases generated, at most, to find each keyword's grid case (`keyword_grid`)."""


def keyword_grid(target: Target) -> list[Case]:
    """One case per keyword of `differentiable`, run before the random ones in every profile: the
    first case its strategy generates, from a fixed seed (so the same every run), in which the
    keyword changes the golden (`keyword_matters`), in the dtypes taken in turn (each case drawn
    in its own: `spec.laws.pairs.pair_grid` says why). A keyword for
    which `GRID_TRIES` cases give none has no grid case (the random ones still draw it)."""
    first = settings(database=None, max_examples=GRID_TRIES, phases=[Phase.generate], deadline=None,
                     suppress_health_check=list(HealthCheck))
    found = []
    for i, kw in enumerate(differentiable(target)):
        def matters(case: Case, kw: Keyword = kw) -> bool:
            return keyword_matters(target, case, kw)

        try:
            in_dtype = target.with_dtypes((target.dtypes[i % len(target.dtypes)],))
            case = find(keyword_cases(in_dtype, kw), matters, settings=first, random=random.Random(kw.name))
        except NoSuchExample:
            continue
        found.append(case)
    return found


@law(strategy=_one_keyword, needs=_needs.gradients & needs_keywords, grid=keyword_grid, scope="generic")
def grad_keywords_match_golden(target: Target, case: Case) -> None:
    """Under each keyword the target declares that changes the gradients (bias, ALiBi, window,
    softcap, sinks, key lengths, packed sequences: one per example, and one case per keyword in
    every profile), with mask= and scale= where taken, ``grad_fn`` given the forward's keywords
    returns the gradients of that call: dq, dk, dv and the declared extras (dbias, dsinks) match
    the golden backward within the tolerance policy.

    Catches: a backward that forgets the softcap's derivative 1 − tanh²(s/c) (exact wherever the
    cap is far, wrong where it bends); a bias, ALiBi slopes, a window, key lengths or packed
    sequences honoured by the forward kernel but not by the backward's recomputed pattern; the
    sink's share left out of the backward's denominator.
    """
    inputs = case.inputs()
    d_out = upstream(case)
    named = ", ".join(f"{name}={case.param(name)!r}" for name in case.keywords)
    assert_gradients_match(target, inputs, d_out, call_grad(target, inputs, d_out), what=f"with {named}, ")


# --- hidden keys --------------------------------------------------------------------------------


def hidden_inputs(case: Case) -> Inputs:
    """The case's inputs; with a bias drawn, the bias made full-shape with −inf on ~30% of the
    keys (for every query of a slice) and, in half the cases, on ~20% of the rows (whole rows)."""
    inputs = case.inputs()
    if case.param("bias") is None:
        return inputs
    rng = case.rng(14)
    shape = (*case.lead(), case.n_q, case.n_k)
    bias = np.broadcast_to(inputs.get("bias"), shape).copy()
    columns = rng.random((*shape[:-2], 1, case.n_k)) < 0.3
    rows = (rng.random((*shape[:-1], 1)) < 0.2) & (rng.random() < 0.5)
    bias[np.broadcast_to(columns | rows, shape)] = -np.inf
    return inputs.replace(bias=bias)


def _hiders(target: Target) -> list[Keyword | None]:
    """What may hide keys in a case: causal and mask= (None), each keyword that restricts what
    the queries see, and a bias (its −inf entries)."""
    restricting = [kw for kw in differentiable(target) if any(isinstance(t, Restricts) for t in kw.terms)]
    return [None, *restricting, *([BIAS] if target.supports_bias else [])]


@st.composite
def _hidden_cases(draw: st.DrawFn, target: Target) -> Case:
    kw = draw(st.sampled_from(_hiders(target)))
    masks = ("random", "rows") if target.supports_mask else ("none",)
    drawn = draw(cases(target, n_max=N_MAX, n_k_min=2, masks=masks, gqa=target.supports_gqa,
                       causal=(True,) if kw is None and not target.supports_mask else (False, True),
                       keywords=() if kw is None else (kw,)))
    return drawn


def _hides_something(target: Target, case: Case) -> bool:
    inputs = hidden_inputs(case)
    return empty_rows_give_zeros(target, inputs) and not visible(target, inputs).all()


hides_keys = Need(
    lambda t: None if _hiders(t) != [None] or t.causal_alignment or t.supports_mask else
    "needs a way to hide keys (causal, mask=, window=, kv_lengths=, packed sequences or bias=)",
    "a way to hide keys (causal, mask=, a keyword)")


@law(strategy=lambda t: _hidden_cases(t).filter(lambda c: _hides_something(t, c)),
     needs=_needs.gradients & _needs.exact_masking & hides_keys)
def grad_hidden_keys_get_nothing(target: Target, case: Case) -> None:
    """A key hidden from every query — by the causal mask, mask=, a window, key lengths, another
    packed sequence or a −inf bias — gets exactly zero dk and dv; a query that sees no key gets
    exactly zero dq (its output is zeros); no gradient is NaN or infinite; and a declared dbias
    is exactly zero where its bias hides a key.

    Catches: a backward that recomputes the pattern with a finite fill (−1e9) for hidden keys, so
    a row that sees nothing — zeros in the forward — is uniform in the backward and sends
    gradient to keys no query sees; a plain softmax in the backward, 0/0 = NaN on such a row.
    """
    inputs = hidden_inputs(case)
    d_out = upstream(case)
    vis = np.broadcast_to(visible(target, inputs), (*inputs.lead, inputs.n_q, inputs.n_k))
    dq, dk, dv, extras = call_grad(target, inputs, d_out)
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv), *extras.items()):
        if (at := first_true(~np.isfinite(g))) is not None:
            raise AssertionError(f"{name} {list(at)} is {float(g[at])!r} for finite inputs")
    unseen = unseen_keys(inputs, vis)[..., None]
    blind = np.asarray(~vis.any(axis=-1))[..., None]
    checks = [("dk", dk, unseen, "a key that no query sees"), ("dv", dv, unseen, "a key that no query sees"),
              ("dq", dq, blind, "a query that sees no key")]
    if "dbias" in extras and extras["dbias"].shape == vis.shape:
        checks.append(("dbias", extras["dbias"], ~vis, "a hidden key"))
    for name, g, where, which in checks:
        bad = np.broadcast_to(where, g.shape) & (g != 0)
        if (at := first_true(bad)) is not None:
            raise AssertionError(f"{name} {list(at)} is {float(g[at])!r}, not 0, for {which}")


# --- the extras: dbias, dsinks ------------------------------------------------------------------


@st.composite
def _broadcast_bias_cases(draw: st.DrawFn, target: Target) -> Case:
    case = draw(cases(target, ndims=(4,), n_max=32, masks=("none", "random"), keywords=(BIAS,)))
    case = case.replace(batch=max(case.batch, 2), heads=max(case.heads, 2), kv_heads=None)
    return case.with_keyword("bias", (case.param("bias")[0], draw(st.sampled_from(("heads", "batch")))))


@law(strategy=lambda t: zero_rows_only(t, _broadcast_bias_cases(t)),
     needs=_needs.keyword(BIAS) & _needs.gradients & _needs.grad_extra("dbias") & _needs.ndim(4))
def grad_bias_broadcast_summed(target: Target, case: Case) -> None:
    """A bias broadcast over the heads (``[batch, 1, n_q, n_k]``) or over the batch
    (``[1, heads, n_q, n_k]``), two or more of each, gets ``dbias`` in its own shape: the sum of
    dS over the axis it was broadcast along, matching the golden backward (as dq, dk, dv do).

    Catches: dbias of a broadcast bias taken from one slice (head 0, batch row 0) instead of
    summed over the copies — right whenever there is one head or one batch row; dbias averaged
    instead of summed.
    """
    inputs = case.inputs()
    d_out = upstream(case)
    assert_gradients_match(target, inputs, d_out, call_grad(target, inputs, d_out),
                           what=f"with a bias of shape {inputs.get('bias').shape}, ")


@st.composite
def _per_head_sink_cases(draw: st.DrawFn, target: Target) -> Case:
    gqa = target.supports_gqa and draw(st.booleans())
    case = draw(cases(target, ndims=(3, 4), n_max=32, masks=("none", "random"), gqa=gqa, keywords=(SINKS,)))
    case = case if case.heads >= 2 else case.replace(heads=2, kv_heads=None)
    sinks = tuple(float(x) for x in np.linspace(-4.0, 4.0, case.heads))  # one distinct sink per head
    return case.with_keyword("sinks", sinks[::-1] if draw(st.booleans()) else sinks)


@law(strategy=lambda t: zero_rows_only(t, _per_head_sink_cases(t)),
     needs=_needs.keyword(SINKS) & _needs.gradients & _needs.grad_extra("dsinks") & _needs.ndim(3, 4))
def grad_sinks_per_head(target: Target, case: Case) -> None:
    """With one distinct sink per query head (and grouped K/V heads when the target takes them),
    ``dsinks`` is ``[heads]``, each head's the sum over its batch rows and queries of
    −p_sink·Σ_j p_j dP_j, matching the golden backward (as dq, dk, dv do).

    Catches: dsinks accumulated per K/V head (each query head given its group's sum), as a
    backward that loops over K/V heads does; dsinks of head 0 for every head.
    """
    inputs = case.inputs()
    d_out = upstream(case)
    assert_gradients_match(target, inputs, d_out, call_grad(target, inputs, d_out),
                           what=f"with sinks {case.param('sinks')}, ")


# --- dropout ------------------------------------------------------------------------------------


def dropout_cases(target: Target) -> st.SearchStrategy[Case]:
    return grad_cases(target, n_max=32, masks=("none", "random"), values=("normal",), keywords=(DROPOUT,))


def kept_set(target: Target, case: Case) -> Array:  # -> [*lead, n_q, n_k] float64: 0 or 1/(1 − p)
    """The forward's dropout multiplier for the case's seed, read through V = I: a dropped weight
    is exactly 0 in the pattern (0 times anything, summed with exact zeros), a kept one is not
    (unless its weight underflows, where it carries no gradient either)."""
    p = float(case.inputs().get("dropout_p"))
    return np.where(run_pattern(target, pattern_inputs(case)) != 0, 1.0 / (1.0 - p), 0.0)


@law(strategy=dropout_cases, needs=_needs.keyword(DROPOUT) & _needs.gradients)
def grad_dropout_uses_forward_kept_set(target: Target, case: Case) -> None:
    """With ``dropout_p`` and ``seed``, the backward is that of the forward's own dropout: read the
    kept set from the forward with the same seed (through V = I), the gradients match the golden
    backward of ``out = (P ∘ K) V`` with K = 1/(1 − p) where kept and 0 where dropped.

    Catches: a backward that draws its own mask (another generator, or the seed's next stream), so
    gradients flow through weights the forward dropped; the kept weights' 1/(1 − p) left out of
    the backward (every gradient shrinks by 1 − p).
    """
    inputs = case.inputs()
    d_out = upstream(case)
    keep = kept_set(target, case)
    assert_gradients_match(target, inputs, d_out, call_grad(target, inputs, d_out), keep=keep,
                           what=f"with dropout_p={inputs.get('dropout_p')}, seed={inputs.get('seed')} "
                                "(the forward's kept set), ")
