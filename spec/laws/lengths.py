"""Laws of ragged batches: per-row key lengths (``kv_lengths=``) and packed sequences
(``cu_seqlens_q=``, ``cu_seqlens_k=``), DESIGN §2b.

Both say the same thing in two layouts: a sequence's output is what it would be on its own. The
comparisons call the target a second time on each row or sequence alone (never the golden alone),
so an implementation is judged against itself; each sequence also meets the float64 golden,
called once per sequence (:mod:`spec.golden` knows no packing).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st

from spec.cases import Case, cases
from spec.laws._helpers import assert_matches, assert_same, needs_ndim, run
from spec.registry import law
from spec.target import Target

Array = np.ndarray


def needs_kv_lengths(t: Target) -> str | None:
    """kv_lengths= (supports_kv_lengths) on 4-D inputs"""
    if not t.supports_kv_lengths:
        return "needs kv_lengths= (target declares supports_kv_lengths=False)"
    return needs_ndim(4)(t)


def needs_varlen(t: Target) -> str | None:
    """cu_seqlens_q=/cu_seqlens_k= (supports_varlen) on 3-D inputs"""
    if not t.supports_varlen:
        return "needs cu_seqlens_q=/cu_seqlens_k= (target declares supports_varlen=False)"
    return needs_ndim(3)(t)


def _causal_choices(t: Target) -> tuple[bool, ...]:
    # Truncating a row moves a bottom-right diagonal (it sits at i + n_k − n_q): only top-left
    # causal masks are the same before and after truncation.
    return (False, True) if t.causal_alignment == "top_left" else (False,)


@st.composite
def kv_length_cases(draw: st.DrawFn, t: Target) -> Case:
    """4-D cases with one key length per batch row in [0, n_k], some short, sometimes 0."""
    case = draw(cases(t, ndims=(4,), causal=_causal_choices(t), masks=("none", "random"), n_max=48,
                      values=("normal",)))
    n_k = case.n_k
    batch = draw(st.integers(2, 3))
    lengths = draw(st.lists(st.one_of(st.integers(0, n_k), st.sampled_from((0, 1, n_k))),
                            min_size=batch, max_size=batch))
    return dataclasses.replace(case, batch=batch, kv_lengths=tuple(lengths))


@law(strategy=kv_length_cases, needs=needs_kv_lengths)
def kv_lengths_is_truncation(target: Target, case: Case) -> None:
    """With ``kv_lengths=L`` each batch row b gives what the same call gives on that row alone
    with only its first L_b keys and values (within tolerance; rows that see no key are the
    masked-rows law's), matches the float64 golden, and is bit-identical when the keys and values
    past L_b are replaced by others ×1e3 (within tolerance if exact_masking=False). L_b = 0 is
    allowed.

    Catches: jax#23349 — ``jax.nn.dot_product_attention`` ignored ``key_value_seq_lengths`` unless
    ``query_seq_lengths`` was given too; a length applied to the wrong batch row (lengths indexed
    by head); ``j ≤ L`` instead of ``j < L``, so one padded key leaks in.
    """
    q, k, v = case.arrays()
    mask = case.mask_array()
    lengths = np.asarray(case.kv_lengths)
    out = run(target, case, q, k, v)
    assert_matches(target, case, out, q, k, v, what="with kv_lengths, the output")
    vis = case.visible(target)
    for b, n in enumerate(lengths.tolist()):
        if n == 0:
            continue
        row, keys = slice(b, b + 1), slice(0, n)
        alone = run(target, case, q[row], k[row, :, keys], v[row, :, keys], kv_lengths=None,
                    mask=None if mask is None else mask[row, ..., keys])
        assert_same(target, case, out[row], alone, q[row], k[row, :, keys], v[row, :, keys],
                    visible=vis[row, ..., keys],
                    what=f"batch row {b} called alone with its first {n} keys, against kv_lengths={n}")
    past = (np.arange(case.n_k)[None, :] >= lengths[:, None])[:, None, :, None]  # [batch, 1, n_k, 1]
    rng = case.rng(7)
    k2 = np.where(past, (case.values_like(rng, k.shape) * 1e3).astype(case.dtype), k)
    v2 = np.where(past, (case.values_like(rng, v.shape) * 1e3).astype(case.dtype), v)
    after = run(target, case, q, k2, v2)
    _assert_unchanged(target, case, out, after, np.asarray(vis.any(axis=-1)), q, k, v, vis,
                      what="changing the keys/values past kv_lengths")


def _assert_unchanged(
    target: Target, case: Case, before: Array, after: Array, rows: Array,
    q: Array, k: Array, v: Array, visible: Array, *, what: str,
) -> None:
    """Outputs of ``rows`` bit-identical (up to the sign of zero) for exact-masking targets,
    within tolerance otherwise."""
    __tracebackhide__ = True
    if not target.exact_masking:
        keep = rows[..., None]
        assert_same(target, case, np.where(keep, before, 0), np.where(keep, after, 0), q, k, v,
                    visible=visible, what=f"after {what}, the output")
        return
    same = (after == before) | (np.isnan(after) & np.isnan(before)) | ~rows[..., None]
    if not same.all():
        at = tuple(int(i) for i in np.argwhere(~same)[0])
        raise AssertionError(f"{what} changed output {list(at)} from {float(before[at])!r} "
                             f"to {float(after[at])!r}")


# --- packed sequences --------------------------------------------------------------------------


def _offsets(lengths: list[int]) -> tuple[int, ...]:
    return tuple(int(x) for x in np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]))


@st.composite
def packed_cases(draw: st.DrawFn, t: Target) -> Case:
    """3-D packed cases: 1–4 sequences, each with its own query and key count (0 allowed)."""
    case = draw(cases(t, ndims=(3,), causal=_causal_choices(t),
                      n_max=24, values=("normal",)))
    count = draw(st.integers(1, 4))
    n_qs = draw(st.lists(st.integers(0, 12), min_size=count, max_size=count))
    n_ks = draw(st.lists(st.integers(0, 12), min_size=count, max_size=count))
    if sum(n_qs) == 0:
        n_qs[0] = 1
    if sum(n_ks) == 0:
        n_ks[0] = 1
    return dataclasses.replace(case, n_q=sum(n_qs), n_k=sum(n_ks), cu_seqlens_q=_offsets(n_qs),
                               cu_seqlens_k=_offsets(n_ks))


def _sequences(case: Case) -> list[tuple[slice, slice]]:
    """Each packed sequence's (query rows, key rows)."""
    cq, ck = case.cu_seqlens_q or (), case.cu_seqlens_k or ()
    return [(slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])) for i in range(len(cq) - 1)]


