"""ONNX: the ``Attention`` operator (opset 23; opset 24 for ``nonpad_kv_seqlen``) as two built-in
targets, ``onnxruntime`` (ONNX Runtime's CPU execution provider) and ``onnx_reference`` (the
``onnx`` package's ``onnx.reference.ReferenceEvaluator``), through one graph of one node.

ONNX's arrays are NumPy's, so the adapter moves nothing between frameworks: it reshapes the
suite's ``(n, d)`` and ``(heads, n, d)`` to the operator's 4-D ``[batch, heads, n, d]`` (views,
never a copied value), feeds them to a graph built once per dtype, rank, keyword set and attribute
value (`_graph`, cached), and reshapes the output back. The operator's inputs and attributes are
the suite's keywords: ``mask`` (boolean) and ``bias`` (float) → ``attn_mask``, ``scale``,
``softcap``, ``causal`` → ``is_causal``, ``kv_lengths`` → ``nonpad_kv_seqlen`` (int64, opset
24), ``past_key``/``past_value`` → the operator's own inputs, its ``present_key``/``present_value``
returned beside the output. One thing is folded here rather than passed: a mask with a bias is
one ``attn_mask``, the bias where the mask is True and −inf elsewhere (a selection, no arithmetic),
as the operator takes one.

The declarations of `onnx_target` are measured, not assumed (onnx 1.23.2, onnxruntime 1.32.0, on
CPU; ``tests/spec/test_spec_adapters_onnx.py`` re-measures the ones a new version could change):

- ``is_causal`` is top-left without key lengths (query i sees keys j ≤ i), bottom-right per batch
  row with ``nonpad_kv_seqlen`` (j ≤ i + L_b − n_q), and offset by the past with a past cache
  (j ≤ i + n_past): ``causal_alignment="top_left_kv_lengths"``, the operator's own definition
  (onnx/reference/ops/op_attention.py, ``_apply_causal``: the offset is the number of keys
  before the query block);
- grouped K/V heads are native (4-D K and V with fewer heads; query head i reads K/V head
  i // (h/g), the operator's interleaved repeat); d_v ≠ d_k runs;
- a query row that sees no key gives zeros, whatever hid its keys (boolean mask, −inf in a float
  mask, key length 0, causal with a negative offset): the operator's fully-masked-row guard;
- a call with no keys (n_k = 0) is refused by both runtimes (ONNX Runtime: "KV sequence length
  must be greater than 0"; the reference: a reduction with no identity);
- dtypes: ONNX Runtime float16 and float32 (its bfloat16 Attention falls back to the operator's
  function body, whose ``Expand`` has no bfloat16 kernel on CPU: refused at session creation; its
  float64 computes in float32); the reference float16, float32 and bfloat16 (ml_dtypes). float64
  is not declared for either: the operator's ``scale`` and ``softcap`` are float32 attributes, so a
  float64 call's scale is rounded to float32.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from spec import dtypes
from spec.adapters import Framework, fold_masks, wrap
from spec.target import Target

Array = np.ndarray

SPELLINGS = {"bias": "attn_mask", "kv_lengths": "nonpad_kv_seqlen", "past_key": "past_key",
             "past_value": "past_value", "softcap": "softcap"}
"""How the ONNX ``Attention`` operator names the suite's keyword arguments (its float
``attn_mask`` is the suite's ``bias=``, ``nonpad_kv_seqlen`` its ``kv_lengths=``)."""

RUNTIMES = ("onnxruntime", "onnx_reference")
OPSET = 23
"""The opset of the graph: ``Attention`` first appears in 23; 24 adds ``nonpad_kv_seqlen``."""
OPSET_KV_LENGTHS = 24


def _to_onnx(x: Array, device: str = "cpu") -> Array:  # NumPy -> NumPy, same bits, its own memory
    """ONNX's arrays are NumPy's (bfloat16 ml_dtypes' for both runtimes): a copy."""
    if device != "cpu":
        raise ValueError(f"the onnx adapter runs on the CPU, got device {device!r}")
    return np.array(x, copy=True)


