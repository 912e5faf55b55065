"""The documentation: the generated law reference and Target fields are complete, the README is a
front page, the built site leaves out Python caches and shows its report tables whole, and the
text a user reads speaks Markdown and names only documents a user has."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import docgen

ROOT = Path(__file__).resolve().parents[2]


def listed_laws() -> list[str]:
    """The names ``python -m spec check --list`` prints (first column after the header rule)."""
    done = subprocess.run([sys.executable, "-m", "spec", "check", "--list"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    return [line.split()[0] for line in lines[start:] if line and not line[0].isspace()]


def law_entries(page: str) -> dict[str, str]:
    """The law reference's entries: name -> the text under its ``### `name` `` heading."""
    parts = re.split(r"^### `(\w+)`\n", page, flags=re.MULTILINE)
    bodies = [re.split(r"^## ", body, flags=re.MULTILINE)[0] for body in parts[2::2]]
    return dict(zip(parts[1::2], bodies, strict=True))


def test_law_reference_names_every_listed_law_with_its_law_and_catches():
    entries = law_entries(docgen.expand((ROOT / "docs" / "laws.md").read_text(encoding="utf-8")))
    names = listed_laws()
    assert len(names) >= 21
    missing = [n for n in names if n not in entries]
    assert not missing, f"laws without an entry in docs/laws.md: {missing}"
    for name in names:
        law = re.search(r"^\*\*Law\.\*\* (\S.*)$", entries[name], re.MULTILINE)
        catches = re.search(r"^\*\*Catches\S*\*\* (\S.*)$", entries[name], re.MULTILINE)
        needs = re.search(r"^\*\*Needs:\*\* (\S.*)$", entries[name], re.MULTILINE)
        assert law and catches and needs, f"{name}: entry lacks its law, catches or needs:\n{entries[name]}"


def test_law_reference_groups_laws_by_family_in_report_order():
    from spec.registry import LAW_MODULES, LAWS

    page = docgen.law_reference()
    families = re.findall(r"^## (\w+)$", page, re.MULTILINE)
    assert families == [m.rsplit(".", 1)[-1] for m in LAW_MODULES]
    assert list(law_entries(page)) == list(LAWS)


def test_a_law_without_catches_is_visible_in_the_reference():
    """The check above fails on a law whose docstring lacks its "Catches" paragraph."""
    from spec.registry import LAWS, Law

    prop = next(iter(LAWS.values()))

    def bare(target, case):
        """A law with a statement and nothing else."""

    broken = Law(name="bare", check=bare, strategy=prop.strategy, needs=prop.needs)
    assert broken.catches == ""
    entry = docgen._catches(broken.catches)
    assert not re.search(r"^\*\*Catches\S*\*\* (\S.*)$", entry, re.MULTILINE)


def test_every_target_field_and_capability_is_on_the_targets_page_with_a_docstring():
    from spec.keywords import registered
    from spec.target import Target

    fields = {name: doc for name, _, _, doc in docgen.target_fields()}
    assert [n for n in fields if n in {f.name for f in dataclasses.fields(Target)}] == [
        f.name for f in dataclasses.fields(Target)]
    capabilities = [n for n in fields if n not in {f.name for f in dataclasses.fields(Target)}]
    assert capabilities == [kw.field for kw in registered().values()]
    assert not [n for n, doc in fields.items() if not doc], "Target fields without a docstring"
    page = docgen.expand((ROOT / "docs" / "targets.md").read_text(encoding="utf-8"))
    assert not [n for n in fields if f"### `{n}`" not in page]


def test_api_reference_lists_every_public_name():
    import spec

    page = docgen.api_reference("spec")
    for name in spec.__all__:
        assert f"spec.{name}" in page


def test_unknown_generated_section_is_refused():
    with pytest.raises(ValueError, match="unknown generated section 'nope'"):
        docgen.expand("<!-- generate: nope -->\n")


