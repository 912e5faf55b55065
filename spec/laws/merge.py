"""Laws of merge operators (`spec.merge_target.MergeTarget`): combining the (out, lse) states of
attention over disjoint key sets into the state over their union, as split-KV decoding, ring
attention and cascade attention do. The parts are made by the suite's float64 golden, given in the
target's dtype; the verdict is the float64 golden of the union, or the suite's float64 `merge`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from hypothesis import strategies as st

from spec import dtypes, golden
from spec.laws._helpers import first_true, observe
from spec.laws.lse import merge
from spec.merge_target import MergeTarget, lse_dtype, merge_call
from spec.registry import Need, law

Array = np.ndarray

D_K = 4
"""Width of the queries and keys the parts are computed from."""


def _is_merge(t: object) -> str | None:
    return None if isinstance(t, MergeTarget) else "needs a merge operator (a spec.MergeTarget)"


merge_operator = Need(_is_merge, "a merge operator (spec.MergeTarget)")
pairwise = merge_operator & Need(
    lambda t: None if t.fn is not None else "needs the pairwise form (target declares no fn)", "fn")
n_way = merge_operator & Need(
    lambda t: None if t.fn is not None and t.fn_n is not None else
    "needs both forms (target declares fn and fn_n, not both)", "fn and fn_n")
empty_states = merge_operator & Need(
    lambda t: None if t.empty_parts else "needs empty states (target declares empty_parts=False)",
    "empty states (empty_parts)")
base2 = merge_operator & Need(
    lambda t: None if t.lse_base == 2 else "needs a base-2 lse (target declares lse_base='e')", "lse_base=2")


@dataclass(frozen=True)
class MergeCase:
    """One draw: ``parts`` key sets of attention for ``n_q`` queries (leading dims ``lead``), each
    row's scores in part p shifted by up to ``spread`` (so the parts' lse differ by that much),
    ``offset`` added to every score (lse far from 0), rows of a part left empty with probability
    ``empty``; everything else from ``seed``."""

    seed: int
    dtype: str
    lead: tuple[int, ...]
    n_q: int
    d_v: int
    parts: int
    spread: float
    offset: float
    empty: float

    def describe(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_fields(cls, **fields: object) -> MergeCase:
        fields["lead"] = tuple(fields.get("lead", ()))  # type: ignore[arg-type]
        return cls(**fields)  # type: ignore[arg-type]

    def states(self) -> tuple[list[Array], list[Array], Array, Array]:
        """The parts' float64 states ``(outs, lses)`` (natural lse, −inf for an empty row) and the
        golden ``(out, lse)`` of attention over their union."""
        rng = np.random.default_rng(self.seed)
        q = rng.standard_normal((*self.lead, self.n_q, D_K))
        sizes = rng.integers(1, 5, size=self.parts)
        ks = [rng.standard_normal((*self.lead, int(n), D_K)) for n in sizes]
        vs = [rng.standard_normal((*self.lead, int(n), self.d_v)) for n in sizes]
        shifts = [self.offset + self.spread * rng.uniform(-1, 1, (*self.lead, self.n_q, 1)) for _ in sizes]
        seen = [rng.uniform(size=(*self.lead, self.n_q, 1)) >= self.empty for _ in sizes]
        terms = [golden.Terms(added=(s,)) for s in shifts]
        outs, lses = [], []
        for k, v, s, t in zip(ks, vs, seen, terms, strict=True):
            out, _, lse = golden.forward(q, k, v, visible=np.broadcast_to(s, (*s.shape[:-1], k.shape[-2])),
                                         scale=1.0, terms=t)
            outs.append(out)
            lses.append(lse)
        visible = np.concatenate([np.broadcast_to(s, (*s.shape[:-1], k.shape[-2]))
                                  for s, k in zip(seen, ks, strict=True)], axis=-1)
        added = np.concatenate([np.broadcast_to(s, (*s.shape[:-1], k.shape[-2]))
                                for s, k in zip(shifts, ks, strict=True)], axis=-1)
        out, _, lse = golden.forward(q, np.concatenate(ks, axis=-2), np.concatenate(vs, axis=-2),
                                     visible=visible, scale=1.0, terms=golden.Terms(added=(added,)))
        return outs, lses, out, lse


def merge_cases(t: MergeTarget, *, parts: int = 2, spread: float = 8.0, offset: float = 4.0,
                empty: tuple[float, ...] = (0.0, 0.3)) -> st.SearchStrategy[MergeCase]:
    """Cases in the target's dtypes: 2-D or 4-D states, lse spreads up to ``spread`` and offsets up
    to ``offset`` (either sign), rows left empty with one of the probabilities ``empty`` (none for a
    target that declares ``empty_parts=False``)."""
    return st.builds(
        MergeCase, seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(t.dtypes),
        lead=st.sampled_from([(), (2, 3)]), n_q=st.integers(1, 6), d_v=st.integers(1, 8),
        parts=st.just(parts),
        spread=st.sampled_from([0.0, spread / 4, spread]), offset=st.floats(-offset, offset),
        empty=st.sampled_from(empty if t.empty_parts else (0.0,)))


def allowance(target: MergeTarget, case: MergeCase, outs: list[Array], lses: list[Array], *,
              merges: int = 1) -> tuple[float, float]:
    """How far a merged (out, lse) may lie from the float64 truth: the inputs' rounding (each output
    entry eps·|v|; each lse eps·(1 + |lse|), which moves the weights by as much, relatively) plus
    the merge's own (a few eps of its compute dtype, float32 at least for 16-bit states), per
    part and per merge (``merges`` in sequence); ``out`` relative to the largest |out| of the parts."""
    eps_out = dtypes.eps(case.dtype)
    eps_lse = dtypes.eps(lse_dtype(case.dtype))
    eps_work = max(eps_lse, dtypes.eps("float64"))
    finite = [np.where(np.isfinite(x), np.abs(x), 0.0) for x in lses]
    top = max(float(np.max(x, initial=0.0)) for x in finite)
    lse_err = (eps_lse + eps_work) * (1 + top) * 4 * case.parts
    scale = max(float(np.max(np.abs(o), initial=0.0)) for o in outs) + 1e-300
    return merges * (4 * case.parts * (eps_out + eps_work) * scale + 2 * lse_err * scale), merges * lse_err


def assert_state(got: Array, got_lse: Array, want: Array, want_lse: Array, allowed: tuple[float, float], *,
                 what: str) -> None:
    """``(got, got_lse)`` within ``allowed`` of ``(want, want_lse)``: −inf (empty) rows exactly
    −inf with zero output; no NaN anywhere."""
    __tracebackhide__ = True
    atol, lse_tol = allowed
    got = got.astype(np.float64)
    if (at := first_true(np.isnan(got_lse))) is not None:
        raise AssertionError(f"{what}: lse {list(at)} is NaN, expected {float(want_lse[at])!r}")
    empty = np.isneginf(want_lse)
    if (at := first_true(empty != np.isneginf(got_lse))) is not None:
        raise AssertionError(f"{what}: lse {list(at)} is {float(got_lse[at])!r}, "
                             f"expected {float(want_lse[at])!r}")
    err_lse = np.where(empty, 0.0, np.abs(got_lse - np.where(empty, 0.0, want_lse)))
    err = np.abs(got - want)
    err = np.where(np.isnan(err), np.inf, err)
    observe("merge error ratio", float(np.max(err, initial=0.0)) / atol)
    if (at := first_true(err_lse > lse_tol)) is not None:
        raise AssertionError(f"{what}: lse {list(at)} is {float(got_lse[at])!r}, expected "
                             f"{float(want_lse[at])!r} (allowed {lse_tol:.3g})")
    if (at := first_true(err > atol)) is not None:
        raise AssertionError(f"{what}: out {list(at)} is {float(got[at])!r}, expected {float(want[at])!r} "
                             f"(difference {float(err[at]):.3g}, allowed {atol:.3g})")


def _rounded(case: MergeCase, outs: list[Array], lses: list[Array]) -> tuple[list[Array], list[Array]]:
    """The float64 states as the target receives them (rounded to its dtypes), for a float64
    verdict on exactly its inputs."""
    return ([o.astype(dtypes.as_dtype(case.dtype)).astype(np.float64) for o in outs],
            [lse.astype(lse_dtype(case.dtype)).astype(np.float64) for lse in lses])


def golden_merge(outs: list[Array], lses: list[Array]) -> tuple[Array, Array]:
    """The suite's float64 merge of the states, left to right (`spec.laws.lse.merge`)."""
    out, lse = outs[0], lses[0]
    for o, lse_next in zip(outs[1:], lses[1:], strict=True):
        out, lse = merge(out, lse, o, lse_next)
    return out, lse


