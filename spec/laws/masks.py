"""More laws, for what real kernels are asked to do: key padding, bottom-right (KV-cache) causal
masks passed as ``mask=``, and long rows in low precision.

Listed in :data:`spec.registry.LAW_MODULES`, like :mod:`spec.laws.core`; the comparisons use
the same golden, baseline and floor (:mod:`spec.tolerance`) but with visibilities that
:class:`~spec.cases.Case` does not build.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st

from spec import golden, tolerance
from spec.cases import Case, cases
from spec.laws._helpers import assert_matches, needs_mask, run
from spec.laws._range import at_edge
from spec.registry import law
from spec.target import Target

Array = np.ndarray


def assert_close(
    target: Target, case: Case, out: Array, q: Array, k: Array, v: Array, *, visible: Array, what: str,
) -> tolerance.Comparison:
    """``out`` within the tolerance policy of the float64 golden for this visibility (rows that see
    a key): :func:`spec.laws._helpers.assert_matches` with the law's own visibility."""
    __tracebackhide__ = True
    return assert_matches(target, case, out, q, k, v, visible=visible, what=what)


def key_lengths(case: Case) -> Array:  # -> [batch] ints in [1, n_k]
    """Real keys per sequence: one length per batch entry, at least one of them short."""
    rng = case.rng(5)
    lengths = rng.integers(1, case.n_k + 1, size=case.batch if case.ndim == 4 else 1)
    lengths[rng.integers(0, lengths.size)] = rng.integers(1, max(2, case.n_k))
    return lengths


def padding(case: Case) -> Array:  # -> [batch, 1, 1, n_k] for 4-D, [1, n_k] otherwise
    lengths = key_lengths(case)
    if case.ndim == 4:
        return golden.lengths_visible(lengths, case.n_k)  # one row broadcast over heads and queries
    return golden.lengths_visible(lengths, case.n_k)[0, 0]


@law(strategy=lambda t: at_edge(cases(t, n_k_min=2, values=("normal",)), keep=0.5), needs=needs_mask)
def padding_mask_is_truncation(target: Target, case: Case) -> None:
    """A key-padding mask ``[batch, 1, 1, n_k]`` (broadcast over heads and queries) makes each
    sequence's output what it would be with only its first L_b keys: within tolerance of the
    golden, and bit-identical when the padded keys and values are replaced by others ×1e3 (within
    tolerance if the target declares exact_masking=False). Half the examples have scores up to
    the edge of the dtype's range (finfo).

    Catches: a broadcast mask applied to the wrong sequence (a flattened (batch, heads) index
    mapped back as f % batch instead of f // heads); a kernel that only honours full-shape masks;
    an additive ``finfo(float16).min`` mask, under which a padded key whose score exceeds the real
    keys' by more than 65504 gets the weight (transformers#17306's fill).
    """
    q, k, v = case.arrays()
    mask = padding(case)
    vis = np.broadcast_to(mask, (*case.lead(), case.n_q, case.n_k))
    if case.causal:
        vis = vis & golden.causal_visible(case.n_q, case.n_k, target.alignment)
    out = run(target, case, q, k, v, mask=mask)
    assert_close(target, case, out, q, k, v, visible=vis, what="with key padding, the output")
    # Replace what is padded, and nothing else.
    kept = np.arange(case.n_k) < key_lengths(case)[:, None]  # [batch, n_k]
    pad = ~kept[:, None, :, None] if case.ndim == 4 else ~kept[0][:, None]  # against [..., n_k, d]
    rng = case.rng(6)
    k2 = np.where(pad, (case.values_like(rng, k.shape) * 1e3).astype(case.dtype), k)
    v2 = np.where(pad, (case.values_like(rng, v.shape) * 1e3).astype(case.dtype), v)
    after = run(target, case, q, k2, v2, mask=mask)
    # A row that sees nothing follows the target's masked_rows policy, a law of its own.
    rows = np.asarray(vis.any(axis=-1))[..., None]
    if target.exact_masking:
        same = (after == out) | (np.isnan(after) & np.isnan(out)) | ~rows
        if not same.all():
            at = tuple(int(i) for i in np.argwhere(~same)[0])
            raise AssertionError(
                f"changing padded keys/values changed output {list(at)} from {float(out[at])!r} "
                f"to {float(after[at])!r} (key lengths {key_lengths(case).tolist()})"
            )
    else:
        assert_close(target, case, after, q, k, v, visible=vis,
                     what="after changing padded keys/values, the output")


