"""The suite's side of KV caches (spec.laws.cache): the oracle reads a paged or float8 cache by its
declaration (a `Reads` term) and aligns causal attention per sequence; the cases write caches that
read back to their own keys; a target receives pools in every layout, and a failure shows them as
received; the declarations that go with caches (ml_dtypes, float8 only paged, queries within
keys, per-sequence alignment) say what they say."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from paged_caches import draw_seqs, lengths_of, paged

import spec
from impl import attention
from spec import oracle, tolerance
from spec.cases import Case
from spec.inputs import Inputs
from spec.keywords import Keyword, Reads, registered
from spec.target import Target, TargetError

ml_dtypes = pytest.importorskip("ml_dtypes")
FLOAT8 = ml_dtypes.float8_e4m3fn
CACHE_LAWS = [name for name, p in spec.PROPERTIES.items() if p.family == "cache"]


def _pages(rng, lengths, g=2, d=3, block_size=3):
    """A paged cache of standard-normal keys and values, NaN wherever no sequence's key is."""
    k_seqs, v_seqs = draw_seqs(rng, lengths, g, d), draw_seqs(rng, lengths, g, d)
    k_pool, v_pool, table = paged(k_seqs, v_seqs, block_size, rng)
    return k_seqs, v_seqs, k_pool, v_pool, table


def _contiguous(seqs, n_k):  # per sequence [L_b, g, d] -> [batch, g, n_k, d], zeros past L_b
    out = np.zeros((len(seqs), seqs[0].shape[1], n_k, seqs[0].shape[2]))
    for b, s in enumerate(seqs):
        out[b, :, : len(s)] = np.swapaxes(s, 0, 1)
    return out


# --- the oracle reads the declaration ------------------------------------------------------------


def test_the_golden_of_a_paged_cache_is_that_of_its_gathered_keys():
    """Through the table, with NaN in every unowned position: the golden equals the golden of the
    contiguous keys with kv_lengths, causal aligned per sequence (diag = i + L_b − n_q)."""
    rng = np.random.default_rng(0)
    lengths = [5, 2, 7]
    k_seqs, v_seqs, k_pool, v_pool, table = _pages(rng, lengths)
    q = rng.standard_normal((3, 4, 2, 3))
    given = Inputs(q, k_pool, v_pool, causal=True,
                   keywords={"block_table": table, "kv_lengths": lengths_of(k_seqs)})
    out, w, _ = oracle.golden_of(given, "top_left")  # a paged cache is per sequence in every alignment
    n_k = table.shape[1] * 3
    plain = Inputs(q, _contiguous(k_seqs, n_k), _contiguous(v_seqs, n_k), causal=True,
                   keywords={"kv_lengths": lengths_of(k_seqs)})
    want, want_w, _ = oracle.golden_of(plain, "kv_lengths")
    np.testing.assert_array_equal(out, want)
    assert np.isfinite(out).all()
    # row b, query i sees keys j <= i + L_b - n_q (n_q = 2): the last query sees the whole cache
    for b, n in enumerate(lengths):
        assert (w[b, :, -1, :n] > 0).all() and (w[b, :, -1, n:] == 0).all()
        assert (w[b, :, 0, n - 1] == 0).all() and (w[b, :, 0, : n - 1] > 0).all()
    np.testing.assert_array_equal(w, want_w)


def test_the_golden_reads_float8_codes_times_their_descales():
    rng = np.random.default_rng(1)
    codes = rng.standard_normal((2, 2, 4, 3)).astype(FLOAT8)
    values = rng.standard_normal((2, 2, 4, 3)).astype(FLOAT8)
    k_scale = np.array([[0.5, 4.0], [0.125, 2.0]], np.float32)
    v_scale = np.array([[3.0, 0.25], [1.5, 8.0]], np.float32)
    q = rng.standard_normal((2, 4, 2, 3)).astype(np.float32)  # 4 query heads read 2 K/V heads
    inputs = Inputs(q, codes, values, keywords={"k_descale": k_scale, "v_descale": v_scale})
    read = oracle.meaning(inputs)
    np.testing.assert_array_equal(read.k, codes.astype(np.float64) * k_scale[:, :, None, None])
    np.testing.assert_array_equal(read.v, values.astype(np.float64) * v_scale[:, :, None, None])
    assert oracle.meaning(read) is read and oracle.meaning(inputs) is read  # worked out once
    out, _, _ = oracle.golden_of(inputs)
    want = attention(q.astype(np.float64), read.k, read.v)
    np.testing.assert_allclose(out, want, rtol=1e-12)


