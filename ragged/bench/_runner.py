"""Run the benchmark suites in fresh processes and collect their result documents."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["Suite", "discover", "progress", "run_suite"]

# Suites this repository maintains, in the order the report shows them; other scripts in
# benchmarks/ run after these if they accept ``--json``.
OWNED = ("ops", "skew", "func")
OPTIONAL = ("encoder", "pair", "microbatch", "context_parallel")


@dataclasses.dataclass
class Suite:
    """One benchmark script and what became of it."""

    name: str
    path: Path
    status: str = "pending"  # "ok", "failed", "skipped" or "pending"
    reason: str = ""
    seconds: float = 0.0
    result: dict[str, Any] | None = None


def discover(bench_dir: Path, only: Iterable[str] | None = None) -> list[Suite]:
    """The suites in ``bench_dir``: the owned ones first, then the rest by name.

    Scripts whose name starts with ``_`` are helpers, not suites. ``only`` keeps the named
    suites (unknown names are reported as skipped).
    """
    found = {p.stem: p for p in sorted(bench_dir.glob("*.py")) if not p.stem.startswith("_")}
    order = [n for n in (*OWNED, *OPTIONAL) if n in found]
    order += [n for n in found if n not in order]
    suites = [Suite(name, found[name]) for name in order]
    if only is not None:
        wanted = list(only)
        suites = [s for s in suites if s.name in wanted]
        for name in wanted:
            if name not in found:
                suites.append(Suite(name, bench_dir / f"{name}.py", "skipped", "no such script"))
    return suites


def _env(root: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in [str(root), os.environ.get("PYTHONPATH", "")] if p)
    # One thread everywhere, also for libraries that read these before torch starts.
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _help(suite: Suite, root: Path, timeout: float) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            [sys.executable, str(suite.path), "--help"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(root),
            cwd=root,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return f"exit {proc.returncode}: {tail[0][:200]}"


def supports_json(suite: Suite, root: Path, timeout: float = 120.0) -> bool:
    """Whether the script's ``--help`` runs and offers a ``--json`` flag."""
    proc = _help(suite, root, timeout)
    return proc is not None and proc.returncode == 0 and "--json" in proc.stdout


def _result_problem(result: Any) -> str:
    """Why a suite's JSON is not a result document (see ``_report``), or ``""``."""
    if not isinstance(result, dict):
        return f"result is a {type(result).__name__}, not an object"
    missing = [k for k in ("suite", "command", "machine", "metric", "tables") if k not in result]
    if missing:
        return f"result document lacks {', '.join(missing)} (write it with write_result)"
    tables = result["tables"]
    if not isinstance(tables, list) or not all(
        isinstance(t, dict) and {"title", "columns", "rows"} <= t.keys() for t in tables
    ):
        return "result tables are not a list of {title, columns, rows} objects"
    return ""


def run_suite(
    suite: Suite, root: Path, results: Path, *, quick: bool, timeout: float, log: Path | None
) -> Suite:
    """Run one suite in a subprocess with ``--json``; fills in its status and result."""
    if suite.status == "skipped":
        return suite
    helped = _help(suite, root, 120.0)
    if helped is None or helped.returncode != 0:
        # A script that cannot even print its usage is broken, not optional.
        reason = "timed out or could not start" if helped is None else _last_line(helped)
        suite.status, suite.reason = "failed", f"--help failed: {reason}"
        return suite
    if "--json" not in helped.stdout:
        suite.status, suite.reason = "skipped", "does not accept --json"
        return suite
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"{suite.name}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, str(suite.path), "--json", str(out), *(["--quick"] * quick)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=_env(root), cwd=root
        )
    except subprocess.TimeoutExpired:
        suite.status, suite.reason = "failed", f"timed out after {timeout:.0f} s"
        return suite
    finally:
        suite.seconds = time.perf_counter() - start
    if log is not None:
        log.mkdir(parents=True, exist_ok=True)
        (log / f"{suite.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not out.exists():
        suite.status, suite.reason = "failed", _last_line(proc)
        return suite
    try:
        result = json.loads(out.read_text())
    except json.JSONDecodeError as error:
        suite.status, suite.reason = "failed", f"{out.name} is not JSON: {error}"
        return suite
    problem = _result_problem(result)
    if problem:
        suite.status, suite.reason = "failed", problem
        return suite
    suite.status, suite.result = "ok", result
    return suite


def progress(items: list[Suite], label: Callable[[Suite], str]) -> Iterator[Suite]:
    """Iterate with a progress bar: tqdm when importable, else a plain text bar on stderr."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm(items, unit="suite", file=sys.stderr)
        for item in bar:
            bar.set_description(label(item))
            yield item
        return
    total = len(items)
    for i, item in enumerate(items):
        filled = int(20 * i / max(total, 1))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (20 - filled)}] {i}/{total} {label(item):<30}")
        sys.stderr.flush()
        yield item
    sys.stderr.write(f"\r[{'#' * 20}] {total}/{total}{' ' * 32}\n")
