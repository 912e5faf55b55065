"""tools/mutation: the parts of the driver that decide what runs and what fails (the run itself
takes half an hour: ``tox -e mutation``)."""

from __future__ import annotations

import pytest

from tools.mutation import run, suite
from tools.mutation.run import FileResult, Mutant


def test_annotations_are_found_and_code_is_not():
    source = ("from __future__ import annotations\n"
              "def f(x: int | None = 1) -> list[int]:\n    return [x or 2]\n")
    spots = run.annotation_lines(source)
    line = source.splitlines()[1]
    assert (2, line.index("int | None") + 4) in spots  # the | inside the annotation
    assert (2, line.index("list")) in spots
    assert (2, line.index("1)")) not in spots  # the default is evaluated: mutated
    assert not any(row == 3 for row, _ in spots)


def test_operators_chosen_are_one_natural_change_each():
    assert run.OPERATORS.match("core/ReplaceBinaryOperator_Add_Sub")
    assert run.OPERATORS.match("core/NumberReplacer")
    assert not run.OPERATORS.match("core/ReplaceBinaryOperator_Add_LShift")
    assert not run.OPERATORS.match("core/ReplaceComparisonOperator_Lt_IsNot")


def test_mutated_line_is_the_first_added_line():
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-    a = b + c\n+    a = b - c\n"
    assert run.mutated_line(diff) == "a = b - c"


def test_equivalent_entries_need_a_reason(tmp_path):
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "x.py").write_text("a\n")
    path = tmp_path / "eq.toml"
    entry = ('[[equivalent]]\nfile = "impl/x.py"\nline = 1\noriginal = " a "\nmutated = "b"\n'
             'kind = "bit-identical"\n')
    path.write_text(entry + 'reason = ""\n')
    with pytest.raises(run.ToolError, match="reason"):
        run.load_equivalent(path, tmp_path)
    path.write_text(entry + 'reason = "same"\n')
    assert run.load_equivalent(path, tmp_path) == {
        ("impl/x.py", "a", "b"): run.Reviewed("bit-identical", "same", (1,))}


def test_a_survivor_not_listed_fails_and_listed_ones_count_as_equivalent():
    def mutant(mutated: str, outcome: str) -> Mutant:
        return Mutant("impl/x.py", 3, "core/NumberReplacer", "n = 1", mutated, outcome)

    result = FileResult("impl/x.py", [mutant("n = 2", "killed"), mutant("n = 0", "survived"),
                                      mutant("n = 3", "survived")])
    listed = {("impl/x.py", "n = 1", "n = 0"): run.Reviewed("bit-identical", "n is never read", (3,)),
              ("impl/x.py", "gone", "x"): run.Reviewed("within tolerance", "stale", (9,))}
    text, unlisted = run.report([result], listed, "python -m tools.mutation.run", 60.0)
    assert [m.mutated for m in unlisted] == ["n = 3"]
    assert "| impl/x.py | 3 (of 0) | 1 | 0 | 0 | 1 |" in text and "| impl/x.py | 1 | 1 | 50.0 % |" in text
    assert "`n = 1` → `n = 0`: bit-identical: n is never read" in text and "no longer match" in text


def test_suite_order_puts_the_files_own_target_first_and_impl_tests_last():
    assert suite.order("impl/flash.py") == ["flash", "reference", suite.IMPL]
    assert suite.order("impl/masks.py") == ["reference", "flash", suite.IMPL]
    assert sorted(suite.order(None)) == sorted(suite.CHECKS)
    assert suite.order("flash")[0] == "flash" and suite.order("anything")[-1] == suite.IMPL


def test_results_round_trip(tmp_path):
    result = FileResult("impl/x.py", [Mutant("impl/x.py", 1, "op", "a", "b", "killed")], 4, 7, 1.5, "now")
    result.save(tmp_path)
    assert FileResult.load(tmp_path, "impl/x.py") == result
    assert FileResult.load(tmp_path, "impl/y.py") is None


def test_the_killer_is_read_from_the_suites_last_line_and_impl_only_kills_are_listed():
    assert run.killer(f"flash: large_values fails: ...\n{suite.KILLED_BY}flash\n") == "flash"
    assert run.killer("a crash before any check\n") == ""
    by_law = Mutant("impl/x.py", 3, "op", "n = 1", "n = 2", "killed", "reference")
    by_impl = Mutant("impl/x.py", 4, "op", "m = 1", "m = 2", "killed", suite.IMPL)
    text, _ = run.report([FileResult("impl/x.py", [by_law, by_impl])], {}, "cmd", 1.0)
    assert "| impl/x.py | 2 (of 0) | 2 | 1 | 1 | 0 |" in text and "| impl/x.py | 0 | 0 | 100.0 % |" in text
    only = text.split("## Killed by impl's tests only")[1].split("##")[0]
    assert "`m = 1` → `m = 2`" in only and "n = 2" not in only