@law(strategy=lambda t: merge_cases(t), needs=merge_operator)
def merge_equals_union(target: MergeTarget, case: MergeCase) -> None:
    """Merging the states of attention over two disjoint key sets gives the attention over their
    union: out within the rounding of the inputs and of the merge, lse within its rounding (the
    parts made by the suite's float64 golden, given in the target's dtype).

    Catches: a merge that ignores one part's weight (returns out_a whenever lse_a ≥ lse_b: right
    only when one part dominates); an lse that drops the log-add (max(lse_a, lse_b)); weights
    that forget to subtract the merged lse.
    """
    outs, lses, want, want_lse = case.states()
    out, _, lse = merge_call(target, outs, lses, case.dtype)
    assert_state(out, lse, want, want_lse, allowance(target, case, outs, lses),
                 what="two parts merged, against attention over their union")


@law(strategy=lambda t: merge_cases(t, spread=200.0), needs=merge_operator)
def merge_commutative(target: MergeTarget, case: MergeCase) -> None:
    """merge(a, b) = merge(b, a) within the merge's rounding, for lse gaps up to 200 either way.

    Catches: the larger lse assumed to be the first part's (the running state of a loop): weights
    e^(lse_b − lse_a) overflow to inf when the second part dominates, NaN in the output.
    """
    outs, lses, _, _ = case.states()
    ab, _, lse_ab = merge_call(target, outs, lses, case.dtype)
    ba, _, lse_ba = merge_call(target, outs[::-1], lses[::-1], case.dtype)
    want, want_lse = golden_merge(*_rounded(case, outs, lses))
    allowed = allowance(target, case, outs, lses)
    assert_state(ab, lse_ab, want, want_lse, allowed, what="merge(a, b)")
    assert_state(ba, lse_ba, ab.astype(np.float64), lse_ab, allowed, what="merge(b, a), against merge(a, b)")


