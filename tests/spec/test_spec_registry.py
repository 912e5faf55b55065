"""The registry is an explicit list of law modules; @law only marks, nothing registers on import."""

from __future__ import annotations

import pytest

import spec
from spec import registry


def test_properties_come_from_the_explicit_module_list_in_order():
    families = [p.family for p in spec.LAWS.values()]
    order = ["core", "masks", "gradients", "bias", "alibi", "window", "chunk", "topk", "topk_blocks", "mla",
             "softcap", "mods", "sinks", "lengths", "cache", "past", "dropout", "lse", "invariance",
             "cascade", "grad_keywords", "pairs", "calls", "edges", "stateful", "long_runs", "scale", "merge",
             "ranks"]
    assert [f for i, f in enumerate(families) if f not in families[:i]] == order
    assert registry.LAW_MODULES == tuple(f"spec.laws.{f}" for f in order)
    per_module = {module: list(registry.collect((module,))) for module in registry.LAW_MODULES}
    assert all(per_module.values()), [module for module, found in per_module.items() if not found]
    # the registry is every module's laws, module after module, none lost, doubled or reordered
    assert list(spec.LAWS) == [name for found in per_module.values() for name in found]


def test_collecting_one_module_gives_only_its_laws():
    masks = registry.collect(("spec.laws.masks",))
    assert list(masks) == ["padding_mask_is_truncation", "bottom_right_causal_mask", "long_rows_every_dtype"]


def test_a_law_module_not_in_the_list_registers_nothing(tmp_path, monkeypatch):
    (tmp_path / "extra_laws.py").write_text(
        "from spec.registry import law\n\n"
        "@law()\ndef extra(target, case):\n    '''A law.\\n\\nCatches: x.'''\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import extra_laws  # noqa: F401

    assert "extra" not in registry.collect()  # imported, yet not in LAW_MODULES: not collected
    found = registry.collect(("extra_laws",))
    assert found["extra"].statement == "A law." and found["extra"].catches == "Catches: x."
    with pytest.raises(ValueError, match="defined in both"):
        registry.collect(("extra_laws", "extra_laws"))


def test_property_says_what_a_generated_reference_needs():
    prop = spec.LAWS["mask_semantics"]
    assert (prop.name, prop.family, prop.module) == ("mask_semantics", "core", "spec.laws.core")
    assert prop.requires == "mask= (supports_mask)" and prop.catches.startswith("Catches")


def test_a_law_states_its_needs_one_way():
    with pytest.raises(TypeError, match="needs must be a Need"):
        registry.law(needs=lambda t: None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("module", "old", "new"), [
    ("spec", "PROPERTIES", "LAWS"), ("spec", "Property", "Law"),
    ("spec.registry", "PROPERTIES", "LAWS"), ("spec.registry", "Property", "Law"),
    ("spec.runner", "run_property", "check_law"), ("spec.pytest_plugin", "PropertyItem", "LawItem"),
])
def test_the_old_names_of_laws_still_work_with_a_deprecation_warning(module, old, new):
    import importlib

    where = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use .*{new}"):
        value = getattr(where, old)
    assert value is getattr(where, new)


def test_a_law_says_its_statement_and_the_old_attribute_warns():
    law = spec.LAWS["rows_sum_to_one"]
    assert law.statement.startswith("Every query row that sees a key")
    with pytest.warns(DeprecationWarning, match="Law.law is deprecated"):
        assert law.law == law.statement


def test_each_law_says_what_its_failure_tells():
    """The report's order of failures is data on each law (`Law.scope`): the call first, the generic
    comparisons with the golden last; a scope that is not one of `SCOPES` is refused, naming it."""
    laws = registry.laws()
    assert {law.scope for law in laws.values()} == set(registry.SCOPES)
    assert laws["output_shape_dtype"].scope == "call" and laws["causal_no_leak"].scope == "named"
    assert {name for name, law in laws.items() if law.scope == "generic"} >= {
        "matches_golden", "large_logits", "large_values", "long_rows_every_dtype", "grad_matches_golden",
        "keyword_pairs_match_golden"}
    with pytest.raises(ValueError, match=r"scope must be one of .*'golden'"):
        registry.law(scope="golden")


def test_a_float8_law_names_every_missing_need_at_once(monkeypatch):
    """Without ml_dtypes and without the float8 declaration the skip note names both, so that
    installing ml-dtypes is not followed by a second note naming a declaration the first left out."""
    from impl import attention
    from spec import dtypes

    undeclared = spec.Target(attention, ndims=(4,))
    declared = undeclared.replace(supports_fp8_kv=True)
    fp8 = [law for law in spec.LAWS.values() if law.name.startswith("fp8_")]
    assert fp8
    for law in fp8:
        assert law.needs(undeclared) == "needs k_descale=/v_descale= (target declares supports_fp8_kv=False)"
        monkeypatch.setattr(dtypes, "has_ml_dtypes", lambda: False)
        note = law.needs(undeclared)
        assert note is not None and "supports_fp8_kv=False" in note and note.endswith("pip install ml-dtypes")
        assert law.needs(declared) == ("needs ml_dtypes for float8_e4m3fn, which is not installed: "
                                       "pip install ml-dtypes")
        monkeypatch.undo()
        assert law.needs(declared) is None
