"""tools/mutation/equivalent.toml tells the truth: every entry states its kind of sameness, no key is
listed twice, and no entry outlives the code it was reviewed against (run.load_equivalent)."""

from __future__ import annotations

import pytest

from tools.mutation import run

SOURCE = "x = 1\n\n\n@overload\ndef f(): ...\n@overload\ndef f(): ...\n"


def entry(original="x = 1", mutated="x = 2", line="1", kind='"bit-identical"', reason='"never read"'):
    """One [[equivalent]] entry over impl/m.py, in TOML; a field given as None is left out."""
    fields = dict(file='"impl/m.py"', line=line, original=f'"{original}"', mutated=f'"{mutated}"',
                  kind=kind, reason=reason)
    return "[[equivalent]]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items() if v is not None) + "\n"


@pytest.fixture
def load(tmp_path):
    """Write entries as equivalent.toml over a tree holding impl/m.py = SOURCE, and load them."""
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "m.py").write_text(SOURCE)

    def load(*entries: str):
        path = tmp_path / "equivalent.toml"
        path.write_text("".join(entries))
        return run.load_equivalent(path, tmp_path)

    return load


def test_an_entry_with_each_kind_loads(load):
    got = load(*(entry(mutated=f"x = {i}", kind=f'"{kind}"') for i, kind in enumerate(run.KINDS)))
    assert [r.kind for r in got.values()] == list(run.KINDS)
    assert got[("impl/m.py", "x = 1", "x = 0")] == run.Reviewed("bit-identical", "never read", (1,))


def test_an_entry_without_a_kind_is_refused(load):
    with pytest.raises(run.ToolError, match=r"entry 1 lacks kind"):
        load(entry(kind=None))


def test_a_kind_not_among_the_three_is_refused(load):
    with pytest.raises(run.ToolError, match=r"kind 'same' is none of 'bit-identical', 'within tolerance'"):
        load(entry(kind='"same"'))


def test_a_key_listed_twice_is_refused_naming_it(load):
    with pytest.raises(run.ToolError, match=r"entry 2 \(impl/m.py:1\) repeats entry 1's key "
                                            r"\(impl/m.py: 'x = 1' -> 'x = 2'\)"):
        load(entry(), entry(reason='"said twice"'))


def test_one_key_at_several_lines_is_one_entry_listing_them(load):
    got = load(entry("@overload", "", line="[4, 6]", reason='"typing only"'))
    assert got[("impl/m.py", "@overload", "")].lines == (4, 6)
    with pytest.raises(run.ToolError, match="repeats entry 1's key"):
        load(entry("@overload", "", line="4"), entry("@overload", "", line="6"))


def test_an_entry_whose_original_is_gone_is_refused_as_stale(load):
    with pytest.raises(run.ToolError, match=r"entry 1 \(impl/m.py:1\) is stale: 'x = 0' is not within 40 "
                                            r"lines of line 1 \(it is nowhere in the file\)"):
        load(entry(original="x = 0", mutated="x = 1"))


def test_an_entry_whose_original_moved_far_from_its_line_is_refused_and_told_where(load):
    load(entry(line=str(1 + run.NEAR)))  # near enough: the line drifted with edits above it
    with pytest.raises(run.ToolError, match=r"is stale: 'x = 1' is not within 40 lines of line 42 "
                                            r"\(it is now at line 1\)"):
        load(entry(line=str(2 + run.NEAR)))


def test_missing_and_unknown_fields_are_named_and_every_problem_is_listed(load):
    with pytest.raises(run.ToolError, match=r"2 problems:\n  entry 1 lacks line \(an int >= 1, or a list of "
                                            r"them\)\n  entry 2 has unknown fields note \(it takes file, "):
        load(entry(line=None), entry() + 'note = "x"\n')


def test_the_list_loads_against_the_current_source():
    # The real list: every entry has a kind and reason, no key twice, and its original where it says.
    reviewed = run.load_equivalent()
    assert reviewed and {r.kind for r in reviewed.values()} <= set(run.KINDS)


def test_a_removed_decorator_has_an_empty_mutated_line_as_a_run_records_it():
    pytest.importorskip("cosmic_ray")
    source = "import functools\n\n\n@functools.cache\ndef f():\n    return 1\n"
    assert run.mutated_source_line(source, "core/RemoveDecorator", 0, 4, {}) == ""
    assert run.mutated_source_line(source, "core/NumberReplacer", 0, 6, {}) == "return 2"
