"""A tiled attention kernel in Triton — forward and backward — and what it declares to the suite.

The forward is FlashAttention-2's: each program owns a tile of ``BLOCK_M`` queries of one head and
walks the keys in tiles of ``BLOCK_N``, keeping a running row maximum, a running denominator and an
unnormalised accumulator (the online softmax), and writes the output and each row's logsumexp
(LSE). The backward recomputes the weights from that LSE, one program per key tile for dK and dV
and one per query tile for dQ (no atomics). Any n_q, n_k (n_k = 0 included) and any head sizes:
the last tiles are partial and the head widths are padded to a power of two, both masked.

On a machine without a GPU it runs under Triton's interpreter, on CPU torch tensors::

    TRITON_INTERPRET=1 python -m spec check examples/triton_attention.py:target --profile quick

``TRITON_INTERPRET`` is read when ``triton`` is imported: it must be set before. The same file
also declares three broken kernels, each one line away from the correct one (``BUGS``), which the
suite must reject::

    TRITON_INTERPRET=1 python -m spec check examples/triton_attention.py:unmasked_tail --profile quick

The page docs/triton.md explains each declaration.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

import spec

INTERPRETING = bool(triton.knobs.runtime.interpret)
"""Under ``TRITON_INTERPRET=1``: the kernels run on CPU tensors, one program after another."""
if INTERPRETING:
    from triton.runtime.interpreter import InterpretedFunction
if INTERPRETING and not isinstance(tl.max, InterpretedFunction):
    # triton.language's own jit functions (tl.max, tl.sum) were decorated when triton was imported
    raise RuntimeError("TRITON_INTERPRET=1 was set after triton was imported: set it before (in the shell, "
                       "or in os.environ before the first import of triton or torch's inductor)")
if not INTERPRETING and not torch.cuda.is_available():
    raise RuntimeError("no GPU here: run the kernels under Triton's interpreter, TRITON_INTERPRET=1 set "
                       "before triton is imported")
DEVICE = "cpu" if INTERPRETING else "cuda"
"""Where the suite's arrays go: the interpreter takes CPU tensors, compiled kernels a GPU's."""

BLOCK_M = 64
"""Queries a program owns."""
BLOCK_N = 32
"""Keys a step of the loop reads: the n of the suite's compile-once grid (1, 17, 129) all leave a
partial last key tile, and 17 and 129 take more than one, so the running maximum changes."""
LOG2E = 1.4426950408889634  # exp(x) = exp2(x · log2 e): the kernel works in base 2, as FlashAttention
LN2 = 0.6931471805599453

BUGS = {
    "unmasked_tail": "the partial last key tile is not masked: its padding keys (zeros) join every row",
    "diagonal_off_by_one": "the causal test is j < diag instead of j ≤ diag: a query never sees its own key",
    "not_rescaled": "the accumulator is not rescaled when the running maximum grows",
}
"""The broken kernels this file also builds: each changes one line of the correct one."""
BUG_CODES = {name: code for code, name in enumerate(BUGS, 1)}


@triton.jit
def _forward(Q, K, V, O, L, qk_scale,
             s_qz, s_qm, s_qd, s_kz, s_kn, s_kd, s_vz, s_vn, s_vd, s_oz, s_om, s_od,
             n_q, n_k, d_k, d_v, group, diag_offset,
             CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, BUG: tl.constexpr):
    start_m = tl.program_id(0).to(tl.int64)
    z = tl.program_id(1).to(tl.int64)  # the (batch, head) pair
    kv_z = z // group  # its K/V head (grouped-query attention: group query heads share one)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    dk = tl.arange(0, BLOCK_DK).to(tl.int64)
    dv = tl.arange(0, BLOCK_DV).to(tl.int64)
    q = tl.load(Q + z * s_qz + rows[:, None] * s_qm + dk[None, :] * s_qd,
                mask=(rows[:, None] < n_q) & (dk[None, :] < d_k), other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running maximum, in base-2 units
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)  # running denominator
    acc = tl.full([BLOCK_M, BLOCK_DV], 0.0, tl.float32)
    hi = n_k
    if CAUSAL:  # no key tile past the tile's last query's diagonal
        hi = tl.minimum(n_k, tl.maximum(0, start_m * BLOCK_M + BLOCK_M + diag_offset))
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + kv_z * s_kz + cols[None, :] * s_kn + dk[:, None] * s_kd,
                    mask=(cols[None, :] < n_k) & (dk[:, None] < d_k), other=0.0)  # [BLOCK_DK, BLOCK_N]
        s = tl.dot(q, k, input_precision="ieee") * qk_scale
        # The pairs that count: inside both lengths, and for causal attention key j ≤ query i +
        # diag_offset (bottom-right: diag_offset = n_k − n_q).
        if BUG == 1:  # unmasked_tail: the padding keys of the last tile are left in
            keep = (rows[:, None] < n_q) & (cols[None, :] >= 0)
        else:
            keep = (rows[:, None] < n_q) & (cols[None, :] < n_k)
        if CAUSAL:
            if BUG == 2:  # diagonal_off_by_one
                keep = keep & (cols[None, :] < rows[:, None] + diag_offset)
            else:
                keep = keep & (cols[None, :] <= rows[:, None] + diag_offset)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + kv_z * s_vz + cols[:, None] * s_vn + dv[None, :] * s_vd,
                    mask=(cols[:, None] < n_k) & (dv[None, :] < d_v), other=0.0)
        if BUG != 3:  # not_rescaled skips it
            acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
        m_i = m_new
    seen = l_i > 0.0  # a row that sees no key: zeros, and an LSE of -inf
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
    tl.store(O + z * s_oz + rows[:, None] * s_om + dv[None, :] * s_od, out.to(O.dtype.element_ty),
             mask=(rows[:, None] < n_q) & (dv[None, :] < d_v))
    tl.store(L + z * n_q + rows, lse, mask=rows < n_q)


@triton.jit
def _delta(O, DO, D, s_oz, s_om, s_od, n_q, d_v, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """D_i = Σ_d dO_id · O_id, the term the softmax's Jacobian subtracts (FlashAttention-2's D)."""
    start_m = tl.program_id(0).to(tl.int64)
    z = tl.program_id(1).to(tl.int64)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    dv = tl.arange(0, BLOCK_DV).to(tl.int64)
    where = z * s_oz + rows[:, None] * s_om + dv[None, :] * s_od
    inside = (rows[:, None] < n_q) & (dv[None, :] < d_v)
    o = tl.load(O + where, mask=inside, other=0.0).to(tl.float32)
    do = tl.load(DO + where, mask=inside, other=0.0).to(tl.float32)
    tl.store(D + z * n_q + rows, tl.sum(o * do, 1), mask=rows < n_q)


@triton.jit
def _backward_kv(Q, K, V, DO, L, D, DK, DV, qk_scale, sm_scale,
                 s_qz, s_qm, s_qd, s_kz, s_kn, s_kd, s_vz, s_vn, s_vd, s_oz, s_om, s_od,
                 n_q, n_k, d_k, d_v, group, diag_offset,
                 CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """dK and dV of one key tile for one query head (a K/V head's group is summed by the caller)."""
    start_n = tl.program_id(0).to(tl.int64)
    z = tl.program_id(1).to(tl.int64)
    kv_z = z // group
    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M).to(tl.int64)
    dk = tl.arange(0, BLOCK_DK).to(tl.int64)
    dv = tl.arange(0, BLOCK_DV).to(tl.int64)
    k = tl.load(K + kv_z * s_kz + cols[None, :] * s_kn + dk[:, None] * s_kd,
                mask=(cols[None, :] < n_k) & (dk[:, None] < d_k), other=0.0)  # [BLOCK_DK, BLOCK_N]
    v = tl.load(V + kv_z * s_vz + cols[None, :] * s_vn + dv[:, None] * s_vd,
                mask=(cols[None, :] < n_k) & (dv[:, None] < d_v), other=0.0)  # [BLOCK_DV, BLOCK_N]
    acc_dk = tl.full([BLOCK_N, BLOCK_DK], 0.0, tl.float32)
    acc_dv = tl.full([BLOCK_N, BLOCK_DV], 0.0, tl.float32)
    lo = 0
    if CAUSAL:  # the first query tile that sees a key of this tile: query i sees j when i ≥ j − diag_offset
        lo = tl.maximum(0, start_n * BLOCK_N - diag_offset) // BLOCK_M * BLOCK_M
    for start_m in range(lo, n_q, BLOCK_M):
        rows = start_m + offs_m
        q = tl.load(Q + z * s_qz + rows[:, None] * s_qm + dk[None, :] * s_qd,
                    mask=(rows[:, None] < n_q) & (dk[None, :] < d_k), other=0.0)
        do = tl.load(DO + z * s_oz + rows[:, None] * s_om + dv[None, :] * s_od,
                     mask=(rows[:, None] < n_q) & (dv[None, :] < d_v), other=0.0)
        lse = tl.load(L + z * n_q + rows, mask=rows < n_q, other=float("-inf"))
        delta = tl.load(D + z * n_q + rows, mask=rows < n_q, other=0.0)
        # P = exp(s − LSE), recomputed (0 where hidden, and in a row that sees no key: LSE −inf)
        keep = (rows[:, None] < n_q) & (cols[None, :] < n_k) & (lse[:, None] > float("-inf"))
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + diag_offset)
        s = tl.dot(q, k, input_precision="ieee") * qk_scale
        p = tl.where(keep, tl.exp2(s - tl.where(lse > float("-inf"), lse * LOG2E, 0.0)[:, None]), 0.0)
        acc_dv = tl.dot(tl.trans(p).to(do.dtype), do, acc_dv, input_precision="ieee")
        dp = tl.dot(do, v, input_precision="ieee")
        ds = p * (dp - delta[:, None])
        acc_dk = tl.dot(tl.trans(ds).to(q.dtype), q, acc_dk, input_precision="ieee")
    inside = cols[:, None] < n_k
    tl.store(DK + z * n_k * d_k + cols[:, None] * d_k + dk[None, :],
             (acc_dk * sm_scale).to(DK.dtype.element_ty), mask=inside & (dk[None, :] < d_k))
    tl.store(DV + z * n_k * d_v + cols[:, None] * d_v + dv[None, :], acc_dv.to(DV.dtype.element_ty),
             mask=inside & (dv[None, :] < d_v))


