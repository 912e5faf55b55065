"""The associative-recall experiment: does gradient descent build queries and keys?

Task. A sequence holds ``n_pairs = 3`` key–value pairs — distinct keys out of ``n_keys = 8``,
values drawn uniformly (with repeats) from ``n_values = 8`` — and then a question key, one of the
three. The answer is the value paired with the question key. Chance is 1/8.

Model (one head, six weight matrices, no positions — nothing here depends on order):

    x_i      = E_key[key_i] + E_val[value_i]   pair tokens, i = 0, 1, 2            [d]
    x_3      = E_key[question]                 the question token                  [d]
    q        = x_3 W_Q                         the one query, from the question    [d_h]
    k_j, v_j = x_j W_K, x_j W_V                keys and values, j = 0, 1, 2, 3      [d_h]
    o        = attention(q, k, v)              over the 3 pairs and the question   [d_h]
    logits   = o W_out                         the answer, read by a final matrix  [n_values]

The question token reuses the key embedding (a question *is* a key), so the six matrices are
``E_key [n_keys, d]``, ``E_val [n_values, d]``, ``W_Q [d, d_h]``, ``W_K [d, d_h]``,
``W_V [d, d_h]``, ``W_out [d_h, n_values]``. Loss: softmax cross-entropy, mean over a batch.
The backward pass is written out below, with `impl.grad.attention_backward` for the head.

Two runs share every setting — initial weights, the stream of training batches, Adam — and differ
in one thing: in ``uniform`` W_Q = W_K = 0, frozen, so every score is 0 and the head averages the
four positions. Then the output knows which keys and which values occur, but not which key goes
with which value, and the best it can do is to guess the most repeated value: the ceiling
`recall_ceiling`, 29/64 for the article's sizes, derived by exact enumeration.
(W_Q = W_K = 0 is also a stationary point — ∂loss/∂W_Q is proportional to the keys and
∂loss/∂W_K to the query, both zero — so the two stay exactly zero even unfrozen; the freeze
states the intent, as in the article.)
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from itertools import product
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from tabulate import tabulate

from cmdline import Parser, UsageError, check_output_dir, fail, int_at_least
from impl.attention import Array, attention, softmax
from impl.grad import attention_backward, gradcheck

MATRICES = ("E_key", "E_val", "W_Q", "W_K", "W_V", "W_out")
Params = dict[str, Array]

# The figures of the article ("How an LLM Works, Part 6: Attention"), shown beside ours.
ARTICLE = {
    "learned_accuracy": "≈100 % within 100 steps",
    "uniform_accuracy": "45.7 %",
    "ceiling": "45.3 %",
    "matching_pair_weight": "not stated",
    "matching_pair_top_fraction": "100 %",
    "non_matching_pair_weight": "≈1 % each",
    "question_position_weight": "≈47 %",
    "gradcheck_max_rel_diff": "1.2e-6 (24 parameters, 6 matrices)",
}

# A hand-written gradient that is right agrees with central differences to ~1e-6 or better;
# one with a real mistake is off by 1e-2 or more. The run fails (exit 1) above this.
GRADCHECK_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Config:
    """Everything a run depends on besides the seed (the defaults reproduce the README's table)."""

    n_keys: int = 8  # key vocabulary; the keys of one sequence are distinct
    n_values: int = 8  # value vocabulary; values repeat freely
    n_pairs: int = 3  # key–value pairs per sequence
    d_model: int = 16  # embedding width d
    d_head: int = 16  # query/key and value width d_h of the one head
    embedding_std: float = 0.1  # E_key, E_val start small: see init_params
    steps: int = 3000  # Adam steps per run
    batch: int = 64  # fresh sequences per step
    lr: float = 0.01  # Adam step size (β = 0.9, 0.999; ε = 1e-8)
    n_test: int = 5000  # fresh test sequences, the same for both runs and every evaluation
    eval_every: int = 10  # steps between evaluations of the accuracy curves, up to dense_until
    dense_until: int = 500  # after it, evaluate every 10 × eval_every steps (the curves are flat)
    n_gradcheck: int = 24  # parameters nudged by the gradient check, spread over the six matrices


class Batch(NamedTuple):
    keys: Array  # [n, n_pairs] int, distinct within a row
    values: Array  # [n, n_pairs] int
    pick: Array  # [n] int, which pair the question asks about
    question: Array  # [n] int, = keys[pick]
    answer: Array  # [n] int, = values[pick]


def sample_batch(rng: np.random.Generator, n: int, cfg: Config) -> Batch:
    """``n`` independent sequences: distinct keys, uniform values, a question about a uniform pair."""
    keys = np.argsort(rng.random((n, cfg.n_keys)), axis=1)[:, : cfg.n_pairs]  # a random n_pairs-subset
    values = rng.integers(0, cfg.n_values, size=(n, cfg.n_pairs))
    pick = rng.integers(0, cfg.n_pairs, size=n)
    rows = np.arange(n)
    return Batch(keys, values, pick, keys[rows, pick], values[rows, pick])


def init_params(rng: np.random.Generator, cfg: Config, *, uniform: bool = False) -> Params:
    """Gaussian weights, float64: projections with std 1/√fan-in, embeddings with ``cfg.embedding_std``.

    The embeddings' scale decides where the trained head leaves the question's own weight. From
    small embeddings (std 0.1) score(question, itself) and score(question, matching pair) grow
    together — they share the term from ``E_key[question]`` — and the head ends near half and
    half, as in the article. From unit-scale embeddings Adam also learns to favour pair
    tokens over the question token, which ends with a few percent (README: Associative recall).

    ``uniform=True`` zeroes W_Q and W_K, and nothing else, so both runs start from the same E, W_V, W_out.
    """
    d, h = cfg.d_model, cfg.d_head
    params = {
        "E_key": rng.standard_normal((cfg.n_keys, d)) * cfg.embedding_std,
        "E_val": rng.standard_normal((cfg.n_values, d)) * cfg.embedding_std,
        "W_Q": rng.standard_normal((d, h)) / math.sqrt(d),
        "W_K": rng.standard_normal((d, h)) / math.sqrt(d),
        "W_V": rng.standard_normal((d, h)) / math.sqrt(d),
        "W_out": rng.standard_normal((h, cfg.n_values)) / math.sqrt(h),
    }
    if uniform:
        params["W_Q"] = np.zeros_like(params["W_Q"])
        params["W_K"] = np.zeros_like(params["W_K"])
    return params


# --- forward and backward ------------------------------------------------------------------------

def embed(params: Mapping[str, Array], batch: Batch) -> Array:  # -> [n, n_pairs + 1, d]
    """Pair tokens ``E_key[key] + E_val[value]`` followed by the question token ``E_key[question]``."""
    pairs = params["E_key"][batch.keys] + params["E_val"][batch.values]  # [n, n_pairs, d]
    return np.concatenate([pairs, params["E_key"][batch.question][:, None, :]], axis=1)


class Forward(NamedTuple):
    x: Array  # [n, t, d] tokens, t = n_pairs + 1, the question last
    q: Array  # [n, 1, d_h] the question's query
    k: Array  # [n, t, d_h]
    v: Array  # [n, t, d_h]
    weights: Array  # [n, 1, t] the head's pattern from the question position
    o: Array  # [n, 1, d_h]
    logits: Array  # [n, n_values]


def forward(params: Mapping[str, Array], batch: Batch) -> Forward:
    x = embed(params, batch)
    q = x[:, -1:, :] @ params["W_Q"]  # only the question position asks
    k, v = x @ params["W_K"], x @ params["W_V"]
    o, weights = attention(q, k, v, return_weights=True)
    return Forward(x, q, k, v, weights, o, o[:, 0, :] @ params["W_out"])


def cross_entropy(logits: Array, answer: Array) -> tuple[float, Array]:  # [n, c], [n] -> loss, [n, c]
    """Mean softmax cross-entropy and its gradient ``(softmax − one_hot) / n``."""
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    d_logits = softmax(logits, axis=1)
    d_logits[np.arange(n), answer] -= 1.0
    return float(-log_probs[np.arange(n), answer].mean()), d_logits / n


def loss_and_grads(params: Mapping[str, Array], batch: Batch) -> tuple[float, Params]:
    """The loss and ``∂loss/∂`` each of the six matrices, by the chain rule written out."""
    fw = forward(params, batch)
    loss, d_logits = cross_entropy(fw.logits, batch.answer)  # [n, n_values]
    d_o = (d_logits @ params["W_out"].T)[:, None, :]  # [n, 1, d_h]
    dq, dk, dv = attention_backward(fw.q, fw.k, fw.v, d_o)

    def through(x: Array, dy: Array) -> Array:  # Σ over batch and positions of xᵀ dy: [d, d_h]
        return np.einsum("ntd,nth->dh", x, dy)

    # Each token feeds W_K and W_V; the question token also feeds W_Q.
    dx = dk @ params["W_K"].T + dv @ params["W_V"].T  # [n, t, d]
    dx[:, -1:, :] += dq @ params["W_Q"].T
    d_e_key = np.zeros_like(params["E_key"])
    d_e_val = np.zeros_like(params["E_val"])
    # A row used by several tokens collects all of their gradients (np.add.at does not overwrite).
    np.add.at(d_e_key, batch.keys, dx[:, :-1, :])
    np.add.at(d_e_key, batch.question, dx[:, -1, :])
    np.add.at(d_e_val, batch.values, dx[:, :-1, :])
    grads = {
        "E_key": d_e_key,
        "E_val": d_e_val,
        "W_Q": through(fw.x[:, -1:, :], dq),
        "W_K": through(fw.x, dk),
        "W_V": through(fw.x, dv),
        "W_out": fw.o[:, 0, :].T @ d_logits,
    }
    return loss, grads


def check_gradients(params: Mapping[str, Array], batch: Batch, n_samples: int, seed: int) -> float:
    """Max relative difference, analytic vs central differences, over ``n_samples`` parameters."""
    _, grads = loss_and_grads(params, batch)
    return gradcheck(lambda p: loss_and_grads(p, batch)[0], params, grads, n_samples=n_samples,
                     seed=seed).max_rel_diff


# --- training ------------------------------------------------------------------------------------

@dataclass
class Adam:
    """Adam (Kingma & Ba, 2015) over a dict of arrays; ``frozen`` names are never updated."""

    lr: float
    frozen: frozenset[str] = frozenset()
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    t: int = 0
    m: dict[str, Array] = field(default_factory=dict)
    v: dict[str, Array] = field(default_factory=dict)

    def step(self, params: Params, grads: Mapping[str, Array]) -> Params:
        self.t += 1
        new = dict(params)
        for name, g in grads.items():
            if name in self.frozen:
                continue
            self.m[name] = self.beta1 * self.m.get(name, 0.0) + (1 - self.beta1) * g
            self.v[name] = self.beta2 * self.v.get(name, 0.0) + (1 - self.beta2) * g * g
            m_hat = self.m[name] / (1 - self.beta1**self.t)
            v_hat = self.v[name] / (1 - self.beta2**self.t)
            new[name] = params[name] - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)
        return new


