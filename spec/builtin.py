"""Targets by name — the one module of `spec` that imports `impl`.

- ``reference`` — `impl.attention`; ``flash`` — `impl.flash_attention`; ``reference_latent``,
  ``flash_latent`` — the same called as MLA's shared latent (``v_from_k``);
- ``torch``, ``jax``, ``mlx``, ``torch_flex_paged``, ``torch_flex_topk``, ``torch_flex``,
  ``torch_flex_compiled``, ``onnxruntime``,
  ``onnx_reference`` — each framework adapter's targets (`spec.adapters`), its module imported
  only when one is asked for, so the suite needs no framework;
- ``pallas_mha``, ``pallas_decode``, ``pallas_gpu_paged``, ``pallas_tpu_flash``, ``pallas_tpu_paged``,
  ``pallas_splash`` — JAX's Pallas attention kernels under the Pallas interpreters
  (`spec.adapters.pallas`, the jax adapter's);
- ``merge`` — `impl.merge` (``merge_states``, ``merge_states_n``) and ``torch_sdpa_merger`` —
  PyTorch's ``_SDPAMerger`` (`spec.adapters.torch_merge`): merge operators (`spec.MergeTarget`,
  `MERGE_BUILTIN`), checked on the merge laws alone;
- ``ring`` — the suite's own ring attention on ``torch.distributed`` (`spec.adapters.torch_ring`): a
  context-parallel target (`spec.RankTarget`, `RANK_BUILTIN`), checked on the rank laws alone; and
  ``torch_cp``, PyTorch's own ``context_parallel`` on the CPU (`spec.adapters.torch_cp`);
- ``package.module:attr`` — any importable callable, `spec.Target` or `spec.MergeTarget` (an attribute path
  such as ``pkg.mod:Class.method`` works too);
- ``path/to/script.py:attr`` — the same from a file, imported under a module name of its own (not
  ``__main__``, so its ``if __name__ == "__main__":`` block does not run).

``source_of`` is the way back: the ``module:attr`` or ``path.py:attr`` that loads a target given as
an object, which a failure's reproduction line names.

The oracle (`spec.golden`) never imports `impl`: only this map does.
"""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import importlib
import importlib.util
import os
import pkgutil
import reprlib
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spec import dtypes as dt
from spec.adapters import ADAPTERS, builtin
from spec.merge_target import MergeTarget
from spec.rank_target import RankTarget
from spec.target import Target, TargetError, _callable_name


def _reference_grad(q: Any, k: Any, v: Any, d_out: Any, **keywords: Any) -> Any:
    """`impl.grad.attention_backward` with the gradients of the bias and the sinks given."""
    from impl.grad import attention_backward

    return attention_backward(q, k, v, d_out, return_extras=True, **keywords)


def _reference() -> Target:
    from impl import attention

    return Target(attention, name="reference", supports_mask=True, supports_scale=True,
                  dtypes=("float16", "float32", "float64", *dt.bfloat16_if_installed()), ndims=(2, 3, 4),
                  grad_fn=_reference_grad, grad_extras=("dbias", "dsinks", "dqv"), supports_gqa=True,
                  supports_bias=True, supports_window=True, supports_softcap=True, supports_sinks=True,
                  supports_kv_lengths=True, supports_varlen=True, supports_dropout=True, returns_lse=True,
                  supports_alibi=True, supports_paged_kv=True, supports_fp8_kv=dt.has_ml_dtypes(),
                  supports_chunk=True, supports_topk=True, supports_topk_blocks=True, supports_qv=True,
                  empty_keys="compute")  # no keys: zeros of the output's shape, as impl promises
# The reference declares no invariance (a declaration covers every form of call): its dense calls and
# kv_lengths hold batch, position and neighbours (300 examples each), but packed sequences are one
# masked softmax over the whole pack (the others' keys hidden, their count and offsets still shaping
# the sums), which breaks all three, and a paged cache is gathered to the longest sequence's length
# (impl.cache.gather), which breaks batch and neighbours: the reference.replace(invariant=...) fails.