@triton.jit
def _backward_q(Q, K, V, DO, L, D, DQ, qk_scale, sm_scale,
                s_qz, s_qm, s_qd, s_kz, s_kn, s_kd, s_vz, s_vn, s_vd, s_oz, s_om, s_od,
                n_q, n_k, d_k, d_v, group, diag_offset,
                CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """dQ of one query tile."""
    start_m = tl.program_id(0).to(tl.int64)
    z = tl.program_id(1).to(tl.int64)
    kv_z = z // group
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    dk = tl.arange(0, BLOCK_DK).to(tl.int64)
    dv = tl.arange(0, BLOCK_DV).to(tl.int64)
    q = tl.load(Q + z * s_qz + rows[:, None] * s_qm + dk[None, :] * s_qd,
                mask=(rows[:, None] < n_q) & (dk[None, :] < d_k), other=0.0)
    do = tl.load(DO + z * s_oz + rows[:, None] * s_om + dv[None, :] * s_od,
                 mask=(rows[:, None] < n_q) & (dv[None, :] < d_v), other=0.0)
    lse = tl.load(L + z * n_q + rows, mask=rows < n_q, other=float("-inf"))
    delta = tl.load(D + z * n_q + rows, mask=rows < n_q, other=0.0)
    acc = tl.full([BLOCK_M, BLOCK_DK], 0.0, tl.float32)
    hi = n_k
    if CAUSAL:
        hi = tl.minimum(n_k, tl.maximum(0, start_m * BLOCK_M + BLOCK_M + diag_offset))
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + kv_z * s_kz + cols[None, :] * s_kn + dk[:, None] * s_kd,
                    mask=(cols[None, :] < n_k) & (dk[:, None] < d_k), other=0.0)  # [BLOCK_DK, BLOCK_N]
        v = tl.load(V + kv_z * s_vz + cols[None, :] * s_vn + dv[:, None] * s_vd,
                    mask=(cols[None, :] < n_k) & (dv[:, None] < d_v), other=0.0)  # [BLOCK_DV, BLOCK_N]
        # P = exp(s − LSE), recomputed (0 where hidden, and in a row that sees no key: LSE −inf)
        keep = (rows[:, None] < n_q) & (cols[None, :] < n_k) & (lse[:, None] > float("-inf"))
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + diag_offset)
        s = tl.dot(q, k, input_precision="ieee") * qk_scale
        p = tl.where(keep, tl.exp2(s - tl.where(lse > float("-inf"), lse * LOG2E, 0.0)[:, None]), 0.0)
        dp = tl.dot(do, v, input_precision="ieee")
        ds = p * (dp - delta[:, None])
        acc = tl.dot(ds.to(k.dtype), tl.trans(k), acc, input_precision="ieee")
    tl.store(DQ + z * n_q * d_k + rows[:, None] * d_k + dk[None, :], (acc * sm_scale).to(DQ.dtype.element_ty),
             mask=(rows[:, None] < n_q) & (dk[None, :] < d_k))


