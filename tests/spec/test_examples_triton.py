"""examples/triton_attention.py: its Triton kernels give a float64 softmax's output, LSE and
gradients at partial tiles, odd head widths, grouped K/V heads, bottom-right causal rows that see
nothing and n_k = 0; its target conforms at a small profile; each of its broken kernels fails
matches_golden; a process that set TRITON_INTERPRET too late, or has neither it nor a GPU, is told so.

Without a GPU the kernels run under Triton's interpreter, which reads TRITON_INTERPRET when triton is
imported (triton.language's own jit functions are decorated then): it is set here before any import
of triton. With a GPU and TRITON_INTERPRET=0 the same tests check the compiled kernels."""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import spec
from spec.report import failure

os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("triton")
kernel = importlib.import_module("examples.triton_attention")

ROOT = Path(__file__).resolve().parents[2]


def softmax64(q, k, v, causal, scale=None):  # [..., h, n_q, d_k], [..., g, n_k, d_k] -> out, lse
    """softmax(scale · q kᵀ) v in float64, the causal mask bottom-right; a row that sees no key: 0, −inf."""
    q, k, v = (x.double() for x in (q, k, v))
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    n_q, n_k = s.shape[-2:]
    if causal:
        seen = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + (n_k - n_q)
        s = s.masked_fill(~seen, -math.inf)
    lse = torch.logsumexp(s, -1) if n_k else torch.full(s.shape[:-1], -math.inf, dtype=s.dtype)
    w = torch.where(torch.isfinite(lse)[..., None], torch.exp(s - lse[..., None]), 0.0)
    return w @ v, lse


SHAPES = [  # (leading dims of q, K/V heads, n_q, n_k, d_k, d_v, causal)
    ((1, 1), 1, 1, 1, 8, 8, False),
    ((2, 3), 3, 37, 20, 40, 24, False),  # partial tiles both ways, widths not powers of two
    ((1, 4), 2, 129, 129, 64, 64, True),  # grouped K/V heads, a causal square of five key tiles
    ((1, 2), 2, 17, 5, 8, 3, True),  # bottom-right: the first 12 rows see no key
    ((), None, 70, 33, 16, 16, False),  # 2-D inputs
    ((1, 1), 1, 5, 0, 8, 8, False),  # no keys
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("lead", "kv_heads", "n_q", "n_k", "d_k", "d_v", "causal"), SHAPES)
def test_kernels_give_a_float64_softmax(lead, kv_heads, n_q, n_k, d_k, d_v, causal, dtype):
    gen = torch.Generator().manual_seed(n_q + n_k)
    kv_lead = (*lead[:-1], kv_heads) if lead else ()

    def draw(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(kernel.DEVICE).requires_grad_()

    q, k, v = draw(*lead, n_q, d_k), draw(*kv_lead, n_k, d_k), draw(*kv_lead, n_k, d_v)
    out, lse = kernel.attention(q, k, v, causal=causal, scale=0.3, return_lse=True)
    want, want_lse = softmax64(q.detach().cpu(), k.detach().cpu(), v.detach().cpu(), causal, scale=0.3)
    atol = 2e-3 if dtype == torch.float16 else 1e-5
    assert out.dtype == dtype and lse.dtype == torch.float32
    torch.testing.assert_close(out.detach().cpu().double(), want, atol=atol, rtol=0)
    torch.testing.assert_close(lse.cpu().double(), want_lse, atol=1e-5, rtol=0)  # −inf where want's is
    if n_k == 0:
        return
    d_out = torch.randn(out.shape, generator=gen).to(dtype)
    out.backward(d_out.to(kernel.DEVICE))
    q64, k64, v64 = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    softmax64(q64, k64, v64, causal, scale=0.3)[0].backward(d_out.double())
    for got, meant in ((q, q64), (k, k64), (v, v64)):
        assert got.grad.dtype == dtype
        torch.testing.assert_close(got.grad.cpu().double(), meant.grad, atol=10 * atol, rtol=0)


def test_the_example_conforms_at_a_small_profile():
    report = spec.check(kernel.target, profile="quick", max_examples=3, seed=0)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    status = {r.name: r.status for r in report.results}
    # what its declarations open: gradients, the LSE, grouped heads, rows that see nothing, no keys
    for law in ("grad_matches_golden", "lse_matches_golden", "gqa_matches_repeated_kv", "masked_rows_policy",
                "empty_keys", "score_variance"):
        assert status[law] == "pass", law


@pytest.mark.parametrize("bug", list(kernel.BUGS))
def test_each_broken_kernel_fails_matches_golden(bug):
    report = spec.check(getattr(kernel, bug), profile="ci", only=["matches_golden"])
    (result,) = report.results
    assert result.status == "fail", f"matches_golden did not catch: {kernel.BUGS[bug]}"
    shown = failure(result)
    (line,) = [line for line in shown.splitlines() if "reproduce:" in line]
    assert f"spec.replay('examples.triton_attention:{bug}', 'matches_golden'" in line, shown


def test_an_unknown_bug_is_refused():
    q = torch.ones(1, 4, 16, device=kernel.DEVICE)
    with pytest.raises(ValueError, match="bug must be one of unmasked_tail"):
        kernel.attention(q, q, q, bug="typo")


def _import_in_a_fresh_process(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_interpret_set_after_triton_is_imported_is_refused():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = _import_in_a_fresh_process(
        "import os, triton; os.environ['TRITON_INTERPRET'] = '1'; import examples.triton_attention", env)
    assert done.returncode != 0
    assert "TRITON_INTERPRET=1 was set after triton was imported" in done.stderr


def test_no_gpu_and_no_interpreter_is_refused():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the kernels compile for it")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = _import_in_a_fresh_process("import examples.triton_attention", env)
    assert done.returncode != 0 and "no GPU here" in done.stderr
