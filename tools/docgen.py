"""Pages generated from the code at build time, so that they cannot go stale.

``docs/hooks.py`` (an MkDocs hook) replaces a marker line in a page with the text made here:

    <!-- generate: laws -->      every registered law, by family (spec.registry.LAWS)
    <!-- generate: targets -->   every Target field with its type, default and docstring
    <!-- generate: keywords -->  every declared keyword: arguments, field, terms, spellings, module
    <!-- generate: api impl -->  a mkdocstrings entry (``::: impl.name``) per name of ``impl.__all__``
    <!-- generate: gallery -->   the gallery's broken implementations and the law meant to reject each
    <!-- generate: imports spec -->  the project modules each module of ``spec`` imports (from the code)
    <!-- generate: pages performance.md ... -->  links to those of these pages that exist (pages
                                 other engineers' tools write); a line saying which are missing

``tests/tools/test_docs.py`` renders the same text and checks it names every law and every field.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- generate: ([\w-]+)((?: \S+)*) -->$", re.MULTILINE)


def _markdown(text: str) -> str:
    """reST's ``code`` and *emphasis* as Markdown."""
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _catches(text: str) -> str:
    """A law's "Catches ..." paragraph with its first word in bold."""
    head, _, rest = text.partition(" ")
    return f"**{head}** {_markdown(rest)}"


