"""``python -m spec audit PROBLEM``: another harness's check of an attention kernel, audited.

A benchmark that scores generated kernels checks each one as its problem file says: the kernel's
output and the reference's on a few random inputs of one shape (``get_inputs()``), compared with
``allclose(atol, rtol)``. `audit` runs that very check on kernels that are wrong — the trivial
kernels of `spec.power` (zeros, the mean of V, uniform weights, no mask, no scale, a lower
precision) and the cheats below, which are right on that check's inputs and wrong elsewhere —
and runs the suite on each of them too, and says side by side which the check passes, which the
suite rejects, by which laws, and the time each took.

A problem file (`load_problem`) is a Python file in KernelBench's shape: ``get_inputs()`` (the
arrays q, k, v: NumPy, or anything with ``.numpy()``, torch tensors among them), a reference
callable (``reference(q, k, v)``, or a class ``Model`` whose instance, made from
``get_init_inputs()`` if the file has it, is called), and ``atol`` and ``rtol``. Each of the
check's ``trials`` seeds NumPy's global generator (and torch's, when the file imported torch) with
the trial's number before ``get_inputs()``, as such a harness seeds each trial.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from spec import power
from spec.target import Target

Array = np.ndarray
Kernel = Callable[..., Any]


# --- the problem -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """A harness's check: its inputs, its reference, its tolerances."""

    name: str
    get_inputs: Callable[[], Sequence[Any]]
    reference: Kernel
    atol: float
    rtol: float

    def inputs(self, trial: int) -> tuple[Array, Array, Array]:
        """The inputs of ``trial``: the global generators seeded with its number, as NumPy arrays."""
        np.random.seed(trial)  # noqa: NPY002 (the global generator: what the problem's get_inputs draws from)
        if "torch" in sys.modules:
            sys.modules["torch"].manual_seed(trial)
        got = list(self.get_inputs())
        if len(got) != 3:
            raise ValueError(f"problem {self.name}: get_inputs() must return q, k, v, got {len(got)} values")
        q, k, v = (as_numpy(x, f"get_inputs()[{i}]") for i, x in enumerate(got))
        return q, k, v


