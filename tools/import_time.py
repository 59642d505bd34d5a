"""Import time of ``ragged`` against ``torch`` alone, in fresh processes.

Usage: ``python tools/import_time.py [--runs 15]`` from a checkout. Each run starts two fresh
interpreters, one importing ``torch`` and one importing ``ragged`` (which imports torch), in
alternating order, and times each from start to exit; the report gives the medians and minima
and their difference, which is what ``import ragged`` adds (docs/benchmarks.md, "Import time").
The processes may write bytecode (``PYTHONDONTWRITEBYTECODE`` is dropped from their
environment, and a first import of each warms the caches), as an installed package's imports
would: compiling ragged's sources on every import costs about 0.15 s here. It also checks that
the heavy modules stay unloaded (sympy, ``torch._dynamo``,
``torch._inductor``), as ``tests/test_import.py`` does.

The breakdown times ``import ragged`` inside a process that has imported torch, with the time
spent in full garbage collections (generation 2) apart, and the same collection in a control
process that allocates 12,000 dicts after ``import torch`` instead: torch's import leaves a
full collection pending that whatever allocates next pays.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
HEAVY = ("sympy", "torch._dynamo", "torch._inductor")


def timed(statement: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True, cwd=ROOT, env=ENV)
    return time.perf_counter() - start


# Run in a fresh process after `import torch`: the job's time and its full collections' time.
_IN_PROCESS = """
import gc, json, sys, time
import torch
full = []
def track(phase, info):
    if info["generation"] == 2:
        full.append(time.perf_counter() if phase == "start" else -time.perf_counter())
gc.callbacks.append(track)
start = time.perf_counter()
exec(sys.argv[1])
took = time.perf_counter() - start
print(json.dumps([took, -sum(full)]))
"""
_JOBS = {
    "import ragged": "import ragged",
    "12,000 dicts (control)": "keep = [{} for _ in range(12000)]",
}


def breakdown(runs: int) -> None:
    """Median time of each job after ``import torch``, and of its full collections."""
    results: dict[str, list[tuple[float, float]]] = {job: [] for job in _JOBS}
    for _ in range(runs):
        for job, code in _JOBS.items():
            out = subprocess.run(
                [sys.executable, "-c", _IN_PROCESS, code],
                check=True,
                cwd=ROOT,
                env=ENV,
                capture_output=True,
                text=True,
            ).stdout
            took, collecting = json.loads(out.strip().splitlines()[-1])
            results[job].append((took, collecting))
    for job, pairs in results.items():
        took = statistics.median(p[0] for p in pairs)
        collecting = statistics.median(p[1] for p in pairs)
        print(
            f"after import torch, {job:<23} {took:.3f} s, of which full collections "
            f"{collecting:.3f} s, the rest {took - collecting:.3f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="pairs of processes (default 15)")
    args = parser.parse_args()
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys, ragged; print([m for m in {HEAVY!r} if m in sys.modules])",
        ],
        check=True,
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
    ).stdout.strip()
    timed("import torch")  # warm the file cache
    timed("import ragged")  # and write ragged's bytecode
    times: dict[str, list[float]] = {"torch": [], "ragged": []}
    for k in range(args.runs):
        order = ("torch", "ragged") if k % 2 == 0 else ("ragged", "torch")
        for name in order:
            times[name].append(timed(f"import {name}"))
    med = {name: statistics.median(t) for name, t in times.items()}
    low = {name: min(t) for name, t in times.items()}
    for name in times:
        print(f"import {name:<7} median {med[name]:.3f} s, min {low[name]:.3f} s")
    print(
        f"ragged adds: median {med['ragged'] - med['torch']:.3f} s, "
        f"min {low['ragged'] - low['torch']:.3f} s ({args.runs} runs each, alternating)"
    )
    print(f"heavy modules loaded by `import ragged`: {loaded}")
    breakdown(max(3, args.runs // 3))


if __name__ == "__main__":
    main()
