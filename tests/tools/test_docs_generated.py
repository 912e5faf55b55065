"""The README's and the home page's lists of tox environments and optional extras are generated
from tox.ini and pyproject.toml (tools/docs_outputs.py), so they say what those files say:
every environment ``tox`` runs and every other, each with its description, and every extra."""

from __future__ import annotations

import configparser
import re
import tomllib
from pathlib import Path

import pytest

from tools import docs_outputs as outputs

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md"]


def shown(page: Path, name: str) -> str:
    """The text of the generated list ``name`` on ``page``."""
    lists = {m["name"]: m["body"] for m in outputs.GENERATED.finditer(page.read_text(encoding="utf-8"))}
    assert name in lists, f"{page.name} has no generated {name!r} list"
    return lists[name]


def entries(text: str) -> list[tuple[str, str]]:
    """``- `name` — text`` lines as (name, text)."""
    return re.findall(r"^- `([^`]+)` — (.*)$", text, re.MULTILINE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_environments_shown_are_tox_ini_s(page):
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini", encoding="utf-8")
    envlist = [e.strip() for e in config["tox"]["envlist"].split(",")]
    described = {s.removeprefix("testenv:"): " ".join(config[s]["description"].split())
                 for s in config.sections() if s.startswith("testenv:")}
    described["py"] = " ".join(config["testenv"]["description"].split())
    text = shown(page, "envs")
    default, _, others = text.partition("on request")
    assert [name for name, _ in entries(default)] == envlist
    assert sorted(name for name, _ in entries(others)) == sorted(set(described) - set(envlist))
    assert dict(entries(text)) == described


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_extras_shown_are_pyproject_s(page):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"]
    listed = dict(entries(shown(page, "extras")))
    assert list(listed) == list(extras)
    for name, requirements in extras.items():
        assert re.findall(r"`([^`]+)`", listed[name]) == requirements, name


def test_a_time_is_stated_once_in_tox_ini():
    """A duration ("about an hour", "about 50 min") is tox.ini's, shown through the generated list:
    no other sentence of the README or the home page states how long an environment takes."""
    for page in PAGES:
        text = outputs.GENERATED.sub("", page.read_text(encoding="utf-8"))
        assert not re.search(r"\b\d+\s*(?:min|minutes|h|hours?)\b|an hour", text), page.name


def test_a_changed_list_is_stale_and_rewritten(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n\n<!-- generated: envs -->\n- `py` — old words\n<!-- end generated -->\nend\n")
    assert outputs.stale_lists(page) == ["envs"]
    fresh = outputs.regenerate(page.read_text())
    assert fresh.startswith("intro\n\n<!-- generated: envs -->\n`tox` runs") and fresh.endswith(
        "<!-- end generated -->\nend\n")
    page.write_text(fresh)
    assert outputs.stale_lists(page) == []


def test_an_unknown_list_is_refused():
    with pytest.raises(ValueError, match="unknown generated list 'nope'"):
        outputs.regenerate("<!-- generated: nope -->\n<!-- end generated -->\n")


def test_an_envlist_name_without_a_section_is_refused(tmp_path):
    ini = tmp_path / "tox.ini"
    ini.write_text("[tox]\nenvlist = py, gone\n\n[testenv]\ndescription = tests\n")
    with pytest.raises(ValueError, match=r"envlist names \['gone'\]"):
        outputs.tox_envs(ini)


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "docs" / "tutorial.md"], ids=lambda p: p.name)
def test_a_pytest_line_with_n_follows_an_install_that_gives_pytest_xdist(page):
    """``-n 2`` is pytest-xdist's: the install line shown before a pytest line that uses it names
    an extra that installs pytest-xdist (``pip install .`` alone does not: pytest exits 4,
    "unrecognized arguments: -n")."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"]
    lines = page.read_text(encoding="utf-8").splitlines()
    uses = [i for i, line in enumerate(lines) if line.startswith("python -m pytest") and " -n " in line]
    assert uses, f"{page.name} shows no pytest line with -n"
    for i in uses:
        installs = [line for line in lines[:i] if "pip install" in line]
        assert installs, f"{page.name}: no install before {lines[i]!r}"
        named = re.findall(r"'\.\[([\w,]+)\]'", installs[-1])
        given = [req for group in named for extra in group.split(",") for req in extras[extra]]
        assert any(req.startswith("pytest-xdist") for req in given), (lines[i], installs[-1])
