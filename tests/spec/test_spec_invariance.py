"""The declared invariances (``Target(invariant=...)``), the target's own merge (``Target(merge=...)``),
and the laws that hold a target to them (`spec.laws.invariance`, `spec.laws.cascade`)."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from gallery.invariance import BROKEN, each_row_alone, one_split_whatever_asked
from hypothesis import HealthCheck, given, settings

import spec
from impl import attention
from impl.merge import merge_states
from spec import MergeTarget, Target, oracle
from spec.builtin import load_target
from spec.cases import Case
from spec.keywords import registered
from spec.keywords.num_splits import COUNTS, NUM_SPLITS
from spec.laws.cascade import chunk_call, chunks, own_merge
from spec.laws.invariance import holding, output_of, sequences, split_cases, steps
from spec.target import INVARIANCES, TargetError

INVARIANCE_LAWS = ["batch_invariant", "position_invariant", "neighbours_invariant"]


def _lse_attention(q, k, v, *, return_lse=False, **kw):
    return attention(q, k, v, return_lse=return_lse, **kw)


# --- the declaration -----------------------------------------------------------------------------


def test_invariant_defaults_to_none_and_keeps_the_declared_names_in_order():
    assert Target(attention).invariant == ()
    declared = Target(attention, invariant=["neighbours", "batch", "batch"])
    assert declared.invariant == ("neighbours", "batch")


@pytest.mark.parametrize("given", [("batch", "batches"), ("Batch",)])
def test_invariant_refuses_an_unknown_name_naming_the_field_and_the_allowed(given):
    with pytest.raises(TargetError, match="invariant names") as e:
        Target(attention, invariant=given)
    assert all(name in str(e.value) for name in INVARIANCES)


def test_invariant_refuses_a_bare_string():
    with pytest.raises(TargetError, match="invariant must be a tuple"):
        Target(attention, invariant="batch")


def test_invariant_refuses_a_nondeterministic_target():
    with pytest.raises(TargetError, match="deterministic=False"):
        Target(attention, invariant=("batch",), deterministic=False)


def test_chunked_prefill_needs_an_alignment_that_chunks_keep():
    with pytest.raises(TargetError, match=r"chunked_prefill.*causal_alignment"):
        Target(attention, invariant=("chunked_prefill",))
    assert Target(attention, invariant=("chunked_prefill",), causal_alignment="bottom_right").invariant
    assert Target(attention, invariant=("chunked_prefill",), supports_paged_kv=True).invariant


def test_merge_is_a_merge_target_a_function_read_as_one_or_refused():
    made = own_merge(Target(_lse_attention, returns_lse=True, lse_base=2, layout="bnhd", merge=merge_states))
    assert isinstance(made, MergeTarget) and made.fn is merge_states
    assert (made.lse_base, made.layout) == (2, "bnhd")
    given = MergeTarget(merge_states, name="mine")
    assert Target(_lse_attention, returns_lse=True, merge=given).merge is given
    with pytest.raises(TargetError, match="merge must be"):
        Target(_lse_attention, returns_lse=True, merge=3)
    with pytest.raises(TargetError, match="merge needs returns_lse"):
        Target(attention, merge=merge_states)


# --- the built-ins: what each holds ----------------------------------------------------------------


def test_an_undeclared_invariance_is_skipped_naming_the_declaration():
    report = spec.check("reference", profile="quick", only=INVARIANCE_LAWS)
    assert [r.status for r in report.results] == ["skip"] * 3
    assert all("invariant=" in r.message for r in report.results)


def test_flash_holds_the_invariances_it_declares():
    flash = load_target("flash")
    assert set(flash.invariant) == {"batch", "position", "neighbours"}
    report = spec.check(flash, profile="quick", only=INVARIANCE_LAWS, seed=4)
    assert [r.status for r in report.results] == ["pass"] * 3


def test_reference_would_break_batch_invariance_if_it_declared_it():
    """Why the reference declares nothing: its packed sequences are one masked softmax over the pack."""
    reference = load_target("reference").replace(invariant=("batch",))
    (result,) = spec.check(reference, profile="ci", only=["batch_invariant"], seed=1).results
    assert result.status == "fail" and "alone" in result.message


# --- the laws' messages and their calls -----------------------------------------------------------


def test_a_neighbour_failure_names_the_neighbour_its_step_and_the_sequence_it_moved():
    splits_by_total = next(b.target for b in BROKEN if b.catches == "neighbours_invariant")
    (result,) = spec.check(splits_by_total, profile="ci", only=["neighbours_invariant"]).results
    assert result.status == "fail"
    assert "neighbour " in result.message and "key length" in result.message and "→" in result.message
    assert "changed sequence" in result.message and "row" in result.message


def _packed_case() -> Case:
    return Case(dtype="float64", ndim=3, batch=1, heads=2, n_q=5, n_k=6, d_k=3, d_v=2, seed=7,
                keywords={"varlen": ((0, 2, 2, 5), (0, 1, 4, 6))})


def test_holding_reorders_packed_sequences_and_keeps_each_ones_rows():
    inputs = _packed_case().inputs()
    moved = holding(inputs, [2, 0, 1])
    assert moved.get("cu_seqlens_q").tolist() == [0, 3, 5, 5]
    assert moved.get("cu_seqlens_k").tolist() == [0, 2, 3, 6]
    for got, want in zip(sequences(moved), [sequences(inputs)[s] for s in (2, 0, 1)], strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    out = attention(*(moved.q, moved.k, moved.v), cu_seqlens_q=moved.get("cu_seqlens_q"),
                    cu_seqlens_k=moved.get("cu_seqlens_k"))
    assert output_of(moved, out, 0).shape == (2, 3, 2)


def test_steps_move_one_length_by_one_up_and_down_within_range():
    case = _packed_case()
    said = [text for text, _ in steps(case, case.inputs(), 1)]
    assert said == ["query length 0 → 1", "key length 3 → 4", "key length 3 → 2"]
    lengths = Case(dtype="float32", ndim=4, batch=2, heads=1, n_q=2, n_k=5, d_k=2, d_v=2, seed=1,
                   keywords={"kv_lengths": (5, 0)})
    moves = {text: changed.get("kv_lengths").tolist()
             for text, changed in steps(lengths, lengths.inputs(), 0)}
    assert moves == {"key length 5 → 4": [4, 0]}


def test_chunks_cover_the_prompt_and_each_sees_the_cache_up_to_its_end():
    case = Case(dtype="float64", ndim=4, batch=1, heads=1, n_q=6, n_k=9, d_k=2, d_v=2, seed=3, causal=True)
    cut = chunks(case)
    assert cut[0][0] == 0 and cut[-1][1] == 6
    assert all(a[1] == b[0] for a, b in itertools.pairwise(cut))
    part = chunk_call(case.inputs(), 2, 4)
    assert part.q.shape[-2] == 2 and part.k.shape[-2] == 9 - 6 + 4


# --- the cascade with the target's own merge --------------------------------------------------------


def _averaging(out_a, lse_a, out_b, lse_b):  # the parts' mean, whatever their weights
    return (out_a + out_b) / 2, np.logaddexp(lse_a, lse_b).astype(lse_a.dtype)


def test_the_cascade_feeds_the_targets_own_merge_and_catches_a_wrong_one():
    good = Target(_lse_attention, name="with_merge", returns_lse=True, merge=merge_states)
    (result,) = spec.check(good, profile="quick", only=["cascade_shared_prefix"], seed=2).results
    assert result.status == "pass"
    bad = good.replace(merge=_averaging)
    (result,) = spec.check(bad, profile="quick", only=["cascade_shared_prefix"], seed=2).results
    assert result.status == "fail" and "merged by" in result.message and "_averaging" in result.message


def test_a_target_computing_each_sequence_alone_keeps_every_invariance():
    target = Target(each_row_alone, invariant=("batch", "position", "neighbours"), supports_kv_lengths=True,
                    supports_mask=True, ndims=(4,))
    report = spec.check(target, profile="quick", only=INVARIANCE_LAWS, seed=6)
    assert [r.status for r in report.results] == ["pass"] * 3


def _aligned_per_row(q, k, v, *, causal=False, kv_lengths=None, **kw):
    align = "kv_lengths" if kv_lengths is not None else "bottom_right"
    return attention(q, k, v, causal=causal, kv_lengths=kv_lengths, align=align, **kw)


@pytest.mark.parametrize("form", ["paged", "kv_lengths", "bottom_right"])
def test_chunked_prefill_holds_within_tolerance_in_each_form(form):
    """A correct target passes the chunked-prefill law whichever way its chunks keep their diagonal."""
    if form == "paged":
        target = load_target("reference")
    else:
        target = Target(_aligned_per_row, name=f"aligned_{form}", causal_alignment=form, ndims=(4,),
                        supports_kv_lengths=form == "kv_lengths")
    (result,) = spec.check(target, profile="quick", only=["chunked_prefill_matches_one_call"], seed=1).results
    assert result.status == "pass", result.message


def test_chunked_prefill_is_skipped_where_chunks_lose_their_diagonal():
    only = ["chunked_prefill_matches_one_call"]
    (result,) = spec.check(Target(attention), profile="quick", only=only).results
    assert result.status == "skip" and "causal_alignment" in result.message


def _top_left_chunks(q, k, v, *, causal=False, **kw):  # declared bottom-right, computed top-left
    return attention(q, k, v, causal=causal, **kw)


def test_chunked_prefill_catches_a_chunk_that_ignores_its_cache():
    target = Target(_top_left_chunks, causal_alignment="bottom_right", ndims=(4,))
    (result,) = spec.check(target, profile="quick", only=["chunked_prefill_matches_one_call"], seed=1).results
    assert result.status == "fail" and "as a chunk against the cache" in result.message


def test_flash_keeps_a_sequence_bits_where_the_batch_makes_it_go_threaded():
    """The laws draw small calls; flash's declaration also covers the batch that crosses its threading
    threshold (alone 180,000 scores: one thread; four of them 720,000: one job per thread; a one-thread
    BLAS in both), so a sequence alone and in the batch of four must agree bit for bit, whatever BLAS
    (with OPENBLAS_CORETYPE=Haswell a multi-threaded BLAS rounds the call alone differently)."""
    from impl import flash_attention

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((4, 2, 300, 128)).astype(np.float32) for _ in range(3))
    together = flash_attention(q, k, v, causal=True)
    alone = flash_attention(q[2:3], k[2:3], v[2:3], causal=True)
    assert np.array_equal(together[2:3], alone)


def test_chunked_prefill_over_a_past_cache_holds_for_a_correct_one_and_catches_a_top_left_one():
    """The past-cache form: each chunk's keys are its own, the chunks before it its past."""
    from gallery.past import PAST, _with_past

    def joined(q, k, v, **kw):
        return _with_past(q, k, v, **kw)

    def top_left(q, k, v, **kw):
        return _with_past(q, k, v, bug="top_left", **kw)

    only = ["chunked_prefill_matches_one_call"]
    (result,) = spec.check(Target(joined, **PAST), profile="quick", only=only, seed=1).results
    assert result.status == "pass", result.message
    (result,) = spec.check(Target(top_left, **PAST), profile="quick", only=only, seed=1).results
    assert result.status == "fail" and "as a chunk" in result.message