def test_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert "python3 -m venv .venv && . .venv/bin/activate" in readme
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "tox" in [line.strip() for line in ci] and "pip install tox && tox" in readme
    assert "python -m calc gpt3" in readme and "python -m spec check reference" in readme


def test_the_generated_links_of_a_page_have_distinct_titles():
    """A page's list of generated pages names each by its own title: two links with one title
    (the forward and the backward line profiles) leave the reader to guess."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        for marker in docgen.MARKER.finditer(page.read_text(encoding="utf-8")):
            if marker[1] == "pages":
                titles = re.findall(r"^- \[(.+)\]\(", docgen.expand(marker[0]), re.MULTILINE)
                assert len(titles) == len(set(titles)), f"{page.name}: {titles}"


def test_the_site_leaves_out_python_caches(tmp_path):
    """The built site leaves out docs/__pycache__, which importing docs/hooks.py writes next to the
    pages when bytecode is on."""
    mkdocs_config = pytest.importorskip("mkdocs.config")
    from mkdocs.structure.files import get_files

    (tmp_path / "__pycache__").mkdir()
    for name in ("index.md", "hooks.py", "__pycache__/hooks.cpython-311.pyc", "bench.png"):
        (tmp_path / name).write_bytes(b"# x\n")
    config = mkdocs_config.load_config(str(ROOT / "mkdocs.yml"), docs_dir=str(tmp_path))
    published = sorted(f.src_uri for f in get_files(config) if not f.inclusion.is_excluded())
    assert published == ["bench.png", "index.md"]


FITS_AT_1280 = 130  # characters of code a 1280 px window shows whole (docs/stylesheets/extra.css)


def test_report_tables_fit_a_1280_px_window():
    """A report table wider than the window hides its notes: at 1280 px the site's stylesheet (TOC
    in the left sidebar, a wider grid, 12 px code) shows 130 columns, and every report table shown on
    a page is at most that wide (longer single lines scroll in their block)."""
    mkdocs_config = pytest.importorskip("mkdocs.config")
    config = mkdocs_config.load_config(str(ROOT / "mkdocs.yml"))
    assert "toc.integrate" in config["theme"]["features"]
    assert [str(css) for css in config["extra_css"]] == ["stylesheets/extra.css"]
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    assert "font-size: 0.6rem" in css and "max-width: 90rem" in css
    from tools import docs_outputs

    def table_rows(body: str) -> list[str]:  # from the header row "property ..." to the table's end
        lines = body.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("property")), len(lines))
        rows = []
        for line in lines[start:]:
            if not line:
                break
            if not line.startswith(("  ", "FAIL")):
                rows.append(line)
        return rows

    tables = [line for path in docs_outputs.files() for block in docs_outputs.blocks(path)
              for line in table_rows(block.body)]
    assert tables and max(map(len, tables)) <= FITS_AT_1280


USER_FACING = ("impl", "spec", "calc", "examples", "tools", "docs")
SPHINX_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|obj|exc):`")
ABSENT_DOCUMENT = re.compile(r"DESIGN|\bsource article\b|§2[b-d]\b")


def user_facing_files() -> list[Path]:
    """Every file whose text reaches a user: docstrings and messages (.py), pages (.md)."""
    found = [ROOT / "README.md"]
    for top in USER_FACING:
        found += sorted(p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".md"))
    return found


@pytest.mark.parametrize("pattern", [SPHINX_ROLE, ABSENT_DOCUMENT], ids=["sphinx-role", "absent-document"])
def test_user_facing_text_speaks_markdown_and_names_documents_a_user_has(pattern):
    """The site renders docstrings as Markdown (mkdocstrings), where a Sphinx role (``:func:`x```)
    shows raw; and a user has the project's own pages and the source's title, not a design document
    or "the source article": neither may appear in the text a user reads."""
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in user_facing_files()
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if pattern.search(line)]
    assert not hits, "\n".join(hits[:20])