def as_numpy(x: Any, what: str) -> Array:
    """``x`` as a NumPy array (a torch tensor through ``.detach().cpu().numpy()``)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x = x.numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what} must be an array (NumPy, or with .numpy()), got {type(x).__name__}")
    return x


def load_problem(path: str) -> Problem:
    """The problem file at ``path`` (the module docstring says its shape). Raises ValueError naming
    what is missing or wrong."""
    file = Path(path)
    if file.suffix != ".py" or not file.is_file():
        raise ValueError(f"PROBLEM must be a Python file, got {path!r}")
    spec_ = importlib.util.spec_from_file_location(f"_audited_{file.stem}", file)
    if spec_ is None or spec_.loader is None:
        raise ValueError(f"PROBLEM {path!r} cannot be imported")
    module = importlib.util.module_from_spec(spec_)
    try:
        spec_.loader.exec_module(module)
    except Exception as e:  # the file's own error, said in one line
        raise ValueError(f"PROBLEM {path!r} raised {type(e).__name__}: {e}") from None
    if not callable(getattr(module, "get_inputs", None)):
        raise ValueError(f"PROBLEM {path!r} has no get_inputs()")
    reference = getattr(module, "reference", None)
    if reference is None and hasattr(module, "Model"):
        init: Any = getattr(module, "get_init_inputs", lambda: [])()
        reference = module.Model(*init)
    if not callable(reference):
        raise ValueError(f"PROBLEM {path!r} has neither reference(q, k, v) nor a class Model")
    tolerances = {}
    for name in ("atol", "rtol"):
        value = getattr(module, name, None)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"PROBLEM {path!r} must set {name} to a number ≥ 0, got {value!r}")
        tolerances[name] = float(value)
    return Problem(file.stem, module.get_inputs, reference, **tolerances)


# --- the kernels audited ---------------------------------------------------------------------------


def _correct() -> Kernel:
    from spec.builtin import load_target

    return load_target("reference").fn


def fingerprint_cache() -> Kernel:
    """Keeps its last output keyed on a cheap fingerprint of the inputs (shapes, dtype, first and
    last elements, sums, every 7th element) and returns it whenever the fingerprint matches."""
    right = _correct()
    kept: dict[Any, Array] = {}

    def fn(q: Array, k: Array, v: Array, **kw: Any) -> Array:
        key = (*((x.shape, x.dtype.str, x.reshape(-1)[:1].tobytes(), x.reshape(-1)[-1:].tobytes(),
                  float(np.sum(x, dtype=np.float64)), x.reshape(-1)[::7].tobytes())
                 for x in (q, k, v)), repr(sorted(kw.items(), key=str)))
        if key not in kept:
            kept.clear()
            kept[key] = np.asarray(right(q, k, v, **kw))
        return kept[key].copy()

    return fn


def buffer_cache() -> Kernel:
    """Keeps its outputs keyed on where the inputs live (their addresses, shapes and strides, as a
    tensor's ``data_ptr()``): the same buffers, refilled with new values in place, get the stale
    output."""
    right = _correct()
    kept: dict[Any, Array] = {}

    def fn(q: Array, k: Array, v: Array, **kw: Any) -> Array:
        key = (*((x.__array_interface__["data"][0], x.shape, x.strides) for x in (q, k, v)),
               repr(sorted(kw.items(), key=str)))
        if key not in kept:
            kept[key] = np.asarray(right(q, k, v, **kw))
        return kept[key].copy()

    return fn


def corrupt_after(calls: int = 10) -> Kernel:
    """Right for its first ``calls`` calls; after them, its output rows in the wrong order."""
    right, made = _correct(), [0]

    def fn(q: Array, k: Array, v: Array, **kw: Any) -> Array:
        made[0] += 1
        out = np.asarray(right(q, k, v, **kw))
        return out if made[0] <= calls else out[..., ::-1, :].copy()

    return fn


def one_shape(shape: tuple[int, ...]) -> Kernel:
    """Right at q's ``shape`` (the check's), the mean of V at any other."""
    right = _correct()

    def fn(q: Array, k: Array, v: Array, **kw: Any) -> Array:
        if q.shape == shape:
            return np.asarray(right(q, k, v, **kw))
        with np.errstate(invalid="ignore"):  # no keys: NaN, as a mean of nothing is
            mean = np.mean(v.astype(np.float64), axis=-2, keepdims=True)
        return np.broadcast_to(mean, (*q.shape[:-1], v.shape[-1])).astype(q.dtype)

    return fn


@dataclass(frozen=True)
class Audited:
    """A kernel the audit runs: its name, what it does, and how it is made for the shape of the
    check's q (the cheats are stateful: a fresh one for each check, the harness's and the
    suite's)."""

    name: str
    does: str
    make: Callable[[tuple[int, ...]], Target]


def _trivial(name: str) -> Callable[[tuple[int, ...]], Target]:
    return lambda shape: power.as_target(name)


def _cheat(build: Callable[[tuple[int, ...]], Kernel], name: str) -> Callable[[tuple[int, ...]], Target]:
    return lambda shape: Target(build(shape), name=f"cheat {name}", dtypes=("float32", "float64"),
                                         supports_mask=True, supports_scale=True)


KERNELS: tuple[Audited, ...] = (
    *(Audited(t.name, t.means, _trivial(t.name)) for t in power.KERNELS),
    Audited("fingerprint_cache", "returns its last output when shapes, first/last elements and sums match",
            _cheat(lambda shape: fingerprint_cache(), "fingerprint_cache")),
    Audited("buffer_cache", "returns its last output when handed the same buffers, refilled",
            _cheat(lambda shape: buffer_cache(), "buffer_cache")),
    Audited("corrupt_after_10", "right for 10 calls, its rows in the wrong order after",
            _cheat(lambda shape: corrupt_after(10), "corrupt_after_10")),
    Audited("one_shape", "right at the check's shape only, the mean of V elsewhere",
            _cheat(one_shape, "one_shape")),
)
"""The kernels `audit` runs: every trivial kernel of `spec.power`, then the cheats."""


# --- the audit -----------------------------------------------------------------------------------


