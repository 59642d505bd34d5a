"""The benchmark runner (``python -m ragged.bench``), its helpers, and a smoke run of a suite."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ragged
import ragged.bench.__main__ as bench_main
from ragged.bench import Table, Timing, compare, pin_cpu, replace_section
from ragged.bench.__main__ import WIDTH, main, render_suite
from ragged.bench._runner import discover

ROOT = Path(__file__).resolve().parent.parent

FAKE_SUITE = """
import argparse, json
parser = argparse.ArgumentParser()
parser.add_argument("--json")
parser.add_argument("--quick", action="store_true")
parser.add_argument("--device", default="cpu")
args = parser.parse_args()
print("fake: case 1 of 2 done")
print("fake: case 2 of 2 done")
long_note = "a long note " * 40
table = {"title": "fake", "columns": ["a", "b"], "rows": [["1", "2"]],
         "notes": ["n", long_note, "device " + args.device]}
machine = {"cpu": "X", "cores": 1, "torch_threads": 1, "torch": "0", "python": "3"}
doc = {"suite": "fake", "command": "python benchmarks/fake.py", "quick": args.quick,
       "machine": machine, "metric": "cpu", "tables": [table], "plots": {}}
open(args.json, "w").write(json.dumps(doc))
"""

NO_JSON_SUITE = """
import argparse
argparse.ArgumentParser().parse_args()
print("hello")
"""

FAILING_SUITE = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--json")
parser.add_argument("--quick", action="store_true")
parser.parse_args()
raise SystemExit("boom")
"""

IMPORT_ERROR_SUITE = """
import no_such_module_for_the_runner_test
"""

MALFORMED_SUITE = """
import argparse, json
parser = argparse.ArgumentParser()
parser.add_argument("--json")
parser.add_argument("--quick", action="store_true")
args = parser.parse_args()
open(args.json, "w").write(json.dumps({"rows": [1, 2]}))
"""