# --- split counts: num_splits= and invariant=("splits",) -------------------------------------------


def _splitting(q, k, v, *, num_splits=1, **kw):
    return attention(q, k, v, **kw)


SPLITS = dict(supports_num_splits=True, num_splits_values=(1, 2, 4))
NOT_COUNTS = "num_splits_values must be None .any count. or a non-empty tuple of integers"


def test_num_splits_values_keep_the_counts_in_order_once_each():
    target = Target(_splitting, supports_num_splits=True, num_splits_values=[4, 1, 4, 2])
    assert target.num_splits_values == (4, 1, 2)
    assert Target(_splitting, supports_num_splits=True).num_splits_values is None  # any count


@pytest.mark.parametrize(("declared", "said"), [
    (dict(num_splits_values=(1, 2)), r"num_splits_values=\(1, 2\) needs supports_num_splits=True"),
    (dict(supports_num_splits=True, num_splits_values=(0, 2)), NOT_COUNTS),
    (dict(supports_num_splits=True, num_splits_values=(True,)), NOT_COUNTS),
    (dict(supports_num_splits=True, num_splits_values=2), NOT_COUNTS),
    (dict(supports_num_splits=True, num_splits_values=(1.0, 2)), NOT_COUNTS),
    (dict(supports_num_splits=True, num_splits_values=()), NOT_COUNTS),
    (dict(invariant=("splits",)), "invariant='splits'.*supports_num_splits=True and two or more"),
    (dict(invariant=("splits",), supports_num_splits=True, num_splits_values=(2,)), "two or more"),
])
def test_a_split_declaration_that_cannot_hold_is_refused_naming_the_field(declared, said):
    with pytest.raises(TargetError, match=said):
        Target(_splitting, **declared)