def _width(d: int) -> int:
    """A head width's tile: the next power of two (tl.arange's), at least 16 (tl.dot's least on a GPU)."""
    return max(16, triton.next_power_of_2(max(d, 1)))


def _flat(x: torch.Tensor) -> torch.Tensor:
    """``[..., n, d]`` as ``[z, n, d]`` (z the leading dims flattened: one program column each)."""
    return x.reshape(math.prod(x.shape[:-2]), *x.shape[-2:])


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


class _Launch:
    """One call's shapes and the arguments every kernel shares."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 scale: float | None, bug: int) -> None:
        if not (q.dim() == k.dim() == v.dim() and q.dim() in (2, 3, 4)):
            raise ValueError(f"q, k and v must all be 2-, 3- or 4-D, got {q.dim()}, {k.dim()}, {v.dim()}")
        if q.dtype != k.dtype or q.dtype != v.dtype:
            raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        self.shape = q.shape
        heads = q.shape[-3] if q.dim() >= 3 else 1
        kv_heads = k.shape[-3] if k.dim() >= 3 else 1
        if heads % kv_heads:
            raise ValueError(f"q's {heads} heads are not a multiple of k's {kv_heads}")
        self.group = heads // kv_heads
        self.q, self.k, self.v = _flat(q.contiguous()), _flat(k.contiguous()), _flat(v.contiguous())
        self.z, self.n_q, self.d_k = self.q.shape
        self.n_k, self.d_v = self.k.shape[1], self.v.shape[2]
        self.sm_scale = 1.0 / math.sqrt(self.d_k) if scale is None else float(scale)
        self.causal, self.bug = bool(causal), bug
        self.diag_offset = self.n_k - self.n_q if causal else 0  # bottom-right, as FlashAttention ≥ 2.1

    def common(self) -> tuple[Any, ...]:
        return (*_strides(self.q), *_strides(self.k), *_strides(self.v))

    def sizes(self) -> tuple[int, ...]:
        return self.n_q, self.n_k, self.d_k, self.d_v, self.group, self.diag_offset

    def constants(self) -> dict[str, Any]:
        return {"CAUSAL": self.causal, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N,
                "BLOCK_DK": _width(self.d_k), "BLOCK_DV": _width(self.d_v)}


def forward(launch: _Launch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [z, n_q, d_v], lse [z, n_q] float32)``."""
    out = torch.empty(launch.z, launch.n_q, launch.d_v, dtype=launch.q.dtype, device=launch.q.device)
    lse = torch.empty(launch.z, launch.n_q, dtype=torch.float32, device=launch.q.device)
    if launch.z and launch.n_q:
        grid = (triton.cdiv(launch.n_q, BLOCK_M), launch.z)
        _forward[grid](launch.q, launch.k, launch.v, out, lse, launch.sm_scale * LOG2E, *launch.common(),
                       *_strides(out), *launch.sizes(), **launch.constants(), BUG=launch.bug)
    return out, lse