def _flash_grad(q: Any, k: Any, v: Any, d_out: Any, *, out: Any = None, lse: Any = None,
                **keywords: Any) -> Any:
    """The tiled backward from the forward's output and logsumexp, as a training step runs it:
    those handed over (``out=``, ``lse=``), or recomputed by the forward."""
    from impl import flash_attention, flash_attention_backward

    if out is None or lse is None:
        out, lse = flash_attention(q, k, v, return_lse=True, **keywords)
    return flash_attention_backward(q, k, v, out, lse, d_out, **keywords)


def _flash() -> Target:
    from impl import flash_attention

    return Target(flash_attention, name="flash", supports_scale=True,
                  dtypes=("float16", "float32", "float64", *dt.bfloat16_if_installed()), ndims=(2, 3, 4),
                  supports_window=True, supports_softcap=True, returns_lse=True, grad_fn=_flash_grad,
                  grad_takes_residuals=True, supports_alibi=True, supports_chunk=True,
                  # its top-k path gathers the listed keys: a key listed twice counts twice
                  supports_topk=True, topk_duplicates="each", supports_topk_blocks=True,
                  # a paged cache, float8 or not, and its kv_lengths (carried by block_table): the
                  # float8 path and kv_lengths only with a block table, ALiBi only without
                  supports_paged_kv=True, supports_fp8_kv=dt.has_ml_dtypes(),
                  fp8_kv_paged_only=dt.has_ml_dtypes(), holds_scores=False, empty_keys="compute",
                  # split-KV, any count: each row's keys cut into n near-equal splits merged by their
                  # LSEs. Not invariant="splits": measured, the merge rounds (float32: 1.2e-7 to 1.8e-7
                  # from one split, float64: 2.2e-16 to 4.4e-16, n = 2..20 on 2×3×37×45 causal)
                  supports_num_splits=True,
                  # each (batch row, head) is its own row blocks and key tiles of fixed sizes, from its
                  # own key 0 (a paged cache: its own table row, up to its own length), each row's online
                  # softmax its own: the batch, a row's place in it and the others' lengths only change
                  # which thread runs which job. Not chunked_prefill: measured, a chunk's rows differ from
                  # the one call's in their last bits (float16: 1.5e-5), within tolerance
                  invariant=("batch", "position", "neighbours"))


def _latent(make: Callable[[], Target]) -> Callable[[], Target]:
    """The built-in ``make`` gives, called as MLA's shared latent (``v_from_k``: ``v=None``, ``d_v=``,
    V the first d_v columns of K), which `impl` takes beside every keyword but a float8 cache (its
    codes are K's; the latent's V would be a slice of them)."""

    def latent() -> Target:
        plain = make()
        return plain.replace(name=f"{plain.name}_latent", v_from_k=True, supports_fp8_kv=False,
                             fp8_kv_paged_only=False)

    return latent


BUILTIN: dict[str, Callable[[], Target]] = {
    "reference": _reference,
    "flash": _flash,
    "reference_latent": _latent(_reference),
    "flash_latent": _latent(_flash),
    # each framework adapter's targets (spec.adapters.ADAPTERS), its module imported when asked for
    **{name: functools.partial(builtin, library, name) for library, adapter in ADAPTERS.items()
       for name in adapter.targets},
}
"""Built-in targets by name; each entry builds its Target on demand."""


def _merge() -> MergeTarget:
    """`impl.merge`: both forms, natural lse, −inf for an empty state."""
    from impl.merge import merge_states, merge_states_n

    return MergeTarget(merge_states, fn_n=merge_states_n, name="merge",
                       dtypes=("float16", "float32", "float64"))


def _torch_sdpa_merger() -> MergeTarget:
    from spec.adapters.torch_merge import torch_sdpa_merger

    return torch_sdpa_merger()


MERGE_BUILTIN: dict[str, Callable[[], MergeTarget]] = {
    "merge": _merge,
    "torch_sdpa_merger": _torch_sdpa_merger,
}
"""Built-in merge operators by name (`spec.MergeTarget`), each built on demand."""


