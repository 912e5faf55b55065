"""More laws, for what real kernels are asked to do: key padding, bottom-right (KV-cache) causal
masks passed as ``mask=``, and long rows in low precision."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from spec import golden
from spec.cases import SEEDS, Case, between, boundary_cases, cases, one_of, pick
from spec.laws import _needs
from spec.laws._helpers import assert_hidden_unmoved, assert_matches, run
from spec.laws._range import at_edge
from spec.registry import law
from spec.target import Target

Array = np.ndarray


def key_lengths(case: Case) -> Array:  # -> [batch] ints in [1, n_k]
    """Real keys per sequence: one length per batch entry, at least one of them short."""
    rng = case.rng(5)
    lengths = rng.integers(1, case.n_k + 1, size=case.batch if case.ndim == 4 else 1)
    lengths[rng.integers(0, lengths.size)] = rng.integers(1, max(2, case.n_k))
    return lengths


def padding(case: Case) -> Array:  # -> [batch, 1, 1, n_k] for 4-D, [1, n_k] otherwise (True = a real key)
    kept = np.arange(case.n_k) < key_lengths(case)[:, None]  # [batch, n_k]
    return kept[:, None, None, :] if case.ndim == 4 else kept[:1]


@law(strategy=lambda t: at_edge(t, cases(t, n_k_min=2, values=("normal",), tiles=True), keep=0.5),
     needs=_needs.mask, grid=lambda t: boundary_cases(t, n_k_min=2, tiles=True))
def padding_mask_is_truncation(target: Target, case: Case) -> None:
    """A key-padding mask ``[batch, 1, 1, n_k]`` (broadcast over heads and queries) makes each
    sequence's output what it would be with only its first L_b keys: within tolerance of the
    golden, and bit-identical when the padded keys and values are replaced by others (within
    tolerance if the target declares exact_masking=False). Half the examples have scores up to
    the edge of the dtype's range (finfo).

    Catches: a broadcast mask applied to the wrong sequence (a flattened (batch, heads) index
    mapped back as f % batch instead of f // heads); a kernel that only honours full-shape masks;
    an additive ``finfo(float16).min`` mask, under which a padded key whose score exceeds the real
    keys' by more than 65504 gets the weight (transformers#17306's fill).
    """
    mask = padding(case)
    inputs = case.inputs().replace(mask=mask)
    out = run(target, inputs)
    assert_matches(target, inputs, out, what="with key padding, the output")
    assert_hidden_unmoved(target, case, inputs, ~mask[:, 0] if case.ndim == 4 else ~mask[0], before=out,
                          what=f"changing padded keys/values (key lengths {key_lengths(case).tolist()})")


def _decoding_cases(t: Target) -> st.SearchStrategy[Case]:
    return at_edge(t, cases(t, causal=(False,), n_max=48, tiles=True).filter(lambda c: c.n_k >= c.n_q),
                   keep=0.5)


@law(strategy=_decoding_cases, needs=_needs.mask,
     grid=lambda t: boundary_cases(t, causal=(False,), keep=lambda c: c.n_k >= c.n_q, tiles=True))
def bottom_right_causal_mask(target: Target, case: Case) -> None:
    """``mask=causal_mask(n_q, n_k, align="bottom_right")`` (query i sees keys j ≤ i + n_k − n_q,
    the alignment of decoding after n_k − n_q cached tokens) gives, in each row i, the output of a
    call with that query alone and the keys 0..i + n_k − n_q, no mask: both within tolerance of the
    golden. Half the examples have scores up to the edge of the dtype's range (finfo).

    Catches: a mask argument that is dropped in favour of the kernel's own top-left causal mode
    (FlashAttention < 2.1 semantics, PyTorch's is_causal); a mask read transposed or shifted by
    the cache length.
    """
    inputs = case.inputs().replace(mask=golden.causal_visible(case.n_q, case.n_k, "bottom_right"))
    assert_matches(target, inputs, run(target, inputs), what="with a bottom-right causal mask, the output")
    i = int(case.rng(7).integers(0, case.n_q))
    seen = i + case.n_k - case.n_q + 1
    one = inputs.replace(q=inputs.q[..., i:i + 1, :], k=inputs.k[..., :seen, :], v=inputs.v[..., :seen, :],
                         mask=None)
    assert_matches(target, one, run(target, one),
                   what=f"query {i} decoded alone over keys 0..{seen - 1}, the output")


LONG_ROWS = (1024, 2048, 4096)


LONG_ROW_LENGTHS = (st.sampled_from(LONG_ROWS), st.integers(1025, 4096))  # branches for `one_of`


def _long_row_widths(draw: st.DrawFn, t: Target) -> tuple[int, int]:
    """(d_k, d_v): d_k of 8, 16 or 64 and d_v ≤ 8 where the target takes any width; inside its
    ``head_dims`` (d_v = d_k under ``equal_head_dims``) where it declares them. One slice of at
    most 4 rows and 4,096 keys: a width of 512 holds 2 million keys' entries, 16 MB in float64."""
    if t.head_dims is None:
        return pick(draw, (8, 16, 64)), draw(between(1, 8))
    d_k = pick(draw, t.head_dims)
    return d_k, d_k if t.equal_head_dims else pick(draw, t.head_dims)


@st.composite
def _long_row_cases(draw: st.DrawFn, t: Target) -> Case:
    d_k, d_v = _long_row_widths(draw, t)
    return Case(dtype=pick(draw, t.dtypes), ndim=pick(draw, t.ndims), batch=1, heads=1,
                n_q=draw(between(1, 4)), n_k=one_of(draw, LONG_ROW_LENGTHS), d_k=d_k,
                d_v=d_v, seed=draw(SEEDS), values=pick(draw, ("normal", "ints")),
                amplitude=pick(draw, (1e-4, 1e-2)))


def _longest_rows(t: Target) -> list[Case]:
    """The longest row in each declared dtype, first: where a key-by-key sum loses the most (d_k =
    16, d_v = 4, or the smallest declared head size)."""
    d_k, d_v = (min(t.head_dims), min(t.head_dims)) if t.head_dims else (16, 4)
    return [Case(dtype=dtype, ndim=min(t.ndims), batch=1, heads=1, n_q=2, n_k=LONG_ROWS[-1], d_k=d_k, d_v=d_v,
                 seed=i, values="ints", amplitude=1e-4) for i, dtype in enumerate(t.dtypes)]


def _long_rows_served(t: Target, case: Case) -> Case:
    """A long-row case narrowed to the serving declarations: one query (``decode_only``), a square
    of the shortest long row (``self_attention_only``), causal (``causal_only``, where the alignment is
    bottom-right, so that each query still sees about n_k keys; top-left, the law is skipped)."""
    if t.decode_only:
        case = case.replace(n_q=1)
    if t.self_attention_only:  # a square of the shortest long row: 4,096² scores cost seconds a call
        case = case.replace(n_q=min(case.n_k, LONG_ROWS[0]), n_k=min(case.n_k, LONG_ROWS[0]))
    return case.replace(causal=t.causal_only and t.alignment != "top_left")


@law(strategy=lambda t: _long_row_cases(t).map(lambda c: _long_rows_served(t, c)),
     grid=lambda t: [_long_rows_served(t, c) for c in _longest_rows(t)], scope="generic")
def long_rows_every_dtype(target: Target, case: Case) -> None:
    """Rows of 1,024–4,096 keys stay within the tolerance policy in every declared dtype (values
    in [1, ∞) and small amplitudes, so the weights are near-uniform, ~1/n_k each: the hardest
    sum); the worst error ratio is reported per dtype. One (batch, head) slice, in any rank the
    target declares; the longest row (4,096 keys) in each dtype comes first.

    Catches: a softmax denominator or weighted sum accumulated one key at a time in float16 —
    past 2,048 keys each weight of 1/4,096 is below half an ulp of the running sum 0.5 and is lost
    (NumPy's pairwise float16 sum, the baseline's, keeps it).
    """
    v = case.inputs().v
    inputs = case.inputs().replace(v=(1 + np.abs(v)).astype(case.dtype))  # values ≥ 1: the output is ~1.5
    assert_matches(target, inputs, run(target, inputs),
                   what=f"over {case.n_k} keys in {case.dtype}, the output")
