"""Laws of context-parallel attention (`spec.rank_target.RankTarget`): the sequence sharded over the
ranks of a ``torch.distributed`` group on gloo by each declared layout and world size, the ranks'
shards gathered and judged against the float64 golden of the unsharded attention, never against
`impl`.

The ranks are real processes (`spec.rank_target.RankPool`), except for a target that declares
``in_process=True``: the laws that vary one thing about a sharding (world size and layout, load
balance, uneven lengths, documents, the scale of the scores) then run its ranks as threads of the
suite's process (`spec.rank_target.ThreadRanks`), while `ranks_match_golden`, the conformance
statement, and the backward run on real processes in every check.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from spec import dtypes, golden
from spec.laws._helpers import first_true, observe
from spec.rank_target import RankTarget, fits, gather, positions, run_ranks, shard
from spec.registry import Need, law
from spec.target import TargetFailed

Array = np.ndarray

BALANCED = ("zigzag", "striped")
"""The layouts that balance a causal mask's work over the ranks."""
UNEVEN = ("contiguous", "striped")
"""The layouts that shard any n, a rank holding fewer tokens than another, or none."""
LEADS = [(1, 1), (2, 2)]
"""The leading dims (batch, heads) of unpacked cases."""


IN_PROCESS = ("ranks_invariant", "ranks_causal_balanced", "ranks_uneven_and_empty", "ranks_documents",
              "ranks_large_logits")
"""The laws that run a target declared ``in_process`` on rank threads (each law's call of `_matches`
says so); the others run on processes whatever it declares."""


def _is_rank(t: object) -> str | None:
    return None if isinstance(t, RankTarget) else "needs a context-parallel target (a spec.RankTarget)"


def _has_gloo(t: object) -> str | None:
    try:
        import torch.distributed as dist
    except ImportError:
        return "needs torch.distributed (the torch extra) to start the ranks"
    return None if dist.is_available() and dist.is_gloo_available() else "needs torch.distributed with gloo"


ranked = Need(_is_rank, "a context-parallel target (spec.RankTarget)") & Need(_has_gloo,
                                                                             "torch.distributed (gloo)")
balanced = ranked & Need(lambda t: None if set(BALANCED) & set(t.layouts) else
                         "needs a load-balanced layout (target declares neither zigzag nor striped)",
                         "a zigzag or striped layout")
uneven = ranked & Need(lambda t: None if set(UNEVEN) & set(t.layouts) else
                       "needs a layout of any n (target declares neither contiguous nor striped)",
                       "a contiguous or striped layout") & Need(
    lambda t: None if t.supports_uneven else
    "needs shards of any length (target declares supports_uneven=False)", "supports_uneven")
two_shardings = ranked & Need(lambda t: None if len(t.world_sizes) * len(t.layouts) > 1 else
                              "needs two shardings (target declares one world size and one layout)",
                              "two world sizes or layouts")
causal_mode = ranked & Need(lambda t: None if t.supports_causal else
                            "needs a causal mode (target declares supports_causal=False)", "supports_causal")
documents = ranked & Need(lambda t: None if t.supports_varlen else
                          "needs packed documents (target declares supports_varlen=False)", "supports_varlen")
backward = ranked & Need(lambda t: None if t.grad_fn is not None else
                         "needs gradients (target declares no grad_fn)", "grad_fn")


