"""What laws share: calling the target with an `Inputs`, the expectations of exactly those
inputs (`spec.oracle`), the one golden-tolerance assertion, and the one check that what must be
hidden does not move the rest (`assert_hidden_unmoved`).

Assertions here raise ``AssertionError`` with a message that says what broke; their frames are
hidden from pytest tracebacks (``__tracebackhide__``) so a failure points at the law.
"""

from __future__ import annotations

import numpy as np

from spec import compared, context, dtypes, golden, oracle, power, tolerance
from spec.call import call
from spec.cases import Case
from spec.inputs import Inputs
from spec.oracle import Expected
from spec.target import FINITE_FILL, Target

Array = np.ndarray

def run(target: Target, inputs: Inputs) -> Array:  # -> [..., n_q, d_v], float64
    """The target's output for ``inputs``, as float64."""
    out = call(target, inputs.replace(return_lse=None))
    return out.astype(np.float64)


def run_lse(target: Target, inputs: Inputs, *, as_returned: bool = False) -> tuple[Array, Array]:
    # -> [..., n_q, d_v], [..., n_q]
    """``run`` with ``return_lse=True``: the output and the target's logsumexp, as float64; the
    LSE the target declares for a row that sees no key (``empty_lse``, +inf for FlashAttention's
    CUDA kernels) read as what it stands for, −inf, unless ``as_returned``; a base-2 LSE
    (``lse_base=2``) read as the natural one it stands for, times ln 2, unless ``as_returned``."""
    out, lse = call(target, inputs.replace(return_lse=True))
    lse = lse.astype(np.float64)
    if not as_returned and target.lse_base == 2:
        lse = lse * np.log(2.0)  # ±inf stays ±inf
    if not as_returned and target.empty_lse != -np.inf:
        blind = ~np.asarray(visible(target, inputs).any(axis=-1))
        lse = np.where(np.broadcast_to(blind, lse.shape) & (lse == target.empty_lse), -np.inf, lse)
    return out.astype(np.float64), lse


def observe(key: str, value: float) -> None:
    """Report ``value`` of the figure ``key`` (the worst of a run is kept: `spec.context`)."""
    run = context.current()
    if run is not None:
        run.observe(key, value)


def expected(target: Target, inputs: Inputs, *, visible: Array | None = None) -> Expected:
    """The golden, its pattern, the baseline and the floor of exactly these inputs
    (`spec.oracle.expected`)."""
    return oracle.expected(target, inputs, visible=visible)


def visible(target: Target, inputs: Inputs) -> Array:  # -> [*lead, n_q, n_k] bool
    """What each query sees for these inputs (every restriction, the target's alignment)."""
    return oracle.visibility(target.alignment, inputs)


def sees_any(target: Target, inputs: Inputs) -> Array:  # -> [*lead, n_q] bool
    return np.asarray(visible(target, inputs).any(axis=-1))


def precision_text(target: Target, inputs: Inputs) -> str:
    return target.precision_text(np.dtype(inputs.q.dtype).name)


def assert_matches(
    target: Target, inputs: Inputs, out: Array, *, rows: Array | None = None, visible: Array | None = None,
    what: str = "output",
) -> tolerance.Comparison:
    """Assert ``out`` is within the tolerance policy of the golden of ``inputs`` on rows that see
    a key (and are selected by ``rows`` [..., n_q], when given)."""
    __tracebackhide__ = True
    want = expected(target, inputs, visible=visible)
    chosen = want.seen if rows is None else rows & want.seen
    cmp = tolerance.compare(out, want.out, want.baseline, rows=chosen, tolerance=target.tolerance,
                            floor_=want.floor, dtype=inputs.q.dtype)
    assert_within_tolerance(cmp, dtype=precision_text(target, inputs), what=what)
    return cmp


GOLDEN = "the float64 golden"
"""What an output is compared with by default: the golden of the forward (the power guard counts
such comparisons: `spec.power.compared_with_golden`)."""


def assert_within_tolerance(
    cmp: tolerance.Comparison, *, dtype: str, what: str, against: str = GOLDEN
) -> None:
    """THE golden-tolerance assertion of every law: the ratio is observed (worst per dtype, for
    the report) and a ratio above 1 fails, saying what differed from what, where and by how much."""
    __tracebackhide__ = True
    compared.relabel(f"{what} against {against}")
    if against == GOLDEN:
        power.compared_with_golden()
    observe(f"error ratio {dtype}", cmp.ratio)
    assert cmp.ok, f"{what} differs from {against}: {cmp.explain()}"


