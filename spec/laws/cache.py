"""Laws of KV caches as inference kernels read them: paged caches (``block_table=``), float8
caches (``k_descale=``, ``v_descale=``), and causal attention aligned to each sequence's cache
(decoding, chunked prefill).

A **paged cache** (vLLM's PagedAttention; FlashAttention's ``block_table``; FlashInfer's page
table) keeps every sequence's keys in fixed-size blocks of one shared pool:

    k [num_blocks, block_size, heads_kv, d_k], v [num_blocks, block_size, heads_kv, d_v]  (any layout)
    key j of sequence b = k[block_table[b, j // block_size], j % block_size],   j < kv_lengths[b]

``kv_lengths`` always comes with the table (`PAGED` carries it). Nothing else in the pool may be
read: other sequences' blocks, blocks nobody owns, the tail of a sequence's last block, and
table entries past its last block — the cases fill them with NaN or huge values, and redraw them.
Causal attention and windows over a paged cache are bottom-right aligned per sequence, diag =
i + kv_lengths[b] − n_q (the last query sees every key of its sequence); so is ALiBi's distance.

A **float8 cache** (FlashAttention 3's ``k_descale``/``v_descale``; vLLM's ``fp8`` KV cache) holds
k and v as ``float8_e4m3fn`` codes (ml_dtypes), with one float32 scale per batch row and K/V head:
the keys mean ``k.astype(float32) · k_descale[b, g]``, the values likewise. The cases draw the
scales log-uniform over a factor of 64, per row and head, apart for K and V — and, where the
case's dtype can hold them, caches whose keys and values leave float16's range (`WIDE_RANGE`).

The declarations (`PAGED`, `FP8`, in `spec.keywords.paged` and `spec.keywords.fp8`) say how a
case writes its keys into a cache (``writes``) and how the oracle reads them back (their
`spec.keywords.Reads` terms): the golden owes nothing to any kernel's gather.
``causal_alignment="kv_lengths"`` (`spec.Target`) is the same per-sequence alignment for
contiguous keys with ``kv_lengths=`` (`spec.laws.lengths`).
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec import oracle
from spec.cases import BOOLEANS, Case, between, cases, grid_width, pick
from spec.inputs import Inputs
from spec.keywords.fp8 import FP8, SCALE_RANGE, draw_scales
from spec.keywords.kv_lengths import draw_lengths
from spec.keywords.paged import FILLS, PAGED, _lengths, block_choices, fill_value, owned
from spec.keywords.window import draw as draw_window
from spec.laws import _needs
from spec.laws._helpers import (
    assert_empty_rows_follow_policy,
    assert_matches,
    assert_same,
    first_true,
    run,
    same_bits,
)
from spec.registry import Need, law
from spec.target import Target

Array = np.ndarray

# --- the declarations are spec.keywords.paged's (PAGED) and spec.keywords.fp8's (FP8) -------------

needs_paged = _needs.keyword(PAGED) & _needs.ndim(4)
needs_fp8 = _needs.both(_needs.keyword(FP8), _needs.ml_dtypes) & _needs.ndim(4)


# --- cases -------------------------------------------------------------------------------------


def _gqa_choices(t: Target) -> tuple[bool, ...]:
    return (False, True) if t.supports_gqa else (False,)


@st.composite
def paged_cases(draw: st.DrawFn, t: Target, *, n_max: int = 40, block_sizes: bool = False,
                gqa: bool | None = None) -> Case:
    """4-D paged cases: 2–3 sequences of their own lengths, a block size, a poison; grouped K/V
    heads where the target has them (``gqa``: always or never); causal or not. ``block_sizes``:
    the block size at least 2 and below the longest length (so that another block size is
    another blocking)."""
    gqa = pick(draw, _gqa_choices(t)) if gqa is None else gqa
    m = t.block_multiple or 1  # block sizes are multiples of it: lengths past one block drawn
    wide = {"n_max": max(n_max, 3 * m), "n_k_min": m + 1} if block_sizes and m > 1 else {"n_max": n_max}
    case = draw(cases(t, ndims=(4,), values=("normal",), gqa=gqa, keywords=(PAGED,), **wide))  # type: ignore[arg-type]
    if block_sizes:
        longest = max(_lengths(case))
        assume(longest >= max(3, m + 1))
        size = draw(between(2, longest - 1)) if m == 1 else m * draw(between(1, (longest - 1) // m))
        case = case.with_keyword("paged", (size, case.param("paged")[1]))
    return case


def _paged_parts(inputs: Inputs) -> tuple[Array, Array, int]:  # -> block_table, kv_lengths, num_blocks
    return np.asarray(inputs.get("block_table")), np.asarray(inputs.get("kv_lengths")), inputs.k.shape[0]


# --- paged laws --------------------------------------------------------------------------------


@law(strategy=paged_cases, needs=needs_paged)
def paged_matches_golden(target: Target, case: Case) -> None:
    """Over a paged cache (``block_table=``, ``kv_lengths=``; block sizes from 1 up, tables in
    shuffled physical order) the output matches the float64 golden of the contiguous keys and
    values the table gathers, key j of sequence b at k[block_table[b, j // block_size],
    j % block_size] (causal per sequence); rows that see no key (a sequence of length 0) hold
    the declared masked-row policy.

    Catches: a block index off by one (block_table[b, j // block_size + 1]); the offset inside a
    block swapped with the block index (k[block_table[b, j % block_size], j // block_size]);
    every sequence reading row 0 of the table.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    assert_empty_rows_follow_policy(target, inputs, out)
    assert_matches(target, inputs, out, what=f"over a paged cache (block size {case.param('paged')[0]}), "
                                             "the output")


@law(strategy=paged_cases, needs=needs_paged)
def paged_reads_only_its_keys(target: Target, case: Case) -> None:
    """Nothing a sequence does not own is read: with every pool position that holds no
    sequence's key (the tail of each last block, blocks nobody owns) changed from NaN to huge
    values or back, and the table's entries past each sequence's last block redrawn, the output
    is bit-identical (within tolerance if exact_masking=False) and finite wherever a row sees a
    key.

    Catches: a stale tail read — a kernel that attends to the whole last block, keys past
    kv_lengths[b] included (the NaNs vLLM zeroes its value tails against); a prefetch of the
    table entry after a sequence's last block used as data.
    """
    inputs = case.inputs()
    block_size, fill = case.param("paged")
    table, lengths, num_blocks = _paged_parts(inputs)
    keep = owned(table, lengths, num_blocks, block_size)[:, :, None, None]
    other = FILLS[1 - FILLS.index(fill)]
    counts = -(-lengths // block_size)
    tails = np.arange(table.shape[1]) >= counts[:, None]
    redrawn = np.where(tails, case.rng(61).integers(0, num_blocks, size=table.shape), table)

    def poisoned(pool: Array) -> Array:
        return np.where(keep, pool, fill_value(other, pool.dtype)).astype(pool.dtype)

    changed = inputs.replace(k=poisoned(inputs.k), v=poisoned(inputs.v),
                             block_table=redrawn.astype(table.dtype))
    before, after = run(target, inputs), run(target, changed)
    want = oracle.expected(target, inputs)
    for out, poison in ((before, fill), (after, other)):
        bad = want.seen[..., None] & ~np.isfinite(out)
        if (at := first_true(bad)) is not None:
            raise AssertionError(f"with {poison} where no sequence's key is, output {list(at)} is "
                                 f"{float(out[at])!r}: something a sequence does not own was read")
    if not target.exact_masking:
        assert_matches(target, inputs, after, what=f"with the unowned pool positions {other}, the output")
        return
    if (at := first_true(~same_bits(before, after))) is not None:
        raise AssertionError(f"changing the pool positions no sequence owns ({fill} -> {other}) and the "
                             f"table entries past each last block changed output {list(at)} from "
                             f"{float(before[at])!r} to {float(after[at])!r}")


def _long_blocks(t: Target) -> list[Case]:
    """One case whose sums are long enough to round differently in another order: two sequences
    of 48 and 37 keys in blocks of 4 (or the target's block multiple), each row summing over
    every key it sees, a finite poison (so a kernel that reads the whole pool keeps finite sums,
    whose order then shows), in the target's first dtype and the boundary grid's width."""
    block = max(4, t.block_multiple or 1)
    width = grid_width(t)
    return [Case(dtype=t.dtypes[0], ndim=4, batch=2, heads=1, n_q=4, n_k=48, d_k=width, d_v=width, seed=62,
                 causal=False, keywords={"kv_lengths": (48, 37), "paged": (block, "huge")})]


@law(strategy=paged_cases, needs=needs_paged, grid=_long_blocks)
def paged_block_order_invariant(target: Target, case: Case) -> None:
    """Moving the physical blocks of the pool (a permutation, the table rewritten to match) leaves
    the output bit-identical (within tolerance if deterministic=False): a correct kernel reads
    each sequence's keys in their logical order, so where a block sits changes no operation.
    First a case of rows long enough (48 keys) that another order of their sums rounds
    differently (`_long_blocks`), then drawn ones.

    Catches: a kernel that visits a sequence's blocks in physical order (a sorted table, or a
    pool-order scan with the positions carried along): right up to rounding, but its sums
    depend on where the allocator put the blocks, so the same request gives other bits on
    another server.
    """
    inputs = case.inputs()
    table, _, num_blocks = _paged_parts(inputs)
    moved = case.rng(62).permutation(num_blocks)  # block i goes to place moved[i]
    k, v = np.empty_like(inputs.k), np.empty_like(inputs.v)
    k[moved], v[moved] = inputs.k, inputs.v
    shuffled = inputs.replace(k=k, v=v, block_table=moved[table].astype(table.dtype))
    before, after = run(target, inputs), run(target, shuffled)
    if not target.deterministic:
        assert_same(target, inputs, before, after, what="with the pool's blocks moved")
        return
    if (at := first_true(~same_bits(before, after))) is not None:
        raise AssertionError(f"moving the pool's physical blocks (the table rewritten to match) changed "
                             f"output {list(at)} from {float(before[at])!r} to {float(after[at])!r}")


@law(strategy=lambda t: paged_cases(t, block_sizes=True), needs=needs_paged)
def paged_block_size_invariant(target: Target, case: Case) -> None:
    """The same keys paged in blocks of another size (1, or one that does not divide the lengths)
    give the same output within twice the tolerance, both matching the golden. Not
    bit-identical: a correct kernel may tile its sums by block (vLLM's per-block dot products,
    FlashInfer's per-page partial softmax), so another block size is another summation order.

    Catches: a last partial block dropped (⌊L / block_size⌋ blocks read instead of ⌈L /
    block_size⌉), right only when the block size divides every length; a block size taken from a
    compile-time constant instead of the pool's shape.
    """
    inputs = case.inputs()
    block_size, fill = case.param("paged")
    m = target.block_multiple or 1  # another block size, a multiple of it too
    other = m if block_size > max(2, m) and case.rng(63).random() < 0.3 else block_size + m
    reblocked = case.with_keyword("paged", (other, fill)).inputs()
    out, again = run(target, inputs), run(target, reblocked)
    assert_matches(target, inputs, out, what=f"in blocks of {block_size}, the output")
    assert_matches(target, reblocked, again, what=f"in blocks of {other}, the output")
    assert_same(target, inputs, out, again, what=f"blocks of {other} against blocks of {block_size}")


# --- causal attention aligned per sequence: decoding and chunked prefill -----------------------

LONG_CACHES = (255, 256, 257, 1024, 2049, 3000)
"""Cache lengths past the short tiles, for decoding (one query): a few thousand keys, kept cheap
(two sequences, one or two heads, widths ≤ 8; fewer keys for wider declared heads, `CACHE_ENTRIES`)."""


def _per_sequence_contiguous(t: Target) -> bool:
    """Contiguous keys with kv_lengths= aligned per sequence (`Target.causal_alignment`)."""
    return t.causal_alignment in ("kv_lengths", "top_left_kv_lengths") and t.supports_kv_lengths


aligned_per_sequence = Need(
    lambda t: None if t.supports_paged_kv or _per_sequence_contiguous(t) else
    "needs block_table= (target declares supports_paged_kv=False) or kv_lengths= with "
    "causal_alignment='kv_lengths'",
    "block_table= (supports_paged_kv) or kv_lengths= with causal_alignment='kv_lengths'")


CACHE_ENTRIES = LONG_CACHES[-1] * 8
"""The most entries (keys × width) a cache case holds per sequence and K/V head: the longest
cache at width 8; wider heads get fewer keys (at 128, up to 187)."""


def _cache_widths(t: Target, base: Case) -> tuple[int, int]:
    """(d_k, d_v): the drawn widths, cut to ≤ 8 where the target takes any, as drawn (inside its
    ``head_dims``) where it declares them."""
    if t.head_dims is not None:
        return base.d_k, base.d_v
    return min(base.d_k, 8), min(base.d_v, 8)


@st.composite
def cache_cases(draw: st.DrawFn, t: Target) -> Case:
    """Decoding (one query over up to `LONG_CACHES` keys) and chunked prefill (2–8 queries, each
    sequence's cache of its own length), causal, sometimes with a window; paged where the target
    takes a paged cache, contiguous with kv_lengths where it aligns them per sequence."""
    paged = t.supports_paged_kv and (not _per_sequence_contiguous(t) or draw(BOOLEANS))
    base = draw(cases(t, ndims=(4,), causal=(True,), n_max=8, values=("normal",),
                      gqa=pick(draw, _gqa_choices(t))))
    decoding = t.decode_only or draw(BOOLEANS)  # a decode kernel: every case decodes
    n_q = 1 if decoding else draw(between(2, 8))
    long = decoding and draw(BOOLEANS)
    d_k, d_v = _cache_widths(t, base)
    most = max(n_q, CACHE_ENTRIES // max(d_k, d_v))  # keys per sequence and head
    n_k = pick(draw, tuple(n for n in LONG_CACHES if n <= most) or (most,)) if long else \
        draw(between(n_q, min(48, most)))
    case = base.replace(n_q=n_q, n_k=n_k, d_k=d_k, d_v=d_v, causal=True, mask="none")
    case = draw_lengths(draw, t, case)  # each sequence's own cache length, some shorter than the chunk
    if t.supports_window and draw(BOOLEANS):
        case = draw_window(draw, t, case)
    if paged:
        case = case.with_keyword("paged", (pick(draw, block_choices(t)), pick(draw, FILLS)))
    return case


@law(strategy=cache_cases, needs=aligned_per_sequence & _needs.causal_mode)
def causal_aligned_per_sequence(target: Target, case: Case) -> None:
    """Decoding and chunked prefill: with causal=True over a paged cache, or over contiguous keys
    with kv_lengths= for a target declaring causal_alignment='kv_lengths', query i of sequence b
    sees keys j ≤ i + kv_lengths[b] − n_q — its last query sees the whole cache — with a window
    measured from that diagonal; one query over up to 3,000 keys, or 2–8 over caches of their
    own lengths. The output matches that golden.

    Catches: a chunked prefill aligned top-left (query i sees keys j ≤ i, the cache ignored); a
    diagonal at i + n_k − n_q from the longest sequence (or the table's capacity) instead of each
    sequence's own length.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    assert_empty_rows_follow_policy(target, inputs, out)
    assert_matches(target, inputs, out, what=f"causal over caches of lengths {list(_lengths(case))} with "
                                             f"{case.n_q} queries, the output")


# --- float8 laws -------------------------------------------------------------------------------


@st.composite
def fp8_cases(draw: st.DrawFn, t: Target, *, gqa: bool | None = None, n_max: int = 32,
              wide: bool = True) -> Case:
    """4-D float8 cases, paged where the target takes float8 caches only paged (and half the time
    where it takes paged caches at all), contiguous otherwise; ``wide``: caches past float16's
    range among them (`draw_scales`)."""
    paged = t.supports_paged_kv and (t.fp8_kv_paged_only or draw(BOOLEANS))
    with_gqa = pick(draw, _gqa_choices(t)) if gqa is None else gqa
    if paged:
        case = draw(paged_cases(t, n_max=n_max, gqa=with_gqa))
    else:
        case = draw(cases(t, ndims=(4,), n_max=n_max, values=("normal",), gqa=with_gqa))
    return draw_scales(draw, t, case, wide=wide)


@law(strategy=fp8_cases, needs=needs_fp8)
def fp8_matches_golden(target: Target, case: Case) -> None:
    """With k and v as float8_e4m3fn codes and their descales (``k_descale=``, ``v_descale=``
    ``[batch, heads_kv]``, log-uniform from 1/16 to 4 — and, in half the cases whose dtype and
    compute dtype reach past float16, from 256 to 512 with codes filling e4m3's range, so the
    dequantized keys and values reach 86,016 to 229,376), the output matches the float64 golden
    of the dequantized keys and values ``codes · descale``, within the tolerance plus what
    rounding the weights to e4m3 for the P·V product may cost (`spec.tolerance.weights_floor`).

    Catches: a descale applied to K only (the values read as raw codes); a descale applied by
    division instead of multiplication; codes read as int8; a cache dequantized in float16
    (saturating at 65,504) by a kernel that computes in float32.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what="with a float8 cache, the output")


def _spread(count: int, rng: np.random.Generator) -> tuple[float, ...]:
    """``count`` distinct descales, a factor of 2 apart or more, in shuffled order."""
    exponents = np.linspace(SCALE_RANGE[0], SCALE_RANGE[1], count) if count > 1 else np.zeros(1)
    return tuple(float(np.float32(2.0 ** e)) for e in rng.permutation(exponents))


@st.composite
def _per_head_cases(draw: st.DrawFn, t: Target) -> Case:
    case = draw(fp8_cases(t, gqa=t.supports_gqa, wide=False))
    g = case.kv_heads or case.heads
    assume(case.batch * g >= 2)
    rng = case.rng(64)
    k_scales, v_scales = (np.asarray(_spread(case.batch * g, rng)).reshape(case.batch, g) for _ in range(2))
    return case.with_keyword("fp8", tuple(tuple(map(tuple, x.tolist())) for x in (k_scales, v_scales)))


@law(strategy=_per_head_cases, needs=needs_fp8 &
     _needs.not_declared("fp8_scale", "tensor", "descales per batch row and K/V head"))
def fp8_per_row_and_kv_head(target: Target, case: Case) -> None:
    """Each descale reaches its own (batch row, K/V head): with every row's and head's descales
    distinct (a factor of two or more apart, shuffled) and grouped K/V heads where the target has
    them, the output matches the golden, in which query head i reads K/V head i // (h / g) and
    its scale.

    Catches: descales indexed by the query head (k_descale read as [batch, heads], so with
    grouped heads each query head takes another K/V head's scale); batch row 0's descales used
    for every row.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs), what="with distinct descales per row and K/V head, "
                                                             "the output")


@st.composite
def _apart_cases(draw: st.DrawFn, t: Target) -> Case:
    case = draw(fp8_cases(t, wide=False))
    g = case.kv_heads or case.heads
    ratio = 2.0 ** pick(draw, (-4, -3, 3, 4))
    k_scale = pick(draw, (0.25, 0.5, 1.0))
    k_scales = tuple((k_scale,) * g for _ in range(case.batch))
    v_scales = tuple((float(np.float32(k_scale * ratio)),) * g for _ in range(case.batch))
    return case.with_keyword("fp8", (k_scales, v_scales))


@law(strategy=_apart_cases, needs=needs_fp8)
def fp8_k_and_v_not_interchangeable(target: Target, case: Case) -> None:
    """K's and V's descales are not interchangeable: with V's descale 8 or 16 times K's (or
    K's that much larger), the output matches the golden, where K's scale multiplies the scores
    and V's the output.

    Catches: k_descale and v_descale swapped (a kernel that takes them positionally in the other
    order, or one descale applied to both k and v).
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what="with K's and V's descales far apart, the output")

