"""cmdline: the one copy of what the command lines share, each command's one-line errors, and the one
BLAS limiter."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import threadpoolctl

import calc.cli
import cmdline
import impl.__main__
import impl.bench
import impl.bench.measure
import impl.bench.profiling
import impl.flash
import impl.recall
import spec.cli
import spec.runner
from cmdline import Parser, UsageError, check_output_dir, fail, int_at_least, positive_number, seconds_between
from cmdline.blas import one_thread_blas


def refusal(parse: Callable[[str], object], text: str) -> str:
    """What the argparse type ``parse`` says of ``text``."""
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(text)
    return str(refused.value)


def test_int_at_least_names_what_it_expected():
    assert int_at_least(0)("0") == 0 and int_at_least(1)("7") == 7
    for low, text, says in [(1, "0", "a positive integer"), (0, "-1", "a non-negative integer"),
                            (3, "2", "an integer ≥ 3"), (1, "1.5", "a positive integer")]:
        assert refusal(int_at_least(low), text) == f"expected {says}, got '{text}'"


def test_int_at_least_keeps_a_commands_own_lead():
    assert refusal(int_at_least(1, lead="must be"), "x") == "must be a positive integer, got 'x'"


@pytest.mark.parametrize(("text", "says"), [("x", "no number, got 'x'"), ("0", "above 0, got '0'"),
                                            ("-2", "above 0, got '-2'"), ("inf", "above 0, got 'inf'"),
                                            ("nan", "above 0, got 'nan'")])
def test_positive_number_refuses_what_is_not_finite_and_above_zero(text, says):
    parse = positive_number("above 0", unparsed="no number")
    assert parse("2.5") == 2.5
    assert refusal(parse, text) == says


def test_seconds_between_includes_both_ends_and_refuses_nan():
    parse = seconds_between(0, 60)
    assert parse("0") == 0 and parse("60") == 60
    for text in ("-0.1", "60.5", "nan", "soon"):
        assert refusal(parse, text) == f"expected seconds between 0 and 60, got '{text}'"


def test_parser_raises_usage_error_instead_of_exiting():
    parser = Parser(prog="p")
    parser.add_argument("--n", type=int_at_least(1))
    with pytest.raises(UsageError, match="argument --n: expected a positive integer, got '0'"):
        parser.parse_args(["--n", "0"])


def test_check_output_dir_refuses_a_missing_folder(tmp_path):
    check_output_dir("--json", tmp_path / "x.json")
    with pytest.raises(UsageError) as refused:
        check_output_dir("--json", "/no/such/x.json")
    assert str(refused.value) == "--json: no such directory for '/no/such/x.json'"


def test_fail_says_one_line_and_returns_2(capsys):
    assert fail("python -m x", UsageError("bad")) == 2
    assert capsys.readouterr().err == "python -m x: error: bad\n"


def test_every_command_line_uses_the_one_copy():
    """Every command line takes UsageError and Parser from cmdline, the one copy: a second copy of
    the same lines would let one command's messages and exit codes drift from the others'."""
    for module in (calc.cli, spec.cli, impl.recall, impl.__main__, impl.bench.cli):
        assert module.UsageError is cmdline.UsageError and module.Parser is cmdline.Parser, module.__name__


def blas_threads() -> set[int]:
    """The thread counts of the loaded BLAS libraries, as threadpoolctl reports them."""
    return {lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"}


def test_one_thread_blas_lowers_blas_to_one_thread_within_and_restores_it_after():
    # 3, a count no default would give, where the process's BLAS can take it: after some tests of
    # the run (torch in the same process) OpenBLAS stays at what it had, so compare with that
    with threadpoolctl.threadpool_limits(3, user_api="blas"):
        outside = blas_threads()
        with one_thread_blas():
            assert blas_threads() == {1}
        assert blas_threads() == outside


def test_every_blas_limiter_is_the_one_copy():
    """The suite's runner, flash's worker threads and the bench's one-thread timings limit BLAS with
    the one limiter (`spec` may not import `impl`, so it lives in cmdline)."""
    for module in (spec.runner, impl.flash, impl.bench.measure, impl.bench.profiling):
        assert module.one_thread_blas is one_thread_blas, module.__name__


@pytest.mark.parametrize(
    ("main", "argv", "err"),
    [
        (impl.bench.main, ["--sizes", "0"],
         "python -m impl.bench: error: argument --sizes: expected a positive integer, got '0'\n"),
        (impl.bench.main, ["--bogus"], "python -m impl.bench: error: unrecognized arguments: --bogus\n"),
        (impl.recall.main, ["--steps", "0"],
         "python -m impl.recall: error: argument --steps: expected a positive integer, got '0'\n"),
        (impl.__main__.main, ["--bogus"], "python -m impl: error: unrecognized arguments: --bogus\n"),
        (spec.cli.main, ["check", "reference", "--max-examples", "0"],
         "python -m spec: error: argument --max-examples: expected a positive integer, got '0'\n"),
        (spec.cli.main, ["check", "reference", "--bogus"],
         "python -m spec: error: unrecognized arguments: --bogus\n"),
        (calc.cli.main, ["gpt3", "--seq", "0"],
         "python -m calc: error: argument --seq: must be a positive integer, got '0'\n"),
        (calc.cli.main, ["gpt3", "--peak-tflops", "x"],
         "python -m calc: error: argument --peak-tflops: must be a positive number, got 'x'\n"),
        (calc.cli.main, ["gpt3", "--bandwidth-gbs", "inf"],
         "python -m calc: error: argument --bandwidth-gbs: must be a positive finite number, got 'inf'\n"),
        (calc.cli.main, ["gpt3", "--bogus"], "python -m calc: error: unrecognized arguments: --bogus\n"),
    ],
    ids=lambda x: " ".join(x) if isinstance(x, list) else None,
)
def test_a_bad_command_line_is_exit_2_and_one_line_on_stderr(main, argv, err, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == err and captured.out == ""


ROOT = Path(__file__).resolve().parents[2]


def new_modules(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``python *args`` with ``-X importtime``; the process and the top-level names it imported
    after start-up (``site`` and what it loads aside)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True,
                          check=False, cwd=ROOT)
    started = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True,
                             text=True, check=True, cwd=ROOT)

    def names(stderr: str) -> set[str]:
        return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in stderr.splitlines()
                if line.startswith("import time:") and line.rsplit("|", 1)[1].strip() != "imported package"}

    return done, names(done.stderr) - names(started.stderr)


def test_cmdline_imports_only_the_standard_library():
    done, names = new_modules("-c", "import cmdline, cmdline.blas")
    assert done.returncode == 0 and "cmdline" in names
    assert names - {"cmdline"} <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)


def test_python_m_calc_starts_without_numpy():
    """calc's start-up stays NumPy-free with the shared helpers (``import impl`` would import NumPy;
    SymPy's printer module ``sympy.printing.numpy`` is no import of NumPy)."""
    done, names = new_modules("-m", "calc", "gpt3")
    assert done.returncode == 0 and "attention" in done.stdout
    assert {"calc", "cmdline", "sympy"} <= names
    assert "numpy" not in names
