"""The oracle's top-k and block selections (`spec.keywords.topk`, `spec.keywords.topk_blocks`):
their visibility against loops written from the definition — invalid entries, truncation, grouped
K/V heads, partial last blocks — at some rows alone, their arguments refused, the causes of the
rows they empty; the lists the cases draw; and the declarations they come with (``lse_base``,
``topk_duplicates``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings

import spec
from spec import oracle
from spec.cases import Case, cases
from spec.inputs import Inputs
from spec.keywords.topk import TOPK, check_topk, listed_counts
from spec.keywords.topk_blocks import TOPK_BLOCKS
from spec.target import TargetError


def loop_listed(idx, n_k, length, heads):
    """[batch, heads, n_q, n_k] from the definition: query i of head h sees key j when one of the
    first length[b, i] entries of row i of K/V head h // (heads / heads_kv) is j and 0 <= j < n_k."""
    batch, heads_kv, n_q, _ = idx.shape
    seen = np.zeros((batch, heads, n_q, n_k), dtype=bool)
    for b, h, i in itertools.product(range(batch), range(heads), range(n_q)):
        for j in idx[b, h // (heads // heads_kv), i, :length[b, i]]:
            if 0 <= j < n_k:
                seen[b, h, i, j] = True
    return seen


def random_lists(rng, batch, heads_kv, n_q, n_k, width):
    idx = rng.integers(-3, n_k + 3, size=(batch, heads_kv, n_q, width)).astype(np.int32)
    length = rng.integers(0, width + 1, size=(batch, n_q)).astype(np.int32)
    return idx, length


@pytest.mark.parametrize(("heads", "heads_kv"), [(1, 1), (4, 2), (6, 1)])
@pytest.mark.parametrize("width", [1, 3, 9])
def test_topk_visibility_is_the_definition(heads, heads_kv, width):
    rng = np.random.default_rng(width * 10 + heads)
    n_q, n_k = 5, 6
    idx, length = random_lists(rng, 2, heads_kv, n_q, n_k, width)
    q, k = np.zeros((2, heads, n_q, 1)), np.zeros((2, heads_kv, n_k, 1))
    inputs = Inputs(q, k, k, keywords={"topk_indices": idx, "topk_length": length})
    want = loop_listed(idx, n_k, length, heads)
    np.testing.assert_array_equal(oracle.visibility("top_left", inputs), want)
    without = inputs.replace(topk_length=None)
    np.testing.assert_array_equal(oracle.visibility("top_left", without),
                                  loop_listed(idx, n_k, np.full((2, n_q), width), heads))
    rows = np.array([1, 4])
    np.testing.assert_array_equal(oracle.visibility("top_left", inputs, rows=rows), want[..., rows, :])


def test_topk_on_3d_and_2d_inputs_reads_lengths_per_query():
    rng = np.random.default_rng(3)
    idx, length = random_lists(rng, 1, 2, 4, 5, 3)
    q3, k3 = np.zeros((4, 4, 1)), np.zeros((2, 5, 1))
    inputs = Inputs(q3, k3, k3, keywords={"topk_indices": idx[0], "topk_length": length[0]})
    np.testing.assert_array_equal(oracle.visibility("top_left", inputs), loop_listed(idx, 5, length, 4)[0])
    q2, k2 = np.zeros((4, 1)), np.zeros((5, 1))
    flat = Inputs(q2, k2, k2, keywords={"topk_indices": idx[0, 1], "topk_length": length[0]})
    np.testing.assert_array_equal(oracle.visibility("top_left", flat), loop_listed(idx, 5, length, 2)[0, 1])


def test_counts_count_each_listing_and_ignore_invalid_entries():
    idx = np.array([[[3, 3, -1, 7, 0]]])  # one row of n_k = 4: key 3 twice, 0 once, −1 and 7 invalid
    np.testing.assert_array_equal(listed_counts(idx, 4)[0, 0], [1, 0, 0, 2])
    np.testing.assert_array_equal(listed_counts(idx, 4, np.array([2]))[0, 0], [0, 0, 0, 2])


def test_a_row_with_no_valid_key_is_emptied_by_topk_after_causal():
    """Row 0 lists key 2 only (causal hides it: cause causal), row 1 only −1 (cause topk), row 2
    key 1 (sees it)."""
    q, k = np.zeros((3, 1)), np.zeros((3, 1))
    inputs = Inputs(q, k, k, causal=True, keywords={"topk_indices": np.array([[2], [-1], [1]])})
    assert oracle.causes("top_left", inputs).tolist() == ["topk", "topk", ""]
    assert oracle.causes("top_left", inputs.replace(topk_indices=np.array([[1], [-1], [1]]))).tolist() == \
        ["topk", "topk", ""]
    np.testing.assert_array_equal(oracle.visibility("top_left", inputs).astype(int),
                                  [[0, 0, 0], [0, 0, 0], [0, 1, 0]])


@pytest.mark.parametrize(("indices", "length", "message"), [
    (np.zeros((3, 2)), None, "topk_indices must be integers"),
    (np.zeros((4, 2), dtype=np.int32), None, "topk_indices must be integers shaped"),
    (np.zeros((3, 2), dtype=np.int32), np.array([0, 1]), "topk_length must be integers shaped"),
    (np.zeros((3, 2), dtype=np.int32), np.array([0, 3, 1]), r"topk_length must lie in \[0, topk=2\]"),
])
def test_bad_lists_are_refused_naming_the_argument(indices, length, message):
    with pytest.raises(ValueError, match=message):
        check_topk(indices, length, (), 3)


def loop_blocks(blocks, size, n_k):
    seen = np.zeros((*blocks.shape[:-1], n_k), dtype=bool)
    count = -(-n_k // size)
    for at in np.ndindex(*blocks.shape[:-1]):
        for b in blocks[at]:
            if 0 <= b < count:
                for j in range(b * size, min((b + 1) * size, n_k)):
                    seen[(*at, j)] = True
    return seen


@pytest.mark.parametrize(("size", "n_k"), [(1, 5), (2, 5), (3, 7), (4, 4), (16, 5)])
def test_block_visibility_is_the_definition_with_a_partial_last_block(size, n_k):
    rng = np.random.default_rng(size * 7 + n_k)
    blocks = rng.integers(-2, -(-n_k // size) + 2, size=(2, 6, 3)).astype(np.int32)
    q, k = np.zeros((4, 6, 1)), np.zeros((2, n_k, 1))
    inputs = Inputs(q, k, k, keywords={"topk_blocks": blocks, "topk_block_size": size})
    np.testing.assert_array_equal(oracle.visibility("top_left", inputs),
                                  np.repeat(loop_blocks(blocks, size, n_k), 2, axis=0))


@pytest.mark.parametrize("size", [0, -1, 2.0, True])
def test_a_bad_block_size_is_refused(size):
    q = np.zeros((2, 1))
    blocks = np.zeros((2, 1), dtype=np.int32)
    inputs = Inputs(q, q, q, keywords={"topk_blocks": blocks, "topk_block_size": size})
    with pytest.raises(ValueError, match="topk_block_size must be an integer > 0"):
        oracle.visibility("top_left", inputs)


LISTS = spec.Target(lambda q, k, v, **kw: q, name="lists", supports_topk=True, supports_topk_blocks=True,
                    supports_gqa=True, ndims=(2, 3, 4))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(cases(LISTS, keywords=(TOPK,), n_max=24, gqa=False))
def test_drawn_lists_share_a_key_across_queries_and_list_none_twice(case):
    """Every drawn call with two queries or more has a key listed by several of them (the normal
    case of top-k selection), and no row lists a valid key twice among the entries it reads (so
    the golden holds whatever ``topk_duplicates`` says)."""
    inputs = case.inputs()
    idx, length = inputs.get("topk_indices"), inputs.get("topk_length")
    assert idx.dtype == np.int32 and idx.shape[:-1] == (*case.kv_lead, case.n_q)
    read = None if length is None else length.astype(np.int64)
    counts = listed_counts(idx.astype(np.int64), case.n_k, read)
    assert counts.max(initial=0) <= 1
    if case.n_q >= 2 and counts.any():
        assert (counts.sum(axis=-2) >= 2).any()


def test_drawn_lists_cover_padding_widths_and_truncation():
    """Over 40 seeds the lists pad with −1, list keys past n_k, and truncate some rows to 0."""
    seen = set()
    for seed in range(40):
        case = Case(dtype="float32", ndim=4, batch=2, heads=2, n_q=6, n_k=5, d_k=1, d_v=1, seed=seed)
        for parameter in [(9, "minus_one", True), (3, "past_n_k", False), (2, "valid", True)]:
            inputs = case.with_keyword("topk", parameter).inputs()
            idx, length = inputs.get("topk_indices"), inputs.get("topk_length")
            seen |= {"minus_one"} if (idx == -1).any() else set()
            seen |= {"past"} if (idx >= 5).any() else set()
            seen |= {"zero_length"} if length is not None and (length == 0).any() else set()
    assert seen == {"minus_one", "past", "zero_length"}


@pytest.mark.parametrize(("declared", "message"), [
    ({"lse_base": 3, "returns_lse": True}, "lse_base must be 'e'"),
    ({"lse_base": 2}, "lse_base=2 needs returns_lse=True"),
    ({"topk_duplicates": "twice", "supports_topk": True}, "topk_duplicates must be one of"),
    ({"topk_duplicates": "each"}, "topk_duplicates='each' needs supports_topk=True"),
])
def test_bad_declarations_are_refused(declared, message):
    with pytest.raises(TargetError, match=message):
        spec.Target(lambda q, k, v, **kw: q, **declared)


def test_lse_base_2_is_read_as_its_natural_value():
    from spec.laws._helpers import run_lse

    def base2(q, k, v, *, return_lse=False):
        out, lse = spec.builtin.load_target("reference").fn(q, k, v, return_lse=True)
        return (out, lse / np.log(2)) if return_lse else out

    target = spec.Target(base2, returns_lse=True, lse_base=2)
    q = np.random.default_rng(0).standard_normal((3, 4))
    inputs = Inputs(q, q, q)
    _, natural = spec.builtin.load_target("reference").fn(q, q, q, return_lse=True)
    np.testing.assert_allclose(run_lse(target, inputs)[1], natural, rtol=1e-12)
    np.testing.assert_allclose(run_lse(target, inputs, as_returned=True)[1], natural / np.log(2), rtol=1e-12)


def test_topk_and_blocks_are_alternatives_never_drawn_together():
    assert not TOPK.combines_with(TOPK_BLOCKS) and not TOPK_BLOCKS.combines_with(TOPK)


def test_a_bnhd_target_gets_the_lists_with_heads_and_queries_swapped():
    """4-D lists reach a ``bnhd`` target as ``[batch, n_q, heads_kv, topk]`` (FlashMLA's order), as q
    does; the suite's arrays stay ``bhnd``."""
    seen = {}

    def kernel(q, k, v, *, topk_indices=None):
        seen["q"], seen["idx"] = q.shape, topk_indices.shape
        return np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)

    target = spec.Target(kernel, layout="bnhd", supports_topk=True, supports_gqa=True, ndims=(4,))
    q, k = np.zeros((2, 4, 3, 8), np.float32), np.zeros((2, 2, 5, 8), np.float32)
    idx = np.zeros((2, 2, 3, 6), np.int32)
    spec.call.call(target, Inputs(q, k, k, keywords={"topk_indices": idx}))
    assert seen == {"q": (2, 3, 4, 8), "idx": (2, 3, 2, 6)}
