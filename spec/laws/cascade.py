"""Cascade laws: attention computed in pieces and put back together gives the one call.

- **Shared prefix** (FlashInfer's cascade attention, prefix caching): sequences that share a prefix
  of keys attend to it in one call that holds every sequence's queries, and to their own suffixes
  in another; the two states, merged by their logsumexps, are attention over the whole. The merge
  is the suite's (`spec.laws.lse.merge`, float64) fed by the target's own LSE, and the target's own
  merge where it declares one (``Target(merge=...)``, a `spec.MergeTarget`).
- **Chunked prefill** (vLLM, SGLang): a prompt's queries in chunks, each against the cache of every
  key up to its end (bottom-right or per-sequence causal alignment, or a past cache the chunk's
  queries continue, so the chunk's last query sees the cache's last key), give the rows of one call
  on the whole prompt — within tolerance for every
  target, bit for bit for one that declares ``invariant=("chunked_prefill",)``.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import strategies as st

from spec.cases import Case, between, cases, pick, split_point
from spec.inputs import Inputs
from spec.keywords.lse import LSE
from spec.laws import _needs
from spec.laws._helpers import assert_same, run, run_lse
from spec.laws.invariance import assert_same_bits
from spec.laws.lse import assert_lse_close, merge
from spec.laws.past import run_past
from spec.merge_target import MergeTarget, merge_call
from spec.registry import Need, law
from spec.target import Target

Array = np.ndarray

CHUNKS = 90
"""The random stream (`spec.cases.Case.rng`) of where a prompt is cut into chunks."""


# --- shared prefix -------------------------------------------------------------------------------


def shared_prefix_cases(t: Target) -> st.SearchStrategy[Case]:
    """4-D calls of 1–3 sequences, non-causal, with at least two keys (a prefix and a suffix)."""
    return cases(t, ndims=(4,), causal=(False,), n_k_min=2, n_max=32, values=("normal",), scale=True)


def with_shared_prefix(inputs: Inputs, t: int) -> Inputs:
    """``inputs`` whose first ``t`` keys and values are batch row 0's in every row: a shared prefix."""
    k, v = np.array(inputs.k), np.array(inputs.v)
    k[:, :, :t], v[:, :, :t] = k[:1, :, :t], v[:1, :, :t]
    return inputs.replace(k=k, v=v)


def prefix_call(inputs: Inputs, t: int) -> Inputs:
    """Every sequence's queries in one row against the shared prefix: q ``[1, h, batch·n_q, d_k]``."""
    b, h, n_q, d = inputs.q.shape
    folded = np.ascontiguousarray(np.swapaxes(inputs.q, 0, 1).reshape(1, h, b * n_q, d))
    return inputs.replace(q=folded, k=np.ascontiguousarray(inputs.k[:1, :, :t]),
                          v=np.ascontiguousarray(inputs.v[:1, :, :t]))


def unfolded(x: Array, batch: int) -> Array:  # [1, h, batch·n_q, ...] -> [batch, h, n_q, ...]
    """A prefix call's output or LSE back to one row per sequence."""
    h = x.shape[1]
    return np.swapaxes(x[0].reshape(h, batch, -1, *x.shape[3:]), 0, 1)


def own_merge(target: Target) -> MergeTarget | None:
    """The target's merge operator (``Target.merge``) as a `spec.MergeTarget`: as declared, or a
    function read as one in the target's layout, LSE base and empty LSE; None when it declares none."""
    given = target.merge
    if given is None or isinstance(given, MergeTarget):
        return given
    return MergeTarget(given, lse_base=target.lse_base, empty_lse=target.empty_lse, layout=target.layout,
                       dtypes=target.dtypes)