def backward(launch: _Launch, out: torch.Tensor, lse: torch.Tensor,
             d_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` from the forward's output and LSE (dk, dv per K/V head: a group summed)."""
    device = launch.q.device
    d_out = _flat(d_out.contiguous())
    dq = torch.zeros_like(launch.q)
    dk = torch.zeros(launch.z, launch.n_k, launch.d_k, dtype=launch.k.dtype, device=device)
    dv = torch.zeros(launch.z, launch.n_k, launch.d_v, dtype=launch.v.dtype, device=device)
    delta = torch.empty(launch.z, launch.n_q, dtype=torch.float32, device=device)
    if launch.z and launch.n_q and launch.n_k:
        args = (launch.sm_scale * LOG2E, launch.sm_scale, *launch.common(), *_strides(d_out), *launch.sizes())
        _delta[(triton.cdiv(launch.n_q, BLOCK_M), launch.z)](
            out, d_out, delta, *_strides(out), launch.n_q, launch.d_v, BLOCK_M=BLOCK_M,
            BLOCK_DV=_width(launch.d_v))
        _backward_kv[(triton.cdiv(launch.n_k, BLOCK_N), launch.z)](
            launch.q, launch.k, launch.v, d_out, lse, delta, dk, dv, *args, **launch.constants())
        _backward_q[(triton.cdiv(launch.n_q, BLOCK_M), launch.z)](
            launch.q, launch.k, launch.v, d_out, lse, delta, dq, *args, **launch.constants())
    if launch.group > 1:  # a K/V head's gradient is the sum over the query heads that read it
        dk = dk.reshape(-1, launch.group, launch.n_k, launch.d_k).sum(1)
        dv = dv.reshape(-1, launch.group, launch.n_k, launch.d_v).sum(1)
    return dq, dk, dv


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                scale: float | None, bug: int) -> tuple[torch.Tensor, torch.Tensor]:
        launch = _Launch(q, k, v, causal, scale, bug)
        out, lse = forward(launch)
        ctx.launch, ctx.shapes = launch, (q.shape, k.shape, v.shape)
        ctx.save_for_backward(out, lse)
        ctx.mark_non_differentiable(lse)
        return out.reshape(*q.shape[:-1], launch.d_v), lse.reshape(q.shape[:-1])

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor, _d_lse: torch.Tensor) -> tuple[Any, ...]:
        out, lse = ctx.saved_tensors
        dq, dk, dv = backward(ctx.launch, out, lse, d_out)
        q_shape, k_shape, v_shape = ctx.shapes
        return dq.reshape(q_shape), dk.reshape(k_shape), dv.reshape(v_shape), None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, return_lse: bool = False, bug: str | None = None) -> Any:
    """softmax(scale · q kᵀ) v by the Triton kernels: q ``[..., h, n_q, d_k]``, k ``[..., g, n_k,
    d_k]``, v ``[..., g, n_k, d_v]`` (h a multiple of g), -> ``[..., h, n_q, d_v]`` (and the LSE
    ``[..., h, n_q]``, float32, with ``return_lse=True``). ``causal``: bottom-right aligned (query i
    sees key j ≤ i + n_k − n_q). ``bug``: one of `BUGS`, for the broken kernels."""
    if bug is not None and bug not in BUG_CODES:
        raise ValueError(f"bug must be one of {', '.join(BUGS)} or None, got {bug!r}")
    out, lse = _Attention.apply(q, k, v, causal, scale, BUG_CODES.get(bug, 0) if bug else 0)
    return (out, lse) if return_lse else out


def make_target(bug: str | None = None) -> spec.Target:
    """The kernel as the suite checks it (``bug``: one of the broken kernels, `BUGS`)."""

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **keywords: Any) -> Any:
        return attention(q, k, v, bug=bug, **keywords)

    kernel.__name__ = kernel.__qualname__ = f"triton_attention{'' if bug is None else '_' + bug}"
    return spec.from_torch(
        kernel,
        name=f"triton {triton.__version__} tiled attention{', interpreted' if INTERPRETING else ''}"
             + ("" if bug is None else f" ({bug})"),
        grad=True,
        device=DEVICE,
        dtypes=("float16", "float32"),
        ndims=(2, 3, 4),
        supports_scale=True,
        supports_gqa=True,
        returns_lse=True,
        causal_alignment="bottom_right",
        masked_rows="zeros",
        # The interpreter runs each program's tile steps in Python: each new shape is fast to
        # "compile" but each call costs tens of milliseconds to seconds, so the sizes come from
        # the compile-once grid (tile edges included) and a call gets a minute.
        compiles_per_shape=True,
        deadline_s=60.0,
    )


target = make_target()
unmasked_tail = make_target("unmasked_tail")
diagonal_off_by_one = make_target("diagonal_off_by_one")
not_rescaled = make_target("not_rescaled")
