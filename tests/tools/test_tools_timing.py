"""The timing tools whose tables the docs show: tools/rank_hosts.py (a context-parallel target's
laws with its ranks as threads against processes) and tools/xdist_speedup.py (the pytest door on one
process against N workers). Their figures depend on the machine and are never compared; what is
tested is what they run and report."""

from __future__ import annotations

import json

import pytest

import spec
from spec.laws.ranks import IN_PROCESS
from spec.rank_target import RankTarget
from tools import rank_hosts, xdist_speedup

needs_gloo = pytest.mark.skipif(spec.LAWS["ranks_match_golden"].needs(RankTarget(print)) is not None,
                                reason="needs torch.distributed with gloo")


@needs_gloo
def test_rank_hosts_times_every_rank_law_on_both_hosts(capsys):
    assert rank_hosts.main(["--profile", "quick", "--runs", "1", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    rows = {row["law"]: row for row in table["rows"]}
    assert list(rows) == [name for name, law in spec.LAWS.items() if law.family == "ranks"]
    assert {law for law, row in rows.items() if row["on threads when declared"] == "yes"} == set(IN_PROCESS)
    assert all(row["in_process=True s"] > 0 and row["in_process=False s"] > 0 for row in rows.values())


def test_xdist_speedup_times_one_process_and_two_workers(capsys):
    code = xdist_speedup.main(["examples.my_attention:target", "--only", "rows_sum_to_one",
                               "output_shape_dtype", "--rounds", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "| -n 0 " in out and "| -n 2 " in out and out.count("2 passed") == 2, out
    assert "speed-up of -n 2 over -n 0 (median wall): " in out
    assert "slowest law: " in out and ("rows_sum_to_one" in out or "output_shape_dtype" in out)


@pytest.mark.parametrize("argv", [["reference", "--workers", "1"], ["reference", "--rounds", "0"]])
def test_xdist_speedup_refuses_a_bad_count(argv, capsys):
    with pytest.raises(SystemExit) as ended:
        xdist_speedup.main(argv)
    assert ended.value.code == 2 and "--workers must be at least 2" in capsys.readouterr().err
