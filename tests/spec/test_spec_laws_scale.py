"""spec.laws.scale, spec.scale_plan and --profile scale: the cases at the reports' shapes (planned,
not run: the real sizes take minutes), composed with the target's capabilities, limits and memory
budget; their inputs; the tolerance for long 16-bit rows; the profile running only its laws, and
they only there; and the laws run at small sizes (`scale_plan.sized`) against the built-in
targets."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from spec import context, scale_plan, tolerance
from spec.builtin import load_target
from spec.inputs import Inputs
from spec.laws import scale
from spec.profiles import PROFILES, runs_at

SMALL = scale_plan.Sizes(decode_keys=3_000, square=300, slices=(40, 3), packed=(6, 33), elements=(2, 700, 8),
                         width=8, needles=(2**9, 2**10, 2**11), needle_keys=2**11 + 64)
REFERENCE, FLASH = load_target("reference"), load_target("flash")


def planned(target, gib=8.0):
    with context.memory(gib * 2**30):
        return {p.name: p for p in scale_plan.plan(target)}


def test_the_cases_have_the_reports_shapes():
    plan = planned(REFERENCE, 1e4)
    shapes = {name: p.case for name, p in plan.items()}
    assert shapes["decode"].n_q == 1 and shapes["decode"].n_k >= 350_000
    square = shapes["causal_square"]
    assert square.n_q == square.n_k == 65_537 and square.causal
    assert shapes["slices"].batch * shapes["slices"].heads >= 132_800 and shapes["slices"].n_q == 1
    offsets_q, _ = shapes["packed"].keywords["varlen"]
    assert offsets_q[-1] > 2**17 and offsets_q[-2] > 2**17  # more than 2^17 tokens, the last sequence past it
    big = shapes["elements_2^31"]
    assert big.heads * big.n_k * big.d_k > 2**31
    needles = shapes["needles"]
    assert needles.n_k > 2**18 and needles.heads == 3 and needles.n_q == 1  # a decode row per needle


def test_the_needles_sit_past_each_power_of_two_where_an_index_wraps():
    with context.memory(1e4 * 2**30):
        plan = {p.name: p for p in scale_plan.plan(REFERENCE)}
        keys = {name: [n.key for n in scale_plan.needles_of(REFERENCE, p.case)] for name, p in plan.items()}
        packed = scale_plan.needles_of(REFERENCE, plan["packed"].case)[0]
        flat = spec.Target(lambda q, k, v, causal=False: q, ndims=(2,))  # one slice: rows 0, 1, 2
        case = planned(flat, 1e4)["needles"].case
        rows = [(n.at, n.row, n.axis) for n in scale_plan.needles_of(flat, case)]
    assert keys["needles"] == [2**16, 2**17, 2**18]
    assert keys["packed"] == keys["packed_decode"] == [2**17]
    big = plan["elements_2^31"].case
    last, first = keys["elements_2^31"]
    assert last == big.n_k - 1 and ((big.heads - 1) * big.n_k + first) * big.d_k >= 2**31  # past 2^31 in bhnd
    assert keys["decode"] == keys["causal_square"] == keys["slices"] == []
    cu_q, cu_k = plan["packed"].case.keywords["varlen"]
    s = int(np.searchsorted(cu_k, 2**17, side="right")) - 1
    assert packed.row == cu_q[s + 1] - 1  # the last query of the sequence holding token 2^17
    assert rows == [((), 0, 0), ((), 1, 1), ((), 2, 2)]
    decoding = planned(FLASH.replace(ndims=(2,), decode_only=True), 1e4)
    assert decoding["needles"].case is None and "decode_only=True" in decoding["needles"].why


def test_a_needle_dominates_its_row_and_its_value_is_the_rows_output():
    with scale_plan.sized(SMALL), context.memory(2**30):
        plan = {p.name: p.case for p in scale_plan.plan(REFERENCE)}
        for name in ("needles", "packed", "elements_2^31"):
            needles = scale_plan.needles_of(REFERENCE, plan[name])
            inputs = scale_plan.inputs_of(plan[name], needles)
            out = np.asarray(REFERENCE.fn(inputs.q, inputs.k, inputs.v, causal=inputs.causal,
                                          **dict(inputs.keywords)), dtype=np.float64)
            for n in needles:
                assert scale._weight(inputs, n) > 1 - 1e-6
                assert np.allclose(out[(*n.at, n.row)][:-1], n.value, rtol=1e-3), (name, n)
                assert out[(*n.at, n.row, -1)] == pytest.approx(1, rel=1e-3)  # the weight sum column


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_key_index_that_wraps_fails_the_needles_where_a_diffuse_row_may_not_show_it(dtype):
    """Key 2^18 read as key 0 (tests/spec/gallery/scale.py): the needle's row reads an ordinary
    key's value; in bfloat16, the diffuse decode row over 350,000 keys is within tolerance."""
    from gallery.scale import key_index_wraps

    sizes = scale_plan.Sizes(**{**SMALL.__dict__, "needles": (2**16, 2**17, 2**18),
                                "needle_keys": 2**18 + 2**12, "decode_keys": 350_000})
    target = spec.Target(key_index_wraps, name="wraps", ndims=(3, 4), holds_scores=False, dtypes=(dtype,))
    with scale_plan.sized(sizes):
        report = spec.check(target, profile="scale", memory=4,
                            only=["scale_matches_golden", "scale_needles_found"])
    status = {r.name: r for r in report.results}
    assert status["scale_needles_found"].status == "fail"
    said = status["scale_needles_found"].message
    assert "row 0 → key 262,144 (2^18) should read the needle's value 6" in said
    assert "2^16" not in said  # the keys before the wrap are read
    if dtype == "bfloat16":
        assert status["scale_matches_golden"].status == "pass"


