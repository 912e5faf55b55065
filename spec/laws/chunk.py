"""Laws of ``attention_chunk=C`` (Llama 4's chunked local attention): query i sees key j only when
``diag(i) // C == j // C``, positions measured on the target's causal alignment (per batch row for
``kv_lengths`` and over a paged cache, from each packed sequence's start), floored before the
first key; ANDed with ``causal``, ``window`` and ``mask`` (`spec.keywords.chunk`).

Public report: vllm PR #28739 (chunk positions measured top-left while the KV cache aligns queries
bottom-right: wrong Llama 4 outputs).
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec import oracle
from spec.cases import Case, cases
from spec.keywords.chunk import CHUNK, chunk_visible
from spec.keywords.kv_lengths import KV_LENGTHS
from spec.keywords.varlen import VARLEN
from spec.laws import _needs
from spec.laws._helpers import assert_hidden_unmoved, assert_matches, assert_same, run
from spec.registry import law
from spec.target import Target

Array = np.ndarray


needs_chunk = _needs.keyword(CHUNK)


def chunk_cases(target: Target, **given: object) -> st.SearchStrategy[Case]:
    return cases(target, n_max=48, keywords=(CHUNK,), **given)  # type: ignore[arg-type]


@law(strategy=lambda t: chunk_cases(t, masks=("none", "random"), tiles=True), needs=needs_chunk)
def chunk_matches_golden(target: Target, case: Case) -> None:
    """With ``attention_chunk=C`` every row that sees a key matches the float64 golden, whose query
    i sees key j only when diag(i) // C == j // C (ANDed with causal and mask=); C drawn 1..4, up
    to n_k + 2 (one chunk wider than the call, one that does not divide n) or a power of two, on
    sizes around tile edges too.

    Catches: chunked attention built as a sliding window of C keys (|diag − j| < C: the keys a
    query sees slide with it instead of resetting at each chunk's start); a chunk boundary
    computed by truncating division of a negative position.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with attention_chunk={case.param('chunk')}, the output")


@law(strategy=lambda t: chunk_cases(t, masks=("none", "random"), n_k_min=2), needs=needs_chunk)
def chunk_no_leak(target: Target, case: Case) -> None:
    """Changing the keys and values outside one query's chunk leaves every row that sees none of
    them bit-identical (within tolerance if the target declares exact_masking=False): a query
    never sees a key of another chunk.

    Catches: a chunk boundary off by one (j // C compared with (i + 1) // C: the last query of a
    chunk sees the next chunk's keys); a chunk applied to the scores' maximum but not to the sum.
    """
    inputs = case.inputs()
    chunk = case.param("chunk")
    row = int(case.rng(22).integers(0, case.n_q))
    outside = ~np.broadcast_to(chunk_visible(oracle.geometry(target.alignment, inputs), chunk),
                               (*inputs.lead, case.n_q, case.n_k))[..., row, :]  # [*lead, n_k]
    assume(outside.any())
    assert_hidden_unmoved(target, case, inputs, outside,
                          what=f"changing keys outside the attention_chunk={chunk} of query {row}")


@law(strategy=lambda t: chunk_cases(t, masks=("none", "random")), needs=needs_chunk)
def chunk_wider_than_sequence(target: Target, case: Case) -> None:
    """A chunk of C ≥ n_q + n_k positions holds every position of the call from 0 on: where no
    query lies before the first key (every position ≥ 0 on the target's diagonal) it equals no
    chunk (within tolerance; with causal, causal alone), and it matches the golden.

    Catches: a chunk size silently clipped to a kernel's tile (a fixed 16-key chunk); chunk
    indices taken modulo a table of chunk starts sized for the shortest sequence.
    """
    chunk = case.n_q + case.n_k + case.param("chunk")
    inputs = case.inputs().replace(attention_chunk=chunk)
    geo = oracle.geometry(target.alignment, inputs)
    assume(bool(np.all(np.asarray(geo.diagonal) - np.asarray(geo.origin) >= 0)))  # −1 lies in chunk −1
    out = run(target, inputs)
    assert_matches(target, inputs, out, what=f"with attention_chunk={chunk}, the output")
    plain = inputs.replace(attention_chunk=None)
    assert_same(target, plain, run(target, plain), out, what=f"attention_chunk={chunk} against no chunk")


@st.composite
def _unequal_cases(draw: st.DrawFn, target: Target) -> Case:
    case = draw(chunk_cases(target, causal=(False, True), n_k_min=2))
    assume(case.n_q != case.n_k)
    return case


@law(strategy=_unequal_cases, needs=needs_chunk)
def chunk_alignment(target: Target, case: Case) -> None:
    """With n_q ≠ n_k each query's chunk is that of its position on the target's declared diagonal:
    i (top_left) or i + n_k − n_q (bottom_right, square_or_decoding, kv_lengths); the output
    matches that golden.

    Catches: chunk positions measured top-left while the causal mask (and the KV cache) align the
    queries bottom-right, so a decode step's query reads the first chunk of the cache instead of
    its own (vllm PR #28739: wrong Llama 4 outputs).
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with attention_chunk={case.param('chunk')} and n_q={case.n_q}, n_k={case.n_k} "
                        f"({target.alignment} diagonal), the output")


@law(strategy=lambda t: chunk_cases(t, causal=(True,)), needs=needs_chunk & _needs.causal_mode)
def chunk_with_causal(target: Target, case: Case) -> None:
    """``causal=True`` with ``attention_chunk=C`` (Llama 4's chunked attention) sees only the keys of
    its chunk up to its diagonal: it matches the golden, which ANDs the two.

    Catches: a chunked path that drops the causal mask (a query sees the later keys of its chunk);
    causal and chunk composed with OR instead of AND.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"causal with attention_chunk={case.param('chunk')}, the output")


@law(strategy=lambda t: cases(t, n_max=48, ndims=(4,), keywords=(KV_LENGTHS, CHUNK)),
     needs=needs_chunk & _needs.keyword(KV_LENGTHS) & _needs.ndim(4))
def chunk_with_kv_lengths(target: Target, case: Case) -> None:
    """A chunk together with ``kv_lengths`` hides what either hides: the output matches the golden,
    and changing the keys past each row's length moves no row.

    Catches: a chunked code path that builds its own mask and drops the key lengths (the padded
    keys of the last chunk are then attended); chunks measured from the row's length instead of
    the declared diagonal.
    """
    inputs = case.inputs()
    out = run(target, inputs)
    assert_matches(target, inputs, out,
                   what=f"with attention_chunk={case.param('chunk')} and kv_lengths, the output")
    past = np.arange(case.n_k) >= np.asarray(case.param("kv_lengths"))[:, None, None]  # [batch, 1, n_k]
    assert_hidden_unmoved(target, case, inputs, past, before=out, what="changing the keys past kv_lengths")


@law(strategy=lambda t: cases(t, n_max=24, ndims=(3,), values=("normal",), keywords=(VARLEN, CHUNK)),
     needs=needs_chunk & _needs.keyword(VARLEN) & _needs.ndim(3))
def chunk_per_sequence(target: Target, case: Case) -> None:
    """In packed sequences (``cu_seqlens_q``, ``cu_seqlens_k``) each sequence's positions restart
    at 0: a query sees the keys of its own sequence whose position in it lies in its chunk; the
    output matches that golden.

    Catches: chunks computed on the packed token index (a sequence starting mid-chunk has its
    first chunk cut short at the packed chunk's end), right whenever every sequence starts at a
    multiple of C.
    """
    inputs = case.inputs()
    assert_matches(target, inputs, run(target, inputs),
                   what=f"with attention_chunk={case.param('chunk')} in packed sequences "
                        f"{case.param('varlen')}, the output")