@law(strategy=shared_prefix_cases, needs=_needs.keyword(LSE) & _needs.ndim(4))
def cascade_shared_prefix(target: Target, case: Case) -> None:
    """Sequences sharing their first t keys: attention over the prefix (one call holding every
    sequence's queries) and over each sequence's own suffix (a second call), merged by the target's
    own LSEs (``lse_base`` read as declared), equal the call over the whole keys within twice the
    tolerance, the merged LSE the whole call's within its rounding — merged by the suite's float64
    merge, and by the target's own merge operator where it declares one (``Target(merge=...)``).

    Catches: an LSE of the unscaled scores (the scale applied after the softmax), or a base-2 LSE
    (m·log2 e + log2 l) returned undeclared: each part's output is right and the cascade's merge
    weights are not; a declared merge operator that weighs the parts by anything but their LSEs.
    """
    inputs = case.inputs()
    t = split_point(target, case, stream=91)
    inputs = with_shared_prefix(inputs, t)
    whole, whole_lse = run_lse(target, inputs)
    prefix_out, prefix_lse = run_lse(target, prefix_call(inputs, t))
    suffix = inputs.replace(k=np.ascontiguousarray(inputs.k[:, :, t:]),
                            v=np.ascontiguousarray(inputs.v[:, :, t:]))
    suffix_out, suffix_lse = run_lse(target, suffix)
    parts = [unfolded(prefix_out, case.batch), suffix_out], [unfolded(prefix_lse, case.batch), suffix_lse]
    out, lse = merge(parts[0][0], parts[1][0], parts[0][1], parts[1][1])
    said = f"the shared prefix of {t} keys and the suffixes, merged by the suite's merge"
    assert_same(target, inputs, whole, out, what=f"{said}, against the one call, the output")
    assert_lse_close(target, inputs, lse, whole_lse, what=f"{said}, against the one call")
    operator = own_merge(target)
    if operator is not None:
        own, _, own_lse = merge_call(operator, *parts, np.dtype(inputs.q.dtype).name)
        said = f"the shared prefix of {t} keys and the suffixes, merged by {operator.name}"
        assert_same(target, inputs, whole, own.astype(np.float64),
                    what=f"{said}, against the one call, the output")
        assert_lse_close(target, inputs, own_lse, whole_lse, what=f"{said}, against the one call")


# --- chunked prefill -----------------------------------------------------------------------------


def chunk_forms(t: Target) -> tuple[str, ...]:
    """How the target's chunks keep their diagonal: a paged cache (per sequence), contiguous keys
    with ``kv_lengths=`` aligned per sequence, a past cache (``past_key=``: the chunk's queries
    continue it), or contiguous keys bottom-right aligned; none of them, an empty tuple."""
    forms = {"paged": t.supports_paged_kv,
             "kv_lengths": t.causal_alignment == "kv_lengths" and t.supports_kv_lengths,
             "past": t.supports_past_kv,
             "bottom_right": t.causal_alignment in ("bottom_right", "kv_lengths")}
    return tuple(form for form, takes in forms.items() if takes)


chunkable = Need(
    lambda t: None if chunk_forms(t) else (
        f"needs chunks that keep their diagonal: block_table= (supports_paged_kv), past_key= "
        f"(supports_past_kv), or causal_alignment 'bottom_right' or 'kv_lengths' (target declares "
        f"causal_alignment={t.causal_alignment!r})"),
    "a paged cache (block_table=), a past cache (past_key=), or causal_alignment 'bottom_right' or "
    "'kv_lengths'")


@st.composite
def prompt_cases(draw: st.DrawFn, t: Target) -> Case:
    """A causal 4-D call of 2–12 queries over a cache of the queries' own keys after a cached prefix
    of 0–12 (1–12 as a past cache; every sequence the same length), in one of the forms the target's
    chunks keep their diagonal in (`chunk_forms`)."""
    form = pick(draw, chunk_forms(t))
    base = draw(cases(t, ndims=(4,), causal=(True,), n_max=12, values=("normal",)))
    n_q = draw(between(2, 12))
    prefix = draw(between(1 if form == "past" else 0, 12))
    case = base.replace(n_q=n_q, n_k=n_q + prefix, mask="none")
    if form == "past":
        return case.with_keyword("past_kv", prefix)
    if form == "bottom_right":
        return case
    case = case.with_keyword("kv_lengths", (case.n_k,) * case.batch)
    if form == "paged":
        case = case.with_keyword("paged", (draw(between(1, 5)), "nan"))
    return case