def _load_kind(spec: Any, kind: type[Any], table: dict[str, Callable[[], Any]]) -> Any:
    """The target of class ``kind`` that ``spec`` names (one as it is, a name of ``table``, or a
    ``module:attr`` / ``path.py:attr`` holding one), or None when it names anything else."""
    if isinstance(spec, kind):
        return spec
    if not isinstance(spec, str):
        return None
    if spec in table:
        return table[spec]()
    if spec in BUILTIN or spec in MERGE_BUILTIN or spec in RANK_BUILTIN or ":" not in spec:
        return None
    module_name, _, attr_path = spec.rpartition(":")
    try:
        obj: Any = _import(module_name) if _is_path(module_name) else importlib.import_module(module_name)
        for part in attr_path.split("."):
            obj = getattr(obj, part)
    except Exception:  # whatever fails, load_target fails the same way and says it
        return None
    if not isinstance(obj, kind):
        return None
    named = getattr(obj, "fn", None) or getattr(obj, "fn_n", None)
    # named after its function only: the name it was loaded by says more (as `load_target`'s)
    return obj.replace(name=spec) if named is not None and obj.name == _callable_name(named) else obj


def load_merge_target(spec: Any) -> MergeTarget | None:
    """The merge operator ``spec`` names (a `MergeTarget`, a built-in merge name, or a
    ``module:attr`` / ``path.py:attr`` holding one), or None when it names anything else (an
    attention target, or nothing that loads: `load_target` then says why)."""
    found: MergeTarget | None = _load_kind(spec, MergeTarget, MERGE_BUILTIN)
    return found


def _ring() -> RankTarget:
    """`spec.adapters.torch_ring`: the suite's own ring attention, forward, LSE and backward."""
    from spec.adapters.torch_ring import ring_target

    return ring_target()


def _torch_cp() -> RankTarget:
    """`spec.adapters.torch_cp`: PyTorch's ``context_parallel`` around SDPA (math backend, non-causal)."""
    from spec.adapters.torch_cp import torch_cp

    return torch_cp()


RANK_BUILTIN: dict[str, Callable[[], RankTarget]] = {
    "ring": _ring,
    "torch_cp": _torch_cp,
}
"""Built-in context-parallel targets by name (`spec.RankTarget`), each built on demand."""


def load_rank_target(spec: Any) -> RankTarget | None:
    """The context-parallel target ``spec`` names (a `RankTarget`, a built-in name of
    `RANK_BUILTIN`, or a ``module:attr`` / ``path.py:attr`` holding one), or None when it names
    anything else."""
    found: RankTarget | None = _load_kind(spec, RankTarget, RANK_BUILTIN)
    return found


def as_target(obj: Any) -> Target:
    """A `Target` as it is; any other callable as a target with default capabilities."""
    if isinstance(obj, Target):
        return obj
    if callable(obj):
        return Target(obj)
    raise TargetError(f"a target must be callable or a spec.Target, got {type(obj).__name__}")


def load_target(spec: str | Callable[..., Any] | Target, *, device: str | None = None) -> Target:
    """Resolve a built-in name, a ``module:attr`` string, a callable or a `Target`; ``device``:
    where a framework built-in's arrays go (``cuda``), for those alone.

    Raises `TargetError` (one line, naming what was wrong) when nothing loads.
    """
    if device is not None:
        framework = {name for adapter in ADAPTERS.values() for name in adapter.targets}
        if spec not in framework:
            raise TargetError(f"--device applies to the framework targets ({', '.join(sorted(framework))}), "
                              f"not {spec if isinstance(spec, str) else type(spec).__name__!r}: a target of "
                              "your own places its arrays itself (spec.from_torch(fn, device=...))")
        try:
            return BUILTIN[spec](device=device)  # type: ignore[call-arg]
        except (RuntimeError, ValueError, AssertionError) as e:  # the framework refuses the device
            raise TargetError(f"built-in target {spec!r} cannot run on {device!r}: {e}") from None
    if not isinstance(spec, str):
        return as_target(spec)
    if spec in MERGE_BUILTIN:
        raise TargetError(f"{spec!r} is a merge operator (spec.MergeTarget): check it with spec.check or "
                          "python -m spec check, which run the merge laws on it")
    if spec in RANK_BUILTIN:
        raise TargetError(f"{spec!r} is a context-parallel target (spec.RankTarget): check it with "
                          "spec.check or python -m spec check, which run the rank laws on it")
    if spec in BUILTIN:
        return BUILTIN[spec]()
    if ":" not in spec:
        raise TargetError(_without_attr(spec))
    module_name, _, attr_path = spec.rpartition(":")  # rpartition: a Windows path has a colon
    if not module_name or not attr_path:
        raise TargetError(f"target {spec!r} must look like package.module:attr")
    try:
        obj: Any = _import(module_name) if _is_path(module_name) else importlib.import_module(module_name)
    except TargetError:
        raise
    except ImportError as e:
        raise TargetError(f"cannot import module {module_name!r} for target {spec!r}: {e}"
                          f"{_did_you_mean_module(e, module_name)}") from None
    except Exception as e:  # a module that fails while importing is the target's problem
        raise TargetError(f"importing {module_name!r} for target {spec!r} raised "
                          f"{type(e).__name__}: {e}") from None
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            hint = did_you_mean(part, [n for n in dir(obj) if not n.startswith("_")])
            raise TargetError(f"module {module_name!r} has no attribute {attr_path!r}{hint}") from None
    if not callable(obj):
        raise TargetError(f"target {spec!r} is {type(obj).__name__} {reprlib.repr(obj)}, "
                          "not a callable or a spec.Target")
    target = as_target(obj)
    if target.name == _callable_name(target.fn) and not isinstance(obj, Target):
        target = target.replace(name=spec)
    return target