def _from_onnx(x: Any) -> Array:  # the runtime's result -> a writable NumPy array, same bits
    return np.array(x, copy=True)


def _elem_type(dtype: np.dtype) -> int:
    """The ONNX tensor type of a NumPy dtype (bfloat16: ml_dtypes')."""
    from onnx import TensorProto

    name = np.dtype(dtype).name
    known = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE,
             "bfloat16": TensorProto.BFLOAT16, "bool": TensorProto.BOOL, "int64": TensorProto.INT64}
    if name not in known:
        raise TypeError(f"the ONNX Attention operator takes float16, float32, float64 or bfloat16 "
                        f"arrays here, got {name}")
    return known[name]


def _model(dtype: str, mask: tuple[str, int] | None, past: bool, lengths: bool,
           attributes: tuple[tuple[str, Any], ...]) -> Any:
    """The ``onnx.ModelProto`` of one ``Attention`` node on 4-D inputs of ``dtype`` (every size
    symbolic): an ``attn_mask`` of ``mask = (dtype, rank)`` if given, ``past_key``/``past_value``
    (then ``present_key``/``present_value`` are outputs too), ``nonpad_kv_seqlen`` (opset 24)."""
    from onnx import TensorProto, helper

    elem = _elem_type(np.dtype(dtypes.as_dtype(dtype)))

    def tensor(name: str, elem_type: int, rank: int) -> Any:
        return helper.make_tensor_value_info(name, elem_type, [None] * rank)

    graph_inputs = [tensor(name, elem, 4) for name in ("Q", "K", "V")]
    names = ["Q", "K", "V", "", "", "", ""]
    if mask is not None:
        graph_inputs.append(tensor("attn_mask", _elem_type(np.dtype(dtypes.as_dtype(mask[0]))), mask[1]))
        names[3] = "attn_mask"
    if past:
        graph_inputs += [tensor("past_key", elem, 4), tensor("past_value", elem, 4)]
        names[4:6] = ["past_key", "past_value"]
    if lengths:
        graph_inputs.append(tensor("nonpad_kv_seqlen", TensorProto.INT64, 1))
        names[6] = "nonpad_kv_seqlen"
    while not names[-1]:
        names.pop()
    outputs = ["Y", "present_key", "present_value"] if past else ["Y"]
    node = helper.make_node("Attention", names, outputs, **dict(attributes))
    graph = helper.make_graph([node], "attention", graph_inputs, [tensor(name, elem, 4) for name in outputs])
    opset = OPSET_KV_LENGTHS if lengths else OPSET
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@functools.lru_cache(maxsize=512)
def _graph(runtime: str, dtype: str, mask: tuple[str, int] | None, past: bool, lengths: bool,
           attributes: tuple[tuple[str, Any], ...]) -> Any:
    """``run(feeds) -> [outputs]`` of the graph for these arguments, built once: an ONNX Runtime
    session (CPU execution provider, its default graph optimizations), or a ReferenceEvaluator."""
    model = _model(dtype, mask, past, lengths, attributes)
    if runtime == "onnxruntime":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 4  # its refusals come back as exceptions; not also logged to stderr
        session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                               providers=["CPUExecutionProvider"])
        return lambda feeds: session.run(None, feeds)
    if runtime == "onnx_reference":
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(model)
        return lambda feeds: evaluator.run(None, feeds)
    raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")