def slack(target: Target, inputs: Inputs) -> float:
    """Tolerance on the weights' sum for these inputs (see tolerance.weight_sum_slack)."""
    k = golden.with_kv_heads(inputs.q, inputs.k)
    top = tolerance.max_score(inputs.q, k, visible=visible(target, inputs), scale=inputs.scale_value)
    return tolerance.weight_sum_slack(target.precision(np.dtype(inputs.q.dtype).name), inputs.n_k, top)


def assert_same(
    target: Target, inputs: Inputs, a: Array, b: Array, *, visible: Array | None = None, what: str,
) -> None:
    """Assert two outputs of the target agree within twice what the tolerance policy allows each
    for ``inputs`` (they may round differently; they may not differ by more). NaN must match NaN."""
    __tracebackhide__ = True
    want = expected(target, inputs, visible=visible)
    rows = want.seen
    allowed = tolerance.allowance(want.out, want.baseline, rows=rows, tolerance=target.tolerance,
                                  floor_=want.floor)
    compared.record(what, a, b, 2 * allowed, rows=rows)
    with np.errstate(invalid="ignore"):
        diff = np.where(rows[..., None], np.abs(a - b), 0.0)
    diff = np.where(np.isnan(a) & np.isnan(b), 0.0, np.where(np.isnan(diff), np.inf, diff))
    if diff.size == 0:
        return
    at = np.unravel_index(int(np.argmax(diff)), diff.shape)
    observe(f"error ratio {precision_text(target, inputs)}",
            float(diff[at]) / (2 * allowed) if allowed > 0 else 0.0)
    assert diff[at] <= 2 * allowed, (
        f"{what}: entry {[int(i) for i in at]} is {float(b[at]):.6g} instead of {float(a[at]):.6g} "
        f"(difference {float(diff[at]):.3g}, allowed {2 * allowed:.3g})"
    )


def short(perm: Array) -> str:
    items = perm.tolist()
    return str(items) if len(items) <= 8 else str(items[:8])[:-1] + ", …]"


def identity_values(case: Case) -> Array:  # -> [*kv_lead, n_k, n_k]
    """V = I: the output is then the attention pattern itself."""
    eye = np.eye(case.n_k, dtype=case.dtype)
    return np.ascontiguousarray(np.broadcast_to(eye, (*case.kv_lead, case.n_k, case.n_k)))


def pattern_inputs(case: Case) -> Inputs:
    """The case's inputs with V = I, so that the output is the pattern."""
    return case.inputs().replace(v=identity_values(case))


def pattern(target: Target, case: Case) -> tuple[Array, Inputs]:
    """(the pattern read through V = I, the inputs that read it)."""
    inputs = pattern_inputs(case)
    return run_pattern(target, inputs), inputs


def run_pattern(target: Target, inputs: Inputs) -> Array:  # V = I [.., n_k, n_k] -> [.., n_q, n_k]
    """The attention pattern of ``inputs``, whose values are V = I: the output itself, or, for a
    target that takes only some value widths (``head_dims``, ``equal_head_dims``), the output of
    one call per block of w columns of I, w a width it takes (the block's output holds those
    columns of the pattern: each output column depends on its value column alone)."""
    n_k = inputs.v.shape[-1]
    width = _value_width(target, inputs.q.shape[-1], n_k)
    if width is None:
        return run(target, inputs)
    blocks = []
    for start in range(0, n_k, width):
        block = np.zeros((*inputs.v.shape[:-1], width), dtype=inputs.v.dtype)
        stop = min(start + width, n_k)
        block[..., start:stop, : stop - start] = np.eye(stop - start, dtype=block.dtype)
        blocks.append(run(target, inputs.replace(v=block))[..., : stop - start])
    return np.concatenate(blocks, axis=-1) if blocks else run(target, inputs)


def _value_width(target: Target, d_k: int, n_k: int) -> int | None:
    """The width a pattern is read in when the target does not take d_v = n_k, else None."""
    if target.equal_head_dims:
        return None if n_k == d_k else d_k
    if target.head_dims is not None and n_k not in target.head_dims:
        return max(target.head_dims)
    return None