def chunks(case: Case) -> list[tuple[int, int]]:
    """Where the prompt's queries are cut: 2–4 chunks ``(start, stop)``, from the case's stream."""
    rng = case.rng(CHUNKS)
    count = int(rng.integers(2, min(4, case.n_q) + 1))
    cuts = sorted(rng.choice(np.arange(1, case.n_q), size=count - 1, replace=False).tolist())
    edges = [0, *cuts, case.n_q]
    return list(itertools.pairwise(edges))


def chunk_call(inputs: Inputs, start: int, stop: int) -> Inputs:
    """Queries ``start:stop`` against the cache of every key up to the chunk's last: the keys
    before ``n_k − n_q + stop`` (key lengths cut there; contiguous keys cut there; a past cache
    holding the keys before the chunk's own)."""
    n_q = inputs.q.shape[-2]
    q = np.ascontiguousarray(inputs.q[..., start:stop, :])
    lengths = inputs.get("kv_lengths")
    if lengths is not None:  # the same keys, fewer of them visible: the cache up to the chunk's end
        return inputs.replace(q=q, kv_lengths=np.asarray(lengths) - (n_q - stop))
    past = inputs.get("past_key")
    if past is not None:  # the past grows by the chunks before this one; the chunk's keys are its own
        keys = np.concatenate([past, inputs.k], axis=-2)
        values = np.concatenate([inputs.get("past_value"), inputs.v], axis=-2)
        before, end = past.shape[-2] + start, past.shape[-2] + stop
        cut = [np.ascontiguousarray(x) for x in (keys[..., :before, :], values[..., :before, :],
                                                 keys[..., before:end, :], values[..., before:end, :])]
        return inputs.replace(q=q, past_key=cut[0], past_value=cut[1], k=cut[2], v=cut[3])
    n_k = inputs.k.shape[-2]
    end = n_k - n_q + stop
    return inputs.replace(q=q, k=np.ascontiguousarray(inputs.k[..., :end, :]),
                          v=np.ascontiguousarray(inputs.v[..., :end, :]))


def output(target: Target, inputs: Inputs) -> Array:  # -> [..., n_q, d_v] float64
    """The target's output for ``inputs``, the presents of a past cache left aside."""
    return run_past(target, inputs)[0] if inputs.get("past_key") is not None else run(target, inputs)


@law(strategy=prompt_cases, needs=chunkable & _needs.causal_mode)
def chunked_prefill_matches_one_call(target: Target, case: Case) -> None:
    """A prompt's queries cut into 2–4 chunks, each called causal against the cache of every key up
    to its end (a paged cache or key lengths cut there, a past cache of the keys before the chunk's
    own, or contiguous keys bottom-right aligned),
    give the rows of the one causal call on the whole prompt: within twice the tolerance, and bit
    for bit for a target that declares ``invariant=("chunked_prefill",)``.

    Catches: a chunk aligned top-left on its cache (query i of the chunk sees keys j ≤ i, the cached
    prefix ignored); a chunk's diagonal taken from the cache's capacity instead of its length; a
    split count or tile order chosen from the chunk's query count, so chunked prefill rounds each
    prompt differently from one call (vLLM's batch-invariant mode forbids it).
    """
    inputs = case.inputs()
    whole = output(target, inputs)
    bitwise = "chunked_prefill" in target.invariant
    for start, stop in chunks(case):
        part = chunk_call(inputs, start, stop)
        got = output(target, part)
        said = f"queries {start}:{stop} of {case.n_q} as a chunk against the cache up to its end"
        if bitwise:
            for b in range(case.batch):
                assert_same_bits(whole[b, :, start:stop], got[b], change=said, sequence=b)
        else:
            assert_same(target, part, whole[..., start:stop, :], got, what=f"{said}, against the one call")
