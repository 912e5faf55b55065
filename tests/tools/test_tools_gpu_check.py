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
    rows = [line for line in lines if line.startswith("| math") or line.startswith("| flash ")]
    assert len(rows) == 4 and all("| True" in row for row in rows)
    assert "efficient -: not available: no efficient kernel on cpu" in run.stdout
    for kernel in ("flash_mla_decode", "flash_mla_sparse", "fa3_qv"):  # not installed here (or no Hopper GPU)
        assert f"{kernel} -: not available:" in run.stdout


# --- the MLA kernels' adapters, run on the CPU against stand-ins written from their interfaces ---


def _gpu_check():
    import importlib.util

    found = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
    module = importlib.util.module_from_spec(found)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    found.loader.exec_module(module)
    return module


def _fake_flash_mla():
    """``flash_mla`` as its interface documents it, in float64 torch on the CPU: the paged dense
    decode (q [b, s_q, h_q, d], a cache of blocks [num_blocks, 64, h_kv, d], V the first d_v columns,
    causal per sequence, LSE [b, h_q, s_q], +inf for a row that sees nothing) and the sparse prefill
    (q [s_q, h_q, d], kv [s_kv, h_kv, d], indices [s_q, h_kv, topk], a base-2 LSE [s_q, h_q])."""
    import math
    import types

    import torch

    module = types.ModuleType("flash_mla")
    module.get_mla_metadata = lambda seqlens, per_head_k, heads_k: (None, None)

    def with_kvcache(q, k_cache, table, seqlens, d_v, metadata, splits, softmax_scale=None, causal=False):
        batch, s_q, h_q, d = q.shape
        g = k_cache.shape[2]
        scale = d ** -0.5 if softmax_scale is None else softmax_scale
        outs, lses = [], []
        for b in range(batch):
            n = int(seqlens[b])
            keys = k_cache[table[b].long()].reshape(-1, g, d)[:n].double().permute(1, 0, 2)
            keys = keys.repeat_interleave(h_q // g, 0)  # [h_q, n, d]
            s = q[b].double().permute(1, 0, 2) @ keys.transpose(-1, -2) * scale  # [h_q, s_q, n]
            if causal:
                s = s.masked_fill(torch.arange(n)[None, :] > torch.arange(s_q)[:, None] + n - s_q, -math.inf)
            lse = torch.logsumexp(s, -1)
            outs.append((torch.softmax(s, -1).nan_to_num() @ keys[..., :d_v]).permute(1, 0, 2))
            lses.append(torch.where(torch.isneginf(lse), math.inf, lse))
        return torch.stack(outs).to(q.dtype), torch.stack(lses).float()

    def sparse_fwd(q, kv, indices, sm_scale, d_v):
        s_q, h_q, _ = q.shape
        s_kv, h_kv = kv.shape[:2]
        out = torch.zeros(s_q, h_q, d_v, dtype=torch.float64)
        lse = torch.full((s_q, h_q), math.inf)
        for i in range(s_q):
            for h in range(h_q):
                listed = [j for j in indices[i, h // (h_q // h_kv)].tolist() if 0 <= j < s_kv]
                if listed:
                    keys = kv[listed, h // (h_q // h_kv)].double()
                    s = keys @ q[i, h].double() * sm_scale
                    out[i, h] = torch.softmax(s, 0) @ keys[:, :d_v]
                    lse[i, h] = float(torch.logsumexp(s, 0)) / math.log(2)
        return out.to(q.dtype), None, lse

    module.flash_mla_with_kvcache, module.flash_mla_sparse_fwd = with_kvcache, sparse_fwd
    return module


def _fake_fa3():
    """``flash_attn_interface.flash_attn_func`` with ``qv``, bnhd, in float64 torch: the score of
    query i and key j is scale·(q_i·k_j + qv_i·v_j), causal bottom-right, (out, lse) asked for."""
    import math
    import types

    import torch

    module = types.ModuleType("flash_attn_interface")

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, return_attn_probs=False):
        h, g = q.shape[2], k.shape[2]
        qq, kk, vv = (x.double().transpose(1, 2) for x in (q, k, v))
        kk, vv = kk.repeat_interleave(h // g, 1), vv.repeat_interleave(h // g, 1)
        width = q.shape[-1] + (0 if qv is None else qv.shape[-1])
        scale = width ** -0.5 if softmax_scale is None else softmax_scale
        s = qq @ kk.transpose(-1, -2)
        if qv is not None:
            s = s + qv.double().transpose(1, 2) @ vv.transpose(-1, -2)
        s = s * scale
        n_q, n_k = s.shape[-2:]
        if causal:
            s = s.masked_fill(torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + n_k - n_q, -math.inf)
        out = (torch.softmax(s, -1).nan_to_num() @ vv).transpose(1, 2).to(q.dtype)
        return (out, torch.logsumexp(s, -1).float()) if return_attn_probs else out

    module.flash_attn_func = flash_attn_func
    return module


@pytest.mark.parametrize(("kernel", "laws"), [
    ("flash_mla_decode", ["v_from_k_matches_golden", "paged_matches_golden", "lse_matches_golden"]),
    ("flash_mla_sparse", ["topk_matches_golden", "v_from_k_matches_golden", "lse_matches_golden",
                          "topk_empty_rows_as_declared"]),
    ("fa3_qv", ["qv_matches_golden", "qv_scale_applied", "lse_matches_golden"]),
])
def test_the_mla_adapters_pass_their_laws_on_stand_ins_of_their_interfaces(kernel, laws, monkeypatch):
    """Each MLA adapter of tools/gpu_check.py (its layouts, its transposes, its declarations: the
    latent, the base-2 LSE, the paged cache of 64-key blocks) against a stand-in module written from
    the kernel's documented interface: the plumbing is right before a Hopper GPU runs the real one."""
    pytest.importorskip("torch")
    import spec

    monkeypatch.setitem(sys.modules, "flash_mla", _fake_flash_mla())
    monkeypatch.setitem(sys.modules, "flash_attn_interface", _fake_fa3())
    target = _gpu_check().MLA_TARGETS[kernel]("cpu", "bfloat16")
    report = spec.check(target, profile="quick", max_examples=4, only=laws)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert sum(r.status == "pass" for r in report.results) >= 2, [(r.name, r.message) for r in report.results]