SCRIPT_MODULE = "_spec_script_"
"""The prefix of the module name a ``path/to/script.py:attr`` target's file is imported under."""


def _is_path(module_name: str) -> bool:
    """``path/to/script.py`` rather than ``package.module``."""
    return module_name.endswith(".py") or "/" in module_name or os.sep in module_name


def _import(path_text: str) -> Any:
    """The module in the file ``path_text``, imported (once per file) under a name of its own,
    never ``__main__``: a script's ``if __name__ == "__main__":`` block does not run. Its folder
    leads ``sys.path`` while it imports, as when the script runs, so its sibling imports work."""
    path = Path(path_text).expanduser().resolve()
    if path.suffix != ".py":
        dotted = path_text.replace("/", ".").replace(os.sep, ".")
        raise TargetError(f"{path_text!r} is neither a module name nor a .py file: give "
                          f"{dotted}:NAME or {path_text}.py:NAME")
    if not path.is_file():
        hint = did_you_mean(path.name, [f.name for f in path.parent.glob("*.py")],
                             lambda n: str(Path(path_text).with_name(n)))
        raise TargetError(f"no file {path_text!r} (from {os.getcwd()}){hint}")
    name = f"{SCRIPT_MODULE}{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    found = importlib.util.spec_from_file_location(name, path)
    if found is None or found.loader is None:
        raise TargetError(f"cannot import {path_text!r} as Python")
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module  # before running it: dataclasses and pickle look it up by name
    sys.path.insert(0, str(path.parent))
    try:
        found.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        if str(path.parent) in sys.path:  # unless the script took it out itself
            sys.path.remove(str(path.parent))
    return module


def _without_attr(text: str) -> str:
    """Why ``text``, which names no attribute, loads no target: a file path wants its
    ``path/to/file.py:attr`` form (with the one Target or function the file defines, when it
    defines exactly one); anything else is a built-in name, perhaps misspelt, or ``module:attr``."""
    if _is_path(text):
        return (f"target {text!r} names a file but not what in it to check: give the "
                f"path/to/file.py:attr form, {_only_candidate(text) or f'{text}:NAME'}")
    names = ", ".join(BUILTIN)
    return (f"unknown target {text!r}: give a built-in name ({names}), module:attr or "
            f"path/to/file.py:attr{did_you_mean(text, list(BUILTIN))}")


