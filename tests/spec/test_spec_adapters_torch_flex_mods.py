"""PyTorch's FlexAttention given mask and score functions (spec.adapters.torch_flex_mods): the
library's functions run on torch tensors as on NumPy arrays, the eager path agrees with the golden
on every function of the library at 2, 3 and 4 dimensions, and the built-ins declare what they do.
The compiled path (seconds of compilation per new shape and function on this CPU) runs on one
shape past FlexAttention's block of 128 keys."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spec  # noqa: E402
from spec import oracle  # noqa: E402
from spec.adapters.torch_flex_mods import torch_flex, torch_flex_compiled  # noqa: E402  (needs torch)
from spec.builtin import load_target  # noqa: E402
from spec.inputs import Inputs  # noqa: E402
from spec.keywords.mask_mod import MASKS, mask_mod  # noqa: E402
from spec.keywords.score_mod import score_mod  # noqa: E402

MASK_LIBRARY = [("causal", ()), ("sliding_window", (3,)), ("prefix_lm", (4,)), ("document", ((3, 7),)),
                ("dilated", (3,)), ("block_causal", (4,)), ("head_window", (2,)), ("batch_prefix", (1,))]
SCORE_LIBRARY = [None, ("alibi", ()), ("softcap", (5.0,)), ("relative_bias", (2,))]


def problem(lead, n_q, n_k, *, kv_heads=None, d=8, seed=0):
    rng = np.random.default_rng(seed)
    kv_lead = lead if kv_heads is None else (*lead[:-1], kv_heads)
    q = rng.standard_normal((*lead, n_q, d)).astype(np.float32)
    k, v = (rng.standard_normal((*kv_lead, n_k, d)).astype(np.float32) for _ in range(2))
    return q, k, v


def golden(q, k, v, **kw):
    return oracle.golden_of(Inputs(q, k, v, causal=kw.pop("causal", False), mask=kw.pop("mask", None),
                                   keywords=kw))[0]


def test_the_library_gives_the_same_on_torch_tensors_as_on_numpy_arrays():
    b, h = np.arange(2).reshape(-1, 1, 1, 1), np.arange(3).reshape(1, -1, 1, 1)
    q, kv = np.arange(9).reshape(1, 1, -1, 1), np.arange(11).reshape(1, 1, 1, -1)
    s = np.random.default_rng(0).standard_normal((2, 3, 9, 11)).astype(np.float32)
    tb, th, tq, tkv, ts = (torch.from_numpy(x) for x in (b, h, q, kv, s))
    assert sorted(MASKS) == sorted(name for name, _ in MASK_LIBRARY)
    for parameter in MASK_LIBRARY:
        for form in (0, 1):
            function = mask_mod(parameter, form)
            assert np.array_equal(function(tb, th, tq, tkv).numpy(), function(b, h, q, kv)), (parameter, form)
    for parameter in SCORE_LIBRARY[1:]:
        function = score_mod(parameter)
        np.testing.assert_allclose(function(ts, tb, th, tq, tkv).numpy(), function(s, b, h, q, kv),
                                   rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("parameter", MASK_LIBRARY, ids=[p[0] for p in MASK_LIBRARY])
def test_eager_flex_agrees_with_the_golden_on_every_function(parameter):
    q, k, v = problem((2, 4), 9, 13, kv_heads=2)
    for scores in SCORE_LIBRARY:
        kw = {"mask_mod": mask_mod(parameter), "score_mod": None if scores is None else score_mod(scores)}
        np.testing.assert_allclose(torch_flex(q, k, v, **kw), golden(q, k, v, **kw), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("lead", [(), (3,)])
def test_inputs_without_batch_or_heads_are_read_as_index_zero(lead):
    q, k, v = problem(lead, 6, 7)
    kw = {"mask_mod": mask_mod(("head_window", (1,))), "score_mod": score_mod(("alibi", ()))}
    out = torch_flex(q, k, v, causal=True, **kw)
    assert out.shape == (*lead, 6, 8)
    np.testing.assert_allclose(out, golden(q, k, v, causal=True, **kw), rtol=2e-5, atol=2e-5)


def test_a_mask_table_causal_and_a_mask_function_are_anded():
    q, k, v = problem((1, 2), 8, 8)
    table = np.random.default_rng(3).random((1, 2, 8, 8)) < 0.7
    kw = {"mask_mod": mask_mod(("dilated", (2,)))}
    out = torch_flex(q, k, v, causal=True, mask=table, **kw)
    np.testing.assert_allclose(out, golden(q, k, v, causal=True, mask=table, **kw), rtol=2e-5, atol=2e-5)
    for fewer in ({"causal": True, **kw}, {"mask": table, **kw}, {"causal": True, "mask": table}):
        assert np.abs(out - golden(q, k, v, **fewer)).max() > 1e-3  # each of the three hides something


def test_a_call_with_no_keys_raises_an_index_error_declared_as_an_expected_failure():
    q, k, v = problem((1, 1), 3, 0)
    assert "IndexError" in load_target("torch_flex").expected_failures["empty_keys"]
    for kw in ({}, {"mask_mod": mask_mod(("causal", ()))}):
        with pytest.raises(IndexError):
            torch_flex(q, k, v, **kw)


def test_the_eager_built_in_conforms_to_the_mask_and_score_laws():
    laws = [name for name, law in spec.LAWS.items() if law.family == "mods"]
    report = spec.check("torch_flex", profile="quick", max_examples=4, seed=0, only=laws)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert {r.name for r in report.results if r.status == "pass"} == set(laws)


def test_compiled_flex_agrees_past_its_block_of_128_keys():
    """n_k = 129: a full block of 128 keys and a partial one of 1 (pytorch/pytorch#159247's shape)."""
    q, k, v = problem((1, 2), 17, 129)
    functions = ((("sliding_window", (40,)), ("softcap", (5.0,))), (("document", ((50, 128),)), None))
    for masks, scores in functions:
        kw = {"mask_mod": mask_mod(masks), "score_mod": None if scores is None else score_mod(scores)}
        np.testing.assert_allclose(torch_flex_compiled(q, k, v, **kw), golden(q, k, v, **kw), rtol=2e-5,
                                   atol=2e-5)


def test_compiled_flex_refuses_float64_so_its_built_in_declares_float32_only():
    q, k, v = problem((1, 1), 3, 5)
    assert load_target("torch_flex_compiled").dtypes == ("float32",)
    with pytest.raises(Exception, match="supported in FlexAttention for CPU"):
        torch_flex_compiled(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                            mask_mod=mask_mod(("causal", ())))


def test_compiled_flex_takes_a_second_key_length_with_a_mask_table():
    """Compiled for static shapes: compiled for dynamic ones (dynamo's default on a second key length),
    the CPU kernel inductor generates does not compile (torch 2.13.0+cpu)."""
    for n_k in (1, 17):
        q, k, v = problem((1, 1), 1, n_k, d=64)
        table = np.ones((1, 1, 1, n_k), dtype=bool)
        np.testing.assert_allclose(torch_flex_compiled(q, k, v, mask=table), golden(q, k, v, mask=table),
                                   rtol=2e-5, atol=2e-5)