@dataclass(frozen=True)
class RankCase:
    """One draw: q, k, v ``[*lead, n, d]`` from ``seed`` (q times ``logit_scale``), ``causal`` or
    not, packed ``documents`` (their lengths; then ``lead`` is ``(heads,)``), sharded by each of
    ``layouts`` the target declares, at each world size it declares, where the layout fits n."""

    seed: int
    dtype: str
    lead: tuple[int, ...]
    n: int
    d_k: int
    d_v: int
    causal: bool
    layouts: tuple[str, ...]
    logit_scale: float = 1.0
    documents: tuple[int, ...] = ()

    def describe(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_fields(cls, **fields: Any) -> RankCase:
        for key in ("lead", "layouts", "documents"):
            fields[key] = tuple(fields.get(key, ()))
        return cls(**fields)

    def arrays(self) -> tuple[Array, Array, Array, Array]:
        """q, k, v in the case's dtype and an upstream gradient ``d_out`` (float64)."""
        rng = np.random.default_rng(self.seed)
        q = rng.standard_normal((*self.lead, self.n, self.d_k)) * self.logit_scale
        k = rng.standard_normal((*self.lead, self.n, self.d_k))
        v = rng.standard_normal((*self.lead, self.n, self.d_v))
        d_out = rng.standard_normal((*self.lead, self.n, self.d_v))
        dtype = dtypes.as_dtype(self.dtype)
        return q.astype(dtype), k.astype(dtype), v.astype(dtype), d_out

    def cu_seqlens(self) -> Array | None:
        return np.cumsum([0, *self.documents]).astype(np.int64) if self.documents else None

    def visible(self) -> Array:  # -> [n, n] bool
        """Top-left causal on global positions, within a document."""
        keep = golden.visibility((), self.n, self.n, causal=self.causal)
        if self.documents:
            doc = np.repeat(np.arange(len(self.documents)), self.documents)
            keep &= doc[:, None] == doc[None, :]
        return keep

    def shardings(self, target: RankTarget) -> list[tuple[int, str]]:
        """Every (world size, layout) the case runs at: the target's, where the layout fits n."""
        return [(w, layout) for w in target.world_sizes for layout in self.layouts
                if layout in target.layouts and fits(self.n, w, layout)]


def rank_cases(t: RankTarget, *, layouts: tuple[str, ...] | None = None,
               causal: tuple[bool, ...] = (False, True), n: st.SearchStrategy[int] | None = None,
               logit_scale: tuple[float, ...] = (1.0,),
               packed: bool = False) -> st.SearchStrategy[RankCase]:
    """Cases in the target's dtypes: ``n`` a multiple of 2·max(world sizes) unless given (so every
    layout fits), 4-D ``[batch, heads, n, d]`` or, ``packed``, 3-D with 1 to 4 documents whose
    ends fall anywhere (the last one rounding n up to that multiple)."""
    unit = 2 * max(t.world_sizes)
    causal = tuple(c for c in causal if t.supports_causal or not c) or (False,)
    chosen = tuple(x for x in (layouts or t.layouts) if x in t.layouts)

    @st.composite
    def draw(draw: Any) -> RankCase:
        docs: tuple[int, ...] = ()
        if packed:
            docs = tuple(draw(st.lists(st.integers(1, 13), min_size=1, max_size=4)))
            docs += (-sum(docs) % unit,) if sum(docs) % unit else ()
            size = sum(docs)
        else:
            size = draw(n if n is not None else st.integers(1, 4).map(lambda m: m * unit))
        return RankCase(seed=draw(st.integers(0, 2**32 - 1)), dtype=draw(st.sampled_from(t.dtypes)),
                        lead=(draw(st.integers(1, 2)),) if packed else draw(st.sampled_from(LEADS)),
                        n=size, d_k=draw(st.integers(1, 8)), d_v=draw(st.integers(1, 8)),
                        causal=draw(st.sampled_from(causal)), layouts=chosen,
                        logit_scale=draw(st.sampled_from(logit_scale)), documents=docs)

    return draw()


# --- calling the ranks


def _keywords(target: RankTarget, case: RankCase, layout: str) -> dict[str, Any]:
    keywords: dict[str, Any] = {"layout": layout, "causal": case.causal}
    if case.documents:
        keywords["cu_seqlens_q"] = keywords["cu_seqlens_k"] = case.cu_seqlens()
    return keywords


def _checked(x: Any, shape: tuple[int, ...], dtype: np.dtype, what: str) -> Array:
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TargetFailed(f"{what} is a {type(x).__name__}, not an array")
    x = np.asarray(x)
    if x.shape != shape or x.dtype != dtype:
        raise TargetFailed(f"{what} is {x.dtype.name} {list(x.shape)}, expected {dtype.name} {list(shape)}")
    return x


def sharded_forward(target: RankTarget, case: RankCase, world_size: int, layout: str, q: Array, k: Array,
                    v: Array, *, in_process: bool = False) -> tuple[Array, Array | None]:
    # [*lead, n, d] ×3 -> gathered out [*lead, n, d_v] (float64), lse [*lead, n] or None
    """The target on ``world_size`` ranks (threads where ``in_process`` and the target declares
    it, processes else), each given its shards by ``layout``; the shards it returns checked
    (shape, dtype) and gathered back in sequence order."""
    where = positions(case.n, world_size, layout)
    keywords = _keywords(target, case, layout)
    if target.returns_lse:
        keywords["return_lse"] = True
    replies = run_ranks(target, world_size, "forward", list(zip(*(shard(x, where) for x in (q, k, v)),
                                                                strict=True)), keywords,
                        in_process=in_process and target.in_process)
    outs, lses = [], []
    lse_dtype = np.dtype(np.float64 if case.dtype == "float64" else np.float32)
    for rank, (reply, p) in enumerate(zip(replies, where, strict=True)):
        what = f"rank {rank} of {world_size} ({layout})"
        if target.returns_lse:
            if not isinstance(reply, (tuple, list)) or len(reply) != 2:
                raise TargetFailed(f"{what} must return (out, lse) when called with return_lse=True, "
                                   f"got {type(reply).__name__}")
            reply, lse = reply
            lses.append(_checked(lse, (*case.lead, len(p)), lse_dtype, f"{what}: lse"))
        outs.append(_checked(reply, (*case.lead, len(p), case.d_v), q.dtype, f"{what}: out"))
    out = gather([o.astype(np.float64) for o in outs], where, case.n)
    lse = gather([x.astype(np.float64)[..., None] for x in lses], where, case.n)[..., 0] if lses else None
    return out, lse


def _truth(case: RankCase, q: Array, k: Array, v: Array) -> tuple[Array, Array, float]:
    """The float64 golden ``(out, lse)`` of the unsharded attention on the rounded inputs, and the
    largest |score| a visible key has."""
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    visible = case.visible()
    out, _, lse = golden.forward(q64, k64, v64, visible=visible, scale=1 / math.sqrt(case.d_k))
    s = (q64 @ np.swapaxes(k64, -1, -2)) / math.sqrt(case.d_k)
    return out, lse, float(np.max(np.abs(np.where(visible, s, 0.0)), initial=0.0))


def allowed(case: RankCase, world_size: int, top: float, largest: float) -> float:
    """How far a gathered output may lie from the float64 golden: a few eps of the dtype per block
    merged (W of them) and per unit of the largest score (its rounding moves every weight by as
    much, relatively), times the largest |value| (``top``): the ring's own float32 rounding, never
    a wrong weight, a lost block or a NaN."""
    return dtypes.eps(case.dtype) * (32 + 8 * world_size + 4 * largest) * max(top, 1e-30)


def agreement(case: RankCase, blocks: int, top: float, largest: float) -> float:
    """How far two shardings' outputs may differ: 4 eps of the dtype per block merged in either
    (``blocks``, the two world sizes' sum) and one per unit of the largest score (its rounding in
    blocks of other shapes), times the largest |value|: the order of the merges alone, tighter than
    `allowed` (so that it is no consequence of two golden comparisons)."""
    return dtypes.eps(case.dtype) * (4 * blocks + largest) * max(top, 1e-30)


def assert_close(got: Array, want: Array, atol: float, *, what: str) -> None:
    """``got`` within ``atol`` of ``want`` everywhere; NaN or ±inf where ``want`` is finite fails."""
    __tracebackhide__ = True
    err = np.abs(got - want)
    err = np.where(np.isnan(err), np.inf, err)
    observe("rank error ratio", float(np.max(err, initial=0.0)) / atol)
    if (at := first_true(err > atol)) is not None:
        raise AssertionError(f"{what}: {list(at)} is {float(got[at])!r}, expected {float(want[at])!r} "
                             f"(difference {float(err[at]):.3g}, allowed {atol:.3g})")


def assert_lse(got: Array, want: Array, atol: float, *, what: str) -> None:
    """−inf exactly where the golden's is (a query that sees no key), within ``atol`` elsewhere."""
    __tracebackhide__ = True
    empty = np.isneginf(want)
    if (at := first_true(empty != np.isneginf(got))) is not None:
        raise AssertionError(f"{what}: lse {list(at)} is {float(got[at])!r}, expected {float(want[at])!r}")
    assert_close(np.where(empty, 0.0, got), np.where(empty, 0.0, want), atol, what=f"{what}: lse")


def _matches(target: RankTarget, case: RankCase, *,
             in_process: bool) -> tuple[dict[tuple[int, str], Array], float, float]:
    """Every sharding's gathered output (and lse) against the golden; the outputs by sharding, the
    largest |value| and the largest visible |score| (for `allowed`). ``in_process``: on threads
    where the target declares ``in_process`` (`sharded_forward`)."""
    __tracebackhide__ = True
    q, k, v, _ = case.arrays()
    want, want_lse, largest = _truth(case, q, k, v)
    top = float(np.max(np.abs(v.astype(np.float64)), initial=0.0))
    got: dict[tuple[int, str], Array] = {}
    for world_size, layout in case.shardings(target):
        out, lse = sharded_forward(target, case, world_size, layout, q, k, v, in_process=in_process)
        what = f"world size {world_size}, {layout}{', causal' if case.causal else ''}"
        assert_close(out, want, allowed(case, world_size, top, largest), what=f"{what}: out")
        if lse is not None:
            assert_lse(lse, want_lse, allowed(case, world_size, 1.0 + largest, largest), what=what)
        got[(world_size, layout)] = out
    return got, top, largest


# --- the laws


@law(strategy=lambda t: rank_cases(t), needs=ranked, scope="generic")
def ranks_match_golden(target: RankTarget, case: RankCase) -> None:
    """At every declared world size and layout, causal or not, the ranks' output shards gathered
    back in sequence order equal the float64 golden of the unsharded attention (and so does the
    LSE, where returned), within a few eps per merged block.

    Catches: an empty block's LSE written as FlashAttention's +inf sentinel and merged as a number:
    e^(inf − inf) = NaN in every row the causal mask empties in some block (flash-attention PR
    #1936); a ring that never merges some block; ring-flash-attention's tests, which print the
    difference and assert nothing.

    Always on real processes, whatever the target declares.
    """
    _matches(target, case, in_process=False)


@law(strategy=lambda t: rank_cases(t, causal=(True,)), needs=two_shardings)
def ranks_invariant(target: RankTarget, case: RankCase) -> None:
    """World-size and layout invariance: the gathered causal output (non-causal for a target
    without a causal mode) equals the golden under every sharding, and any two shardings agree
    more closely than the golden's tolerance: within the rounding of the merge order and of the
    scores alone (`agreement`).

    Catches: a zigzag layout whose permutation is off by one chunk (rank r's second chunk taken as
    2W − r, not 2W − 1 − r): the causal mask reads the wrong global positions, while a contiguous
    layout is right.
    """
    got, top, largest = _matches(target, case, in_process=True)
    (first, base), *others = got.items()
    for (world_size, layout), out in others:
        assert_close(out, base, agreement(case, first[0] + world_size, top, largest),
                     what=f"world size {world_size}, {layout}, against world size {first[0]}, {first[1]}")


@law(strategy=lambda t: rank_cases(t, layouts=BALANCED, causal=(True,),
                                   n=st.integers(1, 3).map(lambda m: m * 2 * max(t.world_sizes))),
     needs=balanced & causal_mode)
def ranks_causal_balanced(target: RankTarget, case: RankCase) -> None:
    """Causal attention with load balancing (zigzag, striped), short sequences included (one
    token per zigzag chunk): every query sees exactly the keys at or before its global position,
    whichever rank holds them: the gathered output equals the golden.

    Catches: a causal schedule that skips the blocks of later ranks (right for a contiguous layout,
    where rank r's keys all come after rank r − 1's queries) under a balanced layout, where rank 0's
    second chunk sees every rank's keys (PyTorch #147793, #159706: causal context parallelism with
    head-tail balancing wrong on short sequences).
    """
    _matches(target, case, in_process=True)


@law(strategy=lambda t: rank_cases(t, layouts=UNEVEN, n=st.integers(1, 2 * max(t.world_sizes) + 3)),
     needs=uneven)
def ranks_uneven_and_empty(target: RankTarget, case: RankCase) -> None:
    """Uneven lengths and empty shards: n not a multiple of the world size (a contiguous layout's
    first ranks hold one token more), or smaller than it (some rank holds no token): the gathered
    output still equals the golden.

    Catches: uneven shards padded to the longest (so that every send has one shape) with the
    padding's zero keys left visible: score 0 enters every row's softmax.
    """
    _matches(target, case, in_process=True)


@law(strategy=lambda t: rank_cases(t, packed=True), needs=documents)
def ranks_documents(target: RankTarget, case: RankCase) -> None:
    """Packed documents (``cu_seqlens_q``/``cu_seqlens_k`` over the whole sequence, given to every
    rank) whose boundaries straddle the ranks: a query sees only its own document's keys, on every
    rank that holds them (causal: top-left within the document's global positions).

    Catches: a rank that reads the document of a token at its local index in the shard rather than
    its global position: right on rank 0 of a contiguous layout, wrong on every other.
    """
    _matches(target, case, in_process=True)


@law(strategy=lambda t: rank_cases(t, logit_scale=(300.0, 1000.0)), needs=ranked)
def ranks_large_logits(target: RankTarget, case: RankCase) -> None:
    """Scores in the hundreds and thousands (past e^88, where float32's exp overflows, and e^709,
    float64's): the blocks' LSE merge across ranks stays finite and equals the golden.

    Catches: the merge computed as exp(lse_a) + exp(lse_b): inf/inf = NaN once an lse passes the
    dtype's exponent range (EasyContext #14: ring attention's merge overflowing on long sequences).
    """
    _matches(target, case, in_process=True)


@law(strategy=lambda t: rank_cases(t), needs=backward)
def ranks_backward(target: RankTarget, case: RankCase) -> None:
    """The backward on the ranks: each rank's dq, dk and dv shards, gathered, equal the float64
    golden gradients of the unsharded attention at every declared world size and layout, causal
    or not, within a few eps per block.

    Catches: a backward that normalises each block's weights by the block's own LSE, dropping the
    correction to the global one (exp(s − lse_block) for exp(s − lse)): right with one block, wrong
    with every ring of two or more (ring-flash-attention #42, an error growing with the ring size).

    Always on real processes, whatever the target declares.
    """
    q, k, v, d_out = case.arrays()
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    d_out = d_out.astype(q.dtype)
    want = golden.backward(q64, k64, v64, d_out.astype(np.float64), visible=case.visible(),
                           scale=1 / math.sqrt(case.d_k))
    largest = _truth(case, q, k, v)[2]
    for world_size, layout in case.shardings(target):
        where = positions(case.n, world_size, layout)
        replies = run_ranks(target, world_size, "backward",
                            list(zip(*(shard(x, where) for x in (q, k, v, d_out)), strict=True)),
                            _keywords(target, case, layout))
        what = f"world size {world_size}, {layout}{', causal' if case.causal else ''}"
        for index, name in enumerate(golden.GRADS):
            shards = []
            for rank, (reply, p) in enumerate(zip(replies, where, strict=True)):
                if not isinstance(reply, (tuple, list)) or len(reply) != 3:
                    raise TargetFailed(f"rank {rank} of {world_size}: grad_fn must return (dq, dk, dv), "
                                       f"got {type(reply).__name__}")
                width = case.d_v if name == "dv" else case.d_k
                shards.append(_checked(reply[index], (*case.lead, len(p), width), q.dtype,
                                       f"rank {rank} of {world_size} ({layout}): {name}").astype(np.float64))
            truth = getattr(want, name)
            top = float(np.max(np.abs(truth), initial=0.0)) + 1.0
            assert_close(gather(shards, where, case.n), truth, 4 * allowed(case, world_size, top, largest),
                         what=f"{what}: {name}")
