"""Shards: one check spread over processes and machines, each shard drawing its own examples.

``--shard i/N`` (1-based, as Jest's, Playwright's and pytest-split's ``--group``: ``1/3``, ``2/3``,
``3/3``) runs every law, like the check it is a part of, under a seed of its own (`shard_seed`):
shard 1 draws exactly the examples of the run without ``--shard``, shard i ≥ 2 those of
``--seed shard_seed(...)``; so N shards draw N times the examples, never the same ones twice
(pytest-xdist alone splits the laws, not their examples). The boundary grid (each law's explicit
cases) runs in every shard. A shard's report records which it is (``shard``) and the seed it drew
with (``seed``): ``python -m spec check TARGET --seed SEED`` replays it alone.

`merge` makes one report of the shards' (``python -m spec merge A.json B.json ...``): a law fails
if it failed in any shard (the first failing shard's counterexample kept), its examples and seconds
are summed, its figures are the worst of any shard, and the report conforms exactly when every
shard's does.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any

from spec.report import Counterexample, Report, Result, figures


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1 ≤ index ≤ count)."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def to_dict(self, seed: int | None, *, key: str = "check_seed") -> dict[str, Any]:
        """As the JSON report writes it: which shard, and a seed under ``key`` (a shard's report:
        ``check_seed``, the seed the whole check was given; a merged report's ``shards[]``:
        ``seed``, the one the shard drew with)."""
        return {"index": self.index, "count": self.count, key: seed}


SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


def parse_shard(text: Any, *, name: str = "") -> Shard:
    """``"2/3"`` (or a `Shard`) as a `Shard`; anything else (``"3/2"``, ``"0/2"``, ``"0/0"``, ``"x"``)
    raises ValueError, its message led by ``name``, the argument it came from."""
    if isinstance(text, Shard):
        text = str(text)
    found = SHARD.fullmatch(text) if isinstance(text, str) else None
    lead = f"{name}: " if name else ""
    if found is None:
        raise ValueError(f"{lead}expected I/N, shard I of N counted from 1 (1/2, 2/2), got {text!r}")
    index, count = int(found[1]), int(found[2])
    if not 1 <= index <= count:
        raise ValueError(f"{lead}expected I/N with 1 <= I <= N (shards are counted from 1), got {text!r}")
    return Shard(index, count)


def shard_seed(shard: Shard | None, seed: int | None, *, derandomized: bool) -> int | None:
    """The seed shard ``shard`` of a check given ``seed`` draws with: shard 1 (and no shard) the
    check's own, so adding shards only adds examples; shard i ≥ 2 one derived from (``seed``, i),
    the same on every machine, so each shard is a fixed stream of its own. A profile that draws at
    random when given no seed (``derandomized`` False) draws at random in every shard (None).

    Bug it prevents: shards that all ran under the same seed would draw the same examples N times
    (what pytest-xdist does to a law's examples) and find nothing more than one shard."""
    if shard is None or shard.index == 1 or (seed is None and not derandomized):
        return seed
    digest = hashlib.sha256(f"attention-spec shard {seed} {shard.index}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


# --- reading reports back --------------------------------------------------------------------------

NON_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}
"""How the JSON report spells a non-finite float (`spec.report.NON_FINITE`), read back."""


def _number(x: Any) -> Any:
    """``x`` with the JSON report's spelled non-finite floats read back as floats (in lists too)."""
    if isinstance(x, list):
        return [_number(value) for value in x]
    return NON_FINITE.get(x, x) if isinstance(x, str) else x


def result_from_dict(data: dict[str, Any]) -> Result:
    """A law's result as the JSON report wrote it (`spec.report.Result.to_dict`)."""
    found = data.get("counterexample")
    example = None if found is None else Counterexample(
        case=found["case"], reproduce=found["reproduce"], call=found.get("call"),
        shapes=found.get("shapes", {}),
        dtypes=found.get("dtypes", {}), arrays={k: _number(v) for k, v in found.get("arrays", {}).items()},
        keywords=found.get("keywords", {}))
    return Result(data["name"], data["status"], data["examples"], data["seconds"], data.get("message", ""),
                  example, law=data.get("law", ""),
                  observed={k: float(_number(v)) for k, v in data.get("observed", {}).items()},
                  not_run=data.get("not_run", False), expected=data.get("expected", ""),
                  power=data.get("power"))


def report_from_dict(data: dict[str, Any]) -> Report:
    """A report as the JSON report wrote it (`spec.report.Report.to_dict`); raises ValueError for an
    object that is not one."""
    if not isinstance(data, dict):
        raise ValueError(f"not a report of python -m spec check --json: a JSON {type(data).__name__}")
    missing = [key for key in ("target", "profile", "seed", "results") if key not in data]
    if missing:
        raise ValueError(f"not a report of python -m spec check --json: no {', '.join(missing)}")
    shard = data.get("shard")
    results = [result_from_dict(r) for r in data["results"]]
    # the report's wall time is not in the JSON: the laws' sum stands for it
    return Report(data["target"], data["profile"], data["seed"], results,
                  seconds=sum(r.seconds for r in results), limits=data.get("limits", ""),
                  scale=data.get("scale", ""), power="power" in data, budget_s=data.get("budget_s"),
                  shard=None if shard is None else Shard(shard["index"], shard["count"]),
                  base_seed=None if shard is None else shard["check_seed"])


# --- merging ---------------------------------------------------------------------------------------

RANK = ("fail", "xfail", "xpass", "pass", "skip")
"""Which shard's status a merged law takes: the first of these any shard had. A failure anywhere is
the law's failure; a declared failure seen in one shard is not stale (``xfail``, not ``xpass``)."""


def worst(one: float, other: float) -> float:
    """The worse (larger) of two figures, NaN the worst of all (`spec.context.RunContext.observe`)."""
    return math.nan if math.isnan(one) or math.isnan(other) else max(one, other)


def merge_results(results: list[Result]) -> Result:
    """One law's results in each shard (in shard order) as one: the status `RANK` picks, with the
    message and counterexample of the first shard that had it; examples and seconds summed; each
    figure the worst of any shard; the trivial kernels told by any shard's cases."""
    status = min((r.status for r in results), key=RANK.index)
    first = next(r for r in results if r.status == status)
    observed: dict[str, float] = {}
    for result in results:
        for key, value in result.observed.items():
            observed[key] = worst(observed[key], value) if key in observed else value
    judged = [r.power for r in results if r.power is not None]
    told = sorted(set().union(*judged)) if judged else None
    message, own = first.message, figures(first.observed)
    if status in ("pass", "xpass") and own and message.startswith(own):  # a pass's note: the merged figures
        message = figures(observed) + message[len(own):]
    return Result(first.name, status, sum(r.examples for r in results), sum(r.seconds for r in results),
                  message, first.counterexample, law=first.law, observed=observed,
                  not_run=status == "skip" and any(r.not_run for r in results),
                  expected=first.expected, power=told)


def merge(reports: list[Report], names: list[str] | None = None) -> Report:
    """The shards' reports (`Report.shard`: every shard of one count, each once, any order) as one
    report of the whole check (`merge_results` per law, in run order). Raises ValueError when they are
    not the shards of one check: a report that is no shard, shards of other counts, a shard twice or
    missing, another target, profile, seed or set of laws. ``names``: how the messages name the
    reports (their files; default ``report 1``, ``report 2``, ...)."""
    if not reports:
        raise ValueError("no reports to merge")
    unsharded = [i for i, r in enumerate(reports) if r.shard is None]
    if unsharded:
        name = names[unsharded[0]] if names else f"report {unsharded[0] + 1}"
        raise ValueError(f"{name} is not a shard (run with --shard I/N)")
    count = reports[0].shard.count if reports[0].shard else 0
    ordered = sorted(reports, key=lambda r: r.shard.index if r.shard else 0)
    indices = [r.shard.index for r in ordered if r.shard]
    if any(r.shard and r.shard.count != count for r in reports):
        given = ", ".join(str(r.shard) for r in reports)
        raise ValueError(f"the reports are shards of different counts: {given}")
    if indices != list(range(1, count + 1)):
        twice = sorted({i for i in indices if indices.count(i) > 1})
        missing = sorted(set(range(1, count + 1)) - set(indices))
        said = [f"shard {', '.join(f'{i}/{count}' for i in twice)} given twice"] if twice else []
        said += [f"shard {', '.join(f'{i}/{count}' for i in missing)} missing"] if missing else []
        raise ValueError("; ".join(said))
    head = ordered[0]
    for field_name, called in (("target", "target"), ("profile", "profile"), ("base_seed", "seed")):
        values = {getattr(r, field_name) for r in ordered}
        if len(values) > 1:
            differ = ", ".join(sorted(map(str, values)))
            raise ValueError(f"the shards are of different checks: {called} {differ}")
    names = [r.name for r in head.results]
    for r in ordered[1:]:
        if [x.name for x in r.results] != names:
            raise ValueError(f"shard {r.shard} ran other laws than shard {head.shard}")
    results = [merge_results([r.results[i] for r in ordered]) for i in range(len(names))]
    return Report(head.target, head.profile, head.base_seed, results, seconds=max(r.seconds for r in ordered),
                  limits=head.limits, scale=head.scale, power=any(r.power for r in ordered),
                  budget_s=head.budget_s, merged=[(r.shard, r.seed) for r in ordered if r.shard])