def _alone(case: Case, rows: slice, keys: slice) -> Case:
    """The case of one packed sequence called on its own (no packing)."""
    return dataclasses.replace(case, n_q=rows.stop - rows.start, n_k=keys.stop - keys.start,
                               cu_seqlens_q=None, cu_seqlens_k=None)


@law(strategy=packed_cases, needs=needs_varlen)
def varlen_is_each_sequence_alone(target: Target, case: Case) -> None:
    """With packed sequences (``cu_seqlens_q``, ``cu_seqlens_k``), the rows of each sequence are
    what the same target gives on that sequence alone, causal alignment per sequence (within
    tolerance), and match the float64 golden of that sequence. Empty sequences (no queries or no
    keys) are allowed; rows of a sequence with no keys see nothing (the masked-rows law's).

    Catches: flash-attention#1537 — ``flash_attn_varlen_func`` broke when a sequence had length 0;
    a causal diagonal taken from the packed position instead of the position within the sequence;
    a key range read from ``cu_seqlens_q`` instead of ``cu_seqlens_k``.
    """
    q, k, v = case.arrays()
    out = run(target, case, q, k, v)
    for i, (rows, keys) in enumerate(_sequences(case)):
        one = _alone(case, rows, keys)
        if one.n_q == 0 or one.n_k == 0:
            continue
        args = q[:, rows], k[:, keys], v[:, keys]
        alone = run(target, one, *args)
        assert_same(target, one, out[:, rows], alone, *args,
                    what=f"packed sequence {i} (queries {rows.start}:{rows.stop}, keys "
                         f"{keys.start}:{keys.stop}) called alone, against the packed call")
        assert_matches(target, one, out[:, rows], *args, what=f"packed sequence {i}'s output")


@law(strategy=packed_cases, needs=needs_varlen)
def varlen_no_cross_talk(target: Target, case: Case) -> None:
    """Replacing one packed sequence's queries, keys and values (by others ×1e3) leaves every
    other sequence's output bit-identical (within tolerance if exact_masking=False): nothing
    crosses a sequence boundary.

    Catches: flash-attention#1155 — out-of-bounds writes for zero-length key sequences, which
    overwrote the next sequence's output; a tile that straddles two sequences and reads the
    neighbour's keys past ``cu_seqlens_k[i + 1]``.
    """
    q, k, v = case.arrays()
    seqs = _sequences(case)
    pick = int(case.rng(8).integers(0, len(seqs)))
    rows, keys = seqs[pick]
    rng = case.rng(9)
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for x, at in ((q2, rows), (k2, keys), (v2, keys)):
        x[:, at] = (case.values_like(rng, x[:, at].shape) * 1e3).astype(case.dtype)
    before = run(target, case, q, k, v)
    after = run(target, case, q2, k2, v2)
    others = np.ones(case.n_q, dtype=bool)
    others[rows] = False
    for r, kk in seqs:
        if kk.stop == kk.start:
            others[r] = False  # rows that see nothing: the masked-rows law's
    rows_mask = np.broadcast_to(others, (case.heads, case.n_q))
    vis = np.broadcast_to(others[:, None], (case.heads, case.n_q, case.n_k))
    _assert_unchanged(target, case, before, after, rows_mask, q, k, v, vis,
                      what=f"changing packed sequence {pick}")
