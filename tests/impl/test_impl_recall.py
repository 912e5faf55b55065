"""The associative-recall experiment: task, exact ceiling, model gradients, a short run, the CLI."""

from __future__ import annotations

import doctest
import json
import math
import subprocess
import sys
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import impl.recall as recall
from impl.grad import gradcheck
from impl.recall import Config, recall_ceiling, run_experiment

CONTRACT_KEYS = {
    "learned_accuracy", "uniform_accuracy", "ceiling", "matching_pair_top_fraction",
    "matching_pair_weight", "question_position_weight", "gradcheck_max_rel_diff", "steps_to_99",
}
TINY = replace(Config(), d_model=6, d_head=5)


# --- the task and its ceiling ------------------------------------------------------------------

def test_sequences_follow_the_task() -> None:
    cfg = Config()
    b = recall.sample_batch(np.random.default_rng(0), 2000, cfg)
    assert all(len(set(row)) == cfg.n_pairs for row in b.keys.tolist()), "keys repeat in a sequence"
    assert b.keys.min() >= 0 and b.keys.max() < cfg.n_keys
    assert b.values.min() >= 0 and b.values.max() < cfg.n_values
    rows = np.arange(len(b.pick))
    np.testing.assert_array_equal(b.question, b.keys[rows, b.pick])
    np.testing.assert_array_equal(b.answer, b.values[rows, b.pick])
    # Values repeat freely: with 8 values and 3 pairs, 1 − 8·7·6/8³ = 34.4 % of rows have a repeat.
    repeats = np.mean([len(set(row)) < cfg.n_pairs for row in b.values.tolist()])
    assert 0.30 < repeats < 0.39


def test_ceiling_is_29_64_for_the_article_sizes() -> None:
    # The article's case split: right 1/3 of the time when the three values differ, 2/3 when two
    # match, always when all three match — weighted by the exact probability of each case.
    all_differ, all_same = Fraction(8 * 7 * 6, 8**3), Fraction(8, 8**3)
    two_match = 1 - all_differ - all_same
    by_cases = all_differ / 3 + two_match * Fraction(2, 3) + all_same
    assert recall_ceiling(8, 3) == by_cases == Fraction(29, 64)


@pytest.mark.parametrize("n_values", [1, 2, 3, 8, 13])
def test_ceiling_with_two_pairs_has_its_closed_form(n_values: int) -> None:
    # Two pairs: equal values (probability 1/n) are always right, otherwise a coin flip.
    assert recall_ceiling(n_values, 2) == Fraction(1, n_values) + (1 - Fraction(1, n_values)) / 2


def test_ceiling_with_one_pair_is_certain_and_falls_with_more_pairs() -> None:
    assert recall_ceiling(8, 1) == 1
    ceilings = [recall_ceiling(8, n) for n in range(1, 6)]
    assert ceilings == sorted(ceilings, reverse=True)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "8"])