def _only_candidate(path_text: str) -> str:
    """``my.py:target`` when the file defines exactly one top-level Target, or failing that
    exactly one public function; else "". Read from the source, not run."""
    try:
        tree = ast.parse(Path(path_text).expanduser().read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    targets: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and _makes_target(node.value, targets):
            targets += [t.id for t in node.targets if isinstance(t, ast.Name)]
    functions = [node.name for node in tree.body
                 if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                 and not node.name.startswith("_")]
    candidates = targets or functions
    return f"{path_text}:{candidates[0]}" if len(candidates) == 1 else ""


def _makes_target(value: ast.expr, targets: list[str]) -> bool:
    """``Target(...)``, ``spec.Target(...)``, an adapter's ``from_torch(...)`` (and the like), or
    ``.replace(...)`` on one of these or on a name in ``targets``."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    if isinstance(func, ast.Attribute) and func.attr == "replace":
        named = isinstance(func.value, ast.Name) and func.value.id in targets
        return named or _makes_target(func.value, targets)
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("Target", "from_torch", "from_jax", "from_mlx", "from_onnx")


def _did_you_mean_module(error: ImportError, module_name: str) -> str:
    """"; did you mean 'examples.my_attention'?" when the module itself (not one it imports) is
    missing and a module of a close name sits where it was looked for; else ""."""
    missing = getattr(error, "name", None)
    if not missing or not (module_name == missing or module_name.startswith(missing + ".")):
        return ""
    parent, _, last = missing.rpartition(".")
    try:
        where = importlib.import_module(parent).__path__ if parent else None
    except (ImportError, AttributeError):
        return ""
    folders = [Path(entry or ".") for entry in (where if where is not None else sys.path)]
    names = {m.name for m in pkgutil.iter_modules(where)} | {  # namespace packages: plain folders
        d.name for folder in folders if folder.is_dir() for d in folder.iterdir() if d.name.isidentifier()}
    return did_you_mean(last, sorted(names), lambda n: f"{parent}.{n}" if parent else n)


def did_you_mean(word: str, names: list[str], shown: Callable[[str], str] = str) -> str:
    """"; did you mean 'x'?" naming the names closest to ``word`` (a typo), or ""."""
    near = difflib.get_close_matches(word, names, n=3, cutoff=0.7)
    return f"; did you mean {' or '.join(repr(shown(n)) for n in near)}?" if near else ""


@dataclass(frozen=True)
class NoSource:
    """Why no ``module:attr`` or ``path.py:attr`` loads a target given as an object, so that a
    reproduction line cannot name it."""

    why: str


def source_of(obj: Any) -> str | NoSource:
    """The ``module:attr`` that loads ``obj`` (a callable or a `Target`) again, or
    ``path/to/script.py:attr`` when it lives in a script run as ``__main__``; else why none does.

    A Target is found by a top-level name bound to it, in its function's module, in ``__main__``
    or in any other imported module (its declarations matter, so its function alone would not
    do); a function by its qualified name. A Target named after a built-in is that built-in.
    """
    if (isinstance(obj, Target) and obj.name in BUILTIN) or (isinstance(obj, MergeTarget)
                                                              and obj.name in MERGE_BUILTIN) \
            or (isinstance(obj, RankTarget) and obj.name in RANK_BUILTIN):
        return obj.name
    fn = obj.fn if isinstance(obj, Target) else obj
    qualname = getattr(fn, "__qualname__", "") or ""
    if "<lambda>" in qualname:
        return NoSource("it is a lambda")
    if "<locals>" in qualname:
        return NoSource("it is defined inside a function")
    home = getattr(fn, "__module__", None)
    module = sys.modules.get(home) if isinstance(home, str) else None
    if module is not None and not isinstance(obj, Target) and qualname:
        try:
            found: Any = module
            for part in qualname.split("."):  # a method: Class.method
                found = getattr(found, part)
        except Exception:  # a missing name, or a module attribute that raises when read
            found = None
        if found is obj:
            return _loadable(module, qualname)
    for holder in [module, sys.modules.get("__main__"), *list(sys.modules.values())]:
        if not isinstance(holder, types.ModuleType):  # sys.modules may hold None or other objects
            continue
        # vars(), not getattr: reading a module's dict runs none of its code
        name = next((n for n, value in list(vars(holder).items()) if value is obj and not n.startswith("__")),
                    None)
        if name is not None:
            return _loadable(holder, name)
    kind = "this Target" if isinstance(obj, Target) else f"this {type(obj).__name__}"
    return NoSource(f"{kind} is not bound to a name at the top level of a module")


def _loadable(module: Any, attr: str) -> str | NoSource:
    """``module:attr``, or ``path/to/script.py:attr`` for a script run as ``__main__`` or loaded
    by its path (the path relative to the working directory when under it)."""
    if module.__name__ != "__main__" and not module.__name__.startswith(SCRIPT_MODULE):
        return f"{module.__name__}:{attr}"
    file = getattr(module, "__file__", None)
    if not file or not Path(file).is_file():  # the REPL, python -c, python - (<stdin>), a notebook
        return NoSource("it is defined interactively (in __main__, which has no file)")
    path = Path(file).resolve()
    shown = os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)
    return f"{shown}:{attr}"