def held_fixed(target: Target, inputs: Inputs, blind: Array) -> Array:  # [*lead, n_q] -> [*lead, n_q] bool
    """Of the rows that see none of the changed keys (``blind``), those whose output may not move.
    A row that sees no key at all is among them only where its declared policy (for its cause)
    ignores the values (``zeros``, ``nan``): the mean of all values (``uniform``) or the unmasked
    row (``unmasked``) legitimately moves with them."""
    policy = oracle.policies(target, inputs)
    return blind & ((policy == "") | (policy == "zeros") | (policy == "nan"))


def first_true(bad: Array) -> tuple[int, ...] | None:
    """The index of ``bad``'s first True entry (in C order), as plain ints, to name in a law's
    message; None when no entry is True."""
    if not bad.any():
        return None
    return tuple(int(i) for i in np.argwhere(bad)[0])


def differs_at(a: Array, b: Array) -> tuple[int, ...]:
    """The first index where ``a`` and ``b`` differ (NaN equal to NaN); for arrays that differ."""
    at = first_true(~same_bits(a, b))
    if at is None:
        raise ValueError("differs_at: the arrays do not differ")
    return at


def same_bits(a: Array, b: Array, *, rows: Array | None = None,
              what: str = "bit-identity") -> Array:  # -> bool, same shape
    """Equal entry by entry, NaN equal to NaN (zeros of either sign are equal). The comparison
    (of ``b`` with ``a`` on ``rows`` [..., n_q], when given; ``what`` names it) is the run's
    last (`spec.compared.record`), with nothing allowed."""
    compared.record(what, a, b, 0.0, rows=rows)
    return (a == b) | (np.isnan(a) & np.isnan(b))


LARGE = {"float16": 10.0}
"""How much larger than the case's own values hidden keys and values become in half the examples
(`assert_hidden_unmoved`): 1e5 by default — past a finite fill such as −1e4, so a fill that
lets a hidden key through shows — and 10 where the target computes in float16, whose range ends
at 65504."""


def perturbed(target: Target, case: Case, inputs: Inputs, changed: Array, *,
              queries: Array | None = None) -> Inputs:
    """``inputs`` with the keys and values at ``changed`` (bool, broadcastable to k's ``[..., n_k]``)
    replaced by others from the case's own distribution — at its scale in half the examples, ×1e5
    (×10 where the target computes in float16) in the other half — and the queries at ``queries``
    (``[n_q]``), if given."""
    rng = case.rng(40)
    factor = 1.0 if rng.random() < 0.5 else LARGE.get(target.precision(case.dtype), 1e5)
    where = np.asarray(changed)[..., None]

    def redraw(x: Array, at: Array) -> Array:
        other = (case.values_like(rng, x.shape).astype(np.float64) * factor).astype(x.dtype)
        return np.where(at, other, x)

    changes = {"k": redraw(inputs.k, where), "v": redraw(inputs.v, where)}
    if queries is not None:
        changes["q"] = redraw(inputs.q, np.asarray(queries)[:, None])
    return inputs.replace(**changes)


