"""Laws of mask and score functions (``mask_mod=``, ``score_mod=``, FlexAttention's): the target
calls the functions the suite draws from its library (`spec.keywords.mask_mod`,
`spec.keywords.score_mod`) and must give the attention they define, which the golden evaluates
densely in float64.

Public reports: pytorch/pytorch #141126 (35 % of the elements wrong for a block-context mask),
#163314 (a broadcast head dimension and a sliced block mask silently wrong), #165838 (two logically
equal masks give different outputs), #182593 (the output depends on whether keys sit in full or
partial blocks), #159247 (a key length not a multiple of the block size), #136232 (NaN when the
block mask is larger than the sequence), #150321 (a score function reads buffers in masked-out
regions). PyTorch's own tests compare the *mean* error with the reference's, which dilutes one
wrong row by 1/n; every law here compares each element (`spec.tolerance`).
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec import oracle
from spec.cases import Case, cases, edges_for, outside_limits
from spec.inputs import Inputs
from spec.keywords.mask_mod import BY_INDEX, MASK_MOD, mask_mod, parameters
from spec.keywords.score_mod import SCORE_MOD, BufferBias
from spec.laws import _needs
from spec.laws._helpers import assert_matches, assert_unchanged, run
from spec.registry import law
from spec.target import Target

Array = np.ndarray

needs_mask_mod = _needs.keyword(MASK_MOD)
needs_score_mod = _needs.keyword(SCORE_MOD)

BLOCKS = (16, 32, 64, 128)
"""Block sizes of real kernels (FlexAttention's default is 128): the key lengths just off them."""


def mod_cases(target: Target, keywords: tuple = (MASK_MOD,), **given: object) -> st.SearchStrategy[Case]:
    return cases(target, n_max=48, keywords=keywords, **given)  # type: ignore[arg-type]


@law(strategy=lambda t: mod_cases(t, masks=("none", "random"), tiles=True), needs=needs_mask_mod)
def mask_mod_matches_golden(target: Target, case: Case) -> None:
    """With ``mask_mod=`` (a causal, sliding-window, prefix-LM, document, dilated or block-causal
    function, or one that reads the batch or head index), every row that sees a key matches the
    float64 golden, which evaluates the function densely, element by element (not on the mean
    error), ANDed with causal and mask=; on sizes around tile edges too.

    Catches: a block-sparse kernel whose mask is right in most blocks and wrong in some (#141126:
    35 % of the elements wrong for a block-context mask); a last query row handled apart with its
    mask one row off, which a mean-error tolerance dilutes by 1/n and passes.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with mask_mod={case.param('mask_mod')}, the output")


@law(strategy=lambda t: mod_cases(t, keywords=(SCORE_MOD,), masks=("none", "random"), values=("normal",)),
     needs=needs_score_mod)
def score_mod_matches_golden(target: Target, case: Case) -> None:
    """With ``score_mod=`` (ALiBi, a softcap, a relative-position bias read from a buffer) every row
    that sees a key matches the float64 golden, which applies the function to the scaled scores
    before anything hides a key (causal, mask=).

    Catches: a score function applied after the mask (a softcap turns a hidden key's −inf into −c,
    and the key is seen); a score function given the unscaled scores.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with score_mod={case.param('score_mod')}, the output")


@law(strategy=lambda t: mod_cases(t, masks=("none", "random")), needs=needs_mask_mod)
def mask_mod_forms_agree(target: Target, case: Case) -> None:
    """Two logically equal mask functions written differently (``q >= kv`` and ``~(kv > q)``;
    ``(q − kv) % 3 == 0`` and ``(kv − q) % 3 == 0``) give the same output: bit for bit for a
    deterministic target (the same mask, the same blocks), else within tolerance; and the second
    matches the golden too.

    Catches: #165838 (two logically equal masks give different outputs); indices handed to the
    function as unsigned integers, where a difference of indices wraps and one form of a mask is
    right while the other is not.
    """
    inputs = case.inputs()
    other = inputs.replace(mask_mod=mask_mod(case.param("mask_mod"), form=1))
    first, second = run(target, inputs), run(target, other)
    assert_matches(target, other, second,
                   what=f"with mask_mod={case.param('mask_mod')} written the other way, the output")
    assert_unchanged(target, inputs, first, second, bitwise=target.deterministic,
                     what=f"mask_mod={case.param('mask_mod')} in its two forms",
                     change=f"writing mask_mod={case.param('mask_mod')} the other way")


@st.composite
def _off_block_cases(draw: st.DrawFn, target: Target) -> Case:
    case = draw(mod_cases(target, masks=("none", "random")))
    lengths = [n for n in edges_for(target) if n % BLOCKS[0] and n <= 2 * BLOCKS[-1] + BLOCKS[0] + 1]
    assume(lengths)
    n_k = draw(st.sampled_from(lengths))
    sized = case.replace(n_k=n_k, n_q=min(case.n_q, 24) if case.n_q != case.n_k else n_k,
                         d_k=min(case.d_k, 16), d_v=min(case.d_v, 16))
    sized = sized.with_keyword("mask_mod", draw(parameters(n_k)))
    assume(outside_limits(target, sized) is None)
    assume(not sized.causal or target.causal_shape_ok(sized.n_q, sized.n_k))
    return sized


@law(strategy=_off_block_cases, needs=needs_mask_mod)
def mask_mod_keys_off_block(target: Target, case: Case) -> None:
    """With a key length that is not a multiple of the block size (n_k just past or below 16, 32,
    64, 128 or 256: a partial last block) every row matches the golden: the keys of the partial
    block are seen where the function lets them be, and no key past n_k is.

    Catches: #159247 (a key length not a multiple of the block size); a block mask whose number of
    key blocks is n_k // block, so the partial last block is never visited.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with mask_mod={case.param('mask_mod')} and n_k={case.n_k}, the output")


def longer_call(target: Target, case: Case) -> Case:
    """``case`` over more keys (the next tile edge past n_k the target is drawn at; n_k + 17 past
    the largest), as many queries for a square case, with values of its own."""
    past = [n for n in edges_for(target) if n > case.n_k]
    n_k = past[0] if past else case.n_k + 17
    return case.replace(n_k=n_k, n_q=n_k if case.n_q == case.n_k else case.n_q, seed=case.seed + 1)


@law(strategy=lambda t: mod_cases(t), needs=needs_mask_mod)
def mask_mod_after_longer_call(target: Target, case: Case) -> None:
    """A mask function met first in a call over more keys (and queries: the next tile edge), then
    — the same function object — in this shorter call, gives this call the golden's output:
    whatever the target built for the longer call (a block mask) is not read past this call's
    keys.

    Catches: #136232 (NaN when the block mask is larger than the sequence) and #163314's sliced
    block mask: a block mask cached for the function at the longer length and cut to this call in
    whole blocks, so its partial last block counts as full and padding past n_k is attended.
    """
    longer = longer_call(target, case)
    assume(outside_limits(target, longer) is None)
    assume(not longer.causal or target.causal_shape_ok(longer.n_q, longer.n_k))
    inputs = case.inputs()
    function = inputs.keywords["mask_mod"]
    run(target, longer.inputs().replace(mask_mod=function))
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with mask_mod={case.param('mask_mod')} after a call of n_k={longer.n_k}, "
                        "the output")


@st.composite
def _indexed_cases(draw: st.DrawFn, target: Target) -> Case:
    case = draw(cases(target, n_max=32, ndims=(3, 4), masks=("none", "random")))
    sized = case.replace(heads=max(case.heads, 2), batch=max(case.batch, 2) if case.ndim == 4 else case.batch)
    sized = sized.with_keyword("mask_mod", draw(parameters(max(case.n_q, case.n_k), BY_INDEX)))
    assume(outside_limits(target, sized) is None)
    return sized


@law(strategy=_indexed_cases, needs=needs_mask_mod & _needs.ndim(3, 4))
def mask_mod_reads_batch_and_head(target: Target, case: Case) -> None:
    """A mask function that reads the head (a window per head) or the batch index (a prefix per
    batch row), over 2+ heads (and 2+ batch rows), gives each slice its own mask: the output
    matches the golden.

    Catches: #163314 (a broadcast head dimension silently wrong): a block mask built for head 0
    (or batch row 0) and broadcast to every head.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with mask_mod={case.param('mask_mod')} over {case.lead()}, the output")


@st.composite
def _hidden_cases(draw: st.DrawFn, target: Target) -> Case:
    keywords = (MASK_MOD,) if target.supports_mask_mod else ()
    causal = (True,) if target.causal_alignment and not keywords else (False, True)
    masks = ("random",) if target.supports_mask and not keywords else ("none",)
    return draw(cases(target, n_max=48, keywords=keywords, causal=causal, masks=masks, values=("normal",),
                      n_k_min=2))


def poisoned(target: Target, inputs: Inputs, rng: np.random.Generator) -> BufferBias:
    """A score function adding a bias read from a buffer ``[batch, heads, n_q, n_k]`` (ones for the
    dimensions the inputs lack) that holds N(0, 1/4) values where a key is visible and NaN where it
    is hidden (by causal, mask= or mask_mod=)."""
    seen = np.asarray(oracle.visibility(target.alignment, inputs))  # [*lead, n_q, n_k]
    seen = seen.reshape((1,) * (4 - seen.ndim) + seen.shape)
    buffer = np.where(seen, rng.normal(0.0, 0.5, seen.shape), np.nan).astype(np.float32)
    return BufferBias(buffer)


@law(strategy=_hidden_cases, needs=needs_score_mod)
def score_mod_unused_where_hidden(target: Target, case: Case) -> None:
    """A score function's value for a key that causal, mask= or mask_mod= hides is never used: with
    a function that reads NaN from its buffer exactly there, the output matches the golden (no
    NaN). A target may evaluate the function everywhere (FlexAttention's eager path does); it may
    not let a hidden score reach a row.

    Catches: #150321 (a score function reads buffers in masked-out regions and the NaN reaches the
    output); masking by multiplying the exponentials by 0 (NaN · 0 is NaN) instead of hiding the
    scores.
    """
    inputs = case.inputs()
    function = poisoned(target, inputs, case.rng(43))
    assume(bool(np.isnan(function.buffer).any()))
    modded = inputs.replace(score_mod=function)
    assert_matches(target, modded, run(target, modded),
                   what="with a score_mod that reads NaN where a key is hidden, the output")