@dataclass
class Row:
    """One kernel's two verdicts."""

    kernel: str
    does: str
    check_passes: bool
    worst: float  # the check's worst |out − ref| / (atol + rtol·|ref|) over the trials: ≤ 1 passes
    check_seconds: float
    suite_ok: bool
    suite_failed: list[str] = field(default_factory=list)
    suite_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "does": self.does, "check_passes": self.check_passes,
                "check_worst_ratio": self.worst, "check_seconds": round(self.check_seconds, 3),
                "suite_conforms": self.suite_ok, "suite_failed": self.suite_failed,
                "suite_seconds": round(self.suite_seconds, 3)}


def allclose_check(problem: Problem, fn: Kernel, trials: int,
                   references: list[tuple[tuple[Array, Array, Array], Array]]) -> tuple[bool, float]:
    """The problem's own check of ``fn``: each trial's output against the reference's with
    ``allclose(atol, rtol)``; whether every trial passed, and the worst ratio of the deviation to
    the allowance, |out − ref| / (atol + rtol·|ref|) (≤ 1 passes; NaN, an exception or a wrong
    shape: inf)."""
    worst = 0.0
    for trial in range(trials):
        (q, k, v), ref = references[trial]
        try:
            out = as_numpy(fn(q, k, v), "the kernel's output")
        except Exception:  # a kernel that raises fails the check
            return False, np.inf
        if out.shape != ref.shape:
            return False, np.inf
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.abs(out.astype(np.float64) - ref) / (problem.atol + problem.rtol * np.abs(ref))
        worst = max(worst, np.inf if not np.all(np.isfinite(out)) else float(np.max(ratio, initial=0.0)))
    return bool(worst <= 1), worst


def audit(problem: Problem, *, trials: int = 5, profile: str = "quick",
          kernels: Sequence[Audited] = KERNELS, each: Callable[[Row], None] | None = None) -> list[Row]:
    """Each of ``kernels`` through the problem's check (``trials`` trials) and through the suite
    (`spec.check` at ``profile``)."""
    from spec.runner import check

    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    references = []
    for trial in range(trials):
        q, k, v = problem.inputs(trial)
        references.append(((q, k, v), as_numpy(problem.reference(q, k, v), "the reference's output")
                           .astype(np.float64)))
    shape = references[0][0][0].shape
    rows = []
    for kernel in kernels:
        start = time.perf_counter()
        passes, worst = allclose_check(problem, kernel.make(shape).fn, trials, references)
        took = time.perf_counter() - start
        start = time.perf_counter()
        report = check(kernel.make(shape), profile)
        row = Row(kernel.name, kernel.does, passes, worst, took, report.ok, [r.name for r in report.failures],
                  time.perf_counter() - start)
        rows.append(row)
        if each is not None:
            each(row)
    return rows


def _laws(n: int) -> str:
    return f"{n} law" if n == 1 else f"{n} laws"


def render(problem: Problem, rows: list[Row], trials: int, profile: str) -> str:
    """The audit as a table and one line each for what the suite failed."""
    from tabulate import tabulate

    table = [[r.kernel, "passes" if r.check_passes else "fails", f"{r.worst:.3g}", f"{r.check_seconds:.2f}",
              "conforms" if r.suite_ok else f"rejects ({_laws(len(r.suite_failed))})",
              f"{r.suite_seconds:.2f}"] for r in rows]
    head = (f"{problem.name}: its check (allclose, atol={problem.atol:g}, rtol={problem.rtol:g}, {trials} "
            f"trials) against python -m spec check --profile {profile}")
    body = tabulate(table, headers=["kernel", "check", "worst |out − ref| / allowed", "s", "suite", "s"],
                    tablefmt="simple")
    caught = [f"  {r.kernel}: {', '.join(r.suite_failed[:4])}{', …' if len(r.suite_failed) > 4 else ''}"
              for r in rows if r.suite_failed]
    passed = sum(r.check_passes for r in rows)
    missed = sum(r.check_passes and not r.suite_ok for r in rows)
    tail = (f"the check passes {passed} of {len(rows)} wrong kernels; the suite rejects "
            f"{sum(not r.suite_ok for r in rows)} of {len(rows)}, {missed} of them among those the check "
            "passes")
    return "\n".join([head, "", body, "", "the suite's first failed laws:", *caught, "", tail])


__all__ = ["KERNELS", "Audited", "Problem", "Row", "allclose_check", "audit", "buffer_cache", "corrupt_after",
           "fingerprint_cache", "load_problem", "one_shape", "render"]
