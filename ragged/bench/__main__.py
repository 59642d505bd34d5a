"""``python -m ragged.bench``: run the benchmark suites, plot, and refresh docs/benchmarks.md.

Every script in ``benchmarks/`` is a suite. Each runs in a fresh process with
``--json benchmarks/results/<suite>.json`` (scripts without a ``--json`` flag are recorded as
skipped). Then, unless ``--quick`` (or with ``--update-docs``), the plots go to ``docs/img/``
and the tables into the ``<!-- bench:<suite>:start/end -->`` sections of
``docs/benchmarks.md``, with the command and the machine.

Usage (from a checkout of the repository)::

    python -m ragged.bench [--quick] [--suite NAME ...] [--update-docs | --no-update-docs]
    python -m ragged.bench --render-only   # redraw plots and tables from benchmarks/results/
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from ._plots import available as plots_available
from ._plots import plot_all
from ._report import Table, describe, replace_section
from ._runner import Suite, discover, progress, run_suite, supports_json


def find_root(start: Path) -> Path:
    """The checkout holding ``benchmarks/``: the working directory or the package's parent."""
    for candidate in (start, *start.parents, Path(__file__).resolve().parents[2]):
        if (candidate / "benchmarks").is_dir() and (candidate / "ragged").is_dir():
            return candidate
    raise SystemExit("python -m ragged.bench: run it from a checkout (no benchmarks/ found)")


def render_suite(result: dict[str, Any]) -> str:
    """The Markdown body of one suite's section."""
    when = result.get("date", "")
    metric = result["metric"]
    # Timed suites name a clock ("cpu", "wall"); others what they count ("checks", "cost").
    shown = f"median {metric} time" if metric in ("cpu", "wall") else metric
    lines = [
        f"Command: `{result['command']}`{f' ({when})' if when else ''}. "
        f"Machine: {describe(result['machine'])}. Metric: {shown}"
        f"{' (quick run: small data)' if result.get('quick') else ''}.",
    ]
    for data in result["tables"]:
        table = Table.from_json(data)
        lines += ["", f"**{table.title}**", "", table.markdown()]
    return "\n".join(lines)


def render_status(suites: list[Suite]) -> str:
    lines = ["| suite | status | run time | date |", "|---|---|---|---|"]
    for s in suites:
        status = s.status + (f": {s.reason}" if s.reason else "")
        took = f"{s.seconds:.0f} s" if s.seconds else "-"
        date = (s.result or {}).get("date", "-")
        quick = " (quick)" if (s.result or {}).get("quick") else ""
        lines.append(f"| `benchmarks/{s.name}.py` | {status}{quick} | {took} | {date} |")
    return "\n".join(lines)


def update_docs(doc: Path, suites: list[Suite]) -> list[str]:
    """Rewrite the marked sections of ``doc``; returns the sections that had no markers."""
    text = doc.read_text()
    missing = []
    text, found = replace_section(text, "suites", render_status(suites))
    if not found:
        missing.append("suites")
    for s in suites:
        if s.result is None:
            continue
        text, found = replace_section(text, s.name, render_suite(s.result))
        if not found:
            missing.append(s.name)
    doc.write_text(text)
    return missing


def earlier_status(suite: Suite, root: Path, results_dir: Path) -> None:
    """Status of a suite not run this time: its earlier result, or why it cannot run."""
    previous = results_dir / f"{suite.name}.json"
    if previous.exists():
        suite.result = json.loads(previous.read_text())
        suite.status, suite.seconds = "ok", suite.result.get("seconds", 0.0)
    elif not supports_json(suite, root):
        suite.status, suite.reason = "skipped", "does not accept --json"
    else:
        suite.status, suite.reason = "not run", ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ragged.bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="CI-size runs (small data)")
    parser.add_argument("--suite", action="append", help="run only this suite (repeatable)")
    parser.add_argument(
        "--update-docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write plots and docs/benchmarks.md tables (default: on for full runs only)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per suite")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: redraw the plots and docs tables from benchmarks/results/*.json",
    )
    args = parser.parse_args(argv)
    root = find_root(Path.cwd())
    # Quick (CI-size) results never overwrite the full ones that the docs are drawn from.
    results_dir = root / "benchmarks" / "results" / ("quick" if args.quick else "")
    suites = discover(root / "benchmarks")
    if args.suite:
        unknown = sorted(set(args.suite) - {s.name for s in suites})
        if unknown:
            parser.error(f"no such suite: {', '.join(unknown)}")
    selected = [s for s in suites if not args.suite or s.name in args.suite]
    if args.render_only:
        selected = []
    for suite in progress(selected, lambda s: s.name):
        run_suite(
            suite,
            root,
            results_dir,
            quick=args.quick,
            timeout=args.timeout,
            log=results_dir / "logs",
        )
        if suite.result is not None:
            suite.result["date"] = datetime.date.today().isoformat()
            suite.result["seconds"] = round(suite.seconds, 1)
            text = json.dumps(suite.result, indent=1) + "\n"
            (results_dir / f"{suite.name}.json").write_text(text)
    for suite in suites:
        if suite not in selected:
            earlier_status(suite, root, results_dir)
    for s in selected:
        print(f"{s.name:<12}{s.status:<9}{s.seconds:7.0f} s  {s.reason}")
        if s.result is not None:
            for data in s.result["tables"][:2]:
                print(Table.from_json(data).text())
                print()
    update = (args.render_only or not args.quick) if args.update_docs is None else args.update_docs
    if update:
        # Suites run now, or all earlier results when only rendering.
        shown = suites if args.render_only else selected
        results = {s.name: s.result for s in shown if s.result is not None}
        if plots_available():
            for path in plot_all(results, root / "docs" / "img"):
                print(f"wrote {path.relative_to(root)}")
        else:
            print("matplotlib is not installed (pip install -e '.[bench]'): no plots")
        missing = update_docs(root / "docs" / "benchmarks.md", suites)
        print(
            "updated docs/benchmarks.md"
            + (f" (no markers for: {', '.join(missing)})" if missing else "")
        )
    return 1 if any(s.status == "failed" for s in suites) else 0


if __name__ == "__main__":
    sys.exit(main())
