"""Laws for a target's backward pass: gradients of ``L = Σ out ∘ dO`` against the float64 golden
backward, the masks' exactness in the backward, grouped K/V heads, and a backward handed its
forward's ``out`` and ``lse``. The laws of the backward under each keyword are
`spec.laws.grad_keywords`.

A target declares ``grad_fn(q, k, v, d_out, *, causal=False, **keywords) -> (dq, dk, dv)``,
receiving every keyword its forward receives; these laws skip any target that declares none.
The golden backward is `spec.golden.backward` composed for the call by `spec.oracle.gradients`
(written independently of ``impl.grad``: it pushes ``dP = dO vᵀ`` through each row's explicit
softmax Jacobian ``J = diag(p) − p pᵀ``, no ``D = rowsum(dO ∘ O)`` shortcut). The tolerance
policy is the forward's (`spec.tolerance`) with the baseline the textbook backward in the
target's dtype (`spec.tolerance.baseline_backward`), a gradient floor
(`spec.tolerance.grad_floors`), and the factor ``GRAD_FACTOR · target.tolerance`` (see
`GRAD_FACTOR` for why gradients need more).

Listed in `spec.registry.LAW_MODULES`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from spec import compared, golden, oracle, tolerance
from spec.call import call, call_grad
from spec.cases import Case, cases
from spec.inputs import Inputs
from spec.keywords import Keyword, Leaves, registered
from spec.laws import _needs
from spec.laws._helpers import (
    assert_within_tolerance,
    first_true,
    observe,
    perturbed,
    precision_text,
    visible,
)
from spec.registry import Need, law
from spec.target import Target

Array = np.ndarray
Grads = tuple[Array, Array, Array, dict[str, Array]]

GRAD_FACTOR = 2.0
"""Gradients are allowed ``GRAD_FACTOR`` times the forward's k (so 4 for the default k = 2) times
the naive backward's error, plus the gradient floor. The backward has a cancellation the forward
lacks, ``dS = P ∘ (dP − D)``: where ``dP ≈ D`` a correct backward and the naive baseline lose
different digits, so their errors are less alike than forward errors are. Measured over 300
random cases per dtype (n_q, n_k ≤ 64, d_k ≤ 64, causal or not, normal and integer values): the worst
max|out − golden| / max|baseline − golden| was, forward / gradients (dq, dk, dv),

- reference: float16 1.0 / 1.0, 0.92, 1.0 · float32 1.0 / 5.7, 6.2, 1.0 · float64 1.0 / 14.5, 6.2, 1.0
- torch 2.13 autograd: float16 1.0 / 2.1, 2.3, 2.0 · float32 5.8 / 4.7, 4.5, 8.7 · float64 5.2 / 4.0, 5.0, 8.5