@law(strategy=lambda t: merge_cases(t, parts=3), needs=pairwise)
def merge_associative(target: MergeTarget, case: MergeCase) -> None:
    """merge(merge(a, b), c) = merge(a, merge(b, c)) within the rounding of the two merges, and both
    equal the attention over the three key sets' union: the order split-KV partials are reduced in
    does not matter.

    Catches: an lse that drops the log-add (max(lse_a, lse_b)) while weighting the outputs right:
    the first merge is right, the second weights its result as if it held one part's keys.
    """
    outs, lses, want, want_lse = case.states()
    left, _, lse_left = merge_call(target, outs, lses, case.dtype)
    bc, _, lse_bc = merge_call(target, outs[1:], lses[1:], case.dtype)
    right, _, lse_right = merge_call(target, [outs[0], bc.astype(np.float64)], [lses[0], lse_bc], case.dtype)
    allowed = allowance(target, case, outs, lses, merges=2)
    assert_state(left, lse_left, want, want_lse, allowed, what="merge(merge(a, b), c), against the union")
    assert_state(right, lse_right, left.astype(np.float64), lse_left, allowed,
                 what="merge(a, merge(b, c)), against merge(merge(a, b), c)")


@law(strategy=lambda t: merge_cases(t, empty=(0.0,)), needs=empty_states)
def merge_empty_is_identity(target: MergeTarget, case: MergeCase) -> None:
    """Merging a state with an empty one (output zeros, lse the declared ``empty_lse``), on either
    side, gives the state back: its output within the rounding, its lse within its rounding.

    Catches: an empty state's +inf sentinel (FlashAttention's CUDA convention) merged as a number:
    e^(+inf − +inf) = NaN in every row it touches (flash-attention PR #1936).
    """
    outs, lses, _, _ = case.states()
    empty_out, empty_lse = np.zeros_like(outs[0]), np.full_like(lses[0], -np.inf)
    state, state_lse = _rounded(case, outs[:1], lses[:1])
    allowed = allowance(target, case, outs, lses)
    for order, what in (((0, 1), "merge(state, empty)"), ((1, 0), "merge(empty, state)")):
        pair = [(outs[0], lses[0]), (empty_out, empty_lse)]
        o, _, lse = merge_call(target, [pair[i][0] for i in order], [pair[i][1] for i in order], case.dtype)
        assert_state(o, lse, state[0], state_lse[0], allowed, what=f"{what}, against the state")