def _four_d(x: Array) -> Array:  # [n, d] | [h, n, d] | [b, h, n, d] -> [b, h, n, d], a view
    if x.ndim not in (2, 3, 4):
        raise ValueError(f"the ONNX Attention operator takes q, k, v as (n, d), (h, n, d) or (b, h, n, d), "
                         f"got {x.shape}")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def onnx_attention(
    q: Array, k: Array, v: Array, *, causal: bool = False, mask: Array | None = None,
    scale: float | None = None, bias: Array | None = None, softcap: float | None = None,
    kv_lengths: Array | None = None, past_key: Array | None = None, past_value: Array | None = None,
    runtime: str = "onnxruntime",
) -> Any:  # [..., h, n_q, d_k], [..., g, n_k, d_k], [..., g, n_k, d_v] -> [..., h, n_q, d_v]
    """The ONNX ``Attention`` operator on NumPy arrays, run by ``runtime`` (``onnxruntime`` or
    ``onnx_reference``). With ``past_key``/``past_value`` (``[..., g, n_past, d]``) it returns
    ``(out, present_key, present_value)``, the presents ``[..., g, n_past + n_k, d]`` as the
    operator returns them; otherwise the output alone."""
    q, k, v = (np.asarray(x) for x in (q, k, v))
    ndim, dtype = q.ndim, q.dtype
    if (past_key is None) != (past_value is None):
        raise TypeError("past_key and past_value come together")
    batch = np.broadcast_shapes(_four_d(q).shape[:1], _four_d(k).shape[:1], _four_d(v).shape[:1])
    q4, k4, v4 = (np.ascontiguousarray(np.broadcast_to(x, batch + x.shape[1:]))
                  for x in (_four_d(q), _four_d(k), _four_d(v)))
    feeds: dict[str, Array] = {"Q": q4, "K": k4, "V": v4}
    attn_mask = _attn_mask(mask, bias, dtype)
    if attn_mask is not None:
        feeds["attn_mask"] = attn_mask
    if past_key is not None:
        feeds["past_key"], feeds["past_value"] = (_four_d(np.asarray(x)) for x in (past_key, past_value))
    if kv_lengths is not None:
        feeds["nonpad_kv_seqlen"] = np.asarray(kv_lengths).astype(np.int64)
    attributes: list[tuple[str, Any]] = []
    if causal:
        attributes.append(("is_causal", 1))
    if scale is not None:
        attributes.append(("scale", float(scale)))
    if softcap is not None:
        attributes.append(("softcap", float(softcap)))
    run = _graph(runtime, dtype.name,
                 None if attn_mask is None else (attn_mask.dtype.name, attn_mask.ndim),
                 past_key is not None, kv_lengths is not None, tuple(attributes))
    got = run(feeds)
    out = _from_onnx(got[0])
    out = out.reshape(out.shape[4 - ndim:]) if ndim < 4 else out
    if past_key is None:
        return out
    presents = (_from_onnx(x) for x in got[1:3])
    return (out, *(x.reshape(x.shape[4 - ndim:]) if ndim < 4 else x for x in presents))


def _attn_mask(mask: Array | None, bias: Array | None, dtype: np.dtype) -> Array | None:
    """The operator's one ``attn_mask``: the boolean mask (True = may attend), the bias in the
    inputs' dtype (as the operator adds it), or, with both, the bias where the mask is True and
    −inf elsewhere."""
    def hidden_as_minus_inf(visible: Array, bias: Array) -> Array:
        return np.where(visible, bias, np.array(-np.inf, dtype=dtype)).astype(dtype)

    # No causal here: the operator takes is_causal together with attn_mask.
    folded, _ = fold_masks(mask, None if bias is None else np.asarray(bias).astype(dtype),
                           where=hidden_as_minus_inf)
    return folded