def test_splits_is_an_invariance_a_split_kernel_may_declare():
    assert "splits" in INVARIANCES
    assert Target(_splitting, invariant=("splits",), **SPLITS).invariant == ("splits",)
    assert Target(_splitting, invariant=("splits",), supports_num_splits=True).invariant == ("splits",)


def _drawn_counts(target: Target) -> set[int]:
    """The split counts the split laws' cases draw for ``target``, each checked passed as drawn and
    leaving the golden as it is."""
    seen = set()

    @settings(max_examples=80, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(split_cases(target))
    def drawn(case):
        n = case.param("num_splits")
        seen.add(n)
        inputs = case.inputs()
        assert inputs.get("num_splits") == n
        golden = oracle.expected(target, inputs).out
        np.testing.assert_array_equal(golden, oracle.expected(target, inputs.replace(num_splits=None)).out)

    drawn()
    return seen


def test_the_keyword_passes_a_declared_count_and_leaves_the_golden_as_it_is():
    assert registered()["num_splits"] is NUM_SPLITS and NUM_SPLITS.passes == ("num_splits",)
    assert _drawn_counts(Target(_splitting, **SPLITS)) == {1, 2, 4}
    assert _drawn_counts(Target(_splitting, supports_num_splits=True)) == set(COUNTS)  # any count


def test_the_split_laws_are_skipped_naming_what_is_missing():
    (result,) = spec.check("reference", profile="quick", only=["num_splits_matches_golden"]).results
    assert result.status == "skip" and "num_splits=" in result.message
    (result,) = spec.check("flash", profile="quick", only=["splits_invariant"]).results
    assert result.status == "skip" and "invariant=('splits',)" in result.message


def test_flash_matches_the_golden_at_every_count_it_takes_but_not_bit_for_bit_across_them():
    """Why flash does not declare "splits": its splits' states are merged by their LSEs, which rounds."""
    flash = load_target("flash")
    assert flash.supports_num_splits and flash.num_splits_values is None
    (result,) = spec.check(flash, profile="ci", only=["num_splits_matches_golden"], seed=1).results
    assert result.status == "pass"
    promised = flash.replace(invariant=(*flash.invariant, "splits"))
    (result,) = spec.check(promised, profile="ci", only=["splits_invariant"], seed=1).results
    assert result.status == "fail"


def test_a_splits_failure_names_the_two_counts_and_the_first_entry_they_differ_at():
    merged_in_turn = next(b.target for b in BROKEN if b.catches == "splits_invariant")
    (result,) = spec.check(merged_in_turn, profile="ci", only=["splits_invariant"], seed=0).results
    assert result.status == "fail"
    assert re.search(r"num_splits=1 → [24] changed output \[[0-9, ]+\] from \S+ to \S+", result.message), \
        result.message


def test_a_kernel_that_drops_its_last_split_fails_the_golden_at_that_count():
    dropping = next(b.target for b in BROKEN if b.catches == "num_splits_matches_golden")
    (result,) = spec.check(dropping, profile="ci", only=["num_splits_matches_golden"], seed=0).results
    assert result.status == "fail" and "num_splits=" in result.message


def test_a_kernel_that_ignores_the_count_holds_splits_and_the_golden():
    target = Target(one_split_whatever_asked, invariant=("splits",), supports_mask=True, supports_scale=True,
                    **SPLITS)
    report = spec.check(target, profile="ci", only=["splits_invariant", "num_splits_matches_golden"], seed=3)
    assert [r.status for r in report.results] == ["pass"] * 2