@law(strategy=lambda t: merge_cases(t, empty=(1.0,)), needs=empty_states)
def merge_empty_empty_is_empty(target: MergeTarget, case: MergeCase) -> None:
    """Merging two empty states gives an empty state: output zeros, lse exactly ``empty_lse``, no
    NaN (a query row that saw no key in any split, as a fully masked row in split-KV decoding).

    Catches: the merge's max shift taken as it is, −inf − (−inf) = NaN, so empty ⊕ empty is NaN
    (flashinfer #4051, fixed in flashinfer PR #5262); vLLM's merge_attn_states tests never set
    both parts empty.
    """
    outs, lses, _, _ = case.states()
    out, raw, _ = merge_call(target, outs, lses, case.dtype)
    if (at := first_true(raw != target.empty_lse)) is not None:
        raise AssertionError(f"empty ⊕ empty: lse {list(at)} is {float(raw[at])!r}, expected the declared "
                             f"empty_lse {target.empty_lse!r}")
    if (at := first_true(out != 0)) is not None:
        raise AssertionError(f"empty ⊕ empty: out {list(at)} is {float(out[at])!r}, expected 0")


@law(strategy=lambda t: merge_cases(t, spread=3000.0, offset=9000.0), needs=merge_operator)
def merge_large_lse(target: MergeTarget, case: MergeCase) -> None:
    """States whose lse are large (offsets up to ±9000, gaps up to 6000: past e^88, where float32
    overflows, and e^709, float64's) merge without overflow, into the union's attention.

    Catches: exp(lse_a) + exp(lse_b) computed directly, which overflows to inf/inf = NaN once an lse
    passes the dtype's exponent range (EasyContext #14: ring attention's merge overflowing on long
    sequences).
    """
    outs, lses, want, want_lse = case.states()
    out, _, lse = merge_call(target, outs, lses, case.dtype)
    assert_state(out, lse, want, want_lse, allowance(target, case, outs, lses),
                 what="two parts with large lse merged, against attention over their union")


@law(strategy=lambda t: merge_cases(t, parts=3, spread=300.0), needs=n_way)
def merge_n_way_equals_pairwise(target: MergeTarget, case: MergeCase) -> None:
    """The n-way form on three states equals the pairwise form applied left to right, within the
    rounding of the merges, both within that of the union's attention; rows of very different lse
    (gaps up to 600) and empty rows included.

    Catches: the n-way form's max shift taken over the whole array instead of over the parts axis:
    rows far below the global max underflow to 0/0 = NaN, which the pairwise form never meets.
    """
    outs, lses, want, want_lse = case.states()
    pairwise_out, _, pairwise_lse = merge_call(target, outs, lses, case.dtype)
    n_out, _, n_lse = merge_call(target, outs, lses, case.dtype, n_way=True)
    allowed = allowance(target, case, outs, lses, merges=2)
    assert_state(n_out, n_lse, want, want_lse, allowed, what="fn_n on three states, against the union")
    assert_state(n_out, n_lse, pairwise_out.astype(np.float64), pairwise_lse, allowed,
                 what="fn_n on three states, against fn left to right")


@law(strategy=lambda t: merge_cases(t, spread=20.0), needs=base2)
def merge_base2_lse(target: MergeTarget, case: MergeCase) -> None:
    """A target that declares ``lse_base=2`` takes and returns log2 Σ 2^(s·log2 e): fed base-2
    lse with gaps up to 20, its merge equals the union's attention (lse read times ln 2).

    Catches: a base-2 lse merged with natural exponentials, e^(lse_a − lse) for 2^(lse_a − lse):
    the weights are off by a power of e/2 (sglang PR #35045).
    """
    outs, lses, want, want_lse = case.states()
    out, _, lse = merge_call(target, outs, lses, case.dtype)
    assert_state(out, lse, want, want_lse, allowance(target, case, outs, lses),
                 what="base-2 states merged, against attention over their union (lse read times ln 2)")

