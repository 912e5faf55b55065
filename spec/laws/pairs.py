"""Laws of keywords two at a time, forward and backward: every pair of keywords a target declares
is drawn together, one case per pair in every profile, random pairs besides.

Each keyword's own laws draw it alone, so a kernel right for every keyword alone and wrong for
two together passes them: a dbias that carries the softcap's derivative (the bias is added after
the cap, so its gradient is dS, not dS·(1 − tanh²)) needs a softcap and a bias in one call; a
packed backward that drops the softcap needs packed sequences and a softcap. The golden composes
the keywords' declared terms in their one order (scale → cap → ALiBi and bias → masks → softmax
with the sink), so every pair is covered without a line of its own.

Which keywords pair is read from their declarations (`spec.keywords.Keyword.combines_with`: a
rank both take, one non-dense arrangement at most, nothing one carries or excludes passed by the
other). Listed in `spec.registry.LAW_MODULES`.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from spec.call import call_grad
from spec.cases import Case, cases, one_of
from spec.keywords import Keyword, Leaves, Reads, registered
from spec.keywords.fp8 import FP8
from spec.keywords.paged import PAGED
from spec.laws import _needs
from spec.laws._helpers import assert_matches, run
from spec.laws.grad_keywords import GRID_TRIES, keyword_matters
from spec.laws.gradients import assert_gradients_match, differentiable, grad_cases, upstream
from spec.registry import Need, law
from spec.target import Target

Pair = tuple[Keyword, ...]


def forward_keywords(target: Target) -> list[Keyword]:
    """The keywords ``target`` declares that a case draws and that change its output (none a
    `Leaves`: dropout's golden is the undropped output, an LSE asked for changes no number)."""
    return [kw for kw in registered().values()
            if getattr(target, kw.field) and kw.draw is not None and set(kw.ndims) & set(target.ndims)
            and not any(isinstance(term, Leaves) for term in kw.terms)]


def pairs(target: Target, keywords: list[Keyword]) -> list[Pair]:
    """Every two of ``keywords`` one case can draw together at a rank ``target`` takes, in
    declaration order, each with the keywords it must come with (`companions`)."""
    found = [(a, b, *companions(target, (a, b))) for a, b in itertools.combinations(keywords, 2)]
    return [pair for pair in found
            if all(x.combines_with(y, target.ndims) for x, y in itertools.combinations(pair, 2))]


def companions(target: Target, pair: Pair) -> Pair:
    """What a case must also draw for ``target`` to take ``pair``: a paged cache, for a target that
    takes float8 caches only paged (`Target.fp8_kv_paged_only`)."""
    return (PAGED,) if target.fp8_kv_paged_only and FP8 in pair and PAGED not in pair else ()


def named(pair: Pair) -> str:
    return " + ".join(kw.name for kw in pair)


def matters(target: Target, case: Case, keyword: Keyword) -> bool:
    """Whether ``keyword`` changes this case's golden (`keyword_matters`); a keyword that only
    represents the keys and values another way (a paged or float8 cache) always does its part."""
    return any(isinstance(t, Reads) for t in keyword.terms) or keyword_matters(target, case, keyword)


def pair_grid(target: Target, drawn: Callable[[Target], list[tuple[Pair, st.SearchStrategy[Case]]]]
              ) -> list[Case]:
    """One case per pair of ``drawn(target)``, run before the random ones in every profile: the first
    its strategy generates from a fixed seed in which each keyword of the pair changes the golden
    (`matters`), else its first case at all, so that every pair is met in every run. The dtypes are
    taken in turn, each case drawn in its own (from ``drawn`` of the target narrowed to it): a draw
    that depends on the dtype (float8 descales past float16's range only where the output holds
    them) is never carried into a dtype it was not drawn for."""
    first = settings(database=None, max_examples=GRID_TRIES, phases=[Phase.generate], deadline=None,
                     suppress_health_check=list(HealthCheck))
    in_dtype = {dtype: {named(pair): s for pair, s in drawn(target.with_dtypes((dtype,)))}
                for dtype in target.dtypes}
    found = []
    for i, (pair, _) in enumerate(drawn(target)):
        strategy = in_dtype[target.dtypes[i % len(target.dtypes)]][named(pair)]

        def both(case: Case, pair: Pair = pair) -> bool:
            return all(matters(target, case, kw) for kw in pair[:2])

        try:
            case = find(strategy, both, settings=first, random=random.Random(named(pair)))
        except NoSuchExample:
            try:
                case = find(strategy, lambda c: True, settings=first, random=random.Random(named(pair)))
            except NoSuchExample:  # the pair cannot be drawn at the sizes the law draws
                continue
        found.append(case)
    return found


# --- the forward ----------------------------------------------------------------------------------


def forward_pairs(target: Target) -> list[tuple[Pair, st.SearchStrategy[Case]]]:
    """Each pair of the target's keywords with its cases (mask= where taken; a mask-free draw where
    a keyword excludes it)."""
    masks = ("none", "random") if target.supports_mask else ("none",)
    return [(pair, cases(target, n_max=32, masks=masks, scale=True, keywords=pair))
            for pair in pairs(target, forward_keywords(target))]


def _forward_cases(target: Target) -> st.SearchStrategy[Case]:
    branches = tuple(strategy for _, strategy in forward_pairs(target))

    @st.composite
    def one(draw: st.DrawFn) -> Case:
        return one_of(draw, branches)

    return one()


needs_pair = Need(lambda t: None if pairs(t, forward_keywords(t)) else
                  "needs two keywords that one call can take together (target declares fewer)",
                  "two keywords one call takes together")


@law(strategy=_forward_cases, needs=needs_pair, grid=lambda t: pair_grid(t, forward_pairs), scope="generic")
def keyword_pairs_match_golden(target: Target, case: Case) -> None:
    """Under every two of its keywords together (each pair one case in every profile, and random
    pairs), with mask= and scale= where taken, the output matches the float64 golden, in which the
    keywords compose in their one order: scale, softcap, then ALiBi's and the bias's terms, then
    what hides keys (causal, mask=, window, key lengths, packed sequences), the softmax with the
    sink in its denominator, over keys read from their cache.

    Catches: ALiBi's term added before the softcap, so the cap bends it (right with either alone);
    a window measured from the top-left diagonal once key lengths move it; a sink dropped on the
    paged path; a bias indexed by the packed offset of another sequence.
    """
    inputs = case.inputs()
    given = ", ".join(f"{name}={case.param(name)!r}" for name in case.keywords)
    assert_matches(target, inputs, run(target, inputs), what=f"with {given}, the output")


# --- the backward ---------------------------------------------------------------------------------


def gradient_pairs(target: Target) -> list[tuple[Pair, st.SearchStrategy[Case]]]:
    """Each pair of the target's keywords that change the gradients (`differentiable`), with its
    gradient cases."""
    masks = ("none", "random") if target.supports_mask else ("none",)
    return [(pair, grad_cases(target, masks=masks, scale=True, keywords=pair))
            for pair in pairs(target, differentiable(target))]


def _gradient_cases(target: Target) -> st.SearchStrategy[Case]:
    branches = tuple(strategy for _, strategy in gradient_pairs(target))

    @st.composite
    def one(draw: st.DrawFn) -> Case:
        return one_of(draw, branches)

    return one()


needs_gradient_pair = Need(lambda t: None if pairs(t, differentiable(t)) else
                           "needs two keywords that change the gradients and that one call can take "
                           "together (target declares fewer)",
                           "two keywords that change the gradients, taken together")


@law(strategy=_gradient_cases, needs=_needs.gradients & needs_gradient_pair,
     grid=lambda t: pair_grid(t, gradient_pairs), scope="generic")
def grad_keyword_pairs_match_golden(target: Target, case: Case) -> None:
    """Under every two of its keywords that change the gradients, together (each pair one case in
    every profile, and random pairs), ``grad_fn`` given the forward's keywords returns the
    gradients of that call: dq, dk, dv and the declared extras (dbias, dsinks) match the golden
    backward within the tolerance policy.

    Catches: dbias carrying the softcap's derivative 1 − tanh²(s/c) (the bias is added after the
    cap: its gradient is dS), right whenever there is no softcap or no bias; a packed (varlen)
    backward that leaves out the softcap, right for unpacked calls and uncapped packed ones.
    """
    inputs = case.inputs()
    d_out = upstream(case)
    given = ", ".join(f"{name}={case.param(name)!r}" for name in case.keywords)
    assert_gradients_match(target, inputs, d_out, call_grad(target, inputs, d_out), what=f"with {given}, ")
