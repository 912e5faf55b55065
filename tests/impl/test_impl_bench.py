"""python -m impl.bench: the FLOP count, the record it writes, and its command line (tiny sizes)."""

import contextlib
import importlib.util
import io
import json
import statistics
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import impl.bench.measure
import impl.flash
from impl.bench import main, useful_flops, visible_pairs
from impl.flash import DEFAULT_BACKWARD_BLOCK
from impl.masks import causal_mask

QUICK = ["--repeat", "1", "--pause", "0"]
FAST = ["--repeat", "2", "--impl", "naive", "--impl", "flash", "--pause", "0"]


@pytest.mark.parametrize(("n_q", "n_k"), [(1, 1), (4, 4), (5, 3), (3, 5), (0, 4), (7, 0)])
def test_visible_pairs_count_the_mask(n_q, n_k):
    assert visible_pairs(n_q, n_k, causal=True) == int(causal_mask(n_q, n_k).sum())
    assert visible_pairs(n_q, n_k, causal=False) == n_q * n_k


def test_useful_flops_are_two_per_multiply_add_over_visible_pairs():
    assert useful_flops(8192, 128, 128, causal=True) == 2 * 256 * (8192 * 8193 // 2)
    assert useful_flops(4, 3, 5, causal=False) == 2 * 8 * 16


@pytest.fixture(autouse=True)
def small_sgemm(monkeypatch):
    monkeypatch.setattr(impl.bench.measure, "SGEMM_SIZE", 256)  # the floor's reference product, kept quick


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """One tiny run shared by the tests that read its record and report."""
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(impl.bench.measure, "SGEMM_SIZE", 256)
        assert main(["--sizes", "16", "32", "64", *FAST, "--naive-max", "32", "--json", str(path)]) == 0
    return json.loads(path.read_text()), out.getvalue()


def test_json_has_the_documented_keys(record):
    data, _ = record
    assert set(data) >= {"command", "date", "config", "machine", "paths", "sgemm", "memory_method", "results",
                         "floor", "paired", "tile_products"}
    assert data["tile_products"] == []  # the backward's only
    assert data["command"].startswith("python -m impl.bench --sizes 16 32 64")
    assert data["date"].endswith("+00:00")  # UTC
    assert data["config"] == {
        "mode": "forward", "sizes": [16, 32, 64], "d_k": 128, "d_v": 128, "dtype": "float32", "causal": True,
        "repeat": 2, "naive_max": 32, "pause_s": 0.0, "implementations": ["naive", "flash"],
    }
    assert set(data["machine"]) >= {"cpu_count", "load_before", "load_after", "numpy", "blas", "blas_runtime",
                                    "torch", "jax", "openblas_env"}
    assert set(data["paths"]) == {"naive", "flash"}
    assert data["paths"]["flash"]["input_ndim"] == 2 and data["paths"]["flash"]["fused"] is True
    assert len(data["machine"]["load_before"]) == 3
    for row in data["results"]:
        assert set(row) == {"implementation", "n_tokens", "flops", "times_s", "calls_per_sample", "time_s",
                            "gflops", "ratio", "peak_bytes", "skipped"}


def test_each_result_is_the_median_of_its_runs_and_ratios_divide_neighbours(record):
    data, _ = record
    flash = [r for r in data["results"] if r["implementation"] == "flash"]
    assert [r["n_tokens"] for r in flash] == [16, 32, 64]
    for r in flash:
        assert len(r["times_s"]) == 2 and r["time_s"] == statistics.median(r["times_s"])
        assert r["flops"] == useful_flops(r["n_tokens"], 128, 128, causal=True)
        assert r["gflops"] == pytest.approx(r["flops"] / r["time_s"] / 1e9)
        assert isinstance(r["peak_bytes"], int) and r["peak_bytes"] > 0
    assert flash[0]["ratio"] is None
    assert flash[2]["ratio"] == pytest.approx(flash[2]["time_s"] / flash[1]["time_s"])


@pytest.mark.parametrize(("min_sample_s", "more_than_one"), [(0.0, False), (0.5, True)])
def test_a_sample_repeats_quick_calls_until_it_lasts_long_enough(monkeypatch, tmp_path, min_sample_s,
                                                                 more_than_one):
    monkeypatch.setattr(impl.bench.measure, "MIN_SAMPLE_S", min_sample_s)
    path = tmp_path / "b.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["--sizes", "8", *QUICK, "--impl", "flash", "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())["results"]
    assert (row["calls_per_sample"] > 1) == more_than_one  # an 8-token call takes far less than 0.25 s


