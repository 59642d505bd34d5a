"""Run the benchmark suites in fresh processes and collect their result documents."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

__all__ = ["Progress", "Suite", "discover", "run_suite", "suite_options"]

# Suites this repository maintains, in the order the report shows them; other scripts in
# benchmarks/ run after these if they accept ``--json``.
OWNED = ("ops", "skew", "func")
OPTIONAL = ("encoder", "pair", "microbatch", "context_parallel")


@dataclasses.dataclass
class Suite:
    """One benchmark script and what became of it."""

    name: str
    path: Path
    status: str = "pending"  # "ok", "failed", "skipped", "not run" or "pending"
    reason: str = ""
    seconds: float = 0.0
    result: dict[str, Any] | None = None
    help: str | None = None  # the script's --help output (read once)


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
    # One thread everywhere, also for libraries that read these before torch starts; output
    # unbuffered, so that the runner sees progress as it happens.
    return {
        **os.environ,
        "PYTHONPATH": path,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


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


def _last_line(returncode: int, output: str) -> str:
    tail = output.strip().splitlines()[-1:] or ["no output"]
    return f"exit {returncode}: {tail[0][:200]}"


def suite_options(suite: Suite, root: Path | None = None, timeout: float = 120.0) -> set[str]:
    """The ``--options`` the script's ``--help`` offers (empty if it does not run)."""
    if suite.help is None:
        proc = _help(suite, root or suite.path.parent.parent, timeout)
        suite.help = proc.stdout if proc is not None and proc.returncode == 0 else ""
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", suite.help))


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


def _stream(
    command: list[str], root: Path, timeout: float, on_line: Callable[[str], None] | None
) -> tuple[int | None, str]:
    """Run ``command``, passing each output line (stdout and stderr) to ``on_line`` as it comes.

    Returns the exit code (``None`` when it ran past ``timeout`` and was killed) and the output.
    """
    output: list[str] = []
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(root),
        cwd=root,
    ) as proc:
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                proc.kill()
                reader.join()
                return None, "".join(output)
            if line is None:
                break
            output.append(line)
            if on_line is not None and line.strip():
                on_line(line.rstrip("\n"))
        reader.join()
    return proc.returncode, "".join(output)


def run_suite(
    suite: Suite,
    root: Path,
    results: Path,
    *,
    quick: bool,
    timeout: float,
    log: Path | None,
    device: str = "cpu",
    on_line: Callable[[str], None] | None = None,
) -> Suite:
    """Run one suite in a subprocess with ``--json`` (and ``--device`` unless on the CPU);
    fills in its status and result. ``on_line`` sees the suite's output as it runs."""
    if suite.status == "skipped":
        return suite
    options = suite_options(suite, root)
    if not suite.help:
        helped = _help(suite, root, 120.0)  # once more, for the reason
        # A script that cannot even print its usage is broken, not optional.
        reason = (
            "timed out or could not start"
            if helped is None
            else _last_line(helped.returncode, helped.stderr or helped.stdout)
        )
        suite.status, suite.reason = "failed", f"--help failed: {reason}"
        return suite
    if "--json" not in options:
        suite.status, suite.reason = "skipped", "does not accept --json"
        return suite
    on_device = device != "cpu"
    if on_device and "--device" not in options:
        suite.status, suite.reason = "skipped", "runs on the CPU only (no --device option)"
        return suite
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"{suite.name}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, str(suite.path), "--json", str(out), *(["--quick"] * quick)]
    command += ["--device", device] if on_device else []
    start = time.perf_counter()
    returncode, output = _stream(command, root, timeout, on_line)
    suite.seconds = time.perf_counter() - start
    if log is not None:
        log.mkdir(parents=True, exist_ok=True)
        (log / f"{suite.name}.log").write_text(output)
    if returncode is None:
        suite.status, suite.reason = "failed", f"timed out after {timeout:.0f} s"
        return suite
    if returncode != 0 or not out.exists():
        suite.status, suite.reason = "failed", _last_line(returncode, output)
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


class Progress:
    """Progress over the suites and inside the one running. On a terminal: a tqdm bar whose text
    is the suite's latest output line (or, without tqdm, one status line rewritten in place).
    Otherwise (a log): every output line of the suite on stderr, prefixed with the suite."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.count, self.name = total, 0, ""
        self.stream = stream if stream is not None else sys.stderr
        self.width = min(shutil.get_terminal_size((100, 20)).columns, 160) - 1
        self.tty = self.stream.isatty()
        self.bar: Any = None
        if total and self.tty:  # in a log (CI) every line is printed instead
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self.bar = tqdm(total=total, unit="suite", file=self.stream, dynamic_ncols=True)

    def start(self, name: str) -> None:
        self.name = name
        if self.bar is not None:
            self.bar.set_description(name)
        else:
            self._show(f"[{self.count + 1}/{self.total}] {name}: starting")

    def line(self, text: str) -> None:
        """One output line of the running suite."""
        text = " ".join(text.split())
        if self.bar is not None:
            self.bar.set_postfix_str(text[: max(10, self.width // 2)], refresh=True)
        else:
            self._show(f"[{self.count + 1}/{self.total}] {self.name}: {text}")

    def done(self, summary: str) -> None:
        self.count += 1
        if self.bar is not None:
            self.bar.set_postfix_str(summary, refresh=False)
            self.bar.update()
        else:
            self._show(f"[{self.count}/{self.total}] {self.name}: {summary}", final=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _show(self, text: str, final: bool = False) -> None:
        text = text[: self.width]
        if self.tty:
            end = "\n" if final else ""
            self.stream.write("\r" + text.ljust(self.width) + end)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
