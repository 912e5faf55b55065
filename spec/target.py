"""Targets: an attention implementation under test, and what it declares it can do.

Any callable ``f(q, k, v, *, causal=False)`` on NumPy arrays is a target as it is:

    q [..., n_q, d_k], k [..., n_k, d_k], v [..., n_k, d_v]  ->  [..., n_q, d_v]

with leading dims ``(batch, heads)`` or none, float32 and float64 inputs, and the causal mask
top-left aligned (query i sees keys j ≤ i, as PyTorch's ``is_causal``). `Target` wraps
such a callable and declares whatever differs; a property that needs a capability the target does
not declare is skipped, and the report says which capability was missing.

A target's ``fn`` always receives NumPy arrays and may return anything ``np.asarray`` accepts.
Adapters for other frameworks (PyTorch, JAX) convert inside ``fn``.

Targets by name are resolved by `spec.builtin.load_target`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from spec import dtypes as dt
from spec.inputs import Inputs
from spec.keywords import CAUSES, Arrangement, Keyword, asked_outputs, gradient_extras, in_layout, registered

Layout = Literal["bhnd", "bnhd"]
Alignment = Literal["top_left", "bottom_right", "square_or_decoding", "kv_lengths", "top_left_kv_lengths"]
MaskedRows = Literal["zeros", "nan", "uniform", "unmasked", "any"]
POLICIES = ("zeros", "nan", "uniform", "unmasked", "any")
Isolation = Literal["thread", "caller", "process"]
EmptyKeys = Literal["either", "compute", "raise"]
WindowSides = Literal["both", "left"]
AlibiShape = Literal["both", "heads"]
Fp8Scale = Literal["kv_head", "tensor"]
LseBase = Literal["e", 2]
TopkDuplicates = Literal["once", "each"]
INVARIANCES = ("batch", "position", "neighbours", "chunked_prefill", "splits")
"""The bit-exact invariances a target may promise (``Target(invariant=...)``; `spec.laws.invariance`)."""

FLOAT_DTYPES = ("float16", "float32", "float64", "bfloat16")

class TargetError(ValueError):
    """A target that cannot be loaded or is declared inconsistently (the CLI's exit 2)."""


class TargetFailed(AssertionError):
    """The target raised, returned something that is not an array, or returned the wrong shape.

    ``raised``: when the target raised an exception (an ``Exception``: not a crash, an overrun or
    ``sys.exit``), that exception as ``"Type: message"``; else None."""

    def __init__(self, message: str, *, raised: str | None = None) -> None:
        super().__init__(message)
        self.raised = raised


@dataclass(frozen=True)
class Target:
    """An attention implementation under test, with the capabilities it declares.

    ``Target(fn)`` with no other argument declares exactly what a plain callable gets.
    """

    fn: Callable[..., Any]
    """``fn(q, k, v, *, causal=False[, mask=][, scale=])`` -> ``[..., n_q, d_v]`` array-like: an
    array with a dtype (NumPy, a framework's CPU tensor), or a list NumPy reads in the inputs'
    dtype (float64; a list for float32 inputs is refused, not silently widened)."""
    name: str = ""
    """Shown in reports; defaults to the callable's qualified name."""
    dtypes: tuple[str, ...] = ("float32", "float64")
    """NumPy dtype names the target accepts (from float16, float32, float64, bfloat16); each is
    tested. The output must have the input's dtype. bfloat16 is NumPy's from ``ml_dtypes``
    (``ml_dtypes.bfloat16``), which must be installed to declare it."""
    layout: Layout = "bhnd"
    """Axis order of 4-D inputs and output: ``bhnd`` = (batch, heads, n, d), as PyTorch's SDPA;
    ``bnhd`` = (batch, n, heads, d), as FlashAttention's and JAX's. 2-D inputs are (n, d) either
    way. A ``mask=`` is always ``[batch, heads, n_q, n_k]`` (or broadcastable to it)."""
    ndims: tuple[int, ...] = (2, 4)
    """Ranks of q/k/v the target accepts: 2 = (n, d), 3 = (heads, n, d), 4 = (batch, heads, n, d)."""
    supports_mask: bool = False
    """``fn`` takes ``mask=``: boolean, True = may attend, broadcastable to ``[..., n_q, n_k]``,
    ANDed with ``causal``."""
    supports_scale: bool = False
    """``fn`` takes ``scale=`` (a float multiplying the scores instead of ``1/√d_k``)."""
    causal_alignment: Alignment | None = "top_left"
    """What ``causal=True`` means: ``top_left`` (query i sees keys j ≤ i; PyTorch) or
    ``bottom_right`` (query i sees keys j ≤ i + n_k − n_q; FlashAttention ≥ 2.1, MLX, decoding
    with a KV cache). The two agree when n_q = n_k. ``square_or_decoding``: defined only for
    n_q = n_k (top-left) and n_q = 1 (decoding: the query sees every key), as transformers' SDPA
    path (``is_causal`` only when n_q > 1); causal cases are then drawn only with those shapes.
    ``kv_lengths``: bottom-right per sequence — with ``kv_lengths=`` the diagonal of batch row b is
    i + kv_lengths[b] − n_q (FlashAttention's ``cache_seqlens`` and ``seqused_k``, ONNX's
    ``nonpad_kv_seqlen``: each row's last query sees its last key), without it i + n_k − n_q.
    ``top_left_kv_lengths``: the same with ``kv_lengths=``, top-left without it (ONNX's
    ``Attention``: the offset of its causal diagonal is the number of keys before the query block,
    0 without a cache, kv_lengths[b] − n_q with ``nonpad_kv_seqlen``). None: the target has no
    causal mode. A ``window=`` is aligned the same way. A paged cache (``block_table=``) is aligned
    per sequence whatever this says (decoding and chunked prefill)."""
    queries_within_keys: bool = False
    """``causal`` and ``window=`` are defined only where no query comes before the first key:
    n_q ≤ n_k, and n_q ≤ kv_lengths[b] for every row of a call with ``kv_lengths=`` (mask
    utilities that place query i at key position i + n_k − n_q and assume it non-negative). Cases
    with causal or a window are then drawn only with such shapes, and the laws that need a query
    before the first key are skipped, saying so."""
    causal_only: bool = False
    """The target has no non-causal mode: every call passes ``causal=True`` (a serving kernel that
    asserts ``causal``). Cases are drawn causal only, and a law that needs a non-causal call is
    skipped, naming this declaration. Needs a causal mode (``causal_alignment`` not None)."""
    keys_cover_queries: bool = False
    """Every call has at least as many keys as queries: n_k ≥ n_q, each batch row's
    ``kv_lengths[b]`` ≥ n_q, each packed sequence's keys ≥ its queries, a past cache's keys and the
    call's together ≥ n_q (a chunked-prefill kernel: a cached prefix plus one new key per query).
    Wider than ``queries_within_keys``: non-causal calls too. Cases are drawn with such shapes, and
    a law that needs a query without a key is skipped, naming this declaration."""
    self_attention_only: bool = False
    """n_q = n_k in every call, every batch row (``kv_lengths[b] = n_q``) and every packed sequence
    (a prefill kernel with one length per sequence). Cases are drawn so; implies
    ``keys_cover_queries``."""
    decode_only: bool = False
    """One query per sequence in every call: n_q = 1 (each packed sequence one query), as a decode
    kernel. Cases are drawn so; a law that needs more queries is skipped, naming this declaration.
    Not with ``self_attention_only`` (one key per call leaves no attention to test) nor with a
    ``seq_multiple`` above 1."""
    masked_rows: MaskedRows | Mapping[str, MaskedRows] = dataclasses.field(default="zeros", hash=False)
    """Output of a query row that sees no key at all: ``zeros`` (PyTorch's fused kernels,
    FlashAttention, `impl`), ``nan`` (a plain softmax over all -inf), ``uniform`` (the plain
    mean of the values: an additive finite mask such as -1e9), ``unmasked`` (the output the row
    would have without the mask: a finite fill that every score of the row shares, such as
    picoGPT's -1e10 in float64; checked to a score error of ``eps·FINITE_FILL``, see
    `FINITE_FILL`), ``any`` (unspecified; not tested). A mapping gives a policy per cause of
    emptiness (`CAUSES`: ``causal``, ``window``, ``chunk``, ``mask``, ``bias``, ``kv_lengths``,
    ``varlen``, ``no_keys``), causes it does not name taking ``zeros``: FlashAttention's reference
    zeroes a row emptied by its causal or window mask and gives NaN for one emptied by key padding
    or a −inf bias, ``{"mask": "nan", "bias": "nan", "kv_lengths": "nan"}``. A row's cause is the
    first restriction, in that order, after which it sees nothing."""
    empty_keys: EmptyKeys = "either"
    """What a call with no keys (n_k = 0) does: ``compute`` returns ``[..., n_q, d_v]``, every row as
    ``masked_rows`` says for a row that sees no key (zeros for ``zeros`` and ``uniform``, NaN for
    ``nan``); ``raise`` refuses it with ValueError or TypeError (never a silent NaN); ``either`` (the
    default, what a plain function gets) does one or the other: returns that output, or refuses with
    any exception it raises (a textbook softmax's row maximum over no keys: NumPy's ValueError),
    the report's note saying which. A crash, an overrun, NaN where zeros are promised or an output of
    the wrong shape fails under every declaration."""
    exact_masking: bool = True
    """Masked keys contribute exactly nothing, so changing them leaves outputs bit-identical.
    False (e.g. an additive -1e4 mask): such changes are only required to stay within tolerance."""
    supports_gqa: bool = False
    """4-D k and v may have fewer heads g than q's h (h divisible by g); query head i reads K/V
    head ``i // (h // g)`` (grouped-query attention, PyTorch's ``enable_gqa``, JAX)."""
    computes: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)
    """Dtypes accepted but computed in a narrower one: ``{"float64": "float32"}`` says float64
    inputs are taken (and returned as float64) but computed in float32. Laws then allow the
    tolerance of the narrower dtype (baseline and floor computed in it), and reports name both
    ("float64 (computed in float32)"). Keys are declared dtypes; values are narrower float dtypes."""
    tolerance: float = 2.0
    """k in the tolerance policy: pass when ``max|out − golden| ≤ k·max|baseline − golden| +
    c·eps·max|golden|``, golden in float64, baseline a naive computation in the target's dtype."""
    deadline_s: float | None = None
    """Time limit for one call of ``fn``, in seconds; None uses the profile's."""
    grad_fn: Callable[..., Any] | None = None
    """Optional backward pass: ``grad_fn(q, k, v, d_out, *, causal=False, **keywords)`` ->
    ``(dq, dk, dv)``, the gradients of ``sum(out · d_out)`` for the call ``fn(q, k, v,
    **keywords)``, in the target's layout. It receives exactly the keywords the forward receives
    (``mask``, ``scale`` and every declared keyword: ``bias``, ``window``, ``dropout_p``/``seed``
    ...; never ``return_lse``); with dropout, the same seed must give the forward's kept set.
    None: no gradient properties."""
    grad_extras: tuple[str, ...] = ()
    """Gradients of extra inputs that ``grad_fn`` also returns: ``("dbias", "dsinks")``. Then it
    returns ``(dq, dk, dv, extras)``, ``extras`` a dict holding the gradient of each declared
    extra whose keyword the call was given (``dbias`` in the shape and dtype of the ``bias`` as
    passed, its broadcast axes summed; ``dsinks`` in those of ``sinks``, ``[heads]``), and no other
    name. The names are those of the keywords' terms (`spec.keywords.gradient_extras`), and each
    needs its keyword declared (``supports_bias``, ``supports_sinks``)."""
    grad_takes_residuals: bool = False
    """``grad_fn`` also accepts ``out=`` and ``lse=``: what the target's own forward returned for
    the same call with ``return_lse=True`` (``out`` in the target's layout, ``lse`` ``[..., n_q]``),
    and then uses them instead of recomputing them, as FlashAttention's backward takes the
    forward's ``out`` and ``softmax_lse``. Called without them it recomputes them. Needs
    ``returns_lse`` and a ``grad_fn``."""
    capabilities: tuple[str, ...] = ()
    """The keywords of real kernels ``fn`` takes, each by its capability (``supports_window``,
    ``returns_lse``: the ``field`` of its declaration, `spec.keywords.Keyword`), and passed to
    ``fn`` only when declared here. Given as keyword arguments, ``Target(fn, supports_window=True)``
    (or as this tuple), read as attributes, ``target.supports_window``, changed as any field,
    ``target.replace(supports_window=False)``. What each keyword means, how it is drawn and checked
    is its declaration's (one module of `spec.keywords`); the docs read it there. A new keyword adds
    nothing here."""
    fp8_kv_paged_only: bool = False
    """``k_descale=``/``v_descale=`` are taken only with a paged cache (``block_table=``), as by
    ``impl.flash_attention`` and vLLM's float8 caches: the float8 laws then draw only paged caches.
    Needs ``supports_fp8_kv`` and ``supports_paged_kv``."""
    # --- how a serving kernel takes its keywords: each narrows the keyword's draws, and a law that
    # cannot be drawn inside it is skipped, naming it (docs/targets.md, "Declare a serving kernel")
    window_sides: WindowSides = "both"
    """The sides a ``window=`` may have: ``both`` (``(left, right)``), or ``left`` (``(left, 0)`` only:
    a sliding window that looks back, as vLLM's and most decoders'). Needs ``supports_window``."""
    window_needs_causal: bool = False
    """A ``window=`` is passed only together with ``causal=True`` (a kernel whose sliding window
    exists only in its causal mode). Needs ``supports_window`` and a causal mode."""
    alibi_shape: AlibiShape = "both"
    """The ALiBi slopes a call passes: ``both`` (``[heads]`` or ``[batch, heads]``), or ``heads``
    (``[heads]`` only). Needs ``supports_alibi``."""
    fp8_scale: Fp8Scale = "kv_head"
    """The float8 descales' granularity: ``kv_head`` (one per batch row and K/V head, drawn
    distinct), or ``tensor`` (one ``k_descale`` and one ``v_descale`` value for the whole call,
    still passed as ``[batch, heads_kv]``, every entry equal). Needs ``supports_fp8_kv``."""
    block_multiple: int | None = None
    """Paged block sizes are multiples of this (a kernel whose tiles hold 16 keys: 16); None: any.
    Needs ``supports_paged_kv``."""
    num_splits_values: tuple[int, ...] | None = None
    """The split counts ``num_splits=`` takes, each an int ≥ 1: ``(1, 2, 4)``; None: any (the cases
    draw 1, 2, 3, 4 and 8). A case draws one of them. Needs ``supports_num_splits``."""
    deterministic: bool = True
    """Two identical calls give bit-identical outputs."""
    isolation: Isolation = "thread"
    """Where each call runs: ``thread`` (a worker thread, under the deadline), ``caller`` (the
    caller's thread, no deadline: for libraries that must be called from one thread) or
    ``process`` (a worker process; a crash or overrun is a failure and the run goes on)."""
    # --- what a real kernel takes: its shape limits, its LSE of an empty row, its known
    # deviations, and whether each new shape costs a compilation (docs/targets.md, "Real kernels")
    head_dims: tuple[int, ...] | None = None
    """The head sizes the kernel accepts, for d_k and d_v alike: ``(64, 128)``; None: any. Every
    case is drawn with widths among them."""
    equal_head_dims: bool = False
    """d_v must equal d_k (FlashAttention and most fused kernels)."""
    v_from_k: bool = False
    """The values are the keys' first d_v columns (MLA's shared latent, FlashMLA): ``fn`` is called
    with ``v=None`` and ``d_v=`` (an int) and reads ``v = k[..., :d_v]``; ``grad_fn`` is called the
    same way and returns ``(dq, dk, None)``, dk the gradient of the latent, the values' gradient
    added into its first d_v columns. Every case is drawn with v that prefix (d_v ≤ d_k), and a
    call whose v is not (a law's own values) is not made. Needs head_dims that allow d_v ≤ d_k."""
    seq_multiple: int | None = None
    """n_q and n_k (each packed sequence's, each cache's length too) are multiples of this: the
    block sizes of a kernel that does not mask a partial tile (Pallas' ``mha``: 128, or n itself
    below it). Cases are drawn at multiples of it, and the boundary grid at its multiples and the
    tile edges that are multiples of it."""
    max_seq: int | None = None
    """No call has more than this many queries or keys."""
    empty_lse: float = -math.inf
    """The LSE a row that sees no key returns: −∞ (the logsumexp of nothing, the default), +∞
    (FlashAttention's CUDA kernels) or another float."""
    lse_base: LseBase = "e"
    """The base of the LSE the target returns: ``"e"`` (natural, the default: log Σ exp(s)) or ``2``
    (log2 Σ 2^(s·log2 e): FlashInfer, FlashMLA's sparse prefill). Needs ``returns_lse``."""
    topk_duplicates: TopkDuplicates = "once"
    """A key listed twice in one row of ``topk_indices`` counts ``once`` (a mask: the default) or
    ``each`` time (a gather: its weight doubles). Needs ``supports_topk``."""
    invariant: tuple[str, ...] = ()
    """The bit-exact invariances the target promises (`INVARIANCES`): ``"batch"``, a sequence's output
    equals, bit for bit, its output in a call of the same form holding it alone; ``"position"``,
    wherever it sits in the batch or the pack; ``"neighbours"``, whatever the other sequences' query
    and key lengths (``kv_lengths=``, packed or paged sequences); ``"chunked_prefill"``, queries in
    chunks against a growing cache give the one call's output (bottom-right or per-sequence
    alignment: ``causal_alignment`` ``bottom_right`` or ``kv_lengths``, a paged or a past cache);
    ``"splits"``, the same call gives the same bits at every split count the target takes
    (``num_splits_values``: two at least). Each names the laws that then compare bit for bit (vLLM's
    batch-invariant mode promises the first three); none declared, the chunked-prefill law still
    holds the target to its tolerance."""
    merge: Any = None
    """The target's own merge operator of attention states (a `spec.MergeTarget`, or a function
    ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)`` read as ``MergeTarget(fn)`` in the target's
    layout, LSE base, empty LSE and dtypes), which the cascade law (`spec.laws.cascade`) also
    merges the target's partial states with; None: the suite's merge alone. Needs ``returns_lse``."""
    expected_failures: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    """Known deviations, each with its reason: ``{"law": "reason"}`` for every dtype,
    ``{"law[float16]": "reason"}`` for one. The law still runs: a failure is XFAIL (the run still
    conforms; the report shows it, compactly, with the reason), a pass is XPASS, which fails the
    run (a stale declaration, as pytest's ``xfail_strict``)."""
    compiles_per_shape: bool = False
    """Each new shape costs a compilation (``jax.jit``, ``torch.compile``, Pallas, Triton's
    autotuning): sizes are drawn from a small fixed grid (`spec.cases.SHAPE_GRID`, tile edges
    included), so a run compiles each shape once."""
    holds_scores: bool = True
    """A call holds every score of its slices at once (n_q × n_k each, as a plain softmax does);
    False: it holds a tile of them (FlashAttention, `impl.flash`, PyTorch's CPU flash kernel),
    its memory beyond the inputs and output O(n_q). Only ``--profile scale`` reads it, to estimate
    what each of its calls needs against ``--memory`` (`spec.scale_plan.footprint`)."""

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TargetError(f"Target fn must be callable, got {type(self.fn).__name__}")
        if not self.name:
            object.__setattr__(self, "name", _callable_name(self.fn))
        wants_bf16 = any(isinstance(d, str) and d == dt.BFLOAT16 for d in self.dtypes)
        if wants_bf16 and not dt.has_bfloat16():
            raise TargetError("Target dtypes include bfloat16, which needs ml_dtypes (not installed): "
                              "pip install ml-dtypes")
        try:
            dtypes = tuple(dt.as_dtype(d).name for d in self.dtypes)
        except TypeError:
            dtypes = ()
        if not dtypes or any(d not in FLOAT_DTYPES for d in dtypes):
            raise TargetError(
                f"Target dtypes must be a non-empty subset of {FLOAT_DTYPES}, got {self.dtypes!r}"
            )
        object.__setattr__(self, "dtypes", dtypes)
        _check_choice("layout", self.layout, ("bhnd", "bnhd"))
        _check_choice("causal_alignment", self.causal_alignment,
                      ("top_left", "bottom_right", "square_or_decoding", "kv_lengths", "top_left_kv_lengths",
                       None))
        object.__setattr__(self, "masked_rows", _check_masked_rows(self.masked_rows))
        object.__setattr__(self, "computes", _check_computes(self.computes, self.dtypes))
        _check_choice("isolation", self.isolation, ("thread", "caller", "process"))
        _check_choice("empty_keys", self.empty_keys, ("either", "compute", "raise"))
        for flag in capability_fields(Target):
            if not isinstance(getattr(self, flag), bool):
                raise TargetError(f"Target {flag} must be True or False, got {getattr(self, flag)!r}")
        if not self.ndims or any(r not in (2, 3, 4) for r in self.ndims):
            raise TargetError(f"Target ndims must be a non-empty subset of (2, 3, 4), got {self.ndims}")
        if not self.tolerance > 0:
            raise TargetError(f"Target tolerance must be positive, got {self.tolerance}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise TargetError(f"Target deadline_s must be positive or None, got {self.deadline_s}")
        object.__setattr__(self, "grad_extras", _check_grad_extras(self))
        _check_declarations(self)
        object.__setattr__(self, "num_splits_values", _check_num_splits_values(self.num_splits_values))
        for keyword in registered().values():  # what each keyword needs of the other declarations
            wrong = keyword.check_target(self) if keyword.check_target is not None else None
            if wrong:
                raise TargetError(wrong)
        _check_limits(self)
        _check_combinations(self)
        if not isinstance(self.empty_lse, (int, float)) or math.isnan(self.empty_lse):
            raise TargetError(f"Target empty_lse must be a float (-inf, +inf or finite), "
                              f"got {self.empty_lse!r}")
        object.__setattr__(self, "empty_lse", float(self.empty_lse))
        _check_lse_base(self)
        _check_choice("topk_duplicates", self.topk_duplicates, ("once", "each"))
        if self.topk_duplicates != "once" and not getattr(self, "supports_topk", False):
            raise TargetError("Target topk_duplicates='each' needs supports_topk=True (it says how "
                              "topk_indices is read)")
        object.__setattr__(self, "expected_failures", _check_expected(self.expected_failures, self.dtypes))
        object.__setattr__(self, "invariant", _check_invariant(self))
        object.__setattr__(self, "merge", _check_merge(self))

    @property
    def alignment(self) -> Literal["top_left", "bottom_right", "kv_lengths", "top_left_kv_lengths"]:
        """The diagonal the golden uses for ``causal`` and ``window``: ``square_or_decoding`` is
        bottom-right (top-left on square shapes, every key for one query), ``kv_lengths`` and
        ``top_left_kv_lengths`` bottom-right per sequence with kv_lengths=, no causal mode top-left."""
        if self.causal_alignment in ("bottom_right", "square_or_decoding"):
            return "bottom_right"
        if self.causal_alignment in ("kv_lengths", "top_left_kv_lengths"):
            return self.causal_alignment
        return "top_left"

    def causal_shape_ok(self, n_q: int, n_k: int) -> bool:
        """Whether the causal mode (and a window) is defined for these lengths: always, except for
        ``square_or_decoding`` (n_q = n_k or n_q = 1) and ``queries_within_keys`` (n_q ≤ n_k; n_k
        is each row's kv_lengths[b] where the call gives them)."""
        if self.queries_within_keys and n_q > n_k:
            return False
        return self.causal_alignment != "square_or_decoding" or n_q in (1, n_k)

    def precision(self, dtype: str) -> str:
        """The dtype inputs of ``dtype`` are computed in (``computes``; the dtype itself by default)."""
        return self.computes.get(dtype, dtype)

    def precision_text(self, dtype: str) -> str:
        """``dtype``, or ``"float64 (computed in float32)"`` when ``computes`` narrows it."""
        narrow = self.precision(dtype)
        return dtype if narrow == dtype else f"{dtype} (computed in {narrow})"

    def call_deadline(self, default: float | None) -> float | None:
        """The deadline of one call, in seconds: the target's own (``deadline_s``), else ``default``
        (the profile's, or one given for the call); None: no deadline."""
        return self.deadline_s if self.deadline_s is not None else default

    @property
    def has_gradients(self) -> bool:
        return self.grad_fn is not None

    def replace(self, **changes: Any) -> Target:
        """A copy with some declarations changed: ``target.replace(tolerance=4.0)``."""
        return dataclasses.replace(self, **changes)

    def with_dtypes(self, dtypes: tuple[str, ...]) -> Target:
        """The target restricted to ``dtypes`` (some of its own), with what it declares of the
        others (``computes``, ``expected_failures``) dropped."""
        keep = {dt.as_dtype(d).name for d in dtypes}
        expected = {key: reason for key, reason in self.expected_failures.items()
                    if (found := EXPECTED.fullmatch(key)) is None or found["dtype"] in (None, *keep)}
        computes = {given: used for given, used in self.computes.items() if given in keep}
        return self.replace(dtypes=tuple(dtypes), computes=computes, expected_failures=expected)

    def policy(self, cause: str) -> MaskedRows:
        """The masked-row policy for a row emptied by ``cause`` (see ``masked_rows``)."""
        if isinstance(self.masked_rows, str):
            return self.masked_rows
        return self.masked_rows.get(cause, "zeros")

    @property
    def policies(self) -> frozenset[str]:
        """Every masked-row policy the target declares, for any cause."""
        if isinstance(self.masked_rows, str):
            return frozenset({self.masked_rows})
        return frozenset({"zeros", *self.masked_rows.values()})

    if TYPE_CHECKING:  # the constructor takes each keyword's capability besides the fields (below)
        def __init__(self, fn: Callable[..., Any], *args: Any, **declared: Any) -> None: ...

    def __getattr__(self, name: str) -> bool:
        """A keyword's capability (``target.supports_window``): whether ``capabilities`` holds it."""
        if name.startswith("_") or "capabilities" not in self.__dict__ or name not in capability_names():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return name in self.capabilities

    def __call__(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray | None, *, arrangement: Arrangement = "dense",
        **kwargs: Any,
    ) -> Any:  # [..., n_q, d_k], [..., n_k, d_k], [..., n_k, d_v] -> [..., n_q, d_v] (, extras)
        """Call ``fn`` on ``(..., n, d)`` arrays with ``kwargs`` as given, translating the layout
        both ways. The calling layer (`spec.call.call`) decides what is passed: ``causal`` only
        when true, ``mask``, ``scale`` and each keyword only when given and declared. A keyword
        that makes a call return more than its output (`spec.keywords.Returns`) makes the result
        ``(out, *extras)``: ``return_lse=True`` ``(out, lse)``, lse as ``fn`` returned it (its shape
        is checked by the caller); ``past_key=``/``past_value=`` ``(out, present_key,
        present_value)``, the presents in the suite's layout. ``arrangement="packed"``: 3-D inputs
        are packed sequences ``(heads, total, d)``, which ``fn`` sees as ``(total, heads, d)`` in
        ``bnhd``; ``"paged"``: k and v are paged caches, passed as they are in every layout
        (`spec.keywords.in_layout`).
        """
        axes = self._layout_axes(q.ndim, packed=arrangement == "packed")
        if axes:
            moved = in_layout(arrangement)
            q, k = (np.ascontiguousarray(np.swapaxes(x, *axes)) if name in moved else x
                    for name, x in zip("qk", (q, k), strict=True))
            if v is not None and "v" in moved:  # None: a v_from_k target reads it from k
                v = np.ascontiguousarray(np.swapaxes(v, *axes))
            kwargs = {name: np.ascontiguousarray(np.swapaxes(x, *axes))
                      if name in moved and isinstance(x, np.ndarray) else x for name, x in kwargs.items()}
        got = self.fn(q, k, v, **kwargs)
        extras = asked_outputs(kwargs)
        if not extras:
            return self._from_layout(_returned(got, "its output", q.dtype), axes)
        names = tuple(name for returns in extras for name in returns.names)
        if not isinstance(got, (tuple, list)) or len(got) != 1 + len(names):
            raise TypeError(f"{' and '.join(r.asked for r in extras)} the target must return "
                            f"(out, {', '.join(names)}), got {type(got).__name__}")
        returned = [_returned(x, name, q.dtype) for x, name in zip(got, ("out", *names), strict=True)]
        laid_out = (True, *(returns.in_layout for returns in extras for _ in returns.names))
        return tuple(self._from_layout(x, axes) if moves else x
                     for x, moves in zip(returned, laid_out, strict=True))

    def _layout_axes(self, ndim: int, *, packed: bool) -> tuple[int, int] | None:
        """The axes swapped between the suite's ``(..., heads, n, d)`` and ``bnhd``."""
        if self.layout != "bnhd":
            return None
        if ndim == 4:
            return (1, 2)
        if ndim == 3 and packed:
            return (0, 1)
        return None

    @staticmethod
    def _from_layout(out: np.ndarray, axes: tuple[int, int] | None) -> np.ndarray:
        if axes is not None and out.ndim == max(axes) + 2:
            return np.swapaxes(out, *axes)
        return out


def capability_fields(cls: type) -> tuple[str, ...]:
    """The boolean fields of a Target class (capabilities and ``deterministic``)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.type in ("bool", bool))


class _Capabilities:
    """The capability names of the keywords `spec.keywords.registered` holds, read again when it
    holds others (`spec.keywords.declared`)."""

    table: ClassVar[dict[str, Keyword] | None] = None
    names: ClassVar[dict[str, Keyword]] = {}


def capability_names() -> dict[str, Keyword]:
    """Every declared keyword by its capability (``supports_window``: its ``field``), in declaration
    order: the names `Target` takes and reads besides its fields. A capability that is a field of
    Target is refused (ValueError): it would be two declarations of one thing."""
    table = registered()
    if _Capabilities.table is not table:
        found = {kw.field: kw for kw in table.values()}
        taken = sorted(set(found) & {f.name for f in dataclasses.fields(Target)})
        if taken:
            raise ValueError(f"keyword {found[taken[0]].name!r} names its capability {taken[0]!r}, which is "
                             "a field of Target: name it after the keyword")
        _Capabilities.table, _Capabilities.names = table, found
    return _Capabilities.names


def _taking_capabilities(init: Callable[..., None]) -> Callable[..., None]:
    """The dataclass's ``__init__``, taking each keyword's capability as a keyword argument too
    (``supports_window=True``): they are gathered into ``capabilities``, in declaration order, a
    capability given by name overriding the tuple (``dataclasses.replace`` passes both)."""

    @functools.wraps(init)
    def __init__(self: Target, *args: Any, **given: Any) -> None:
        known = capability_names()
        named = {name: given.pop(name) for name in [n for n in given if n in known]}
        for name, value in named.items():
            if not isinstance(value, bool):
                raise TargetError(f"Target {name} must be True or False, got {value!r}")
        held = given.pop("capabilities", ())
        if isinstance(held, str) or not all(isinstance(name, str) for name in held):
            raise TargetError(f"Target capabilities must be a tuple of names such as ('supports_window',), "
                              f"got {held!r}")
        unknown = [name for name in held if name not in known]
        if unknown:
            raise TargetError(f"Target capabilities names {unknown[0]!r}; the keywords' capabilities are "
                              f"{', '.join(known)}")
        declared = {*held} - {name for name, value in named.items() if not value}
        declared |= {name for name, value in named.items() if value}
        init(self, *args, capabilities=tuple(name for name in known if name in declared), **given)

    return __init__


setattr(Target, "__init__", _taking_capabilities(Target.__init__))  # noqa: B010 (mypy: no assigning a method)


FINITE_FILL = 1e10
"""The largest finite fill ``masked_rows="unmasked"`` allows for (picoGPT's -1e10): a fully masked
row's scores all move by it, so each is off by up to ``eps·FINITE_FILL`` after rounding."""


def _check_computes(computes: Any, dtypes: tuple[str, ...]) -> dict[str, str]:
    """``computes``: a dict from declared dtypes to strictly narrower float dtypes."""
    if not isinstance(computes, dict):
        raise TargetError(f"Target computes must be a dict such as {{'float64': 'float32'}}, "
                          f"got {type(computes).__name__}")
    out: dict[str, str] = {}
    for given, used in computes.items():
        try:
            given_name, used_name = dt.as_dtype(given).name, dt.as_dtype(used).name
        except TypeError:
            raise TargetError(f"Target computes must map dtype names to dtype names, got "
                              f"{given!r}: {used!r}") from None
        if given_name not in dtypes:
            raise TargetError(f"Target computes names {given_name}, which is not among the declared "
                              f"dtypes {dtypes}")
        if used_name not in FLOAT_DTYPES or not dt.eps(used_name) > dt.eps(given_name):
            raise TargetError(f"Target computes must map {given_name} to a narrower float dtype, "
                              f"got {used_name!r}")
        out[given_name] = used_name
    return out


def _check_masked_rows(given: Any) -> Any:
    """``masked_rows``: one policy, or a mapping from causes of emptiness to policies."""
    if isinstance(given, str):
        _check_choice("masked_rows", given, POLICIES)
        return given
    if not isinstance(given, Mapping):
        raise TargetError(f"Target masked_rows must be one of {POLICIES} or a mapping from causes to them, "
                          f"got {given!r}")
    for cause, policy in given.items():
        if cause not in CAUSES:
            raise TargetError(f"Target masked_rows names the cause {cause!r}; "
                              f"the causes are {', '.join(CAUSES)}")
        _check_choice(f"masked_rows[{cause!r}]", policy, POLICIES)
    return dict(given)


def _check_grad_extras(target: Target) -> tuple[str, ...]:
    """``grad_extras``: names of gradients the keywords' terms define, each with its keyword
    declared, and a ``grad_fn`` to return them."""
    given = target.grad_extras
    if isinstance(given, str) or not isinstance(given, (tuple, list)) or \
            not all(isinstance(name, str) for name in given):
        raise TargetError(f"Target grad_extras must be a tuple of names such as ('dbias', 'dsinks'), "
                          f"got {given!r}")
    if given and target.grad_fn is None:
        raise TargetError(f"Target grad_extras={tuple(given)!r} needs a grad_fn to return them")
    if not given:
        return ()
    known = gradient_extras()
    for name in given:
        if name not in known:
            raise TargetError(f"Target grad_extras names {name!r}; the gradients the keywords define are "
                              f"{', '.join(known) or 'none'}")
        argument, field = known[name].passes[0], known[name].field
        if not getattr(target, field):
            raise TargetError(f"Target grad_extras names {name!r}, the gradient of {argument}=, "
                              f"which needs {field}=True")
    return tuple(dict.fromkeys(given))


def _check_num_splits_values(given: Any) -> tuple[int, ...] | None:
    """``num_splits_values``: None or a tuple of ints ≥ 1 (`spec.keywords.num_splits.check_values`)."""
    from spec.keywords.num_splits import check_values

    try:
        return check_values(given)
    except ValueError as e:
        raise TargetError(f"Target {e}") from None


def _check_invariant(target: Target) -> tuple[str, ...]:
    """``invariant``: a tuple of names among `INVARIANCES` (a bare name is refused: ``("batch")`` is
    a string, not a tuple), ``chunked_prefill`` only with an alignment that chunks keep."""
    given = target.invariant
    if isinstance(given, str) or not isinstance(given, (tuple, list)) or \
            not all(isinstance(name, str) for name in given):
        raise TargetError(f"Target invariant must be a tuple of names among {INVARIANCES}, got {given!r}")
    for name in given:
        if name not in INVARIANCES:
            raise TargetError(f"Target invariant names {name!r}; the invariances are "
                              f"{', '.join(INVARIANCES)}")
    if given and not target.deterministic:
        raise TargetError("Target invariant promises bit-identical outputs, which deterministic=False "
                          "rules out")
    if "chunked_prefill" in given and target.causal_alignment not in ("bottom_right", "kv_lengths") and \
            not target.supports_paged_kv and not target.supports_past_kv:
        raise TargetError("Target invariant='chunked_prefill' needs chunks that keep their diagonal: "
                          "causal_alignment 'bottom_right' or 'kv_lengths', supports_paged_kv=True or "
                          "supports_past_kv=True (target declares causal_alignment="
                          f"{target.causal_alignment!r})")
    if "splits" in given and (not target.supports_num_splits or len(target.num_splits_values or (1, 2)) < 2):
        raise TargetError("Target invariant='splits' promises one output across the split counts it takes: "
                          "it needs supports_num_splits=True and two or more counts (target declares "
                          f"supports_num_splits={target.supports_num_splits}, "
                          f"num_splits_values={target.num_splits_values!r})")
    return tuple(dict.fromkeys(given))


def _check_merge(target: Target) -> Any:
    """``merge``: None, a `spec.MergeTarget` (read by its fields: this module is below it), or a
    function, for a target that returns an LSE to merge."""
    given = target.merge
    if given is None:
        return None
    if not callable(given) and not all(hasattr(given, name) for name in ("fn", "fn_n", "lse_base", "layout")):
        raise TargetError(f"Target merge must be a spec.MergeTarget, a function fn(out_a, lse_a, out_b, "
                          f"lse_b) -> (out, lse) or None, got {type(given).__name__}")
    if not target.returns_lse:
        raise TargetError("Target merge needs returns_lse=True (the states it merges carry the target's LSE)")
    return given


def _check_combinations(target: Target) -> None:
    """The serving declarations that leave no call to make together: ``decode_only`` with
    ``self_attention_only``, or with a ``seq_multiple`` above 1."""
    if target.decode_only and target.self_attention_only:
        raise TargetError("Target decode_only=True with self_attention_only=True leaves one query over one "
                          "key in every call: declare one of them")
    if target.decode_only and target.seq_multiple and target.seq_multiple > 1:
        raise TargetError(f"Target decode_only=True has n_q = 1 in every call, which seq_multiple="
                          f"{target.seq_multiple} rules out")


def _check_lse_base(target: Target) -> None:
    """``lse_base``: ``"e"`` or ``2`` (the int; ``"2"`` is read as it), and 2 only for a target that
    returns an LSE."""
    if target.lse_base == "2":
        object.__setattr__(target, "lse_base", 2)
    if isinstance(target.lse_base, bool) or target.lse_base not in ("e", 2):
        raise TargetError(f"Target lse_base must be 'e' (natural) or 2, got {target.lse_base!r}")
    if target.lse_base == 2 and not target.returns_lse:
        raise TargetError("Target lse_base=2 needs returns_lse=True (it says how the returned LSE is read)")


def _check_limits(target: Target) -> None:
    """The shape limits: positive integers, head sizes a non-empty tuple of them."""
    dims = target.head_dims
    if dims is not None:
        if isinstance(dims, int) or not isinstance(dims, (tuple, list)) or not dims or \
                not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
            raise TargetError(f"Target head_dims must be a non-empty tuple of positive integers or None, "
                              f"got {dims!r}")
        object.__setattr__(target, "head_dims", tuple(sorted(set(dims))))
    _check_v_from_k(target)
    for name in ("seq_multiple", "max_seq"):
        value = getattr(target, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise TargetError(f"Target {name} must be a positive integer or None, got {value!r}")
    if target.seq_multiple and target.max_seq and target.max_seq < target.seq_multiple:
        raise TargetError(f"Target max_seq={target.max_seq} is below seq_multiple={target.seq_multiple}: "
                          "no length is both")


def v_from_k_widths(target: Target) -> list[tuple[int, int]]:
    """The widths ``(d_k, d_v)`` a ``v_from_k`` target can be called with: d_v ≤ d_k, each among
    its head_dims (equal under ``equal_head_dims``); None: any (an empty list is not)."""
    dims = target.head_dims
    if dims is None:
        return [(1, 1)]
    return [(d_k, d_v) for d_k in dims for d_v in dims
            if d_v <= d_k and (d_v == d_k or not target.equal_head_dims)]


def _check_v_from_k(target: Target) -> None:
    """A ``v_from_k`` target reads v from k's first d_v columns: it needs widths with d_v ≤ d_k."""
    if target.v_from_k and not v_from_k_widths(target):
        raise TargetError(f"Target v_from_k=True reads v = k[..., :d_v], which needs d_v ≤ d_k; its "
                          f"head_dims={target.head_dims!r} allow no such widths")


@dataclass(frozen=True)
class Declaration:
    """One declaration of a serving kernel, a field of `Target` that limits the calls it is given:
    how it takes a keyword (``window_sides``) or the shape of its calls (``decode_only``). The one
    record that `Target` checks it by (`allowed`, `narrows`, `causal`), that the report's header
    says it by (`said`) and that a call is judged by (`broken_by`, read by
    `spec.cases.outside_limits`)."""

    field: str
    default: Any
    """The field's default, which declares nothing."""
    broken_by: Callable[[Target, Inputs, list[int], list[int]], bool]
    """Whether a call breaks it, given the target that declares it, the call's inputs and each of its
    sequences' query and key counts (`spec.cases.sequence_lengths`; a keyword's form reads the
    inputs alone)."""
    allowed: tuple[Any, ...] | None = None
    """The values it takes; None: True or False (a False default), or a positive integer (None)."""
    narrows: str | None = None
    """The capability of the keyword it says how to take (``supports_window``); None: it limits
    the shape of every call."""
    causal: str | None = None
    """Where it needs a causal mode (``causal_alignment`` not None): the refusal's reason."""

    def declared(self, target: Target) -> bool:
        return getattr(target, self.field) != self.default

    def said(self, target: Target) -> str:
        """As the report's header lists it: ``causal_only``, ``window_sides='left'``."""
        value = getattr(target, self.field)
        return self.field if value is True else f"{self.field}={value!r}"

    def given(self, target: Target) -> str:
        """As a call that breaks it names it, and `Target`'s refusals: ``causal_only=True``."""
        return f"{self.field}={getattr(target, self.field)!r}"


def _right_side(target: Target, inputs: Inputs, queries: list[int], keys: list[int]) -> bool:
    window = inputs.get("window")
    return window is not None and window[1] != 0


def _window_without_causal(target: Target, inputs: Inputs, queries: list[int], keys: list[int]) -> bool:
    return inputs.get("window") is not None and not inputs.causal


def _slopes_per_batch_row(target: Target, inputs: Inputs, queries: list[int], keys: list[int]) -> bool:
    return bool(np.ndim(inputs.get("alibi_slopes")) == 2)


def _descales_differ(target: Target, inputs: Inputs, queries: list[int], keys: list[int]) -> bool:
    scales = [np.asarray(x) for x in (inputs.get("k_descale"), inputs.get("v_descale")) if x is not None]
    return any(x.size and np.any(x != x.flat[0]) for x in scales)


def _other_block_size(target: Target, inputs: Inputs, queries: list[int], keys: list[int]) -> bool:
    return inputs.get("block_table") is not None and bool(inputs.k.shape[1] % target.block_multiple)


def _not_causal(target: Target, inputs: Inputs, queries: list[int], keys: list[int]) -> bool:
    return not inputs.causal


def _fewer_keys(target: Target, inputs: Inputs, queries: list[int], keys: list[int]) -> bool:
    return any(k < n for n, k in zip(queries, keys, strict=True))


def _other_key_count(target: Target, inputs: Inputs, queries: list[int], keys: list[int]) -> bool:
    return any(k != n for n, k in zip(queries, keys, strict=True))


def _several_queries(target: Target, inputs: Inputs, queries: list[int], keys: list[int]) -> bool:
    return any(n != 1 for n in queries)


DECLARATIONS = (
    # how a keyword is taken: a window with a left side only, or only with causal=True; ALiBi slopes
    # [heads] only; one float8 descale per tensor; paged blocks of a multiple of m keys
    Declaration("window_sides", "both", _right_side, allowed=("both", "left"), narrows="supports_window"),
    Declaration("window_needs_causal", False, _window_without_causal, narrows="supports_window",
                causal=": a window passed only with causal=True would never be passed"),
    Declaration("alibi_shape", "both", _slopes_per_batch_row, allowed=("both", "heads"),
                narrows="supports_alibi"),
    Declaration("fp8_scale", "kv_head", _descales_differ, allowed=("kv_head", "tensor"),
                narrows="supports_fp8_kv"),
    Declaration("block_multiple", None, _other_block_size, narrows="supports_paged_kv"),
    # the shape of every call: causal, at least as many keys as queries, as many, one query
    Declaration("causal_only", False, _not_causal, causal=""),
    Declaration("keys_cover_queries", False, _fewer_keys),
    Declaration("self_attention_only", False, _other_key_count),
    Declaration("decode_only", False, _several_queries),
)
"""The declarations of serving kernels, in the order the report's header lists them and a call is
judged by them (docs/targets.md, "Declare a serving kernel")."""


def _check_declarations(target: Target) -> None:
    """Each of `DECLARATIONS`: a value among its own (a positive integer for ``block_multiple``;
    True or False is checked with every flag), with the capability it narrows, and a causal mode
    where it needs one."""
    for declaration in DECLARATIONS:
        name, value = declaration.field, getattr(target, declaration.field)
        if declaration.allowed is not None:
            _check_choice(name, value, declaration.allowed)
        elif declaration.default is None and value is not None and \
                (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise TargetError(f"Target {name} must be a positive integer or None, got {value!r}")
        if not declaration.declared(target):
            continue
        if declaration.narrows is not None and not getattr(target, declaration.narrows):
            raise TargetError(f"Target {declaration.given(target)} needs {declaration.narrows}=True "
                              "(it says how that keyword is taken)")
        if declaration.causal is not None and target.causal_alignment is None:
            raise TargetError(f"Target {declaration.given(target)} needs a causal mode (causal_alignment is "
                              f"None){declaration.causal}")


EXPECTED = re.compile(r"(?P<law>\w+)(?:\[(?P<dtype>\w+)\])?")
"""An entry of ``expected_failures``: a law's name, and perhaps one dtype: ``law[float16]``."""


def _check_expected(given: Any, dtypes: tuple[str, ...]) -> dict[str, str]:
    """``expected_failures``: ``law`` or ``law[dtype]`` (a declared dtype) → a reason (text). The
    law names are checked by the runner, which knows the laws."""
    if not isinstance(given, Mapping):
        raise TargetError(f"Target expected_failures must map 'law' or 'law[dtype]' to a reason, "
                          f"got {given!r}")
    out: dict[str, str] = {}
    for key, reason in given.items():
        found = EXPECTED.fullmatch(key) if isinstance(key, str) else None
        if found is None:
            raise TargetError(f"Target expected_failures key must be 'law' or 'law[dtype]', got {key!r}")
        if found["dtype"] is not None and found["dtype"] not in dtypes:
            raise TargetError(f"Target expected_failures names {key!r}, but {found['dtype']} is not "
                              f"among the declared dtypes {dtypes}")
        if not isinstance(reason, str) or not reason.strip():
            raise TargetError(f"Target expected_failures[{key!r}] needs its reason (text), got {reason!r}")
        out[key] = reason.strip()
    laws = {EXPECTED.fullmatch(key)["law"] for key in out}  # type: ignore[index]
    both = sorted(law for law in laws if law in out and any(k.startswith(f"{law}[") for k in out))
    if both:
        raise TargetError(f"Target expected_failures names {both[0]!r} for every dtype and for one: keep one")
    return out


def parse_expected_failures(text: str, where: str = "") -> dict[str, str]:
    """``expected_failures`` from a file's text: one ``law[dtype]  # reason`` (or ``law  # reason``)
    a line; blank lines and lines that are only a comment are skipped. Raises TargetError naming
    the line that is neither."""
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        entry, _, reason = line.partition("#")
        if not entry.strip():
            continue
        key = entry.strip()
        if EXPECTED.fullmatch(key) is None or not reason.strip():
            raise TargetError(f"{where or 'expected failures'}, line {number}: expected "
                              f"'law[dtype]  # reason', got {line.strip()!r}")
        found[key] = reason.strip()
    return found


def expected_failure(target: Target, law: str, dtype: str | None = None) -> str | None:
    """The reason ``law`` is expected to fail (in ``dtype``, or in every dtype), or None."""
    if dtype is not None and f"{law}[{dtype}]" in target.expected_failures:
        return target.expected_failures[f"{law}[{dtype}]"]
    return target.expected_failures.get(law)


def split_dtypes(target: Target, law: str) -> list[tuple[str, ...]]:
    """The runs of ``law``: one per dtype its expected failures name (``law[float16]``), then one
    of the other dtypes (none when every dtype is named); a single run of every dtype otherwise."""
    named = [d for d in target.dtypes if f"{law}[{d}]" in target.expected_failures]
    rest = tuple(d for d in target.dtypes if d not in named)
    return [(d,) for d in named] + ([rest] if rest else [])


def _check_choice(field: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise TargetError(f"Target {field} must be one of {choices}, got {value!r}")


class NotAnArray(TypeError):
    """The target returned something without a dtype (a list, a tuple) that NumPy cannot read as
    an array in the inputs' dtype: Python floats read as float64, whatever the target computed in."""


def _returned(x: Any, what: str, dtype: np.dtype) -> np.ndarray:
    """``x`` as an ndarray. An array-like with a dtype (NumPy, a framework's CPU tensor) is read
    as it is; one without (a list) only when NumPy reads it in ``dtype``, the inputs' dtype (a
    list of float32 values would silently become float64): else `NotAnArray`, naming it."""
    if hasattr(x, "dtype"):
        return np.asarray(x)
    try:
        read = np.asarray(x)
    except ValueError as e:  # ragged
        raise NotAnArray(f"the target returned {what} as a {type(x).__name__} NumPy cannot read as an "
                         f"array ({e}): return a NumPy array in the inputs' dtype") from None
    if read.dtype != dtype:
        raise NotAnArray(f"the target returned {what} as a {type(x).__name__}, which NumPy reads as "
                         f"{read.dtype} (the inputs are {dtype}): return a NumPy array in the inputs' "
                         "dtype (np.asarray(out, dtype=q.dtype))")
    return read


def _callable_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}:{qualname}" if module else qualname