def test_kv_lengths_alignment_puts_each_rows_diagonal_at_its_own_length():
    """n_q = 2, n_k = 4, lengths [3, 1]: row 0's queries see keys ≤ 1 and ≤ 2, row 1's see
    nothing and key 0; a top-left target's stay at ≤ 0 and ≤ 1 (cut by the lengths)."""
    q, k, v = np.zeros((2, 1, 2, 1)), np.zeros((2, 1, 4, 1)), np.zeros((2, 1, 4, 1))
    inputs = Inputs(q, k, v, causal=True, keywords={"kv_lengths": np.array([3, 1])})
    seen = oracle.visibility("kv_lengths", inputs)[:, 0].astype(int)
    assert seen.tolist() == [[[1, 1, 0, 0], [1, 1, 1, 0]], [[0, 0, 0, 0], [1, 0, 0, 0]]]
    top_left = oracle.visibility("top_left", inputs)[:, 0].astype(int)
    assert top_left.tolist() == [[[1, 0, 0, 0], [1, 1, 0, 0]], [[1, 0, 0, 0], [1, 0, 0, 0]]]


def test_alibi_over_a_paged_cache_measures_from_each_sequences_length():
    """DESIGN §2d: ALiBi's n_k is kv_lengths[b] over a paged cache."""
    rng = np.random.default_rng(2)
    k_seqs, _, k_pool, v_pool, table = _pages(rng, [4, 2], g=1, d=1, block_size=2)
    q = np.zeros((2, 1, 1, 1))
    inputs = Inputs(q, k_pool, np.ones_like(v_pool), keywords={
        "block_table": table, "kv_lengths": lengths_of(k_seqs), "alibi_slopes": np.array([1.0], np.float32)})
    geo = oracle.geometry("top_left", inputs)
    assert geo.bottom_right[:, 0, 0, 0].tolist() == [3, 1]


def test_the_weights_floor_by_hand():
    """Two keys of equal score: p = [1, 1], each rounded by up to eps/2 = 1/16 in e4m3, ℓ = 2:
    2·max|V|·(1/8)/2 = max|V|/8; a weight in e4m3's subnormals costs half their spacing, 2⁻¹⁰."""
    w = np.array([[0.5, 0.5]])
    assert tolerance.weights_floor(w, np.array([[2.0], [-4.0]]), "float8_e4m3fn") == pytest.approx(0.5)
    tiny = np.array([[1.0, 1e-4]]) / (1 + 1e-4)  # p = [1, 1e-4]: 1/16 + 2⁻¹⁰ over ℓ = 1 + 1e-4
    assert tolerance.weights_floor(tiny, np.ones((2, 1)), "float8_e4m3fn") == pytest.approx(
        2 * (1 / 16 + 2 ** -10) / (1 + 1e-4))
    assert tolerance.weights_floor(np.zeros((1, 2)), np.ones((2, 1)), "float8_e4m3fn") == 0.0


# --- cases write caches that read back -----------------------------------------------------------


def _paged_case(**keywords):
    fields = dict(dtype="float32", ndim=4, batch=2, heads=2, n_q=3, n_k=7, d_k=4, d_v=2, seed=5)
    return Case(**fields, keywords={"kv_lengths": (7, 2), "paged": (3, "nan")} | keywords)


def test_a_paged_case_reads_back_to_its_own_keys_and_poisons_the_rest():
    case = _paged_case()
    inputs = case.inputs()
    pool, table = inputs.k, inputs.get("block_table")
    assert pool.shape[1:] == (3, 2, 4) and table.dtype == np.int32 and table.shape == (2, 3)
    read = oracle.meaning(inputs)
    k = case.arrays()[1]
    np.testing.assert_array_equal(read.k[0, :, :7], k[0, :, :7])
    np.testing.assert_array_equal(read.k[1, :, :2], k[1, :, :2])
    assert (read.k[1, :, 2:] == 0).all()
    owned = 3 + 1  # ceil(7 / 3) + ceil(2 / 3) blocks, and 1 or 2 spare ones, all NaN where unowned
    assert pool.shape[0] > owned and np.isnan(pool).sum() == (pool.shape[0] * 3 - 9) * 2 * 4
    assert len({*table[0].tolist(), table[1, 0]}) == 4  # the sequences' blocks are distinct
    assert Case.from_fields(**case.describe()) == case


