"""Declarations of how a serving kernel takes its keywords (`spec.Target`'s ``window_sides``,
``window_needs_causal``, ``alibi_shape``, ``fp8_scale``, ``block_multiple``): each narrows the
keyword's draws so that no call breaks it, a law that cannot be drawn inside it is skipped naming
it, and a small kernel of our own with that contract conforms with the declaration alone and fails
without it (the gallery's correct serving kernels, `gallery.window`, `gallery.alibi`, `gallery.cache`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gallery.alibi import heads_alibi_kernel
from gallery.cache import block16_kernel, tensor_fp8_kernel
from gallery.window import SERVING, causal_window_kernel, left_window_kernel

import spec
from impl import attention
from spec import Target
from spec.cases import limits_text, outside_keyword_forms
from spec.dtypes import has_ml_dtypes
from spec.keywords import registered
from spec.target import TargetError

Array = np.ndarray


KERNELS = {
    "window_sides": (left_window_kernel, {"supports_window": True}, "left"),
    "window_needs_causal": (causal_window_kernel, {"supports_window": True}, True),
    "alibi_shape": (heads_alibi_kernel, {"supports_alibi": True}, "heads"),
    "block_multiple": (block16_kernel, {"supports_paged_kv": True}, 16),
    "fp8_scale": (tensor_fp8_kernel, {"supports_fp8_kv": True, "supports_gqa": True}, "tensor"),
}


def _laws_of(capability: str) -> list[str]:
    """The laws of a keyword, by its capability, and the law of keywords two at a time."""
    return [name for name, law in spec.LAWS.items() if f"({capability})" in law.requires
            or name == "keyword_pairs_match_golden"]


def kernel(field: str, *, declared: bool) -> Target:
    fn, capabilities, value = KERNELS[field]
    return Target(fn, **SERVING, **capabilities, **({field: value} if declared else {}))


def _fields() -> list[str]:
    return [f for f in KERNELS if f != "fp8_scale" or has_ml_dtypes()]


@pytest.mark.parametrize("field", _fields())
def test_a_kernel_conforms_with_its_declaration_alone(field):
    """At ci, over its keyword's laws and the pairs, the kernel is never called outside its contract."""
    target = kernel(field, declared=True)
    report = spec.check(target, profile="ci", only=_laws_of(next(iter(KERNELS[field][1]))))
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert sum(r.status == "pass" for r in report.results) >= 3


@pytest.mark.parametrize("field", _fields())
def test_a_kernel_fails_without_its_declaration(field):
    report = spec.check(kernel(field, declared=False), profile="ci",
                        only=_laws_of(next(iter(KERNELS[field][1]))))
    assert not report.ok


SKIPPED = [("window_sides", "window_with_causal"), ("alibi_shape", "alibi_per_batch_and_head"),
           ("fp8_scale", "fp8_per_row_and_kv_head")]


@pytest.mark.parametrize(("field", "law"), [s for s in SKIPPED if s[0] in _fields()])
def test_a_law_that_cannot_be_drawn_inside_a_declaration_is_skipped_naming_it(field, law):
    target = kernel(field, declared=True)
    (result,) = spec.check(target, profile="quick", only=[law]).results
    value = KERNELS[field][2]
    assert result.status == "skip" and f"{field}={value!r}" in result.message, result.message
    (plain,) = spec.check(target.replace(**{field: Target.__dataclass_fields__[field].default}),
                          profile="quick", only=[law]).results
    assert plain.status != "skip"


def test_a_left_only_window_without_a_causal_mode_skips_the_widening_law():
    target = kernel("window_sides", declared=True).replace(causal_alignment=None)
    (result,) = spec.check(target, profile="quick", only=["window_wider_than_sequence"]).results
    assert result.status == "skip" and "window_sides='left'" in result.message


def _drawn(field: str, laws: list[str], count: int = 25) -> list[Any]:
    """The calls the laws' strategies draw for the declared kernel, without the runner's filter."""
    from hypothesis import HealthCheck, given, settings

    target = kernel(field, declared=True)
    found: list[Any] = []
    for name in laws:
        law = spec.LAWS[name]
        if law.needs(target) is not None:
            continue

        @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
        @given(law.strategy(target))
        def collect(case: Any) -> None:
            found.append(case.inputs())

        collect()
    return found


