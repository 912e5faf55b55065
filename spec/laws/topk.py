"""Laws of top-k sparse attention (``topk_indices=``, ``topk_length=``): query i sees only the
valid keys listed in the first ``topk_length`` entries of its row, ANDed with every other
restriction (`spec.keywords.topk`).

Public reports: cudnn-frontend #384/#385 (backward gradients of ~1e11 when different queries
pick the same key), #676 (NaN gradients on −1-padded rows) and PR #298 (−1 clamped to key 0; dK
and dV dropped when the list is wider than n_k); Primus-Turbo PR #417 (NaN on rows whose listed
keys are all masked); flashinfer PR #5090 (indices past n_k read a zero-filled key: a score of 0,
a weight of exp(0)); PaddleFleet PR #1836 (``topk_length`` ignored).
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec.call import call_grad
from spec.cases import Case, cases
from spec.inputs import Inputs
from spec.keywords.topk import TOPK, entries_read, listed_counts, per_query_head, valid_entries
from spec.laws import _needs
from spec.laws._helpers import (
    assert_empty_rows_follow_policy,
    assert_hidden_unmoved,
    assert_matches,
    assert_same,
    assert_unchanged,
    first_true,
    run,
    run_lse,
    sees_any,
)
from spec.laws.gradients import assert_gradients_match, empty_rows_give_zeros, grad_cases, upstream
from spec.registry import law
from spec.target import Target

Array = np.ndarray

needs_topk = _needs.keyword(TOPK)


def topk_cases(target: Target, **given: object) -> st.SearchStrategy[Case]:
    return cases(target, n_max=48, keywords=(TOPK,), **given)  # type: ignore[arg-type]


def lists(inputs: Inputs) -> tuple[Array, Array | None]:  # -> [*kv_lead, n_q, topk] int64, lengths or None
    """The call's ``topk_indices`` and ``topk_length`` as int64 arrays (a copy to change)."""
    length = inputs.get("topk_length")
    return np.array(inputs.get("topk_indices"), dtype=np.int64), \
        None if length is None else np.array(length, dtype=np.int64)


def relisted(inputs: Inputs, indices: Array) -> Inputs:
    """``inputs`` with ``topk_indices`` replaced (int32, as drawn), its lengths kept."""
    return inputs.replace(topk_indices=indices.astype(np.int32))


def said(inputs: Inputs) -> str:
    idx = inputs.get("topk_indices")
    length = inputs.get("topk_length")
    return f"topk_indices of width {np.shape(idx)[-1]}" + ("" if length is None else " and topk_length")