DOC = """# Benchmarks
<!-- bench:suites:start -->
old
<!-- bench:suites:end -->
<!-- bench:fake:start -->
old
<!-- bench:fake:end -->
"""


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A fake checkout: benchmarks/ with five scripts, docs/benchmarks.md with markers."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (tmp_path / "ragged").mkdir()  # marks the checkout root; not imported (no __init__)
    (bench / "fake.py").write_text(FAKE_SUITE)
    (bench / "plain.py").write_text(NO_JSON_SUITE)
    (bench / "broken.py").write_text(FAILING_SUITE)
    (bench / "crashing.py").write_text(IMPORT_ERROR_SUITE)
    (bench / "malformed.py").write_text(MALFORMED_SUITE)
    (bench / "_helper.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "benchmarks.md").write_text(DOC)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_discover_skips_helpers_and_orders_owned_suites_first(tmp_path):
    for name in ["zeta", "ops", "_private", "func", "alpha"]:
        (tmp_path / f"{name}.py").write_text("")
    assert [s.name for s in discover(tmp_path)] == ["ops", "func", "alpha", "zeta"]


def test_runner_runs_suites_records_skips_and_failures_and_updates_docs(checkout, capsys):
    assert main(["--quick", "--write-docs"]) == 1  # broken.py fails
    out = capsys.readouterr().out
    assert "fake" in out
    result = json.loads((checkout / "benchmarks" / "results" / "quick" / "fake.json").read_text())
    assert result["quick"] is True and result["tables"][0]["rows"] == [["1", "2"]]
    doc = (checkout / "docs" / "benchmarks.md").read_text()
    assert "| 1 | 2 |" in doc and "Command: `python benchmarks/fake.py`" in doc
    assert "`benchmarks/plain.py` | skipped: does not accept --json" in doc
    assert "`benchmarks/broken.py` | failed: exit 1: boom" in doc
    # A script that cannot start is broken, not "without --json"; a result that is not a
    # result document fails instead of crashing the report.
    assert "`benchmarks/crashing.py` | failed: --help failed: exit 1: ModuleNotFoundError" in doc
    assert "`benchmarks/malformed.py` | failed: result document lacks suite" in doc
    assert "old" not in doc


def test_runs_leave_the_docs_alone_unless_asked_and_say_where_they_wrote(checkout, capsys):
    main(["--quick", "--suite", "fake"])
    assert (checkout / "benchmarks" / "results" / "quick" / "fake.json").exists()
    assert not (checkout / "benchmarks" / "results" / "fake.json").exists()
    out = capsys.readouterr().out
    assert "results: benchmarks/results/quick/<suite>.json" in out
    assert "logs: benchmarks/results/quick/logs/<suite>.log" in out
    assert "docs/benchmarks.md and docs/img/ unchanged (--write-docs to update them)" in out
    main(["--suite", "fake"])  # a full run too
    assert (checkout / "benchmarks" / "results" / "fake.json").exists()
    assert (checkout / "docs" / "benchmarks.md").read_text() == DOC
    assert not (checkout / "docs" / "img").exists()


def test_output_is_wrapped_and_progress_is_streamed(checkout, capsys):
    main(["--quick", "--suite", "fake"])
    captured = capsys.readouterr()
    assert max(len(line) for line in captured.out.splitlines()) <= WIDTH
    assert "a long note a long note" in captured.out
    # The suite's own output, line by line, while it runs (stderr is not a terminal here).
    assert "[1/1] fake: fake: case 1 of 2 done" in captured.err
    assert "[1/1] fake: fake: case 2 of 2 done" in captured.err
    assert "[1/1] fake: ok in" in captured.err


def test_device_goes_to_suites_that_take_it_and_others_are_skipped(checkout, capsys):
    assert main(["--quick", "--device", "meta", "--suite", "fake", "--suite", "broken"]) == 0
    result = json.loads(
        (checkout / "benchmarks" / "results" / "quick" / "meta" / "fake.json").read_text()
    )
    assert "device meta" in result["tables"][0]["notes"]
    out = capsys.readouterr().out
    assert "broken      skipped" in out and "runs on the CPU only (no --device option)" in out
    with pytest.raises(SystemExit, match="holds the CPU report"):
        main(["--device", "cuda", "--write-docs"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="sees no CUDA device"):
            main(["--device", "cuda", "--quick"])


def test_runs_outside_a_checkout_with_an_explicit_folder(
    checkout, tmp_path_factory, monkeypatch, capsys
):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(bench_main, "PACKAGE_ROOT", elsewhere)  # as from a wheel: no suites
    with pytest.raises(SystemExit) as error:
        main(["--quick"])
    assert error.value.code == 2
    message = capsys.readouterr().err
    assert "no benchmarks folder found" in message and "pass --benchmarks DIR" in message
    out = elsewhere / "out"
    bench = str(checkout / "benchmarks")
    assert main(["--benchmarks", bench, "--quick", "--suite", "fake", "--out", str(out)]) == 0
    assert json.loads((out / "fake.json").read_text())["quick"] is True
    with pytest.raises(SystemExit):
        main(["--benchmarks", str(elsewhere)])
    assert "no suites (*.py) there" in capsys.readouterr().err


def test_help_lists_suites_and_defaults_in_plain_text(checkout, capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "``" not in text
    assert "one of: broken, crashing, fake, malformed, plain" in text
    assert "(default: cpu)" in text and "--write-docs" in text
    with pytest.raises(SystemExit):
        main(["--suite", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_render_only_redraws_the_docs_from_earlier_results(checkout):
    main(["--suite", "fake"])
    assert (checkout / "docs" / "benchmarks.md").read_text() == DOC
    assert main(["--render-only"]) == 0
    assert (checkout / "docs" / "benchmarks.md").read_text() == DOC
    assert main(["--render-only", "--write-docs"]) == 0
    doc = (checkout / "docs" / "benchmarks.md").read_text()
    assert "| 1 | 2 |" in doc and "- n" in doc
    assert "`benchmarks/fake.py` | ok |" in doc
    assert "`benchmarks/broken.py` | not run |" in doc


def test_unknown_suite_is_an_error(checkout):
    with pytest.raises(SystemExit):
        main(["--suite", "nope"])


def test_render_suite_states_command_machine_and_metric():
    doc = {
        "command": "python benchmarks/x.py",
        "machine": {"cpu": "CPU", "cores": 2, "torch_threads": 1, "torch": "2.13", "python": "3"},
        "metric": "cpu",
        "quick": False,
        "tables": [Table("t", ["a"], [["1"]]).to_json()],
    }
    text = render_suite(doc)
    assert "`python benchmarks/x.py`" in text and "CPU, 2 cores, torch 2.13 on 1 thread" in text
    assert "**t**" in text and "| 1 |" in text


def test_replace_section_reports_missing_markers():
    assert replace_section("no markers", "ops", "x") == ("no markers", False)


def test_compare_times_every_variant_round_robin():
    calls = []
    times = compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeat=3)
    assert calls == ["a", "b"] + ["a", "b"] * 3  # warm-up, then rounds
    assert all(len(t.wall) == 3 and t.median("cpu") >= 0 for t in times.values())


def test_compare_alternates_the_order_of_head_to_head_rounds():
    calls = []
    compare(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
        repeat=3,
        warmup=0,
        alternate=True,
    )
    assert calls == ["a", "b", "b", "a", "a", "b"]


def test_paired_ratios_need_the_same_rounds():
    with pytest.raises(ValueError, match=r"Timing\.paired: other: expected as many"):
        Timing([1.0, 2.0], [1.0, 2.0]).paired(Timing([1.0], [1.0]), "cpu")


@pytest.mark.parametrize("n", [1, 5, 6, 20, 93])
def test_paired_interval_covers_the_median_at_the_binomial_ranks(n):
    mine = Timing([1.0] * n, [1.0] * n)
    theirs = Timing([float(i) for i in range(n)], [0.0] * n)  # ratios 0, 1, ..., n - 1
    low, high = mine.paired_interval(theirs, "wall")
    assert low <= mine.paired(theirs, "wall") <= high and low + high == n - 1  # symmetric
    k = int(low) + 1  # the interval is the k-th smallest to the k-th largest ratio
    tail = sum(math.comb(n, i) for i in range(k)) / 2**n  # P(fewer than k below the median)
    assert tail <= 0.025 or k == 1
    if k < n // 2:  # and k is the largest such rank
        assert tail + math.comb(n, k) / 2**n > 0.025
    with pytest.raises(ValueError, match=r"Timing\.paired_interval: level: expected in"):
        mine.paired_interval(theirs, "wall", level=1.0)


def test_pin_cpu_rejects_a_cpu_outside_the_process_set():
    outside = (os.cpu_count() or 1) + 1024  # no such CPU
    with pytest.raises(ValueError, match=r"pin_cpu: cpus: expected CPUs"):
        pin_cpu(outside)
    assert outside not in os.sched_getaffinity(0)


def test_peak_memory_sees_a_large_allocation():
    # In a fresh process: late in the suite this process holds gigabytes of cold pages that the
    # kernel may reclaim while the call runs (the resident size then falls as much as the call
    # adds, and a fresh CI venv read 0 here).
    code = (
        "import torch\n"
        "from ragged.bench import peak_memory\n"
        "print(peak_memory(lambda: torch.ones(64 << 20, dtype=torch.uint8)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    size = out.stdout.strip().splitlines()[-1]
    if size == "None":
        pytest.skip("no /proc/self/clear_refs here")
    assert float(size) >= 32 << 20


def test_lognormal_lengths_sum_exactly_and_hit_the_skew():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from ops import lognormal_lengths
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    lengths = lognormal_lengths(512, 1 << 16, max_over_mean=7.65)
    assert sum(lengths) == 1 << 16 and min(lengths) >= 1
    assert math.isclose(max(lengths) * 512 / (1 << 16), 7.65, rel_tol=0.01)
    assert len(set(lognormal_lengths(64, 64 * 5, max_over_mean=1.0))) == 1


def test_ops_suite_quick_smoke(tmp_path):
    out = tmp_path / "ops.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/ops.py", "--quick", "--ops", "sum,nosuchop", "--json", out],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    main_table, targets, overhead, detail = doc["tables"]
    assert main_table["rows"][0][0] == "sum"
    assert any(row[:3] == [">= 90% of the copy floor", "sum", "fwd"] for row in targets["rows"])
    assert any("nosuchop" in note and "skipped" in note for note in main_table["notes"])
    assert {row[2] for row in detail["rows"]} >= {"ragged", "padded", "index_add_"}
    assert all(row[-1] == "ok" for row in detail["rows"] if row[2] in ("ragged", "index_add_"))
    assert len(overhead["rows"]) == 3
    assert doc["command"] == "python benchmarks/ops.py --quick --ops sum,nosuchop"


def test_attention_suite_quick_smoke(tmp_path):
    """``benchmarks/attention.py --quick``: every contestant that runs agrees with ragged (the
    suite checks outputs before timing) and gets a time, a rate and a ratio; ragged's ratio to
    itself is 1; the matmul rate is in the title."""
    out = tmp_path / "attention.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/attention.py", "--quick", "--json", out],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    (table,) = doc["tables"]
    rows = {(row[0], row[1]): row for row in table["rows"]}
    for mode in ("forward", "forward+backward"):
        assert rows[(mode, "ragged.attention")][-1] == "1.00x"
        for name in ("SDPA loop", "padded SDPA"):
            assert float(rows[(mode, name)][2]) > 0 and rows[(mode, name)][-1].endswith("x")
    assert "matmul tile rate" in table["title"]
    assert doc["command"] == "python benchmarks/attention.py --quick"


def test_plots_are_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    from ragged.bench._plots import plot_all

    machine = {"cpu": "X", "cores": 1, "torch_threads": 1, "torch": "0", "python": "3"}
    base = {"command": "c", "machine": machine, "metric": "cpu"}
    results = {
        "ops": {
            **base,
            "plots": {
                "speedup": {
                    "sum": {"fwd padded": 9.0, "fwd torch": 1.1, "fwd+bwd padded": 5.0},
                    "max": {"fwd padded": 3.0, "fwd torch": 0.8, "fwd+bwd torch": math.nan},
                }
            },
        },
        "skew": {
            **base,
            "plots": {
                "skew": [
                    {
                        "max_over_mean": m,
                        "ragged_ms": 1.0,
                        "padded_ms": m,
                        "ragged_mb": 1.0,
                        "padded_mb": 2 * m,
                    }
                    for m in (1.0, 2.0, 4.0)
                ]
            },
        },
        "func": {
            **base,
            "plots": {
                "vmap": {
                    "ragged.vmap": {"fwd": 4.0, "fwd+bwd": 5.0},
                    "loop": {"fwd": 1.0, "fwd+bwd": 1.0},
                },
                "compile": {"B=2, rows=9": {"fwd": 2.0, "fwd+bwd": 1.5}},
            },
        },
    }
    plan = {
        "mix": "log-normal",
        "causal": True,
        "static_max_over_mean": 2.0,
        "balanced_max_over_mean": 1.02,
        "static_ring_bytes": 2.0**31,
        "static_needed_bytes": 2.0**28,
        "balanced_bytes": 2.0**29,
    }
    results["context_parallel"] = {
        **base,
        "plots": {
            "plans": [{**plan, "ranks": r} for r in (8, 64)]
            + [{**plan, "causal": False, "ranks": 8}],
            "wall": [{"processes": 2, "static_s": 0.2, "balanced_s": 0.1}],
        },
    }
    written = plot_all(results, tmp_path)
    assert sorted(p.name for p in written) == [
        "context_parallel.png",
        "func.png",
        "ops_speedup.png",
        "skew.png",
    ]
    assert all(p.stat().st_size > 1000 for p in written)


def test_module_entry_point_help():
    proc = subprocess.run(
        [sys.executable, "-m", "ragged.bench", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0 and "--quick" in proc.stdout


@pytest.mark.parametrize(
    "script", sorted((ROOT / "benchmarks").glob("[!_]*.py")), ids=lambda p: p.stem
)
def test_every_suite_starts_and_writes_result_documents(script):
    """Each real suite imports cleanly and offers ``--json`` (the runner's contract)."""
    proc = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--json" in proc.stdout and "--quick" in proc.stdout


def test_gpu_check_script_is_valid_bash_and_explains_itself():
    """``benchmarks/gpu_check.sh`` parses (``bash -n``), passes shellcheck where installed, and
    prints its usage; its full dry run (``--dry-run``: the same steps on the CPU) takes minutes
    and a fresh venv, so it is run by hand."""
    script = ROOT / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    if shutil.which("shellcheck"):
        lint = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout
    usage = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and "--dry-run" in usage.stdout and "TORCH_INDEX" in usage.stdout
    wrong = subprocess.run(["bash", str(script), "--nope"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "unknown argument" in wrong.stderr
    for args in (["--wheels"], ["--wheels", str(ROOT / "no such folder")]):
        nowhere = subprocess.run(["bash", str(script), *args], capture_output=True, text=True)
        assert nowhere.returncode == 2 and "--wheels takes a folder" in nowhere.stderr
    env = {**os.environ, "BUDGET": "8 minutes"}
    vague = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert vague.returncode == 2 and "BUDGET takes whole seconds" in vague.stderr


def test_a_suite_run_alone_keeps_the_other_rows_of_the_status_table():
    from ragged.bench._runner import Suite

    earlier = (
        "| suite | status | run time | date |\n|---|---|---|---|\n"
        "| `benchmarks/ops.py` | ok | 1087 s | 2026-11-30 |\n"
        "| `benchmarks/skew.py` | ok | 181 s | 2026-11-30 |\n"
    )
    ran = Suite("ops", Path("ops.py"), "ok", seconds=12.0, result={"date": "2026-12-01"})
    other = Suite("skew", Path("skew.py"), "not run")
    new = Suite("pair", Path("pair.py"), "not run")
    rows = bench_main.render_status([ran, other, new], earlier).splitlines()[2:]
    assert rows == [
        "| `benchmarks/ops.py` | ok | 12 s | 2026-12-01 |",
        "| `benchmarks/skew.py` | ok | 181 s | 2026-11-30 |",
        "| `benchmarks/pair.py` | not run | - | - |",
    ]


def test_sum_blocks_tool_measures_the_library_kernel(tmp_path):
    """``tools/sum_blocks.py`` builds the sum kernel per variant: its ``blocks-16`` build is the
    library's kernel (bit for bit), and other block sizes and the Kahan-compensated variant
    (its register tiles of 32 columns, the remaining columns and several row blocks: 70
    columns, a segment of 182 rows) sum the same segments."""
    from ragged.kernels import _native
    from ragged.kernels._native_build import library

    if library() is None:
        pytest.skip("no C compiler: the native kernels are not built here")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import sum_blocks
    finally:
        sys.path.remove(str(ROOT / "tools"))
    gen = torch.Generator().manual_seed(0)
    lengths = [0, 17, 1, 100, 182]
    sums = {v: sum_blocks.build(v, tmp_path) for v in ("blocks-16", "blocks-64", "kahan")}
    for width in (5, 70):
        values = torch.rand(300, width, generator=gen) - 0.3
        offsets = ragged.from_lengths(values, lengths).offsets
        library_sum = _native.segment_sum(values, offsets)
        want = torch.stack([s.double().sum(0) for s in values.split(lengths)])
        for variant, segment_sum in sums.items():
            got = segment_sum(values, offsets)
            if variant == "blocks-16":
                assert torch.equal(got, library_sum)
            torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