def law_reference() -> str:
    """Markdown: every law of `spec.registry.LAWS`, grouped by family, in report order."""
    from spec.profiles import running
    from spec.registry import LAW_MODULES, LAWS

    ordinary = running("core")  # a family no profile names
    lines: list[str] = []
    for module in LAW_MODULES:
        laws = [p for p in LAWS.values() if p.module == module]
        family = module.rsplit(".", 1)[-1]
        where = running(family)
        only = "" if where == ordinary else \
            f" They run at {' and '.join(f'`--profile {name}`' for name in where)} only."
        lines += [f"## {family}", "", f"{len(laws)} laws in `{module}`.{only}", ""]
        for prop in laws:
            needs = prop.requires or "nothing beyond a plain target"
            lines += [
                f"### `{prop.name}`",
                "",
                f"**Law.** {_markdown(prop.statement)}",
                "",
                _catches(prop.catches),
                "",
                f"**Needs:** {_markdown(needs)}.",
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"


def target_fields() -> list[tuple[str, str, str, str]]:
    """``(name, type, default, docstring)`` of every `spec.Target` field, from the source
    (the string after each field is its docstring), and after ``capabilities`` each keyword's
    capability, from its declaration."""
    from spec.target import Target

    tree = ast.parse((ROOT / "spec" / "target.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Target"]
    docs: dict[str, str] = {}
    for field, after in zip(cls.body, [*cls.body[1:], None], strict=True):
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
            doc = ""
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                doc = " ".join(str(after.value.value).split())
            docs[field.target.id] = doc
    from spec.keywords import registered

    for kw in registered().values():  # a keyword's field is documented by its declaration
        takes = ", ".join([f"`{a}=`" for a in kw.passes] + [f"`{a}=`" for a in kw.carries])
        docs[kw.field] = f"`fn` takes {takes}: {kw.meaning}"
    rows = []
    for f in dataclasses.fields(Target):
        default = "required" if f.default is dataclasses.MISSING else repr(f.default)
        rows.append((f.name, str(f.type), default, docs.get(f.name, "")))
        if f.name == "capabilities":  # each keyword's capability, a constructor keyword of its own
            rows += [(kw.field, "bool", "False", docs[kw.field]) for kw in registered().values()]
    return rows


def target_reference() -> str:
    """Markdown: one entry per `spec.Target` field."""
    lines = []
    for name, type_, default, doc in target_fields():
        lines += [f"### `{name}`", "", f"`{type_}` — default `{default}`", "", _markdown(doc), ""]
    return "\n".join(lines).rstrip() + "\n"


def _term_text(term: object) -> str:
    """What one term of a keyword's declaration does to the maths, in words."""
    from spec import keywords as kw

    if isinstance(term, kw.Restricts):
        return f"hides keys (rows it empties: `{term.cause}`)"
    if isinstance(term, kw.Transforms):
        return "transforms the scaled scores"
    if isinstance(term, kw.Adds):
        cause = f"; −inf hides a key (`{term.cause}`)" if term.cause else ""
        grad = f"; its gradient is `{term.grad}`" if term.grad else ""
        return f"adds to the scores{cause}{grad}"
    if isinstance(term, kw.Sinks):
        grad = f"; its gradient is `{term.grad}`" if term.grad else ""
        return f"joins each row's denominator{grad}"
    if isinstance(term, kw.Realigns):
        return "moves each query's diagonal"
    if isinstance(term, kw.Reads):
        rounding = (f"; the tolerance allows weights rounded to `{term.weights_in}` for P·V"
                    if term.weights_in else "")
        return f"changes how k and v are stored (the golden reads them: `{term.read.__name__}`){rounding}"
    if isinstance(term, kw.Widens):
        grad = f"; its gradient is `{term.grad}`, and dv gains the part through the scores" \
            if term.grad else ""
        return f"widens every score's product: q' = [q \\| qv], k' = [k \\| v] at the same scale{grad}"
    assert isinstance(term, kw.Leaves)
    return f"leaves the golden as it is: {term.reason}"


def keyword_reference() -> str:
    """Markdown: every declared keyword (`spec.keywords.registered`), read from its declaration:
    the arguments, the Target field, what it does to the maths, how libraries spell it (their
    adapters' spellings, `spec.adapters`), and the
    keyword module that declares it (the module its ``received`` is written in)."""
    from spec.adapters import every_spelling
    from spec.keywords import registered

    spelt = every_spelling()
    rows = ["| keyword | arguments | Target field | what it does | other libraries | declared in |",
            "|---|---|---|---|---|---|"]
    for kw in registered().values():
        args = ", ".join([f"`{a}=`" for a in kw.passes] + [f"`{a}=` (always with it)" for a in kw.carries])
        terms = "; ".join(_term_text(t) for t in kw.terms)
        names = ", ".join(f"{lib}: `{table[kw.passes[0]]}`" for lib, table in spelt.items()
                          if kw.passes[0] in table) or "—"
        rows.append(f"| {kw.name} | {args} | `{kw.field}` | {terms} | {names} | `{kw.received.__module__}` |")
    return "\n".join(rows) + "\n"


def api_reference(package: str) -> str:
    """mkdocstrings entries for every public name of ``package`` (its ``__all__``), so that a new
    export is documented without editing a page; modules and plain data are listed by name."""
    import importlib
    import inspect

    module = importlib.import_module(package)
    lines, data = [], []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            lines += [f"::: {package}.{name}", ""]
        else:
            data.append(f"`{package}.{name}`")
    if data:
        lines += ["Also exported: " + ", ".join(data) + ".", ""]
    return "\n".join(lines)


def gallery_table() -> str:
    """Markdown: each deliberately broken implementation of ``tests/spec/gallery`` (``BROKEN``), the bug
    and the law that must reject it (``tests/spec/test_spec_gallery.py`` checks that it does)."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "spec"))
    from gallery import BROKEN

    rows = ["| bug | gallery name | rejected by |", "|---|---|---|"]
    rows += [f"| {b.bug} | `{b.target.name}` | [`{b.catches}`](#{b.catches}) |" for b in BROKEN]
    return "\n".join(rows) + "\n"


PACKAGES = ("impl", "spec", "calc", "cmdline")


def module_name(path: Path) -> str:
    """``spec/laws/core.py`` -> ``spec.laws.core``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path, *, lazy: bool = True) -> set[str]:
    """The project modules ``path`` imports anywhere (with ``lazy``, imports inside functions
    included; without, only those run when the module itself is imported; never those of an ``if
    TYPE_CHECKING:`` block, which no run makes); ``from spec import golden`` counts as
    ``spec.golden`` when that is a module."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in _anywhere(tree) if lazy else _module_level(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")}
            found |= subs or {node.module}
    return {m for m in found if m.split(".")[0] in PACKAGES}


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _anywhere(tree: ast.Module) -> list[ast.AST]:
    """Every node of the module, functions' bodies included, ``if TYPE_CHECKING:`` blocks left out."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.If) and _type_checking(node):
            todo += node.orelse
        else:
            todo += ast.iter_child_nodes(node)
    return found


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements run when a module is imported (its body and the blocks of its ``if`` and
    ``try`` statements, not its functions' bodies; ``if TYPE_CHECKING:`` blocks left out)."""
    found: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.If) and not _type_checking(node):
            todo += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            todo += [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]
    return found


def import_graph(*, lazy: bool = True) -> dict[str, set[str]]:
    """Every module of the packages -> the project modules it imports (``lazy``: inside
    functions too)."""
    return {module_name(p): imports(p, lazy=lazy) for pkg in PACKAGES
            for p in sorted((ROOT / pkg).rglob("*.py"))}


def import_table(package: str) -> str:
    """Markdown: each module of ``package`` (``__init__`` and ``__main__`` aside) and what it imports."""
    rows = ["| module | imports |", "|---|---|"]
    for module, deps in import_graph().items():
        if module.split(".")[0] == package and module != package and not module.endswith("__main__"):
            shown = ", ".join(f"`{d}`" for d in sorted(deps)) or "nothing of the project"
            rows.append(f"| `{module}` | {shown} |")
    return "\n".join(rows) + "\n"


def page_links(*pages: str) -> str:
    """A bullet list linking the pages of ``docs/`` that exist; the missing ones are named."""
    present = [p for p in pages if (ROOT / "docs" / p).is_file()]
    missing = [p for p in pages if p not in present]
    lines = [f"- [{_title(p)}]({p})" for p in present]
    if missing:
        lines.append(f"- not generated in this checkout yet: {', '.join(f'`docs/{p}`' for p in missing)}")
    return "\n".join(lines) + "\n"


def _title(page: str) -> str:
    """The first ``# `` heading of a page, else its file name."""
    for line in (ROOT / "docs" / page).read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return page


GENERATORS = {"laws": law_reference, "targets": target_reference, "keywords": keyword_reference,
              "api": api_reference, "pages": page_links,
              "imports": import_table,
              "gallery": gallery_table}


def expand(markdown: str) -> str:
    """``markdown`` with each ``<!-- generate: NAME ARGS -->`` line replaced by its generated text."""

    def generate(match: re.Match[str]) -> str:
        name, args = match.group(1), match.group(2).split()
        if name not in GENERATORS:
            raise ValueError(f"unknown generated section {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name](*args)

    return MARKER.sub(generate, markdown)
