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
"""

from __future__ import annotations

import argparse
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


if __name__ == "__main__":
    main()