def test_floor_is_the_useful_flops_at_the_rate_of_the_sgemm_timed_beside_it(record):
    data, _ = record
    assert data["sgemm"]["size"] == 256
    sgemm = data["sgemm"]["times_s"]  # size by size, round by round
    assert len(sgemm) == 2 * 3
    assert data["sgemm"]["gflops"] == pytest.approx(2 * 256**3 / statistics.median(sgemm) / 1e9)
    for j, f in enumerate(data["floor"]):
        flops = useful_flops(f["n_tokens"], 128, 128, causal=True)
        assert f["flops"] == flops
        assert f["times_s"] == pytest.approx([flops * sgemm[j * 2 + r] / (2 * 256**3) for r in range(2)])
        assert f["time_s"] == statistics.median(f["times_s"])


def test_paired_ratios_are_medians_of_same_round_ratios(record):
    data, out = record
    flash = {r["n_tokens"]: r["times_s"] for r in data["results"] if r["implementation"] == "flash"}
    floor = {f["n_tokens"]: f["times_s"] for f in data["floor"]}
    for p in data["paired"]:
        n = p["n_tokens"]
        want = statistics.median(a / b for a, b in zip(flash[n], floor[n], strict=True))
        assert p["flash_over_floor"] == pytest.approx(want)
        assert p["flash_over_torch"] is None  # torch not run
    assert "| flash/torch" not in out and "| flash/floor" in out  # no column for what was not run


def test_naive_above_its_cap_is_skipped_with_the_reason_said(record):
    data, out = record
    naive = {r["n_tokens"]: r for r in data["results"] if r["implementation"] == "naive"}
    assert naive[32]["time_s"] is not None and naive[32]["skipped"] is None
    assert naive[64]["time_s"] is None and naive[64]["times_s"] == [] and naive[64]["peak_bytes"] is None
    assert "--naive-max 32" in naive[64]["skipped"]
    assert "naive at 64: naive skipped above --naive-max 32" in out


def test_the_report_shows_its_tables_and_the_load(record):
    _, out = record
    assert "| n " in out and "naive ms" in out and "flash/floor" in out and "flash MiB" in out
    # four narrow tables (times, ratios, growth, rates and memory), none wider than a 1280 px page shows
    heads = [line for line in out.splitlines() if line.startswith("| n ")]
    assert len(heads) == 4 and max(len(head.split("|")) - 2 for head in heads) <= 7
    assert "load average before" in out and "MiB = 2²⁰ bytes" in out


