"""tools/gpu_check.py: the suite against PyTorch's attention kernels one at a time; its dry run on this
CPU (the script is run on a GPU whenever one is lent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_script_dry_run_on_the_cpu():
    pytest.importorskip("torch")
    run = subprocess.run([sys.executable, "tools/gpu_check.py", "--device", "cpu", "--only", "matches_golden",
                          "causal_no_leak", "--dtypes", "float32", "bfloat16"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].endswith("on cpu, profile quick")
    rows = [line for line in lines if line.startswith("| math") or line.startswith("| flash")]
    assert len(rows) == 4 and all("| True" in row for row in rows)
    assert "efficient -: not available: no efficient kernel on cpu" in run.stdout