def onnx_target(runtime: str = "onnxruntime", device: str = "cpu") -> Target:
    """The ``onnxruntime`` or ``onnx_reference`` built-in target: the ``Attention`` operator on the
    CPU, as measured (see the module's docstring)."""
    import onnx

    _to_onnx(np.zeros(0), device)  # a device other than the CPU is refused here, naming it
    if runtime == "onnxruntime":
        import onnxruntime

        name = f"onnxruntime {onnxruntime.__version__} Attention (opset {OPSET}/{OPSET_KV_LENGTHS}, CPU)"
        declared: tuple[str, ...] = ("float16", "float32")
        # Found, verified against the operator's documentation, declared (docs/peers.md, with the
        # replay lines): ONNX Runtime's CPU kernel refuses an attn_mask broadcast along the queries
        # (the operator's attn_mask is "broadcastable to (batch_size, q_num_heads,
        # q_sequence_length, total_sequence_length)"), and a call with no keys raises its own Fail,
        # an Exception that is neither ValueError nor TypeError.
        expected: dict[str, str] = {
            "padding_mask_is_truncation": "ONNX Runtime refuses an attn_mask [batch, 1, 1, n_k] broadcast "
                                          "along the queries: 'inconsistent q_sequence_length (between "
                                          "attn_mask and Q)'",
            "empty_keys": "ONNX Runtime refuses n_k = 0 with its own Fail exception ('KV sequence length "
                          "must be greater than 0'), not ValueError or TypeError",
        }
    elif runtime == "onnx_reference":
        name = f"onnx {onnx.__version__} ReferenceEvaluator Attention (opset {OPSET}/{OPSET_KV_LENGTHS})"
        declared = ("float16", "float32", *dtypes.bfloat16_if_installed())
        # Found, verified against the operator's documentation and the evaluator's source
        # (onnx/reference/ops/op_attention.py), declared (docs/peers.md, with the replay lines):
        # its causal mask takes q_sequence_length from attn_mask's shape, so a mask broadcast along
        # the queries gives every query query 0's causal row; and its softmax sums in the inputs'
        # dtype, which for bfloat16 (ml_dtypes' ufuncs) accumulates sequentially in bfloat16.
        expected = {
            "padding_mask_is_truncation": "with is_causal, the reference evaluator reads q_sequence_length "
                                          "from attn_mask's shape: a mask [batch, 1, 1, n_k] broadcast along "
                                          "the queries gives every query the causal row of query 0",
            "long_rows_every_dtype[bfloat16]": "the reference evaluator's softmax sums in bfloat16, "
                                               "sequentially (4,096 ones sum to 256)",
        }
    else:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    fn = functools.partial(onnx_attention, runtime=runtime)
    functools.update_wrapper(fn, onnx_attention)
    return Target(
        fn,
        name=name,
        dtypes=declared,
        ndims=(2, 3, 4),
        supports_mask=True,
        supports_scale=True,
        causal_alignment="top_left_kv_lengths",
        masked_rows="zeros",
        empty_keys="raise",
        exact_masking=True,
        supports_gqa=True,
        supports_bias=True,
        supports_softcap=True,
        supports_kv_lengths=True,
        supports_past_kv=True,
        # A new graph (a session, or an evaluator) per dtype, keyword set and attribute value: a
        # few milliseconds each, cached; generous for a loaded machine.
        deadline_s=60.0,
        expected_failures=expected,
    )


def from_onnx(fn: Any, *, rename: dict[str, str] | None = None, name: str = "",
              **declarations: Any) -> Target:
    """A target from a function of NumPy arrays that runs an ONNX graph (``fn(q, k, v, **keywords)``):
    the suite's arrays go in as copies, keywords spelled as the ``Attention`` operator spells them
    (`SPELLINGS`), ``rename`` overriding. ``declarations`` are `spec.Target`'s."""
    return wrap(FRAMEWORK, fn, rename=rename, name=name, **declarations)


FRAMEWORK = Framework(name="onnx", to_native=_to_onnx, to_numpy=_from_onnx, spellings=SPELLINGS)

TARGETS = {
    "onnxruntime": functools.partial(onnx_target, "onnxruntime"),
    "onnx_reference": functools.partial(onnx_target, "onnx_reference"),
}
"""The built-in targets of this adapter (`spec.adapters.ADAPTERS` names them)."""