def test_no_causal_counts_every_pair(tmp_path, capsys):
    path = tmp_path / "b.json"
    assert main(["--sizes", "8", "--no-causal", *QUICK, "--impl", "flash", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["config"]["causal"] is False
    assert data["results"][0]["flops"] == 2 * 256 * 64
    assert "no mask" in capsys.readouterr().out


def test_torch_is_timed_but_its_memory_not_traced(tmp_path, capsys):
    pytest.importorskip("torch")
    path = tmp_path / "b.json"
    assert main(["--sizes", "8", *QUICK, "--impl", "torch", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    (row,) = data["results"]
    assert row["time_s"] > 0 and row["peak_bytes"] is None and row["skipped"] is None
    assert data["paired"][0]["flash_over_torch"] is None  # flash not run


def test_plot_is_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    assert main(["--sizes", "8", "16", *QUICK, "--impl", "flash", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--sizes", "0"], "--sizes: expected a positive integer, got '0'"),
        (["--sizes", "1e3"], "--sizes: expected a positive integer, got '1e3'"),
        (["--repeat", "-1"], "--repeat: expected a positive integer"),
        (["--pause", "nan"], "--pause: expected seconds between 0 and 60, got 'nan'"),
        (["--pause", "-1"], "--pause: expected seconds between 0 and 60"),
        (["--impl", "cuda"], "--impl: unknown implementation 'cuda'"),
        (["--json", "/no/such/dir/b.json"], "--json: no such directory"),
        (["--plot", "/no/such/dir/b.png"], "--plot: no such directory"),
        (["--markdown", "/no/such/dir/b.md"], "--markdown: no such directory"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--from-json", "/no/such/record.json"], "--from-json: no file '/no/such/record.json'"),
        (["--from-json", __file__, "--json", "x.json"], "--from-json renders a stored record"),
        (["--from-json", __file__], "is not a record of python -m impl.bench --json"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, says, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and says in captured.err
    assert captured.err.startswith("python -m impl.bench: error: ")


def test_plot_without_matplotlib_is_refused_before_any_timing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main(["--plot", "x.png"]) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_torch_asked_for_but_missing_is_refused(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert main(["--impl", "torch"]) == 2
    assert "torch is not installed" in capsys.readouterr().err


def test_help_returns_0(capsys):
    assert main(["--help"]) == 0
    assert "--naive-max" in capsys.readouterr().out


def test_real_subprocess(tmp_path):
    run = [sys.executable, "-m", "impl.bench"]
    ok = subprocess.run([*run, "--sizes", "8", "16", "--repeat", "1", "--impl", "flash"],
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and "flash ms" in ok.stdout
    bad = subprocess.run([*run, "--sizes", "-8"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_arrays_are_float32_one_head():
    from impl.bench import bench_arrays

    q, k, v, d_out = bench_arrays(8, 4, 3)
    assert q.shape == (8, 4) and k.shape == (8, 4) and v.shape == (8, 3) and d_out.shape == (8, 3)
    assert {x.dtype for x in (q, k, v, d_out)} == {np.dtype(np.float32)}


def test_backward_flops_count_five_products_per_visible_pair():
    assert useful_flops(4, 3, 5, causal=True, backward=True) == 2 * (3 * 3 + 2 * 5) * 10


# --- peers on their best paths ---------------------------------------------------------------------


def test_torch_gets_contiguous_4d_tensors_and_its_fused_kernel():
    # 2-D (n, d) tensors send SDPA down its unfused math path, which materialises the n × n pattern.
    pytest.importorskip("torch")
    from impl.bench import bench_arrays, make_call, torch_inputs

    tensors = torch_inputs(bench_arrays(16, 8, 8))
    assert [t.shape for t in tensors] == [(1, 1, 16, 8)] * 4
    assert all(t.ndim == 4 and t.is_contiguous() for t in tensors)
    for backward in (False, True):
        _, path = make_call("torch", 16, 8, 8, causal=True, backward=backward)
        assert path["input_ndim"] == 4 and path["backend"] == "FLASH_ATTENTION" and path["fused"] is True
    assert "Flash" in path["autograd_node"]


def test_torch_forward_runs_without_autograd_and_its_backward_times_only_the_gradients():
    torch = pytest.importorskip("torch")
    from impl.bench import make_call

    forward, path = make_call("torch", 16, 8, 8, causal=True)
    assert path["grad"] == "torch.no_grad()" and forward().grad_fn is None
    backward, _ = make_call("torch", 16, 8, 8, causal=True, backward=True)
    grads = backward()
    assert len(grads) == 3 and all(isinstance(g, torch.Tensor) and g.shape == (1, 1, 16, 8) for g in grads)


def test_jax_gets_its_layout_jitted_and_compiled_before_timing():
    pytest.importorskip("jax")
    from impl.bench import make_call

    call, path = make_call("jax", 16, 8, 8, causal=True)
    assert path["input_ndim"] == 4 and path["layout"].startswith("(batch, n, heads, d) = (1, n, 1, d)")
    assert call().shape == (1, 16, 1, 8)


def test_peers_and_their_paths_reach_the_json_and_the_report(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    path = tmp_path / "b.json"
    argv = ["--sizes", "8", *QUICK, "--impl", "flash", "--impl", "torch", "--impl", "jax",
            "--json", str(path)]
    assert main(argv) == 0
    data = json.loads(path.read_text())
    assert data["paths"]["torch"]["input_ndim"] == 4 and data["paths"]["jax"]["input_ndim"] == 4
    (pair,) = data["paired"]
    assert pair["flash_over_torch"] > 0 and pair["flash_over_jax"] > 0
    assert pair["torch_over_floor"] == pytest.approx(
        statistics.median(t / f for t, f in zip(data["results"][1]["times_s"], data["floor"][0]["times_s"],
                                                strict=True)))
    out = capsys.readouterr().out
    assert "flash/torch" in out and "flash/jax" in out
    assert "torch: torch " in out and "4-D (batch, heads, n, d) = (1, 1, n, d)" in out
    assert "backend FLASH_ATTENTION" in out


def test_backward_mode_times_the_gradient_pair(tmp_path, capsys):
    pytest.importorskip("torch")
    path = tmp_path / "b.json"
    assert main(["--backward", "--sizes", "8", "16", *QUICK, "--impl", "flash", "--impl", "torch",
                 "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["config"]["mode"] == "backward"
    flash = [r for r in data["results"] if r["implementation"] == "flash"]
    want = [useful_flops(n, 128, 128, causal=True, backward=True) for n in (8, 16)]
    assert [r["flops"] for r in flash] == want
    assert all(r["peak_bytes"] > 0 for r in flash)
    assert all(p["flash_over_torch"] > 0 for p in data["paired"])
    assert "backward (dq, dk, dv)" in capsys.readouterr().out


def test_backward_times_its_tile_products_on_one_thread_of_numpy_and_of_torch(tmp_path, capsys):
    """What bounds the backward's ratio to PyTorch's: the BLAS of each at the kernel's tile shapes."""
    torch_too = importlib.util.find_spec("torch") is not None
    path = tmp_path / "b.json"
    assert main(["--backward", "--sizes", "8", *QUICK, "--impl", "flash", *(["--impl", "torch"] * torch_too),
                 "--json", str(path)]) == 0
    products = json.loads(path.read_text())["tile_products"]
    rows, cols = DEFAULT_BACKWARD_BLOCK
    assert [p["name"] for p in products] == ["S - lse", "dV", "dP - D", "dQ", "dK"]
    assert [p["shape"] for p in products] == [[rows, 129, cols], [cols, rows, 128], [rows, 129, cols],
                                              [rows, cols, 128], [cols, rows, 128]]
    assert all(p["numpy_gflops"] > 0 for p in products)
    assert all((p["torch_gflops"] > 0) if torch_too else p["torch_gflops"] is None for p in products)
    assert "one backward tile's five products" in capsys.readouterr().out


def test_the_tile_products_with_torch_too(tmp_path, capsys):
    pytest.importorskip("torch")
    test_backward_times_its_tile_products_on_one_thread_of_numpy_and_of_torch(tmp_path, capsys)


def test_markdown_page_says_the_command_that_regenerates_it(tmp_path, capsys):
    path = tmp_path / "results.md"
    assert main(["--sizes", "8", *QUICK, "--impl", "flash", "--markdown", str(path)]) == 0
    page = path.read_text()
    assert page.startswith("# Benchmark results")
    assert f"`python -m impl.bench --sizes 8 --repeat 1 --pause 0 --impl flash --markdown {path}`" in page
    assert "| n " in page and "load average before" in page and "- flash: numpy" in page


def test_markdown_page_is_titled_by_what_was_timed_shows_its_plot_and_lists_its_notes(tmp_path, capsys):
    """Each page is titled by what it timed, shows its own plot, and lists its notes one by one
    rather than as one paragraph."""
    pytest.importorskip("matplotlib")
    (tmp_path / "img").mkdir()
    page, image, stored = tmp_path / "results.md", tmp_path / "img" / "bench.png", tmp_path / "bench.json"
    assert main(["--sizes", "8", *QUICK, "--impl", "flash", "--markdown", str(page), "--plot", str(image),
                 "--json", str(stored)]) == 0
    text = page.read_text()
    assert text.startswith("# Benchmark results: forward\n")
    assert "\n![forward time against n, log-log](img/bench.png)\n" in text
    notes = text.split("\nNotes:\n\n", 1)[1].splitlines()
    assert notes[0].startswith("- floor: ") and notes[1].startswith("- x/y columns: ")
    assert notes[-2:] == ["- paths:", notes[-1]] and notes[-1].startswith("    - flash: numpy")
    # The stored record renders the same page again, timing nothing.
    again = tmp_path / "again.md"
    capsys.readouterr()
    assert main(["--from-json", str(stored), "--markdown", str(again)]) == 0
    assert again.read_text() == text
    assert "flash" in capsys.readouterr().out


def test_the_backward_page_has_its_own_title(tmp_path):
    page = tmp_path / "b.md"
    assert main(["--backward", "--sizes", "8", *QUICK, "--impl", "flash", "--markdown", str(page)]) == 0
    assert page.read_text().startswith("# Benchmark results: backward (dq, dk, dv)\n")


def test_jax_has_no_backward_pair(capsys):
    assert main(["--backward", "--impl", "jax"]) == 2
    assert "--impl jax: --backward compares with torch only" in capsys.readouterr().err


def test_profile_names_the_lines_of_the_tile_loop(tmp_path, capsys):
    pytest.importorskip("line_profiler")
    path = tmp_path / "profile.md"
    assert main(["--profile", "--sizes", "64", "--markdown", str(path)]) == 0
    page = path.read_text()
    assert page.startswith("# Where flash's time goes, line by line: forward\n")
    assert "`python -m impl.bench --profile --sizes 64" in page
    assert "impl.flash._row_block, n = 64" in page and "np.exp(s, out=s)" in page and "% time" in page
    assert main(["--profile", "--backward", "--sizes", "64", "--markdown", str(path)]) == 0
    assert "impl.flash._key_block, n = 64" in capsys.readouterr().out
    assert path.read_text().startswith("# Where flash's time goes, line by line: backward\n")  # its own title


def test_profile_shares_add_up_to_the_whole():
    pytest.importorskip("line_profiler")
    from impl.bench import profile_lines

    profile = profile_lines(96, 16, 16, causal=True)
    assert sum(row["share"] for row in profile["lines"]) == pytest.approx(1.0)
    assert profile["visible_pairs"] == visible_pairs(96, 96, causal=True)


class Watching:
    """line_profiler's LineProfiler, as `impl.bench.profile_lines` uses it, watching instead of timing:
    for each call of the added function, the thread it ran in and the module globals it saw."""

    def __init__(self):
        self.code, self.calls = None, []

    def add_function(self, fn):
        self.code = fn.__code__

    def _hook(self, frame, event, arg):
        if event == "call" and frame.f_code is self.code:
            self.calls.append((threading.get_ident(), dict(frame.f_globals)))

    def enable_by_count(self):
        threading.setprofile(self._hook)  # the threads started from now on, a pool's workers included
        sys.setprofile(self._hook)

    def disable_by_count(self):
        sys.setprofile(None)
        threading.setprofile(None)

    def get_stats(self):
        first = self.code.co_firstlineno
        one_line = [(first + 1, 1, 1000)]  # (line, hits, time in units)
        return SimpleNamespace(unit=1e-9, timings={("flash.py", first, self.code.co_name): one_line})


@pytest.mark.parametrize("backward", [False, True])
def test_the_one_thread_profile_leaves_impl_flash_as_it_is(monkeypatch, backward):
    """``--profile`` asks flash for one thread (``threads=1``) rather than patching its module: every
    tile job runs in the calling thread, and every global of impl.flash is, during the run and after
    it, the object it was before (a patched ``impl.flash._cores`` would change flash for every other
    caller meanwhile)."""
    watching = Watching()
    monkeypatch.setitem(sys.modules, "line_profiler", SimpleNamespace(LineProfiler=lambda: watching))
    before = dict(vars(impl.flash))
    # 1024 tokens: four row (or key) blocks, enough for flash's threaded path on more than one core.
    profile = impl.bench.profile_lines(1024, 16, 16, causal=True, backward=backward)
    assert profile["function"] == f"impl.flash.{'_key_block' if backward else '_row_block'}"
    assert len(watching.calls) >= 4
    assert {thread for thread, _ in watching.calls} == {threading.get_ident()}
    for _, seen in [*watching.calls, (None, dict(vars(impl.flash)))]:
        changed = sorted(name for name in before.keys() | seen.keys()
                         if seen.get(name) is not before.get(name))
        assert changed == [], f"impl.flash.{', '.join(changed)} changed"


def test_profile_refuses_json_and_plot(capsys):
    assert main(["--profile", "--json", "x.json"]) == 2
    assert "--profile writes a report only" in capsys.readouterr().err


def test_sparse_mode_times_both_paths_and_writes_the_documented_record(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(impl.bench.measure, "MIN_SAMPLE_S", 0.0)
    out = tmp_path / "sparse.json"
    argv = ["--sparse", "4", "--sizes", "32", "64", "--repeat", "2", "--pause", "0", "--d-k", "8",
            "--d-v", "4", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "topk 4" in text and "sparse" in text and "dense" in text
    record = json.loads(out.read_text())
    assert set(record) == {"command", "date", "config", "machine", "memory_method", "results"}
    assert record["config"] | {"sizes": None} == {
        "mode": "sparse", "sizes": None, "topk": 4, "d_k": 8, "d_v": 4, "dtype": "float32", "causal": True,
        "repeat": 2, "pause_s": 0.0, "threads": 1}
    rows = {(r["implementation"], r["n_tokens"]): r for r in record["results"]}
    assert set(rows) == {(name, n) for name in ("sparse", "dense") for n in (32, 64)}
    for (name, n), row in rows.items():
        assert len(row["times_s"]) == 2 and row["time_s"] == statistics.median(row["times_s"])
        assert row["peak_bytes"] > 0 and row["peak_bytes_per_token"] == row["peak_bytes"] / n
        previous = rows.get((name, n // 2))
        assert row["ratio"] == (None if previous is None else row["time_s"] / previous["time_s"])


def test_sparse_lists_stay_among_the_keys_each_query_may_see():
    from impl.bench.sparse import topk_lists

    lists = topk_lists(50, 7, causal=True)
    assert lists.shape == (50, 7) and lists.dtype == np.int32
    assert (lists >= 0).all() and (lists <= np.arange(50)[:, None]).all()
    assert (topk_lists(50, 7, causal=False) < 50).all()


@pytest.mark.parametrize("extra", [["--backward"], ["--impl", "flash"], ["--plot", "x.png"], ["--profile"]])
def test_sparse_mode_refuses_the_flags_of_the_other_modes(extra, capsys):
    assert main(["--sparse", "8", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"not with {extra[0]}" in err