def test_a_float8_case_quantizes_to_its_keys_within_three_bits():
    case = Case(dtype="float32", ndim=4, batch=2, heads=2, n_q=3, n_k=5, d_k=4, d_v=2, seed=6,
                keywords={"fp8": (((0.25, 2.0), (1.0, 0.0625)), ((4.0, 0.5), (0.125, 1.0)))})
    inputs = case.inputs()
    assert inputs.k.dtype == FLOAT8 and inputs.get("k_descale").dtype == np.float32
    read = oracle.meaning(inputs)
    k = case.arrays()[1].astype(np.float64)
    np.testing.assert_allclose(read.k, k, rtol=2 ** -4, atol=2.0 ** -10 * 2)  # e4m3: 3 bits
    assert Case.from_fields(**case.describe()) == case


def test_the_builtin_reference_and_flash_declare_the_caches():
    for name in ("reference", "flash"):
        target = spec.builtin.load_target(name)
        assert target.supports_paged_kv and target.supports_fp8_kv
    assert spec.builtin.load_target("flash").fp8_kv_paged_only
    assert not spec.builtin.load_target("flash").supports_kv_lengths  # block_table carries it


# --- what a target receives ------------------------------------------------------------------------


def _bnhd_reference(q, k, v, **kw):
    """impl.attention for q [batch, n, heads, d]: a paged pool is [num_blocks, block_size, g, d] as it is."""
    assert k.ndim == 4 and "block_table" in kw and k.shape[0] >= kw["block_table"].max() + 1
    return np.swapaxes(attention(np.swapaxes(q, 1, 2), k, v, **kw), 1, 2)


def test_a_bnhd_target_receives_the_pool_unswapped():
    target = Target(_bnhd_reference, layout="bnhd", ndims=(4,), supports_paged_kv=True, supports_scale=True)
    report = spec.check(target, profile="quick", only=["paged_matches_golden", "paged_block_size_invariant"])
    assert report.ok, [(r.name, r.message) for r in report.failures]


def test_a_failure_shows_the_paged_cache_as_the_target_received_it():
    def ignores_the_table(q, k, v, *, block_table=None, kv_lengths=None, **kw):  # q [batch, n, heads, d]
        pool = np.swapaxes(k[: q.shape[0]], 1, 2)  # the first blocks, read as if contiguous
        values = np.swapaxes(v[: q.shape[0]], 1, 2)
        return np.swapaxes(attention(np.swapaxes(q, 1, 2), pool, values, **kw), 1, 2)

    target = Target(ignores_the_table, layout="bnhd", ndims=(4,), supports_paged_kv=True)
    (result,) = spec.check(target, profile="ci", only=["paged_matches_golden"]).results
    assert result.status == "fail"
    example = result.counterexample.to_dict()  # as the JSON report has it
    case = Case.from_fields(**example["case"])
    inputs = case.inputs()
    batch, heads, n_q, d_k = case.shapes()["q"]
    assert example["shapes"]["q"] == [batch, n_q, heads, d_k]
    assert example["shapes"]["k"] == list(inputs.k.shape) and len(inputs.k.shape) == 4
    assert example["shapes"]["block_table"] == list(inputs.get("block_table").shape)
    assert example["shapes"]["kv_lengths"] == [batch]


def test_kv_lengths_reaches_a_target_only_with_a_block_table_when_it_declares_no_kv_lengths():
    target = Target(attention, ndims=(4,), supports_paged_kv=True)
    case = _paged_case()
    assert set(spec.call.arguments(target, case.inputs())) == {"block_table", "kv_lengths"}
    with pytest.raises(TargetError, match="kv_lengths= needs supports_kv_lengths=True"):
        spec.call.arguments(target, case.inputs().replace(block_table=None))


# --- declarations ----------------------------------------------------------------------------------


@pytest.fixture
def without_ml_dtypes(monkeypatch):
    from spec import dtypes

    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    dtypes.has_bfloat16.cache_clear()
    yield
    dtypes.has_bfloat16.cache_clear()


def test_declaring_float8_caches_without_ml_dtypes_is_a_clear_target_error(without_ml_dtypes):
    with pytest.raises(TargetError, match="supports_fp8_kv=True needs ml_dtypes"):
        Target(attention, ndims=(4,), supports_fp8_kv=True)
    assert not spec.builtin.load_target("reference").supports_fp8_kv


def test_float8_laws_skip_without_ml_dtypes(monkeypatch):
    target = Target(attention, ndims=(4,), supports_fp8_kv=True)  # declared while ml_dtypes is there
    from spec import dtypes

    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    dtypes.has_bfloat16.cache_clear()
    try:
        report = spec.check(target, profile="quick", only=[n for n in CACHE_LAWS if n.startswith("fp8")])
    finally:
        dtypes.has_bfloat16.cache_clear()
    assert report.results and all(r.status == "skip" and "ml_dtypes" in r.message for r in report.results)