so a gradient strays up to 2.5 times further from the baseline than an output does (14.5 against
5.8). These extremes occur where the baseline is luckily exact and the floor decides: with the
floor of `spec.tolerance.grad_floors`, the worst error / allowed at factor 2·k = 4 was 0.034
(reference) and 0.027 (torch), while the backward bugs of ``tests/spec/test_spec_laws_gradients.py`` reach
990 to 6e5 (float32) and 21 to 580 (float16) on their shrunk counterexamples."""

N_MAX = 64
"""Sizes of the gradient laws' cases: the golden forms each row's full n_k × n_k Jacobian."""

golden_backward = golden.backward  # the float64 backward oracle lives in spec.golden
baseline_backward = tolerance.baseline_backward


def upstream(case: Case) -> Array:  # -> [*lead, n_q, d_v] in the case's dtype
    """The upstream gradient dO for this case, N(0, 1) (its own random stream)."""
    return case.rng(8).standard_normal((*case.lead(), case.n_q, case.d_v)).astype(case.dtype)


def empty_rows_give_zeros(target: Target, inputs: Inputs) -> bool:
    """Whether every row that sees no key has a zero output (policy ``zeros``, or a finite sink),
    so zero gradients. The derivative of a NaN row or of the plain mean is the masked-rows law's
    business, so cases with such rows are not drawn."""
    policy = oracle.policies(target, inputs)
    return bool(np.all((policy == "") | (policy == "zeros")))


def zero_rows_only(t: Target, drawn: st.SearchStrategy[Case]) -> st.SearchStrategy[Case]:
    """The cases of ``drawn`` whose rows that see no key give zeros (`empty_rows_give_zeros`)."""
    return drawn.filter(lambda c: empty_rows_give_zeros(t, c.inputs()))


def grad_cases(t: Target, *, n_max: int = N_MAX, **kwargs: Any) -> st.SearchStrategy[Case]:
    """`spec.cases.cases` of at most ``n_max`` ≤ `N_MAX` queries and keys, every row that sees
    no key a row of zeros (`zero_rows_only`)."""
    return zero_rows_only(t, cases(t, n_max=min(n_max, N_MAX), **kwargs))


def differentiable(target: Target) -> list[Keyword]:
    """The keywords ``target`` declares that change the gradients, and that a case can draw at a
    rank the target takes: every term one the golden backward differentiates through
    (`spec.oracle.BACKWARD_TERMS`), none a `Leaves` (whose golden is not the target's output:
    dropout's kept set is the target's own draw, read by its own law)."""
    return [kw for kw in registered().values()
            if getattr(target, kw.field) and kw.draw is not None and set(kw.ndims) & set(target.ndims)
            and all(isinstance(term, oracle.BACKWARD_TERMS) and not isinstance(term, Leaves)
                    for term in kw.terms)]


def assert_gradients_match(
    target: Target, inputs: Inputs, d_out: Array, got: Grads, *, keep: Array | None = None, what: str = "",
) -> None:
    """THE gradient assertion: dq, dk, dv and every extra ``grad_fn`` returned (`call_grad`'s
    ``extras``: dbias, dsinks) are within the tolerance policy of the golden backward of exactly
    these inputs (`spec.oracle.gradients`; ``keep``: dropout's kept set), at ``GRAD_FACTOR`` times
    the target's factor. A NaN or inf where the golden is finite fails."""
    __tracebackhide__ = True
    want = oracle.gradients(target, inputs, d_out, keep=keep)
    dq, dk, dv, extras = got
    for name, g in ({"dq": dq, "dk": dk, "dv": dv} | extras).items():
        gold = want.golden[name]
        cmp = tolerance.compare(g, gold, want.baseline[name], rows=np.ones(gold.shape[:-1], dtype=bool),
                                tolerance=GRAD_FACTOR * target.tolerance, floor_=want.floors[name],
                                dtype=inputs.q.dtype)
        assert_within_tolerance(cmp, dtype=precision_text(target, inputs), what=f"{what}{name}",
                                against="the float64 golden backward")


# --- the laws ------------------------------------------------------------------------------


@law(strategy=lambda t: grad_cases(t, masks=("none", "random"), scale=True), needs=_needs.gradients,
     scope="generic")
def grad_matches_golden(target: Target, case: Case) -> None:
    """The target's gradients dq, dk, dv of ``Σ out ∘ dO`` equal the float64 golden backward
    (softmax Jacobian) within the tolerance policy, the factor doubled for gradients (GRAD_FACTOR),
    with ``mask=`` and ``scale=`` when the target takes them.

    Catches: dS = P ∘ dP without subtracting the row term D = rowsum(dO ∘ O); dk (or dq) missing
    the scale; dv = P dO instead of Pᵀ dO; a backward that forgets the causal mask (future keys
    then receive gradient from past queries).
    """
    inputs = case.inputs()
    d_out = upstream(case)
    assert_gradients_match(target, inputs, d_out, call_grad(target, inputs, d_out))


def unseen_keys(inputs: Inputs, vis: Array) -> Array:  # [*lead, n_q, n_k] -> [*kv_lead, n_k] bool
    """Keys that no query sees, per K/V head (a grouped K/V head's key is unseen when no query
    head of its group sees it)."""
    seen = np.broadcast_to(vis, (*inputs.lead, inputs.n_q, inputs.n_k)).any(axis=-2)  # [*lead, n_k]
    kv_lead = inputs.k.shape[:-2]
    if seen.shape[:-1] != kv_lead and len(kv_lead) == seen.ndim - 1:  # grouped: OR over each group
        g = kv_lead[-1]
        seen = seen.reshape(*seen.shape[:-2], g, seen.shape[-2] // g, seen.shape[-1]).any(axis=-2)
    return np.asarray(~seen)


@law(strategy=lambda t: grad_cases(t, causal=(True,), n_k_min=2),
     needs=_needs.gradients & _needs.causal_mode & _needs.exact_masking)
def grad_causal_no_leak(target: Target, case: Case) -> None:
    """Under the causal mask, changing the keys and values from position t on leaves dq of every
    query that cannot see t bit-identical (up to the sign of zero), and a key that no query sees
    gets exactly zero dk and dv.

    Catches: a backward that recomputes the pattern with the row maximum taken before masking —
    right to rounding at moderate scores (grad_matches_golden passes it), but large future scores
    move past gradients, or underflow them to 0/0 = NaN; a backward that forgets the causal mask.
    """
    inputs = case.inputs()
    d_out = upstream(case)
    t = int(case.rng(9).integers(1, case.n_k))
    vis = visible(target, inputs)
    dq, dk, dv, _ = call_grad(target, inputs, d_out)
    unseen = unseen_keys(inputs, vis)[..., None]
    for name, g in (("dk", dk), ("dv", dv)):
        bad = unseen & (g != 0)
        if (at := first_true(bad)) is not None:
            raise AssertionError(
                f"{name} {list(at)} is {float(g[at])!r}, not 0, though no query sees key {at[-2]}")
    dq2, _, _, _ = call_grad(target, perturbed(target, case, inputs, np.arange(case.n_k) >= t), d_out)
    blind = np.asarray(~vis[..., t:].any(axis=-1))  # [..., n_q]: rows that see no changed position
    bad = blind[..., None] & ~((dq == dq2) | (np.isnan(dq) & np.isnan(dq2)))
    if (at := first_true(bad)) is not None:
        raise AssertionError(
            f"changing keys/values from position {t} on changed dq {list(at)} from {float(dq[at])!r} "
            f"to {float(dq2[at])!r}, though query {at[-2]} cannot see position {t}"
        )


@law(strategy=lambda t: grad_cases(t, ndims=(3, 4), gqa=True, masks=("none", "random"), n_max=32),
     needs=_needs.gradients & _needs.gqa)
def grad_gqa_sums_group(target: Target, case: Case) -> None:
    """With g K/V heads shared by h query heads, each K/V head's dk and dv are the sums of its
    group's h/g query heads' gradients (query head i reads K/V head i // (h/g)), and dq is each
    query head's own: all match the golden backward of the grouped call.

    Catches: dk and dv taken from the first query head of each group instead of summed over the
    group (right whenever h = g); the group summed over query heads i ≡ j mod g (tiled, not
    repeated: the forward's convention for GQA mixed with a hand-written broadcast's).
    """
    inputs = case.inputs()
    d_out = upstream(case)
    assert_gradients_match(target, inputs, d_out, call_grad(target, inputs, d_out),
                           what=f"with {case.heads} query heads over {case.kv_heads} K/V heads, ")


needs_residuals = Need(
    lambda t: None if t.grad_takes_residuals else
    "needs a backward that takes its forward's out and lse (target declares grad_takes_residuals=False)",
    "out= and lse= taken by grad_fn (grad_takes_residuals)")


@st.composite
def _residual_cases(draw: st.DrawFn, target: Target) -> Case:
    """Cases with mask= (rows that see nothing among them) and scale= when taken, and one of the
    target's differentiable keywords or none."""
    chosen = draw(st.sampled_from([None, *differentiable(target)]))
    masks = ("none", "random", "rows")
    return draw(grad_cases(target, masks=masks, scale=True, keywords=() if chosen is None else (chosen,)))


@law(strategy=_residual_cases, needs=_needs.gradients & needs_residuals)
def grad_residuals_agree(target: Target, case: Case) -> None:
    """A backward handed its own forward's ``out`` and ``lse`` (from the same call with
    ``return_lse=True``) gives the gradients it gives when it recomputes them, within twice the
    tolerance, and both match the golden backward; rows that see no key (lse = −inf) included.

    Catches: a backward that reads the forward's natural-log lse as base 2 (the Triton tutorial
    keeps m + log₂ l) and so recomputes P = 2^(s·log₂e − lse) wrong; P = exp(s − lse) formed
    where lse = −inf, so a row that sees nothing gives exp(−inf + inf) = NaN (FlashAttention 2
    stores +inf for such rows for this reason).
    """
    inputs = case.inputs()
    d_out = upstream(case)
    out, lse = call(target, inputs.replace(return_lse=True))
    recomputed = call_grad(target, inputs, d_out)
    handed = call_grad(target, inputs, d_out, residuals=(out, lse))
    assert_gradients_match(target, inputs, d_out, handed, what="given the forward's out and lse, ")
    assert_gradients_match(target, inputs, d_out, recomputed)
    want = oracle.gradients(target, inputs, d_out)
    for name, a, b in zip(golden.GRADS, recomputed[:3], handed[:3], strict=True):
        gold, factor = want.golden[name], GRAD_FACTOR * target.tolerance
        allowed = tolerance.allowance(gold, want.baseline[name], rows=np.ones(a.shape[:-1], dtype=bool),
                                      tolerance=factor, floor_=want.floors[name])
        compared.record(f"{name} given the forward's out and lse against {name} recomputed", a, b,
                        2 * allowed)
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        worst = float(np.max(diff, initial=0.0))
        observe(f"residuals difference / allowed {precision_text(target, inputs)}",
                worst / (2 * allowed) if allowed > 0 else 0.0)
        assert worst <= 2 * allowed, (
            f"{name} given the forward's out and lse differs from {name} recomputed by {worst:.3g} "
            f"(allowed {2 * allowed:.3g})")
