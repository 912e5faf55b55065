"""The import arrows that docs/architecture.md states hold in the code (the graph is read by
tools.docgen.import_graph, which also writes the page's import tables)."""

from __future__ import annotations

from pathlib import Path

from tools.docgen import PACKAGES, import_graph

ROOT = Path(__file__).resolve().parents[2]


def test_impl_and_calc_import_no_other_package():
    for module, deps in import_graph().items():
        own = module.split(".")[0]
        if own in ("impl", "calc"):
            assert {d.split(".")[0] for d in deps} <= {own, "cmdline"}, f"{module} imports {deps}"


def test_cmdline_imports_nothing_of_the_project():
    """The command lines' shared pieces: every package may import them, so they import none."""
    assert import_graph()["cmdline"] == set()
    assert {"impl.bench.cli", "spec.cli", "calc.cli"} <= {m for m, deps in import_graph().items()
                                                          if "cmdline" in deps}


def test_only_spec_builtin_imports_impl():
    importers = {m for m, deps in import_graph().items()
                 if m.startswith("spec") and any(d.split(".")[0] == "impl" for d in deps)}
    assert importers == {"spec.builtin"}


def test_the_golden_imports_nothing_of_the_project():
    assert import_graph()["spec.golden"] == set()


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``edges`` as a path, or None."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                return [*path, node, dep]
            if dep not in state and (found := visit(dep, [*path, node])):
                return found
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node, [])):
            return found
    return None


def module_edges(*, lazy: bool = True) -> dict[str, set[str]]:
    """Imports between modules; packages' ``__init__`` re-exports aside (they import their own)."""
    packages = {*PACKAGES, "spec.laws"}
    return {m: {d for d in deps if d not in packages and d != m}
            for m, deps in import_graph(lazy=lazy).items() if m not in packages}


FIRST_USE: dict[tuple[str, str], str] = {}
"""The imports that point back up the graph, made inside a function at first use: an import of
the module itself never runs them, so they order nothing. None is left: the keyword declarations
sit below the laws and the target (`spec.keywords`), so neither the target nor the keywords reach
up (tests/spec/test_spec_imports.py holds the whole graph, first-use imports included, acyclic)."""


def test_no_import_cycles_between_modules():
    found = cycle(module_edges(lazy=False))
    assert found is None, f"import cycle: {' -> '.join(found or [])}"


def test_the_only_imports_back_up_are_made_at_first_use():
    lazy = {(m, d) for m, deps in module_edges().items() for d in deps}
    eager = module_edges(lazy=False)
    upward = {(m, d) for m, d in lazy
              if d not in eager.get(m, set()) and cycle({**eager, m: {*eager.get(m, ()), d}})}
    assert upward == set(FIRST_USE), upward ^ set(FIRST_USE)


def test_the_checks_can_fail():
    """A back-arrow makes a cycle; the graph sees the one door from spec into impl."""
    edges = module_edges()
    found = cycle({**edges, "spec.golden": {"spec.tolerance"}})
    assert found is not None and set(found[-2:]) == {"spec.golden", "spec.tolerance"}
    assert "impl" in {d.split(".")[0] for d in import_graph()["spec.builtin"]}


def test_the_architecture_table_maps_every_module_of_spec_and_no_other():
    """docs/architecture.md's table has a row for each module and package of spec (``__init__`` and
    ``__main__`` aside) and names none that is not there: a new module cannot go unmapped, a
    moved one cannot stay on the page."""
    import re

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = [line.split("|")[1] for line in page.splitlines() if line.startswith("| `")]
    named = {name.rstrip("/") for cell in rows for name in re.findall(r"`([\w/]+)`", cell)}
    spec = ROOT / "spec"
    present = {p.stem for p in spec.glob("*.py") if p.stem not in ("__init__", "__main__")}
    present |= {p.name for p in spec.iterdir() if (p / "__init__.py").exists()}
    assert named == present, {"unmapped": present - named, "not in spec": named - present}
