"""``python -m impl``: the causal-mask experiment (16 tokens, position 10 changed)."""

from __future__ import annotations

import sys

from cmdline import Parser, UsageError, fail
from impl.leak import leak_experiment

DESCRIPTION = (
    "The causal-mask experiment of the article \"How an LLM Works, Part 6: Attention\": 16 random "
    "tokens through one random head, then token 10 changed; prints how much each output moves "
    "with and without the causal mask. "
    "Related commands: python -m impl.bench (timings), python -m impl.recall (associative recall)."
)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m impl", description=DESCRIPTION)
    try:
        try:
            parser.parse_args(argv)
        except SystemExit as done:  # --help
            return int(done.code or 0)
    except UsageError as error:
        return fail("python -m impl", error)
    masked = leak_experiment(causal=True)
    unmasked = leak_experiment(causal=False)
    print("max |change| of each output after changing token 10 of 16 (one random head, float64)")
    print(f"{'position':>8}  {'causal mask':>12}  {'no mask':>12}")
    for i, (a, b) in enumerate(zip(masked, unmasked, strict=True)):
        print(f"{i:>8}  {a:>12.3g}  {b:>12.3g}")
    unchanged = int((masked[:10] == 0).sum())
    print(f"with the mask, {unchanged} of the 10 earlier positions are bit-identical")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