def test_ceiling_refuses_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError, match="n_values"):
        recall_ceiling(bad, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_pairs"):
        recall_ceiling(8, bad)  # type: ignore[arg-type]


# --- the model's hand-written backward ---------------------------------------------------------

def _random_point(cfg: Config, seed: int) -> tuple[dict, recall.Batch]:
    rng = np.random.default_rng(seed)
    return recall.init_params(rng, replace(cfg, embedding_std=1.0)), recall.sample_batch(rng, 16, cfg)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_model_gradients_match_central_differences_everywhere(seed: int) -> None:
    params, batch = _random_point(TINY, seed)
    _, grads = recall.loss_and_grads(params, batch)
    assert set(grads) == set(recall.MATRICES)
    check = gradcheck(lambda p: recall.loss_and_grads(p, batch)[0], params, grads, n_samples=None,
                      eps=1e-5, floor=1e-4)
    # Every one of the ~250 entries; rounding in the differences is ~1e-11 against a floor of 1e-4.
    assert check.max_rel_diff < 1e-6


def test_the_24_sampled_parameters_cover_all_six_matrices() -> None:
    params, batch = _random_point(Config(), 4)
    _, grads = recall.loss_and_grads(params, batch)
    check = gradcheck(lambda p: recall.loss_and_grads(p, batch)[0], params, grads, n_samples=24)
    assert sorted(name for name, *_ in check.samples) == sorted(recall.MATRICES * 4)


def test_zero_query_and_key_matrices_give_uniform_attention() -> None:
    cfg = Config()
    rng = np.random.default_rng(5)
    params = recall.init_params(rng, cfg, uniform=True)
    weights = recall.forward(params, recall.sample_batch(rng, 50, cfg)).weights
    assert np.all(weights == 1 / (cfg.n_pairs + 1))


def test_adam_leaves_frozen_matrices_alone() -> None:
    params = {"a": np.ones(3), "b": np.ones(3)}
    grads = {"a": np.full(3, 0.5), "b": np.full(3, 0.5)}
    adam = recall.Adam(lr=0.1, frozen=frozenset({"a"}))
    new = adam.step(adam.step(params, grads), grads)
    np.testing.assert_array_equal(new["a"], params["a"])
    np.testing.assert_allclose(new["b"], 1 - 0.2)  # Adam's first steps move by lr each


def test_zero_query_and_key_matrices_are_a_stationary_point() -> None:
    """dW_Q ∝ k and dW_K ∝ q: with both zero, neither can move, frozen or not."""
    cfg = Config()
    rng = np.random.default_rng(6)
    params = recall.init_params(rng, cfg, uniform=True)
    _, grads = recall.loss_and_grads(params, recall.sample_batch(rng, 64, cfg))
    assert not grads["W_Q"].any() and not grads["W_K"].any()
    assert grads["W_V"].any() and grads["E_key"].any()


# --- a short run --------------------------------------------------------------------------------

SHORT = replace(Config(), steps=300, n_test=2000)
# The uniform model can at best guess a most repeated value, right with probability c = 29/64
# per test sequence. Its measured accuracy is the mean of n_test independent trials (fresh test
# sequences, independent of the trained weights), each right with probability ≤ c, so by
# Hoeffding's inequality P(accuracy > c + t) ≤ exp(−2·n_test·t²). With t below, that chance is
# ≤ 1e-4 (t ≈ 4.8 points for 2,000 sequences, ≈ 4.4 standard errors).
FALSE_ALARM = 1e-4
MARGIN = math.sqrt(math.log(1 / FALSE_ALARM) / (2 * SHORT.n_test))


@pytest.fixture(scope="module")
def short_run() -> recall.Result:
    return run_experiment(SHORT, seed=0)


def test_learned_attention_beats_the_uniform_ceiling(short_run: recall.Result) -> None:
    ceiling = float(recall_ceiling())
    assert short_run.uniform_accuracy <= ceiling + MARGIN
    assert short_run.learned_accuracy > ceiling + MARGIN
    assert short_run.learned_accuracy > short_run.uniform_accuracy
    assert short_run.steps_to_99 is not None and short_run.steps_to_99 <= SHORT.steps


def test_learned_head_puts_top_weight_on_the_matching_pair(short_run: recall.Result) -> None:
    assert short_run.matching_pair_top_fraction > 0.99
    assert short_run.matching_pair_weight > 10 * short_run.non_matching_pair_weight
    weights = short_run.matching_pair_weight + 2 * short_run.non_matching_pair_weight
    assert weights + short_run.question_position_weight == pytest.approx(1.0)


def test_json_carries_the_contract_keys(short_run: recall.Result) -> None:
    figures = short_run.to_json()
    assert CONTRACT_KEYS <= set(figures)
    assert figures["ceiling"] == 29 / 64 and figures["ceiling_exact"] == "29/64"
    json.dumps(figures)  # plain JSON types only


def test_same_seed_same_run_other_seed_other_run() -> None:
    cfg = replace(TINY, steps=20, n_test=200)
    a, b, c = run_experiment(cfg, seed=1), run_experiment(cfg, seed=1), run_experiment(cfg, seed=2)
    strip = lambda r: {k: v for k, v in r.to_json().items() if k != "seconds"}  # noqa: E731
    assert strip(a) == strip(b)
    assert strip(a) != strip(c)


# --- the command line ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--steps", "0"], "--steps"),
        (["--steps", "ten"], "--steps"),
        (["--seed", "-1"], "--seed"),
        (["--frobnicate"], "unrecognized"),
        (["--json", "/no/such/dir/out.json"], "--json"),
        (["--plot", "curves.jpg"], "--plot"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], words: str, capsys: pytest.CaptureFixture
) -> None:
    assert recall.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and words in err and "Traceback" not in err


def test_cli_prints_the_table_and_writes_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib")
    json_path, png = tmp_path / "recall.json", tmp_path / "recall.png"
    assert recall.main(["--steps", "20", "--seed", "3", "--json", str(json_path), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "29/64 = 45.31 %" in out and "uniform (W_Q = W_K = 0)" in out and "article" in out
    figures = json.loads(json_path.read_text())
    assert CONTRACT_KEYS <= set(figures) and figures["seed"] == 3 and figures["config"]["steps"] == 20
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_as_a_real_process() -> None:
    ok = subprocess.run([sys.executable, "-m", "impl.recall", "--steps", "10"], capture_output=True,
                        text=True, check=False, cwd=Path(__file__).resolve().parents[2])
    assert ok.returncode == 0, ok.stderr
    assert "ceiling, most repeated value" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "impl.recall", "--steps", "-3"], capture_output=True,
                         text=True, check=False, cwd=Path(__file__).resolve().parents[2])
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--steps" in bad.stderr


def test_docstring_examples() -> None:
    assert doctest.testmod(recall).failed == 0


@pytest.mark.parametrize(("n_values", "n_pairs"), [(8, 3), (5, 4), (3, 2), (10, 1)])
def test_ceiling_enumerated_here_equals_calcs_symbolic_case_split(n_values: int, n_pairs: int) -> None:
    # Two independent derivations: brute-force enumeration of value tuples (impl) and calc's
    # SymPy sum over repetition patterns.
    from calc.formulas import recall_ceiling as symbolic

    exact = symbolic(n_values, n_pairs)
    enumerated = recall_ceiling(n_values, n_pairs)
    assert (enumerated.numerator, enumerated.denominator) == (exact.p, exact.q)
