"""Targets: declarations are validated, names load, layouts are translated."""

from __future__ import annotations

from pathlib import Path

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
    with pytest.raises(TargetError, match=r"DEFAULT_BLOCK' is tuple \(256, 2048\), not a callable"):
        load_target("impl.flash:DEFAULT_BLOCK")


@pytest.mark.parametrize(
    ("text", "message"),
    [("examples.my_attention:targte", "has no attribute 'targte'; did you mean 'target'?"),
     ("examples.my_atention:target",
      "No module named 'examples.my_atention'; did you mean 'examples.my_attention'?"),
     ("exmaples.my_attention:target", "did you mean 'examples'?"),
     ("examples/my_atention.py:target", "; did you mean 'examples/my_attention.py'?"),
     ("examples/my_attention:target", "give examples.my_attention:NAME or examples/my_attention.py:NAME"),
     ("impl:flash_atention", "did you mean 'flash_attention' or")],
)
def test_a_typo_gets_did_you_mean(text, message, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    with pytest.raises(TargetError) as raised:
        load_target(text)
    assert message in str(raised.value)


def test_a_missing_dependency_is_not_a_typo(tmp_path, monkeypatch):
    (tmp_path / "needs_it.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TargetError, match=r"No module named 'no_such_dependency_xyz'$"):
        load_target("needs_it:f")


def test_a_script_loads_by_its_path_without_running_its_main_block(tmp_path, monkeypatch):
    (tmp_path / "helper.py").write_text("from impl import attention as attn\n")
    (tmp_path / "script.py").write_text(
        "from helper import attn  # a sibling module, as when the script runs\n"
        "import spec\n"
        "target = spec.Target(attn, name='scripted', supports_scale=True)\n"
        "if __name__ == '__main__':\n"
        "    raise SystemExit('the main block ran')\n")
    monkeypatch.chdir(tmp_path)
    target = load_target("script.py:target")
    assert target.name == "scripted" and target.fn is attention and target.supports_scale
    assert load_target(f"{tmp_path}/script.py:target") is target  # one module per file
    assert load_target("script.py:attn").name == "script.py:attn"


def test_the_example_loads_by_module_or_by_path(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    by_path = load_target("examples/my_attention.py:target")
    by_module = load_target("examples.my_attention:target")
    assert by_path.name == by_module.name == "my_attention" and by_path.masked_rows == "nan"


def test_peer_targets_fail_with_one_clear_line_when_unavailable(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails, as where it is not installed
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