@law(strategy=lambda t: topk_cases(t, masks=("none", "random"), tiles=True), needs=needs_topk)
def topk_matches_golden(target: Target, case: Case) -> None:
    """With ``topk_indices=`` (and ``topk_length=``) every row that sees a key matches the float64
    golden, whose query i sees only the valid keys listed in the first topk_length entries of its
    row, ANDed with causal and mask=: lists 1..4 wide, up to n_k + 3 (wider than the keys), 16 or
    64; keys shared across queries, −1 padding and entries at and past n_k; sizes around tile
    edges too.

    Catches: −1 clamped to key 0 (key 0 attended by every padded row: cudnn-frontend PR #298); an
    index past n_k read from zero-filled keys (a score of 0 and a weight of exp(0): flashinfer PR
    #5090); ``topk_length`` ignored (the entries past it, random keys, are read: PaddleFleet PR
    #1836); a list applied to the wrong K/V head.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what=f"with {said(inputs)}, the output")


@law(strategy=lambda t: topk_cases(t, masks=("none", "random"), n_k_min=2), needs=needs_topk)
def topk_no_leak(target: Target, case: Case) -> None:
    """Changing the keys and values one query's row does not list leaves every row that sees none
    of them bit-identical (within tolerance if the target declares exact_masking=False).

    Catches: a gather that reads one tile of keys past the listed ones (a block-sparse kernel
    given token indices); unlisted keys entering the row maximum or the denominator.
    """
    inputs = case.inputs()
    idx, length = lists(inputs)
    row = int(case.rng(22).integers(0, case.n_q))
    outside = listed_counts(idx, case.n_k, length)[..., row, :] == 0  # [*kv_lead, n_k]
    assume(outside.any())
    assert_hidden_unmoved(target, case, inputs, outside,
                          what=f"changing the keys query {row}'s topk_indices row does not list")


def _rewritten(case: Case, inputs: Inputs) -> tuple[Inputs, Array]:
    """The call with every entry that lists no key (−1, past n_k, past ``topk_length``) rewritten:
    an invalid entry to another invalid value (−1 ↔ n_k..n_k + 999, or −2^31), an entry past the
    length to another random key; and which entries changed."""
    idx, length = lists(inputs)
    rng = case.rng(23)
    read = entries_read(idx, length)
    invalid = read & ~valid_entries(idx, case.n_k, length)
    others = np.where(rng.random(idx.shape) < 0.5, -1 - rng.integers(0, 2**31 - 1, size=idx.shape),
                      case.n_k + rng.integers(0, 1000, size=idx.shape))
    new = np.where(invalid, others, idx)
    new = np.where(~read, rng.integers(-1, max(case.n_k, 1), size=idx.shape), new)
    return relisted(inputs, new), (new != idx)


@law(strategy=lambda t: topk_cases(t, masks=("none", "random")), needs=needs_topk)
def topk_ignored_entries_change_nothing(target: Target, case: Case) -> None:
    """Rewriting the entries that list no key — an invalid one (< 0 or ≥ n_k) to another invalid
    value, one past ``topk_length`` to any other key — leaves the output bit-identical (within
    tolerance if the target declares exact_masking=False or deterministic=False).

    Catches: an invalid index clamped or wrapped into range (−1 read as key n_k − 1 or key 0; an
    index past n_k taken modulo a tile); entries past topk_length read (the length honoured only
    when it cuts a whole tile of entries).
    """
    inputs = case.inputs()
    changed_inputs, changed = _rewritten(case, inputs)
    assume(changed.any())
    assert_unchanged(target, inputs, run(target, inputs), run(target, changed_inputs),
                     bitwise=target.exact_masking and target.deterministic,
                     what="after rewriting the entries that list no key, the output",
                     change="rewriting the entries of topk_indices that list no key (invalid, or past "
                            "topk_length)")


@law(strategy=lambda t: topk_cases(t, masks=("none", "random")), needs=needs_topk)
def topk_order_invariant(target: Target, case: Case) -> None:
    """Shuffling the entries each row reads (the first ``topk_length``) changes the output by no
    more than rounding: a list is a set of keys, not a sequence.

    Catches: a kernel that stops at the first invalid entry (−1 padding taken as the end of the
    list, so valid keys after it are dropped); an online softmax whose running maximum is taken
    from the first entry only.
    """
    inputs = case.inputs()
    idx, length = lists(inputs)
    rng = case.rng(24)
    read = entries_read(idx, length)
    keys = np.where(read, rng.random(idx.shape), 2.0)  # entries past the length stay past it
    shuffled = np.take_along_axis(idx, np.argsort(keys, axis=-1, kind="stable"), axis=-1)
    assume(bool(np.any(shuffled != idx)))
    assert_same(target, inputs, run(target, inputs), run(target, relisted(inputs, shuffled)),
                what="with each row's topk_indices shuffled, the output")


def _emptied(case: Case, inputs: Inputs) -> Inputs:
    """The call with some rows listing no key: a row of −1, a row past n_k, a length of 0."""
    idx, length = lists(inputs)
    rng = case.rng(25)
    rows = rng.random(idx.shape[:-1]) < 0.4
    rows.reshape(-1)[rng.integers(0, rows.size)] = True
    fill = np.where(rng.random(idx.shape[:-1]) < 0.5, -1, case.n_k)[..., None]
    idx = np.where(rows[..., None], fill, idx)
    if length is not None:
        zero = rng.random(length.shape) < 0.3
        length = np.where(zero, 0, length)
    return inputs.replace(topk_indices=idx.astype(np.int32),
                          topk_length=None if length is None else length.astype(np.int32))


@law(strategy=lambda t: topk_cases(t), needs=needs_topk & _needs.policy_declared)
def topk_empty_rows_as_declared(target: Target, case: Case) -> None:
    """A row whose list holds no valid key (all −1, all past n_k, or ``topk_length`` 0) gives what
    the target declares for a row emptied by ``"topk"`` (``masked_rows``: zeros by default), and,
    where an LSE is returned, the declared ``empty_lse``; every other row matches the golden.

    Catches: NaN from a softmax over no key (cudnn-frontend #676, Primus-Turbo PR #417); an empty
    row given key 0's value (−1 clamped); an LSE of 0 or a finite fill for an empty row, which a
    merge then weighs.
    """
    inputs = _emptied(case, case.inputs())
    out = run(target, inputs)
    assert_empty_rows_follow_policy(target, inputs, out)
    assert_matches(target, inputs, out, what=f"with rows of {said(inputs)} listing no key, the output")
    if target.returns_lse:
        _, lse = run_lse(target, inputs, as_returned=True)
        blind = ~sees_any(target, inputs)
        if (at := first_true(blind & (lse != target.empty_lse))) is not None:
            raise AssertionError(f"row {list(at)} lists no valid key, so its lse must be "
                                 f"{target.empty_lse!r} "
                                 f"(empty_lse), got {float(lse[at])!r}")


def _doubled(case: Case, inputs: Inputs) -> Inputs:
    """The call with, in about half the rows, one valid entry's key listed again in place of
    another entry of the row."""
    idx, length = lists(inputs)
    rng = case.rng(26)
    valid = valid_entries(idx, case.n_k, length)
    read = entries_read(idx, length)
    for at in np.argwhere(valid.any(axis=-1) & (rng.random(idx.shape[:-1]) < 0.5)):
        row = tuple(at)
        source = rng.choice(np.flatnonzero(valid[row]))
        others = np.flatnonzero(read[row])
        others = others[others != source]
        if others.size:
            idx[(*row, rng.choice(others))] = idx[(*row, source)]
    return relisted(inputs, idx)


@law(strategy=lambda t: topk_cases(t, masks=("none", "random"), n_k_min=2), needs=needs_topk)
def topk_duplicates_as_declared(target: Target, case: Case) -> None:
    """A key listed twice in one row counts as the target declares: once
    (``topk_duplicates="once"``, a mask: the golden of the listed set) or each time (``"each"``,
    a gather: its weight multiplied by the number of times it is listed, the golden with
    log(count) added to its score).

    Catches: a gather kernel declared (or documented) as a mask, or the reverse — the same lists
    give different attention; a deduplication that drops both copies.
    """
    inputs = _doubled(case, case.inputs())
    idx, length = lists(inputs)
    counts = listed_counts(idx, case.n_k, length)
    assume(bool(np.any(counts > 1)))
    out = run(target, inputs)
    what = f"with keys listed twice in a row (topk_duplicates={target.topk_duplicates!r}), the output"
    if target.topk_duplicates == "once":
        assert_matches(target, inputs, out, what=what)
        return
    with np.errstate(divide="ignore"):
        weight = np.log(per_query_head(counts, inputs.lead).astype(np.float64))
    assert_matches(target, inputs.replace(bias=weight), out, what=what)  # float64: log 2 exactly


def hot_lists(case: Case, inputs: Inputs) -> Inputs:
    """The call with every row listing the same few keys (2..4 of them, in its own order, padded
    with −1 to the drawn width or past it): every key listed is picked by every query."""
    rng = case.rng(27)
    hot = rng.permutation(case.n_k)[:int(rng.integers(2, 5))]
    idx, _ = lists(inputs)
    width = max(idx.shape[-1], hot.size)
    order = np.argsort(rng.random((*idx.shape[:-1], hot.size)), axis=-1)
    listed = np.full((*idx.shape[:-1], width), -1, dtype=np.int64)
    listed[..., :hot.size] = hot[order]
    return inputs.replace(topk_indices=listed.astype(np.int32), topk_length=None)


@law(strategy=lambda t: grad_cases(t, keywords=(TOPK,), n_k_min=2, masks=("none", "random")),
     needs=needs_topk & _needs.gradients)
def topk_grad_shared_keys(target: Target, case: Case) -> None:
    """When every query lists the same few keys (the normal case of top-k selection), dK and dV of
    each listed key hold the sum over every query, and every entry, that picked it: the gradients
    match the golden backward; keys no query lists get exact zeros there too.

    Catches: a backward that scatters dK and dV by plain assignment (``dk[idx] = ...``: the last
    query wins, the others are lost) or by unsynchronised adds (gradients of ~1e11, cosine ≈ 0:
    cudnn-frontend #384/#385); dK and dV dropped for entries past the first tile of the list.
    """
    inputs = hot_lists(case, case.inputs())
    assume(empty_rows_give_zeros(target, inputs))  # rows the hot keys leave empty give zeros
    d_out = upstream(case)
    assert_gradients_match(target, inputs, d_out, call_grad(target, inputs, d_out),
                           what="with every query listing the same keys, ")