def test_float8_only_paged_needs_both_declarations():
    with pytest.raises(TargetError, match="fp8_kv_paged_only=True needs"):
        Target(attention, supports_fp8_kv=True, fp8_kv_paged_only=True)


def test_float8_only_paged_draws_only_paged_float8_cases():
    seen = []

    def refuses_contiguous_float8(q, k, v, *, block_table=None, **kw):
        seen.append(block_table is not None)
        if kw.get("k_descale") is not None and block_table is None:
            raise ValueError("k_descale only with block_table")
        return attention(q, k, v, block_table=block_table, **kw)

    target = Target(refuses_contiguous_float8, ndims=(4,), supports_paged_kv=True, supports_fp8_kv=True,
                    fp8_kv_paged_only=True)
    report = spec.check(target, profile="quick", only=[n for n in CACHE_LAWS if n.startswith("fp8")])
    assert report.ok, [(r.name, r.message) for r in report.failures]
    assert seen and all(seen)


def _defined_for_n_q_within_keys(q, k, v, *, causal=False, window=None, kv_lengths=None, **kw):
    """A mask utility that places query i at key i + L − n_q and refuses negative positions."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    if (causal or window is not None) and (n_q > n_k or (kv_lengths is not None and min(kv_lengths) < n_q)):
        raise ValueError(f"causal needs n_q <= every sequence's length, got n_q={n_q}, n_k={n_k}, "
                         f"kv_lengths={kv_lengths}")
    align = "kv_lengths" if kv_lengths is not None else "bottom_right"
    return attention(q, k, v, causal=causal, window=window, kv_lengths=kv_lengths, align=align, **kw)


WITHIN_KEYS = dict(causal_alignment="kv_lengths", supports_kv_lengths=True, supports_window=True,
                   ndims=(2, 3, 4))


def test_queries_within_keys_draws_only_the_shapes_a_target_defines():
    target = Target(_defined_for_n_q_within_keys, queries_within_keys=True, **WITHIN_KEYS)
    report = spec.check(target, profile="quick", seed=4)
    assert report.ok, [(r.name, r.message) for r in report.failures]
    (rows,) = [r for r in report.results if r.name == "masked_rows_policy"]
    assert rows.status == "skip" and "queries_within_keys=True" in rows.message


def test_without_queries_within_keys_the_same_target_fails():
    target = Target(_defined_for_n_q_within_keys, **WITHIN_KEYS)
    report = spec.check(target, profile="quick", seed=4,
                        only=["kv_lengths_is_truncation", "masked_rows_policy", "causal_no_leak"])
    assert not report.ok and any("causal needs n_q" in r.message for r in report.failures)


def test_kv_lengths_alignment_is_a_causal_alignment():
    target = Target(attention, causal_alignment="kv_lengths")
    assert target.alignment == "kv_lengths"
    with pytest.raises(TargetError, match="causal_alignment must be one of"):
        Target(attention, causal_alignment="per_sequence")


def test_every_cache_law_has_its_gallery_bug_and_the_reference_passes():
    sys.path.insert(0, "tests")
    from gallery import cache

    assert {b.catches for b in cache.BROKEN} == set(CACHE_LAWS)
    report = spec.check("reference", profile="ci", only=CACHE_LAWS)
    assert report.ok and all(r.status == "pass" for r in report.results), [(r.name, r.message)
                                                                            for r in report.results]


# --- the declaration itself -------------------------------------------------------------------------


def test_a_keyword_that_reads_k_and_v_and_draws_cases_must_write_them():
    with pytest.raises(ValueError, match="needs writes="):
        Keyword(name="pages", field="supports_paged_kv", passes=("pages",), meaning="m",
                terms=(Reads(lambda k, v: (k, v)),), received=lambda c, p: (p,), draw=lambda d, t, c: c)


def test_a_carried_argument_must_be_passed_by_a_keyword():
    from spec import registry

    before = dict(registered())
    odd = before["paged"].replace(name="odd", passes=("odd_table",), carries=("nothing_passes_this",))
    with pytest.raises(ValueError, match=r"carries \['nothing_passes_this'\], which no declared keyword"):
        registry.check_keywords(before | {"odd": odd})
    assert registered() == before


def test_the_paged_keyword_passes_the_table_and_carries_the_lengths():
    kw = registered()["paged"]
    assert kw.passes == ("block_table",) and kw.carries == ("kv_lengths",) and kw.arrangement == "paged"
    assert kw.given({"block_table": 1, "kv_lengths": 2}) == (1, 2)
    assert kw.given({"kv_lengths": 2}) is None
    assert math.isnan(spec.laws.cache.fill_value("nan", np.dtype(np.float32)))