def _decoding_cases(t: Target) -> st.SearchStrategy[Case]:
    return at_edge(cases(t, causal=(False,), n_max=48).filter(lambda c: c.n_k >= c.n_q), keep=0.5)


@law(strategy=_decoding_cases, needs=needs_mask)
def bottom_right_causal_mask(target: Target, case: Case) -> None:
    """``mask=causal_mask(n_q, n_k, align="bottom_right")`` (query i sees keys j ≤ i + n_k − n_q,
    the alignment of decoding after n_k − n_q cached tokens) gives, in each row i, the output of a
    call with that query alone and the keys 0..i + n_k − n_q, no mask: both within tolerance of the
    golden. Half the examples have scores up to the edge of the dtype's range (finfo).

    Catches: a mask argument that is dropped in favour of the kernel's own top-left causal mode
    (FlashAttention < 2.1 semantics, PyTorch's is_causal); a mask read transposed or shifted by
    the cache length.
    """
    q, k, v = case.arrays()
    mask = golden.causal_visible(case.n_q, case.n_k, "bottom_right")
    vis = np.broadcast_to(mask, (*case.lead(), case.n_q, case.n_k))
    out = run(target, case, q, k, v, mask=mask)
    assert_close(target, case, out, q, k, v, visible=vis, what="with a bottom-right causal mask, the output")
    i = int(case.rng(7).integers(0, case.n_q))
    seen = i + case.n_k - case.n_q + 1
    one = dataclasses.replace(case, n_q=1, n_k=seen, causal=False, mask="none")
    alone = run(target, one, q[..., i:i + 1, :], k[..., :seen, :], v[..., :seen, :], mask=None)
    assert_close(target, one, alone, q[..., i:i + 1, :], k[..., :seen, :], v[..., :seen, :],
                 visible=np.ones((1, seen), dtype=bool),
                 what=f"query {i} decoded alone over keys 0..{seen - 1}, the output")


LONG_ROWS = (1024, 2048, 4096)


def _long_row_cases(t: Target) -> st.SearchStrategy[Case]:
    return st.builds(
        Case, dtype=st.sampled_from(t.dtypes), ndim=st.sampled_from(t.ndims), batch=st.just(1),
        heads=st.just(1),
        n_q=st.integers(1, 4), n_k=st.one_of(st.sampled_from(LONG_ROWS), st.integers(1025, 4096)),
        d_k=st.sampled_from((8, 16, 64)), d_v=st.integers(1, 8), seed=st.integers(0, 2**32 - 1),
        values=st.sampled_from(("normal", "ints")), amplitude=st.sampled_from((1e-4, 1e-2)),
    )


@law(strategy=_long_row_cases)
def long_rows_every_dtype(target: Target, case: Case) -> None:
    """Rows of 1,024–4,096 keys stay within the tolerance policy in every declared dtype (values
    in [1, ∞) and small amplitudes, so the weights are near-uniform, ~1/n_k each: the hardest
    sum); the worst error ratio is reported per dtype. One (batch, head) slice, in any rank the
    target declares.

    Catches: a softmax denominator or weighted sum accumulated one key at a time in float16 —
    past 2,048 keys each weight of 1/4,096 is below half an ulp of the running sum 0.5 and is lost
    (NumPy's pairwise float16 sum, the baseline's, keeps it).
    """
    q, k, v = case.arrays()
    v = (1 + np.abs(v)).astype(case.dtype)  # values ≥ 1: the output is ~1.5, not a mean near 0
    out = run(target, case, q, k, v, causal=False, mask=None)
    assert_close(target, case, out, q, k, v, visible=np.ones((*case.lead(), case.n_q, case.n_k), dtype=bool),
                 what=f"over {case.n_k} keys in {case.dtype}, the output")
