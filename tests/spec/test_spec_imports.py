"""The layers of spec point one way: no import circle among its modules, and the declarations below
the laws (a target, the oracle, the keywords) load no law.

The graph is read from the source, not from a run: every ``import`` and ``from ... import`` anywhere
in a module (at its top or inside a function, where a first-use import hides a circle from the
interpreter), except under ``if TYPE_CHECKING:``, which never runs."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules() -> dict[str, Path]:
    """Every module of the package spec, by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted((ROOT / "spec").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))


def _imported(tree: ast.AST, name: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The spec modules ``name`` imports anywhere but under TYPE_CHECKING: each one named, and the
    packages above it (importing ``spec.a.b`` runs ``spec.a`` first), but not the module's own
    packages, which are always loaded before it."""
    named: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if _type_checking(node):
            stack.extend(getattr(node, "orelse", []))
            continue
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            named.add(base)
            named |= {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules}
        stack.extend(ast.iter_child_nodes(node))
    edges = set()
    for target in named:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            edges.add(".".join(parts[:i]))
    own = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")) + 1)}
    return {m for m in edges if m in modules and m not in own}


def import_graph() -> dict[str, set[str]]:
    """Each spec module -> the spec modules it imports (module-level and first-use alike)."""
    modules = _modules()
    return {name: _imported(ast.parse(path.read_text()), name, path.name == "__init__.py", modules)
            for name, path in modules.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, as the modules along it (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_the_graph_reader_sees_first_use_imports_and_skips_type_checking():
    source = ("from typing import TYPE_CHECKING\nfrom spec import golden\n"
              "if TYPE_CHECKING:\n    from spec.cases import Case\n"
              "def f():\n    from spec.keywords import registered\n    import spec.oracle\n")
    modules = dict.fromkeys(["spec", "spec.golden", "spec.cases", "spec.keywords", "spec.oracle", "spec.x"])
    assert _imported(ast.parse(source), "spec.x", False, modules) == {"spec.golden", "spec.keywords",
                                                                       "spec.oracle"}
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_spec_has_no_import_circle():
    """A circle of imports makes the order modules load in matter, and a first-use import only
    hides it: the keyword declarations sit below the laws, the target below the keywords' users."""
    assert cycle(import_graph()) is None


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` may import, directly or through others, at load or at first use."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_layers_below_the_laws_reach_no_law():
    """A law module imports its keywords, never the reverse: nothing the keywords, the target, the
    cases, the calling layer or the oracle may import, even at first use, is a law or the registry
    of laws."""
    graph = import_graph()
    for start in ("spec.keywords", "spec.keywords.paged", "spec.target", "spec.cases", "spec.call",
                  "spec.oracle", "spec.golden"):
        above = sorted(m for m in reached(graph, start) if m.startswith("spec.laws") or m == "spec.registry")
        assert above == [], f"{start} reaches {above}"


LOADED = """
import json, sys
import numpy as np
import spec.oracle, spec.target
from spec.cases import Case
from spec.inputs import Inputs
from spec.target import Target

target = Target(lambda q, k, v, **kw: q, supports_window=True, supports_bias=True)
case = Case.from_fields(dtype="float64", ndim=4, batch=1, heads=2, n_q=3, n_k=4, d_k=2, d_v=2, seed=1,
                       window=(1, 0), bias=(1.0, ""))
out, _, _ = spec.oracle.golden_of(case.inputs(), target.alignment)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("spec"))))
"""


def test_a_target_and_the_oracle_load_no_law():
    """Loading a target, building one and computing the golden of a call with a keyword load the
    keyword declarations, never a law module (nor the registry of laws)."""
    done = subprocess.run([sys.executable, "-c", LOADED], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert "spec.keywords" in loaded
    assert [m for m in loaded if m.startswith("spec.laws") or m == "spec.registry"] == []