def test_a_case_over_the_budget_is_not_run_naming_it():
    plan = planned(REFERENCE, 8)
    assert plan["causal_square"].case is None
    assert "over the memory budget of 8 GiB" in plan["causal_square"].why
    assert plan["decode"].case is not None and plan["slices"].case is not None
    tiled = planned(FLASH, 8)  # impl.flash holds a tile of scores, not the square
    assert tiled["causal_square"].case is not None and tiled["elements_2^31"].case is None
    decode = plan["decode"].case
    assert scale_plan.footprint(REFERENCE, decode) > scale_plan.footprint(FLASH, decode)
    nothing = planned(REFERENCE, 1e-3)
    assert all(p.case is None for p in nothing.values())


def test_the_cases_follow_the_targets_limits_and_capabilities():
    limited = planned(FLASH.replace(seq_multiple=128, head_dims=(64, 128)), 1e4)
    square = limited["causal_square"].case
    assert square.n_q % 128 == 0 and square.n_q >= 65_537 and square.d_k == 64
    assert limited["decode"].case.n_k % 128 == 0
    capped = planned(FLASH.replace(max_seq=100_000), 1e4)
    assert capped["decode"].case is None and "max_seq=100000" in capped["decode"].why
    assert "supports_varlen=False" in capped["packed"].why
    no_causal = planned(FLASH.replace(causal_alignment=None), 1e4)
    assert no_causal["causal_square"].case is None and "causal mode" in no_causal["causal_square"].why
    plain = planned(spec.Target(lambda q, k, v, causal=False: q), 1e4)  # ndims (2, 4): 4-D cases
    assert plain["slices"].case.ndim == 4 and plain["decode"].case.dtype == "float32"


def test_inputs_are_drawn_in_blocks_with_a_weight_sum_column():
    with scale_plan.sized(SMALL), context.memory(2**30):
        case = scale_plan.plan(REFERENCE)[0].case
        inputs = scale_plan.inputs_of(case)
        again = scale_plan.inputs_of(case)
    assert inputs.q.dtype == np.float16 and inputs.k.shape[-2] == 3_000
    assert np.all(inputs.v[..., -1] == 1) and np.array_equal(again.k, inputs.k)
    assert float(np.std(inputs.k.astype(np.float64))) == pytest.approx(0.25, rel=0.05)  # √(1/16)
    with pytest.raises(ValueError):
        inputs.q[..., 0] = 0  # read-only, as a case's arrays are