@pytest.mark.parametrize("field", _fields())
def test_every_draw_of_a_keyword_respects_its_declaration(field):
    """The keyword's own draws are narrowed (not only filtered by the runner): no case a law draws
    breaks the declaration, and the declaration's form is met (a left side, a causal window ...)."""
    target = kernel(field, declared=True)
    laws = _laws_of(next(iter(KERNELS[field][1])))
    drawn = _drawn(field, laws)
    assert len(drawn) >= 50
    assert [outside_keyword_forms(target, inputs) for inputs in drawn] == [None] * len(drawn)
    given = [x for x in drawn if any(x.get(n) is not None for n in ("window", "alibi_slopes", "k_descale",
                                                                        "block_table"))]
    assert len(given) >= len(drawn) // 2


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("window_sides", "right", "window_sides must be one of"),
    ("alibi_shape", "batch", "alibi_shape must be one of"),
    ("fp8_scale", "row", "fp8_scale must be one of"),
    ("block_multiple", 0, "block_multiple must be a positive integer"),
    ("block_multiple", True, "block_multiple must be a positive integer"),
    ("block_multiple", 16.0, "block_multiple must be a positive integer"),
    ("window_needs_causal", "yes", "window_needs_causal must be True or False"),
])
def test_a_declaration_outside_its_choices_is_refused(field, value, fragment):
    capabilities = {capability: True for _, declared, _ in KERNELS.values() for capability in declared
                    if capability != "supports_fp8_kv" or has_ml_dtypes()}
    with pytest.raises(TargetError, match=fragment):
        Target(attention, **capabilities, **{field: value})


@pytest.mark.parametrize("field", list(KERNELS))
def test_a_declaration_needs_the_keyword_it_narrows(field):
    _, declared, value = KERNELS[field]
    with pytest.raises(TargetError, match=f"{field}=.* needs {next(iter(declared))}=True"):
        Target(attention, **{field: value})


def test_a_window_only_with_causal_needs_a_causal_mode():
    with pytest.raises(TargetError, match="window_needs_causal=True needs a causal mode"):
        Target(attention, supports_window=True, window_needs_causal=True, causal_alignment=None)


def test_the_declarations_are_listed_in_the_limits_header():
    target = Target(attention, supports_window=True, supports_alibi=True, supports_paged_kv=True,
                    window_sides="left", window_needs_causal=True, alibi_shape="heads", block_multiple=16)
    said = limits_text(target)
    for part in ("window_sides='left'", "window_needs_causal", "alibi_shape='heads'", "block_multiple=16"):
        assert part in said
    assert limits_text(Target(attention, supports_window=True, supports_alibi=True)) == ""


def test_a_call_outside_a_declaration_is_named():
    from spec.inputs import Inputs

    q = np.zeros((2, 2, 3, 4))
    target = Target(attention, supports_window=True, supports_alibi=True, window_sides="left",
                    window_needs_causal=True, alibi_shape="heads")
    call = Inputs(q, q, q, causal=True, keywords={"window": (2, 0), "alibi_slopes": np.ones(2)})
    assert outside_keyword_forms(target, call) is None
    assert outside_keyword_forms(target, call.replace(window=(2, 1))) == "window_sides='left'"
    assert outside_keyword_forms(target, call.replace(causal=False)) == "window_needs_causal=True"
    assert outside_keyword_forms(target, call.replace(alibi_slopes=np.ones((2, 2)))) == "alibi_shape='heads'"


@pytest.mark.skipif(not has_ml_dtypes(), reason="float8 caches need ml_dtypes")
def test_unequal_descales_break_a_per_tensor_declaration():
    from spec.inputs import Inputs

    q = np.zeros((2, 2, 3, 4))
    target = Target(attention, supports_fp8_kv=True, fp8_scale="tensor")
    same = np.full((2, 2), 0.5, dtype=np.float32)
    call = Inputs(q, q, q, keywords={"k_descale": same, "v_descale": same * 2})
    assert outside_keyword_forms(target, call) is None
    other = same.copy()
    other[1, 1] = 0.25
    assert outside_keyword_forms(target, call.replace(k_descale=other)) == "fp8_scale='tensor'"


def test_the_declarations_name_registered_keywords():
    """Each declaration narrows a keyword the suite declares (its capability is a keyword's)."""
    capabilities = {kw.field for kw in registered().values()}
    assert {c for _, declared, _ in KERNELS.values() for c in declared} - {"supports_gqa"} <= capabilities
