"""Targets: declarations are validated, names load, layouts are translated."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from impl import attention
from spec import Target, TargetError, load_target


def test_plain_callable_gets_default_capabilities():
    target = spec.as_target(attention)
    assert target.dtypes == ("float32", "float64") and target.layout == "bhnd"
    assert target.causal_alignment == "top_left" and target.masked_rows == "zeros"
    assert not (target.supports_mask or target.supports_scale or target.supports_gqa)
    assert not target.has_gradients and target.tolerance == 2.0
    assert target.name == "impl.attention:attention"


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [("dtypes", ("int8",), "dtypes"), ("dtypes", ("nope",), "dtypes"), ("dtypes", (), "dtypes"),
     ("layout", "nhd", "layout"), ("masked_rows", "ones", "masked_rows"), ("ndims", (5,), "ndims"),
     ("causal_alignment", "left", "causal_alignment"), ("tolerance", 0.0, "tolerance"),
     ("deadline_s", -1.0, "deadline_s"), ("empty_keys", "zeros", "empty_keys")],
)
def test_bad_declaration_is_refused_naming_the_field(field, value, named):
    with pytest.raises(TargetError, match=named):
        Target(attention, **{field: value})


def test_target_fn_must_be_callable():
    with pytest.raises(TargetError, match="callable"):
        Target(3)  # type: ignore[arg-type]


def test_builtin_names_load():
    assert load_target("reference").fn is attention
    assert load_target("flash").name == "flash"


def test_module_attr_loads_a_callable_or_a_target():
    assert load_target("impl:flash_attention").name == "impl:flash_attention"


@pytest.mark.parametrize(
    ("text", "message"),
    [("nope", "unknown target 'nope'"), ("impl:nope", "has no attribute 'nope'"),
     ("no_such_module:f", "cannot import module 'no_such_module'"), (":f", "package.module:attr"),
     ("impl.attention:Array.nope", "has no attribute")],
)
def test_unloadable_target_names_what_is_wrong(text, message):
    with pytest.raises(TargetError, match=message):
        load_target(text)


def test_non_callable_attribute_is_refused():
    with pytest.raises(TargetError, match="callable"):
        load_target("impl.flash:DEFAULT_BLOCK")


def test_peer_targets_fail_with_one_clear_line_when_unavailable(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "spec.frameworks", None)  # import of spec.frameworks now fails
    with pytest.raises(TargetError, match="built-in target 'torch'"):
        load_target("torch")


def test_bnhd_layout_is_translated_both_ways():
    seen = {}

    def sequence_major(q, k, v, *, causal=False):
        seen["shape"] = q.shape
        return np.swapaxes(attention(np.swapaxes(q, 1, 2), np.swapaxes(k, 1, 2), np.swapaxes(v, 1, 2)), 1, 2)

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 7)))
    out = Target(sequence_major, layout="bnhd")(q, k, v)
    assert seen["shape"] == (2, 5, 3, 4)
    np.testing.assert_allclose(out, attention(q, k, v), rtol=1e-12)


def test_flags_are_passed_only_when_set():
    calls = []

    def bare(q, k, v):  # takes no keyword at all
        calls.append(1)
        return attention(q, k, v)

    x = np.ones((2, 2))
    Target(bare, causal_alignment=None)(x, x, x)
    assert calls == [1]


def test_replace_keeps_validation():
    target = load_target("reference").replace(tolerance=4.0)
    assert target.tolerance == 4.0
    with pytest.raises(TargetError):
        target.replace(layout="xyz")