def accuracy(params: Mapping[str, Array], batch: Batch) -> float:
    return float(np.mean(forward(params, batch).logits.argmax(axis=1) == batch.answer))


def train(
    params: Params, cfg: Config, data_seed: np.random.SeedSequence, test: Batch, *, frozen: frozenset[str]
) -> tuple[Params, list[tuple[int, float]]]:
    """``cfg.steps`` Adam steps on fresh batches, and the test accuracy along the way."""
    rng = np.random.default_rng(data_seed)
    adam = Adam(cfg.lr, frozen)
    curve = [(0, accuracy(params, test))]
    for step in range(1, cfg.steps + 1):
        _, grads = loss_and_grads(params, sample_batch(rng, cfg.batch, cfg))
        params = adam.step(params, grads)
        every = cfg.eval_every if step <= cfg.dense_until else 10 * cfg.eval_every
        if step % every == 0 or step == cfg.steps:
            curve.append((step, accuracy(params, test)))
    return params, curve


# --- the ceiling ---------------------------------------------------------------------------------

def recall_ceiling(n_values: int = 8, n_pairs: int = 3) -> Fraction:
    """Exact best accuracy of a model that sees which values occur but not which key each has.

    Given only the multiset of values, the answer is the value of a uniformly chosen pair, so the
    best guess is a most repeated value, right with probability (its count) / n_pairs. Averaged
    over all ``n_values ** n_pairs`` equally likely value tuples — by enumeration, exactly:

    >>> recall_ceiling(8, 3)
    Fraction(29, 64)
    >>> recall_ceiling(2, 1), recall_ceiling(1, 3)
    (Fraction(1, 1), Fraction(1, 1))
    """
    for name, n in (("n_values", n_values), ("n_pairs", n_pairs)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive integer, got {n!r}")
    best = sum(max(values.count(x) for x in values) for values in product(range(n_values), repeat=n_pairs))
    return Fraction(best, n_pairs * n_values**n_pairs)


# --- the experiment ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    config: Config
    seed: int
    learned_curve: list[tuple[int, float]]
    uniform_curve: list[tuple[int, float]]
    ceiling: Fraction
    gradcheck_max_rel_diff: float
    matching_pair_top_fraction: float
    matching_pair_weight: float
    non_matching_pair_weight: float  # mean over the non-matching pairs, each
    question_position_weight: float
    pattern_by_pick: list[list[float]]  # [n_pairs, n_pairs + 1] mean pattern, rows = matching pair
    seconds: float

    @property
    def learned_accuracy(self) -> float:
        return self.learned_curve[-1][1]

    @property
    def uniform_accuracy(self) -> float:
        return self.uniform_curve[-1][1]

    @property
    def steps_to_99(self) -> int | None:
        """First evaluated step at which the learned run reaches 99 % test accuracy (None: never)."""
        return next((step for step, acc in self.learned_curve if acc >= 0.99), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "learned_accuracy": self.learned_accuracy,
            "uniform_accuracy": self.uniform_accuracy,
            "ceiling": float(self.ceiling),
            "ceiling_exact": str(self.ceiling),
            "matching_pair_top_fraction": self.matching_pair_top_fraction,
            "matching_pair_weight": self.matching_pair_weight,
            "non_matching_pair_weight": self.non_matching_pair_weight,
            "question_position_weight": self.question_position_weight,
            "gradcheck_max_rel_diff": self.gradcheck_max_rel_diff,
            "steps_to_99": self.steps_to_99,
            "pattern_by_matching_pair": self.pattern_by_pick,
            "learned_curve": [list(p) for p in self.learned_curve],
            "uniform_curve": [list(p) for p in self.uniform_curve],
            "seed": self.seed,
            "config": asdict(self.config),
            "seconds": self.seconds,
        }


def attention_summary(params: Mapping[str, Array], test: Batch, n_pairs: int) -> dict[str, Any]:
    """Where the head looks from the question position, averaged over the test sequences."""
    w = forward(params, test).weights[:, 0, :]  # [n, n_pairs + 1], question last
    rows = np.arange(len(w))
    matching = w[rows, test.pick]
    others = np.ma.masked_array(w[:, :n_pairs], mask=np.eye(n_pairs, dtype=bool)[test.pick])
    return {
        "matching_pair_top_fraction": float(np.mean(matching > others.max(axis=1))),
        "matching_pair_weight": float(matching.mean()),
        "non_matching_pair_weight": float(others.mean()),
        "question_position_weight": float(w[:, -1].mean()),
        "pattern_by_pick": [w[test.pick == i].mean(axis=0).tolist() for i in range(n_pairs)],
    }


def run_experiment(cfg: Config = Config(), seed: int = 0) -> Result:
    """Gradient check, then the learned and the uniform run from the same start on the same data.

    One seed fixes everything: it is split into independent streams for the initial weights, the
    training batches (the same for both runs), the test set and the gradient check.
    """
    start = time.perf_counter()
    init_seed, data_seed, test_seed, check_seed = np.random.SeedSequence(seed).spawn(4)
    test = sample_batch(np.random.default_rng(test_seed), cfg.n_test, cfg)
    learned = init_params(np.random.default_rng(init_seed), cfg)
    uniform = init_params(np.random.default_rng(init_seed), cfg, uniform=True)
    # The check runs at a random point with unit-scale embeddings, not at the small start: there
    # the W_Q, W_K gradients are ~1e-6, below what central differences resolve relatively.
    check_rng = np.random.default_rng(check_seed)
    max_rel = check_gradients(init_params(check_rng, replace(cfg, embedding_std=1.0)),
                              sample_batch(check_rng, 32, cfg), cfg.n_gradcheck,
                              seed=int(check_rng.integers(2**31)))
    learned, learned_curve = train(learned, cfg, data_seed, test, frozen=frozenset())
    uniform, uniform_curve = train(uniform, cfg, data_seed, test, frozen=frozenset({"W_Q", "W_K"}))
    return Result(
        config=cfg, seed=seed, learned_curve=learned_curve, uniform_curve=uniform_curve,
        ceiling=recall_ceiling(cfg.n_values, cfg.n_pairs), gradcheck_max_rel_diff=max_rel,
        **attention_summary(learned, test, cfg.n_pairs), seconds=time.perf_counter() - start,
    )


# --- report --------------------------------------------------------------------------------------

TABLE_STEPS = (0, 10, 20, 50, 100, 200, 500, 1000, 2000, 3000)


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def _standard_error(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def _curve_rows(result: Result) -> Iterator[list[str]]:
    learned, uniform = dict(result.learned_curve), dict(result.uniform_curve)
    last = result.config.steps
    for step in sorted({s for s in TABLE_STEPS if s < last and s in learned} | {last}):
        yield [str(step), _pct(learned[step]), _pct(uniform[step])]


def report(result: Result) -> str:
    cfg = result.config
    pairs = [f"pair {i}" for i in range(cfg.n_pairs)]
    lines = [
        f"associative recall: {cfg.n_pairs} pairs, {cfg.n_keys} keys, {cfg.n_values} values, one head "
        f"(d = {cfg.d_model}, d_h = {cfg.d_head}); Adam lr {cfg.lr}, batch {cfg.batch}, seed {result.seed}",
        f"test accuracy on {cfg.n_test:,} fresh sequences (chance {_pct(1 / cfg.n_values)})",
        "",
        tabulate(list(_curve_rows(result)), headers=["step", "learned", "uniform (W_Q = W_K = 0)"],
                 disable_numparse=True, colalign=("right", "right", "right")),
        "",
        tabulate(
            [
                ["learned accuracy", _pct(result.learned_accuracy), ARTICLE["learned_accuracy"]],
                ["  first step at ≥ 99 %",
                 "not reached" if result.steps_to_99 is None else str(result.steps_to_99), "within 100"],
                ["uniform accuracy", _pct(result.uniform_accuracy), ARTICLE["uniform_accuracy"]],
                ["ceiling, most repeated value", f"{result.ceiling} = {_pct(float(result.ceiling))}",
                 ARTICLE["ceiling"]],
                ["matching pair has top weight", _pct(result.matching_pair_top_fraction),
                 ARTICLE["matching_pair_top_fraction"]],
                ["weight on the matching pair", _pct(result.matching_pair_weight),
                 ARTICLE["matching_pair_weight"]],
                ["weight on each other pair", _pct(result.non_matching_pair_weight),
                 ARTICLE["non_matching_pair_weight"]],
                ["weight on the question itself", _pct(result.question_position_weight),
                 ARTICLE["question_position_weight"]],
                [f"gradient check, {cfg.n_gradcheck} params", f"{result.gradcheck_max_rel_diff:.1e}",
                 ARTICLE["gradcheck_max_rel_diff"]],
            ],
            headers=["", "this run", "article"], disable_numparse=True,
        ),
        f"one standard error of an accuracy near the ceiling on {cfg.n_test:,} sequences: "
        f"{100 * _standard_error(float(result.ceiling), cfg.n_test):.2f} points",
        "",
        "mean pattern of the learned head from the question position, by where the matching pair sits:",
        tabulate([[f"matching = pair {i}", *(_pct(x) for x in row)]
                  for i, row in enumerate(result.pattern_by_pick)],
                 headers=["", *pairs, "question"], disable_numparse=True),
        "",
        f"{result.seconds:.1f} s",
    ]
    return "\n".join(lines)


def plot(result: Result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, hm) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    for name, curve in (("learned", result.learned_curve), ("uniform (W_Q = W_K = 0)", result.uniform_curve)):
        steps, acc = zip(*curve, strict=True)
        ax.plot(steps, np.array(acc) * 100, label=name)
    ax.axhline(float(result.ceiling) * 100, ls="--", c="gray", lw=1, label=f"ceiling {result.ceiling}")
    ax.axhline(100 / result.config.n_values, ls=":", c="gray", lw=1, label="chance")
    ax.set_xscale("symlog", linthresh=10)  # linear to step 10, then logarithmic
    ax.set(xlabel="step", ylabel="test accuracy (%)", xlim=(0, result.config.steps), ylim=(0, 102),
           title=f"test accuracy, {result.config.n_test:,} fresh sequences")
    ax.legend(loc="lower right")
    pattern = np.array(result.pattern_by_pick)
    image = hm.imshow(pattern, cmap="viridis", vmin=0, vmax=1)
    n = result.config.n_pairs
    hm.set_xticks(range(n + 1), [*(f"pair {i}" for i in range(n)), "question"])
    hm.set_yticks(range(n), [f"matching = {i}" for i in range(n)])
    for (i, j), w in np.ndenumerate(pattern):
        hm.text(j, i, f"{w:.2f}", ha="center", va="center", color="white" if w < 0.5 else "black")
    hm.set_title("learned head, mean weight from the question")
    fig.colorbar(image, ax=hm, shrink=0.7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- command line --------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m impl.recall", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="seed (default 0)")
    parser.add_argument("--steps", type=int_at_least(1), default=Config.steps,
                        help=f"Adam steps per run (default {Config.steps})")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="accuracy curves and the pattern")
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:  # --help
            return int(done.code or 0)
        if args.json is not None:
            check_output_dir("--json", args.json)
        if args.plot is not None:
            check_output_dir("--plot", args.plot)
            if args.plot.suffix.lower() not in (".png", ".pdf", ".svg"):
                raise UsageError(f"--plot: expected a .png, .pdf or .svg file, got {str(args.plot)!r}")
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise UsageError("--plot needs matplotlib: pip install 'attention-spec[plot]'") from None
    except UsageError as error:
        return fail("python -m impl.recall", error)

    result = run_experiment(replace(Config(), steps=args.steps), seed=args.seed)
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    if args.plot is not None:
        plot(result, args.plot)
    if not result.gradcheck_max_rel_diff <= GRADCHECK_TOLERANCE:
        print(f"gradient check failed: max relative difference {result.gradcheck_max_rel_diff:.2e} "
              f"> {GRADCHECK_TOLERANCE:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