def test_the_long_row_floor_counts_the_sum_in_float32_for_16_bit_inputs():
    """At 350,000 keys the suite's float16 floor exceeds the output (√n_k·eps·max|V| alone is
    0.58·max|V|); the scale floor keeps the scores' float16 rounding and sums in float32."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, n, 16)).astype(np.float16) for n in (1, 350_000, 350_000))
    inputs, rows = Inputs(q, k, v), np.array([0])
    suite = tolerance.floor(q, k, v, scale=inputs.scale_value)
    mine = scale.long_row_floor(REFERENCE, inputs, rows)
    assert mine < suite / 3
    assert scale.accumulator(REFERENCE, inputs) == "float32"
    wide = Inputs(*(x.astype(np.float64) for x in (q, k, v)))
    assert scale.accumulator(REFERENCE, wide) == "float64"
    assert scale.long_row_floor(REFERENCE, wide, rows) == pytest.approx(
        tolerance.floor(wide.q, wide.k, wide.v, scale=inputs.scale_value), rel=1e-9)


def test_the_scale_profile_runs_its_laws_alone_and_they_run_nowhere_else():
    assert PROFILES["scale"].family == "scale"
    assert runs_at("scale", "ci") == "runs only at --profile scale"
    assert "--profile quick|ci|thorough" in runs_at("core", "scale")
    assert runs_at("core", "ci") is None and runs_at("scale", "scale") is None
    with scale_plan.sized(SMALL):
        report = spec.check("reference", profile="scale", memory=1, only=["matches_golden",
                                                                          "scale_finite_everywhere"])
    status = {r.name: r for r in report.results}
    assert status["matches_golden"].status == "skip" and "--profile scale" in status["matches_golden"].message
    assert status["scale_finite_everywhere"].status == "pass"
    with pytest.raises(ValueError, match="memory"):
        spec.check("reference", profile="scale", memory=0)


@pytest.mark.parametrize("name", ["reference", "flash"])
def test_the_builtin_targets_conform_at_small_scale_sizes(name):
    with scale_plan.sized(SMALL):
        report = spec.check(name, profile="scale", memory=2)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert [r.name for r in report.results] == ["scale_matches_golden", "scale_finite_everywhere",
                                               "scale_hidden_keys_unmoved", "scale_needles_found",
                                               "scale_gradients_match_golden"]
    assert all(r.status == "pass" and r.examples >= 1 for r in report.results)
    assert report.scale.startswith("memory budget 2 GiB")
    if name == "flash":  # no packed sequences: named in the header and the notes
        assert "packed: needs cu_seqlens_q=" in report.scale
        assert "not run: packed, packed_decode" in report.results[0].message


def test_torch_conforms_at_small_scale_sizes():
    pytest.importorskip("torch")
    with scale_plan.sized(SMALL):
        report = spec.check("torch", profile="scale", memory=2)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert sum(r.status == "pass" for r in report.results) == 5


def test_a_wrong_row_past_the_sampled_edges_fails_at_scale():
    """A target that is right but for its last query row fails scale_matches_golden there."""
    def last_row_off(q, k, v, causal=False):
        out = np.array(FLASH.fn(q, k, v, causal=causal))
        out[..., -1, :] += 1
        return out

    target = spec.Target(last_row_off, name="last_row_off", holds_scores=False)
    with scale_plan.sized(SMALL):
        report = spec.check(target, profile="scale", memory=2, only=["scale_matches_golden",
                                                                     "scale_finite_everywhere"])
    status = {r.name: r for r in report.results}
    assert status["scale_matches_golden"].status == "fail"
    assert "at decode (1 sampled rows: [0]), the output differs" in status["scale_matches_golden"].message
    assert status["scale_finite_everywhere"].status == "pass"


def test_the_default_budget_is_half_the_available_memory():
    assert 0 < scale_plan.default_budget() < 2**50
    with context.memory(None):
        assert scale_plan.budget() == scale_plan.default_budget()


def test_outputs_are_kept_within_a_check_for_the_very_fn_that_gave_them():
    """`scale_plan.output` keeps a deterministic target's output for the next laws of one check
    only (`scale_plan.checking`), for that very ``fn`` (held, compared by identity: never a new
    function's), and nothing outside a check or from one check to the next."""
    calls = []

    def counted(q, k, v, causal=False):
        calls.append(1)
        return FLASH.fn(q, k, v, causal=causal)

    target = spec.Target(counted, name="counted", holds_scores=False)
    with scale_plan.sized(SMALL), context.memory(2**30):
        case = {p.name: p.case for p in scale_plan.plan(target)}["decode"]
        scale_plan.output(target, case)
        scale_plan.output(target, case)
        assert len(calls) == 2  # outside a check: nothing kept
        with scale_plan.checking(target):
            _, first = scale_plan.output(target, case)
            _, again = scale_plan.output(target, case)
            assert len(calls) == 3 and again is first
            other = target.replace(fn=lambda q, k, v, causal=False: counted(q, k, v, causal=causal))
            assert scale_plan.output(other, case)[1] is not first and len(calls) == 4  # another fn
            scale_plan.output(target.replace(deterministic=False), case)
            assert len(calls) == 5  # a target that may differ from call to call is called again
        with scale_plan.checking(target):
            scale_plan.output(target, case)
            assert len(calls) == 6  # a new check keeps nothing of the last
