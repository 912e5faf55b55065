"""The call into a target: the arguments it receives for an `Inputs` (in its layout, only the
keywords it declares), the one way to invoke it (`invoke`: where its isolation says, every
misbehaviour a failure), and what comes back checked (shape, dtype, gradients and their extras).
Each call is recorded in the run's context (`spec.context`) for the report."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import reject

from spec import context, oracle, power
from spec.cases import outside_limits
from spec.golden import GRADS
from spec.inputs import Inputs
from spec.isolation import Request, TargetHung, TargetStopped, call_in
from spec.keywords import arrangement, asked_outputs, by_argument, carried, gradient_extras, in_layout
from spec.target import NotAnArray, Target, TargetError, TargetFailed


def invoke(target: Target, what: str, fn: Callable[[], Any], deadline: float | None = None) -> Any:
    """THE way the suite calls into a target: ``fn()`` where the target's ``isolation`` says
    (`spec.isolation.call_in`), under the target's deadline, else ``deadline``, else the run's
    (`spec.target.Target.call_deadline`), with every misbehaviour a `TargetFailed` (an exception,
    ``sys.exit``, a crash), `spec.isolation.TargetHung` (an overrun) or
    `spec.signature.SignatureMismatch` (the target does not take the keywords it was declared to
    take). ``what`` names the callable in messages ("the target", "grad_fn")."""
    run = context.current()
    if run is not None and run.spent():
        raise context.BudgetSpent("the check's time budget (budget_s) was spent")
    seconds = target.call_deadline(deadline if deadline is not None or run is None else run.deadline)
    try:
        return call_in(target, what, fn, seconds)
    except (TargetHung, TargetStopped, TargetError, TargetFailed):
        raise
    except NotAnArray as e:  # what it returned, said as it is (not "the target raised ...")
        raise TargetFailed(str(e)) from None
    except (Exception, SystemExit) as e:  # a sys.exit() in the target must not end the suite
        raised = f"{type(e).__name__}: {e}" if isinstance(e, Exception) else None
        raise TargetFailed(f"{what} raised {type(e).__name__}: {e}", raised=raised) from e


@dataclass(frozen=True)
class Call:
    """One call into a target, as it received it: ``which`` callable (``fn`` or ``grad_fn``),
    its inputs and, for a gradient, the upstream gradient, in the suite's layout; ``axes``: the
    two axes of q, k, v (and d_out) that ``fn`` received swapped (its ``bnhd`` layout), or None;
    ``arrangement``: the call's (`spec.keywords.arrangement`), which says which of them moved
    (`spec.keywords.in_layout`: a paged cache's k and v never do)."""

    which: str
    inputs: Inputs
    d_out: np.ndarray | None = None
    axes: tuple[int, int] | None = None
    arrangement: str = "dense"

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array argument by name, exactly as the callable received it (in its layout;
        masks and biases are ``[batch, heads, n_q, n_k]`` in every layout, paged caches
        ``[num_blocks, block_size, heads_kv, d]``)."""
        found = self.inputs.arrays() | ({} if self.d_out is None else {"d_out": self.d_out})
        if self.axes is not None:
            moved = (*in_layout(self.arrangement), "d_out")
            found |= {name: np.swapaxes(found[name], *self.axes) for name in moved if name in found}
        return found


def _record(call: Call) -> None:
    run = context.current()
    if run is not None:
        run.record(call)


def arguments(target: Target, inputs: Inputs, *, copy: bool = True) -> dict[str, Any]:
    """The keyword arguments ``fn`` receives for ``inputs``: ``causal`` only when true, ``mask`` and
    ``scale`` when given, each keyword argument when given (a switch's False, ``return_lse=False``,
    is not given: `spec.keywords.Keyword.switch`), on copies when ``copy``. A keyword the target
    does not declare is a `TargetError` (a law asked for something the target cannot do: a bug in
    the law's needs), unless another keyword it declares carries it (``kv_lengths`` with
    ``block_table``: `spec.keywords.Keyword.carries`)."""
    kwargs: dict[str, Any] = {"causal": True} if inputs.causal else {}
    if inputs.mask is not None:
        kwargs["mask"] = np.array(inputs.mask, copy=copy)
    if inputs.scale is not None:
        kwargs["scale"] = inputs.scale
    table = by_argument()
    for name, value in inputs.keywords.items():
        kw = table.get(name)
        if kw is None:
            raise TargetError(f"unknown keyword {name!r}; the keywords are {', '.join(table)}")
        if value is None or (kw.switch and value is False):
            continue
        if not getattr(target, kw.field) and not carried(target, name, inputs.keywords):
            raise TargetError(f"keyword {name}= needs {kw.field}=True, which target {target.name!r} "
                              "does not declare")
        kwargs[name] = np.array(value, copy=copy) if isinstance(value, np.ndarray) else value
    return kwargs


def call(
    target: Target, inputs: Inputs, *, deadline: float | None = None,
    expect_shape: tuple[int, ...] | None = None, copy: bool = True,
) -> Any:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v] (, lse [..., n_q])
    """Call the target on copies of ``inputs`` (so a mutating target cannot corrupt the check;
    ``copy=False`` hands over the caller's arrays) and return its output as an ndarray of the
    expected shape. ``deadline`` (seconds) as `invoke` takes it. A keyword among the arguments
    that makes the call return more (`spec.keywords.Returns`) makes the result ``(out, *extras)``,
    each extra checked by its declaration: with ``return_lse=True`` ``(out, lse)``, lse float and
    shaped ``[..., n_q]``; with ``past_key=``/``past_value=`` ``(out, present_key,
    present_value)``, each present shaped as the keys and values the call means (the past's then
    the call's: `spec.oracle.meaning`) in the inputs' dtype. The call is recorded in the run's
    context for the report."""
    _within_limits(target, inputs)
    args = tuple(np.array(x, copy=copy) for x in (inputs.q, inputs.k, inputs.v))
    kwargs = arguments(target, inputs, copy=copy)
    args, kwargs = from_latent(target, inputs, args, kwargs)
    kwargs["arrangement"] = arranged = arrangement(kwargs)
    _record(Call("fn", inputs, axes=target._layout_axes(inputs.q.ndim, packed=arranged == "packed"),
                 arrangement=arranged))
    request = Request(target, "fn", args, kwargs)
    got = invoke(target, "the target", request, deadline)
    power.see(target, inputs)  # the trivial kernels this call's case tells apart, when asked
    extras = asked_outputs(kwargs)
    out = got[0] if extras else got
    _check_float(out, "the target returned")
    # the output's shape is that of what k and v mean (a paged pool's shape is not the keys')
    meant = oracle.meaning(inputs) if expect_shape is None or extras else inputs  # the call as it means
    expect_shape = meant.out_shape if expect_shape is None else expect_shape
    if out.shape != expect_shape:
        raise TargetFailed(f"the target returned shape {out.shape}, expected {expect_shape}")
    if not extras:
        return out
    returned, at = tuple(got[1:]), 0
    for returns in extras:
        wrong = returns.check(meant, returned[at:at + len(returns.names)], expect_shape)
        if wrong is not None:
            raise TargetFailed(wrong)
        at += len(returns.names)
    return (out, *returned)


def from_latent(target: Target, inputs: Inputs, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a ``v_from_k`` target (`Target.v_from_k`): v as ``None`` and ``d_v=`` its
    width, the target reading ``v = k[..., :d_v]``; ``args`` and ``kwargs`` as they are for any
    other target. A call whose v is not that prefix of k (a law's own values) is not made: it lies
    outside the target's declarations (`spec.cases.outside_limits`), and `_within_limits`, run
    first, rejects it."""
    if not target.v_from_k:
        return args, kwargs
    return (*args[:2], None, *args[3:]), kwargs | {"d_v": int(inputs.v.shape[-1])}


def _within_limits(target: Target, inputs: Inputs) -> None:
    """A call a law derives (one query alone, a truncated row, a slice) that breaks the target's
    declared shape limits is not made: the example is rejected, and a law all of whose examples
    would break them is skipped, naming them (`spec.runner.check_law`)."""
    if outside_limits(target, inputs) is not None:
        reject()


def _check_float(x: Any, said: str) -> None:
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "fiuVc":
        raise TargetFailed(f"{said} {type(x).__name__} of dtype {getattr(x, 'dtype', None)}, not floats")


def call_grad(
    target: Target, inputs: Inputs, d_out: np.ndarray, *,
    residuals: tuple[np.ndarray, np.ndarray] | None = None, deadline: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    # -> dq [.., n_q, d_k], dk [.., n_k, d_k], dv [.., n_k, d_v], extras
    """``target.grad_fn(q, k, v, d_out, **keywords)`` on copies, with exactly the keywords the
    forward would receive for ``inputs`` (`arguments`, without a switch: ``return_lse``), in the
    target's layout (packed sequences too), through `invoke` (so with the same guarantees as a
    forward call). ``residuals``: the forward's ``(out, lse)`` (suite layout), passed as ``out=`` and
    ``lse=`` (`Target.grad_takes_residuals`). ``deadline`` as `invoke` takes it.

    Returns ``(dq, dk, dv, extras)``, each gradient checked for shape and dtype; ``extras`` holds
    the gradient of each extra input the target declares (`Target.grad_extras`) whose keyword
    the call was given, checked to have the shape and dtype of that input as passed (empty when
    none)."""
    grad_fn = target.grad_fn
    if grad_fn is None:
        raise TargetError(f"target {target.name!r} declares no grad_fn")
    _within_limits(target, inputs)
    q, k, v = inputs.q, inputs.k, inputs.v
    table = by_argument()  # a switch asks the forward for an output: never the backward's
    kwargs = {name: x for name, x in arguments(target, inputs).items()
              if name not in table or not table[name].switch}
    arranged = arrangement(kwargs)
    axes = target._layout_axes(q.ndim, packed=arranged == "packed")
    _record(Call("grad_fn", inputs, d_out, axes, arranged))
    moved = (*in_layout(arranged), "d_out")

    def given(name: str, x: np.ndarray) -> np.ndarray:  # a copy, in the target's layout
        if axes and name in moved:
            return np.ascontiguousarray(np.swapaxes(x, *axes))
        return np.array(x, copy=True)

    args = tuple(given(name, x) for name, x in zip(("q", "k", "v", "d_out"), (q, k, v, d_out), strict=True))
    args, kwargs = from_latent(target, inputs, args, kwargs)
    kwargs = {name: given(name, x) if name in moved and isinstance(x, np.ndarray) else x  # qv= as q
              for name, x in kwargs.items()}
    if residuals is not None:
        kwargs["out"], kwargs["lse"] = given("d_out", residuals[0]), np.array(residuals[1], copy=True)
    got = invoke(target, "grad_fn", Request(target, "grad_fn", args, kwargs), deadline)
    size = 4 if target.grad_extras else 3
    if not isinstance(got, (tuple, list)) or len(got) != size or (
            size == 4 and not isinstance(got[3], Mapping)):
        got_what = f"{len(got)} items" if isinstance(got, (tuple, list)) else type(got).__name__
        wanted = ("(dq, dk, dv, extras), extras a dict (the target declares grad_extras="
                  f"{target.grad_extras!r})") if size == 4 else "the three (dq, dk, dv)"
        raise TargetFailed(f"grad_fn returned {got_what}, not {wanted}")
    grads = []
    v_given = np.swapaxes(v, *axes) if axes and "v" in moved else v  # v's shape in the target's layout
    for name, g, x in zip(GRADS, _latent_gradients(target, got[:3], v_given), (q, k, v), strict=True):
        g = Target._from_layout(np.asarray(g), axes)
        _check_gradient(g, name, x.shape, x.dtype)
        grads.append(g)
    extras = _extras(target, kwargs, got[3]) if size == 4 else {}
    known = gradient_extras()  # an extra whose input moved with the layout moves back (dqv, as qv)
    extras = {name: Target._from_layout(g, axes) if known[name].passes[0] in moved else g
              for name, g in extras.items()}
    return grads[0], grads[1], grads[2], extras


def _latent_gradients(target: Target, got: Any, v: np.ndarray) -> tuple[Any, ...]:
    """``(dq, dk, dv)`` as ``grad_fn`` returned them; for a ``v_from_k`` target, which returns
    ``(dq, dk, None)`` (dk the latent's, the values' gradient folded into its first d_v columns),
    dv is zeros of the shape and dtype of ``v`` (as the target would have received it): v is no
    input of its call, so nothing reaches it but through k (`spec.oracle.gradients` folds the
    golden the same way)."""
    if not target.v_from_k:
        return tuple(got)
    if got[2] is not None:
        raise TargetFailed(f"grad_fn returned dv of type {type(got[2]).__name__}; a v_from_k target returns "
                           "(dq, dk, None), the values' gradient added into dk's first d_v columns")
    return (got[0], got[1], np.zeros(v.shape, dtype=v.dtype))


def _check_gradient(g: np.ndarray, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if g.shape != shape:
        raise TargetFailed(f"grad_fn returned {name} of shape {g.shape}, expected {shape}")
    if g.dtype != dtype:
        raise TargetFailed(f"grad_fn returned {name} of dtype {g.dtype}, expected {dtype}")


def _extras(target: Target, kwargs: dict[str, Any], returned: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The declared extras ``grad_fn`` returned, each checked against the input it is the gradient
    of (its keyword's first argument, as passed): present exactly when that keyword was given."""
    known = gradient_extras()
    wanted = {name: known[name] for name in target.grad_extras if known[name].given(kwargs) is not None}
    found: dict[str, np.ndarray] = {}
    for name, g in returned.items():
        if g is None:
            continue
        if name not in target.grad_extras:
            raise TargetFailed(f"grad_fn returned {name!r} among its extras, which the target does not "
                               f"declare (grad_extras={target.grad_extras!r})")
        if name not in wanted:
            raise TargetFailed(f"grad_fn returned {name} though the call gave no {known[name].passes[0]}=")
        value = np.asarray(kwargs[wanted[name].passes[0]])
        g = np.asarray(g)
        _check_gradient(g, name, value.shape, value.dtype)
        found[name] = g
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise TargetFailed(f"grad_fn returned no {missing[0]}, though the call gave "
                           f"{wanted[missing[0]].passes[0]}= and the target declares grad_extras="
                           f"{target.grad_extras!r}")
    return found
