"""The defaults a correct function meets: our own plain NumPy attention (tests/spec/plain_attention.py),
with no declaration, conforms; and what a call with no keys may do under each ``empty_keys``
declaration (spec.laws.edges): by default an output of zeros or a refusal by any exception, the
note saying which; never NaN where zeros are promised, an output of the wrong shape, a crash or
``sys.exit``."""

from __future__ import annotations

import os

import numpy as np
import plain_attention
import pytest

import spec
from impl import attention


def test_a_plain_correct_numpy_attention_conforms_with_no_declaration():
    report = spec.check(plain_attention.attention, "ci")
    assert report.ok, [(r.name, r.message, r.counterexample) for r in report.failures]
    ran = [r for r in report.results if r.status == "pass"]
    assert len(ran) >= 15 and not any(r.message.startswith("not run") for r in report.results)
    (empty,) = [r for r in report.results if r.name == "empty_keys"]
    assert empty.status == "pass"
    assert "refused n_k = 0 with ValueError: zero-size array to reduction operation maximum" in empty.message


@pytest.mark.parametrize("seed", [0, 1])
def test_the_plain_attention_conforms_on_other_example_streams(seed):
    report = spec.check(plain_attention.attention, "quick", seed=seed)
    assert report.ok, [(r.name, r.message, r.counterexample) for r in report.failures]


def _empty_keys(fn, **declared):
    (result,) = spec.check(spec.Target(fn, **declared), "quick", only=["empty_keys"]).results
    return result


def refuses_plainly(q, k, v, *, causal=False):
    if k.shape[-2] == 0:
        raise RuntimeError(f"no keys: k has shape {k.shape}")
    return attention(q, k, v, causal=causal)


def test_by_default_a_refusal_by_any_exception_passes_and_the_note_names_it():
    result = _empty_keys(refuses_plainly)
    assert result.status == "pass", result.message
    assert result.message.startswith("refused n_k = 0 with RuntimeError: no keys: k has shape (0, ")


def test_by_default_zeros_pass_and_the_note_says_so():
    result = _empty_keys(attention)
    assert result.status == "pass" and result.message == "returned zeros for n_k = 0"


def nan_without_keys(q, k, v, *, causal=False):
    if k.shape[-2] == 0:
        return np.full((*q.shape[:-1], v.shape[-1]), np.nan, dtype=q.dtype)
    return attention(q, k, v, causal=causal)


def zeros_like_queries(q, k, v, *, causal=False):
    if k.shape[-2] == 0:
        return np.zeros_like(q)  # width d_k, not d_v
    return attention(q, k, v, causal=causal)


def exits(q, k, v, *, causal=False):
    if k.shape[-2] == 0:
        raise SystemExit(3)
    return attention(q, k, v, causal=causal)


def test_by_default_nan_where_zeros_are_promised_fails():
    result = _empty_keys(nan_without_keys)
    assert result.status == "fail" and "must be exactly 0" in result.message
    assert _empty_keys(nan_without_keys, masked_rows="nan").message == "returned NaN rows for n_k = 0"


@pytest.mark.parametrize("fn, said", [(zeros_like_queries, "the target returned shape"),
                                      (exits, "the target raised SystemExit")])
def test_by_default_a_wrong_shape_or_an_exit_is_no_refusal(fn, said):
    result = _empty_keys(fn)
    assert result.status == "fail" and result.message.startswith(said), result.message


def crashes(q, k, v, *, causal=False):
    if k.shape[-2] == 0:
        os._exit(7)
    return attention(q, k, v, causal=causal)


def test_in_a_worker_process_a_refusal_passes_and_a_crash_fails():
    assert _empty_keys(refuses_plainly, isolation="process").status == "pass"
    result = _empty_keys(crashes, isolation="process")
    assert result.status == "fail" and result.message.startswith("the target ended its worker process with "
                                                                 "exit status 7")
    assert result.counterexample is not None and result.counterexample.case["n_k"] == 0


def test_a_target_that_declares_compute_must_not_raise():
    result = _empty_keys(plain_attention.attention, empty_keys="compute")
    assert result.status == "fail"
    assert "raised ValueError: zero-size array" in result.message and "empty_keys='compute'" in result.message
    assert _empty_keys(attention, empty_keys="compute").status == "pass"


def test_a_target_that_declares_raise_must_not_return_an_output():
    result = _empty_keys(attention, empty_keys="raise")
    assert result.status == "fail" and "declares empty_keys='raise' but returned" in result.message
    assert _empty_keys(plain_attention.attention, empty_keys="raise").status == "pass"  # a ValueError