def blind_rows(target: Target, inputs: Inputs, changed: Array) -> Array:  # -> [*lead, n_q] bool
    """Rows that see none of the keys at ``changed`` (``[..., n_k]``, over K/V heads)."""
    vis = visible(target, inputs)
    at = np.broadcast_to(np.asarray(changed), (*inputs.k.shape[:-2], inputs.n_k))
    if at.ndim >= 2 and at.ndim == inputs.q.ndim - 1 and at.shape[-2] != inputs.q.shape[-3]:
        at = np.repeat(at, inputs.q.shape[-3] // at.shape[-2], axis=-2)  # K/V heads -> query heads
    return np.asarray(~(vis & at[..., None, :]).any(axis=-1))


def assert_unchanged(target: Target, inputs: Inputs, before: Array, after: Array, *, bitwise: bool, what: str,
                     change: str) -> None:
    """Assert ``after`` equals ``before``: bit for bit when ``bitwise`` (up to the sign of zero, NaN
    equal to NaN), else within twice the tolerance (`assert_same`). ``what`` names the output
    compared, ``change`` the change made, as the failure says it."""
    __tracebackhide__ = True
    if not bitwise:
        assert_same(target, inputs, before, after, what=what)
        return
    if (at := first_true(~same_bits(before, after, what=what))) is not None:
        raise AssertionError(f"{change} changed output {list(at)} from {float(before[at])!r} to "
                             f"{float(after[at])!r}")


def assert_hidden_unmoved(
    target: Target, case: Case, inputs: Inputs, changed: Array, *, what: str, before: Array | None = None,
    queries: Array | None = None,
) -> None:
    """THE no-leak assertion: after `perturbed` changes the keys and values at ``changed`` (and the
    queries at ``queries``), every row that sees none of the changed keys and whose query did not
    change (`held_fixed` of it) is bit-identical, up to the sign of zero — within tolerance if the
    target declares exact_masking=False. ``what`` names the change in the message."""
    __tracebackhide__ = True
    blind = held_fixed(target, inputs, blind_rows(target, inputs, changed))
    if queries is not None:
        blind = blind & ~np.asarray(queries)
    before = run(target, inputs) if before is None else before
    after = run(target, perturbed(target, case, inputs, changed, queries=queries))
    if not target.exact_masking:
        assert_matches(target, inputs, after, rows=blind, what=f"after {what}, the output")
        return
    bad = blind[..., None] & ~same_bits(before, after, rows=blind, what=f"after {what}, the output")
    if (at := first_true(bad)) is not None:
        raise AssertionError(f"{what} changed output {list(at)} from {float(before[at])!r} to "
                             f"{float(after[at])!r}, though query {at[-2]} sees none of those keys")


def assert_empty_rows_follow_policy(target: Target, inputs: Inputs, out: Array) -> None:
    """Every row that sees no key holds what the target declares for the cause that emptied it
    (`spec.oracle.policies`): exact zeros, all NaN, the plain mean of all values (``uniform``), or
    the golden with every key visible (``unmasked``, each score off by up to eps·FINITE_FILL, a
    fill the whole row shares); ``any`` is not checked."""
    __tracebackhide__ = True
    policy = oracle.policies(target, inputs)
    for name in ("zeros", "nan", "uniform", "unmasked"):
        rows = policy == name
        if not rows.any():
            continue
        got = out[rows]  # [rows, d_v]
        if name == "zeros":
            ok, want = got == 0, "exact zeros"
        elif name == "nan":
            ok, want = np.isnan(got), "NaN"
        else:
            ref, want, tol = _policy_expectation(target, inputs, name)
            with np.errstate(invalid="ignore"):
                ok = np.abs(got - np.broadcast_to(ref, out.shape)[rows]) <= tol
        if (wrong := first_true(~ok.all(axis=-1))) is not None:  # the wrong one among the selected rows
            at = tuple(int(i) for i in np.argwhere(rows)[wrong[0]])  # where that row sits
            cause = oracle.causes(target.alignment, inputs)[at]
            raise AssertionError(f"query row {list(at)} sees no key ({cause}); expected {want}, "
                                 f"got {out[at][:4]!r}")


def _policy_expectation(target: Target, inputs: Inputs, policy: str) -> tuple[Array, str, float]:
    # -> expected rows [..., n_q | 1, d_v], what, tolerance
    """What a fully masked row must equal under the ``uniform`` or ``unmasked`` policy, and how
    closely: the mean of all values, or the golden with every key visible, where each score may
    be off by eps·FINITE_FILL (a finite fill that the whole row shares). The keys and values are
    those the inputs mean (`spec.oracle.meaning`: a paged cache gathered, float8 dequantized)."""
    inputs = oracle.meaning(inputs)
    work = dtypes.as_dtype(target.precision(np.dtype(inputs.q.dtype).name))
    q, k, v = inputs.q, golden.with_kv_heads(inputs.q, inputs.k), golden.with_kv_heads(inputs.q, inputs.v)
    qw, kw, vw = (x.astype(work) for x in (q, k, v))
    if policy == "uniform":  # no score enters the mean: the floor of scale 0
        return v.astype(np.float64).mean(axis=-2, keepdims=True), "the mean of all values", \
            target.tolerance * tolerance.floor(qw, kw, vw, scale=0.0)
    every = np.ones((*inputs.lead, inputs.n_q, inputs.n_k), dtype=bool)
    gold = expected(target, inputs, visible=every).out
    floor = tolerance.floor(qw, kw, vw, scale=inputs.scale_value)
    shift = min(1.0, dtypes.eps(work) * FINITE_FILL)  # each score moved by up to this
    vmax = float(np.max(np.abs(v.astype(np.float64)), initial=0.0))
    return gold, "the output with nothing masked", target.tolerance * (floor + 2 * shift * vmax)
