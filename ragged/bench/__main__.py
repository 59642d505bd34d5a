"""``python -m ragged.bench``: run the benchmark suites, plot, and (on request) refresh the docs.

Every script in the benchmarks folder is a suite (``benchmarks/`` of a checkout, found from the
working directory or next to the installed package, or ``--benchmarks DIR``). Each runs in a
fresh process with ``--json <results>/<suite>.json`` (scripts without a ``--json`` option are
recorded as skipped); its output is streamed as progress. Results, logs and plots go to the
results folder (``benchmarks/results/``, ``.../quick/`` for ``--quick``, a subfolder per device
other than the CPU, or ``--out DIR``). Only ``--write-docs`` touches the repository's
``docs/img/`` plots and the ``<!-- bench:<suite>:start/end -->`` sections of
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

from ._plots import available as plots_available
from ._plots import plot_all
from ._report import Table, describe, replace_section
from ._runner import Progress, Suite, discover, run_suite, suite_options
from ._timing import use_device

DESCRIPTION = """\
Run the benchmark suites (the scripts in a checkout's benchmarks/ folder), each in a fresh
process, and print their tables. Results, logs and plots go to the results folder; the
repository's docs (docs/benchmarks.md and docs/img/) change only with --write-docs."""

EXAMPLES = """\
examples:
  python -m ragged.bench --quick                 CI-size runs of every suite (minutes)
  python -m ragged.bench --suite ops --suite skew
  python -m ragged.bench --device cuda           on a GPU (suites without --device are skipped)
  python -m ragged.bench --write-docs            full runs, then rewrite docs/benchmarks.md
  python -m ragged.bench --render-only --write-docs   redraw docs plots and tables from results
  python -m ragged.bench --benchmarks ~/torch-ragged/benchmarks   from outside a checkout"""

WIDTH = 100  # printed lines are wrapped to this width
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # a checkout, or site-packages


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Description and examples kept as written; every option's default shown (but ``None`` and
    ``False``, which say nothing)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def find_benchmarks(start: Path, given: str | None = None) -> Path:
    """The benchmarks folder: ``given``, else ``benchmarks/`` in ``start`` or a parent (a
    checkout), else next to the imported package (an editable install or a checkout on
    ``sys.path``). Raises ``SystemExit`` naming the places it looked."""
    if given is not None:
        path = Path(given).expanduser()
        if not _has_suites(path):
            raise SystemExit(
                f"python -m ragged.bench: --benchmarks {given}: no suites (*.py) there"
            )
        return path.resolve()
    looked = []
    for root in (start, *start.parents, PACKAGE_ROOT):
        candidate = root / "benchmarks"
        looked.append(str(candidate))
        if _has_suites(candidate) and (root / "ragged").is_dir():
            return candidate.resolve()
    raise SystemExit(
        "python -m ragged.bench: no benchmarks folder found (looked in "
        f"{', '.join(dict.fromkeys(looked[:3] + looked[-1:]))}). The suites ship with the "
        "source, not the wheel: run from a checkout of torch-ragged, or pass --benchmarks DIR "
        "(its benchmarks/ folder)."
    )


def _has_suites(path: Path) -> bool:
    return path.is_dir() and any(not p.name.startswith("_") for p in path.glob("*.py"))


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


def render_status(suites: list[Suite], earlier: str = "") -> str:
    """The suites table; a suite with neither a run nor a result here keeps its row of
    ``earlier`` (the page's current table), so one suite's run leaves the others' rows as they
    were."""
    kept = {
        line.split("`")[1]: line
        for line in earlier.splitlines()
        if line.startswith("| `benchmarks/") and "| not run |" not in line
    }
    lines = ["| suite | status | run time | date |", "|---|---|---|---|"]
    for s in suites:
        if s.status == "not run" and f"benchmarks/{s.name}.py" in kept:
            lines.append(kept[f"benchmarks/{s.name}.py"])
            continue
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
    earlier = re.search(r"<!-- bench:suites:start -->\n(.*?)<!-- bench:suites:end -->", text, re.S)
    table = render_status(suites, earlier.group(1) if earlier else "")
    text, found = replace_section(text, "suites", table)
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


def earlier_status(suite: Suite, root: Path, results_dir: Path, device: str) -> None:
    """Status of a suite not run this time: its earlier result, or why it cannot run."""
    previous = results_dir / f"{suite.name}.json"
    options = suite_options(suite, root)
    if previous.exists():
        suite.result = json.loads(previous.read_text())
        suite.status, suite.seconds = "ok", suite.result.get("seconds", 0.0)
    elif "--json" not in options:
        suite.status, suite.reason = "skipped", "does not accept --json"
    elif device != "cpu" and "--device" not in options:
        suite.status, suite.reason = "skipped", "runs on the CPU only (no --device option)"
    else:
        suite.status, suite.reason = "not run", ""


def say(text: str = "", *, indent: str = "") -> None:
    """Print ``text`` wrapped to ``WIDTH`` (tables keep their lines; long ones are cut)."""
    for line in text.splitlines() or [""]:
        if len(line) <= WIDTH:
            print(line)
        elif line.startswith("  ") or " " not in line.strip():
            print(line[: WIDTH - 3] + "...")
        else:
            print(textwrap.fill(line, WIDTH, subsequent_indent=indent or "    "))


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[Suite], Path]:
    """Two passes: find the benchmarks folder, then offer its suites as ``--suite`` choices."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--benchmarks")
    known, _ = first.parse_known_args(argv)
    try:
        bench_dir: Path | None = find_benchmarks(Path.cwd(), known.benchmarks)
        error = ""
    except SystemExit as exc:
        bench_dir, error = None, str(exc)
    suites = discover(bench_dir) if bench_dir is not None else []
    names = [s.name for s in suites]
    parser = argparse.ArgumentParser(
        prog="python -m ragged.bench",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--suite",
        action="append",
        choices=names or None,
        metavar="NAME",
        help="run only this suite (repeatable); one of: "
        + (", ".join(names) if names else "none found"),
    )
    parser.add_argument("--quick", action="store_true", help="CI-size runs on small data")
    parser.add_argument(
        "--device",
        default="cpu",
        help="device passed to every suite that has a --device option (cpu, cuda, cuda:1); "
        "the others are skipped with a note",
    )
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="also draw the plots into docs/img/ and rewrite the tables of docs/benchmarks.md "
        "(CPU results only)",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: redraw the plots (and, with --write-docs, the docs) from the results "
        "folder",
    )
    parser.add_argument(
        "--benchmarks",
        metavar="DIR",
        help="the folder of suite scripts (default: benchmarks/ of the checkout found from the "
        "working directory or the package)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="results folder (default: benchmarks/results/, then quick/ and the device type)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per suite")
    args = parser.parse_args(argv)
    if bench_dir is None:
        parser.exit(2, error + "\n")
    return args, suites, bench_dir


def results_folder(args: argparse.Namespace, bench_dir: Path) -> Path:
    if args.out:
        return Path(args.out).expanduser().resolve()
    folder = bench_dir / "results"
    if args.quick:
        folder = folder / "quick"
    device = args.device.split(":")[0]
    return folder / device if device != "cpu" else folder


def docs_dir(bench_dir: Path) -> Path:
    """The repository's ``docs/`` next to the benchmarks folder (for ``--write-docs``)."""
    docs = bench_dir.parent / "docs"
    if not (docs / "benchmarks.md").is_file():
        raise SystemExit(
            f"python -m ragged.bench: --write-docs needs {docs / 'benchmarks.md'} (a checkout)"
        )
    return docs


def main(argv: list[str] | None = None) -> int:
    args, suites, bench_dir = parse_args(argv)
    root = bench_dir.parent
    results_dir = results_folder(args, bench_dir)
    docs = None
    if args.write_docs:
        if args.device != "cpu":
            raise SystemExit(
                "python -m ragged.bench: docs/benchmarks.md holds the CPU report; "
                f"--write-docs with --device {args.device} would overwrite it (results stay in "
                f"{results_dir})"
            )
        docs = docs_dir(bench_dir)
    if args.device != "cpu" and not args.render_only:
        use_device(args.device)  # a clear error now rather than one failure per suite
    selected = (
        [] if args.render_only else [s for s in suites if not args.suite or s.name in args.suite]
    )
    progress = Progress(len(selected))
    for suite in selected:
        progress.start(suite.name)
        run_suite(
            suite,
            root,
            results_dir,
            quick=args.quick,
            timeout=args.timeout,
            log=results_dir / "logs",
            device=args.device,
            on_line=progress.line,
        )
        progress.done(f"{suite.status} in {suite.seconds:.0f} s")
        if suite.result is not None:
            suite.result["date"] = datetime.date.today().isoformat()
            suite.result["seconds"] = round(suite.seconds, 1)
            text = json.dumps(suite.result, indent=1) + "\n"
            (results_dir / f"{suite.name}.json").write_text(text)
    progress.close()
    for suite in suites:
        if suite not in selected:
            earlier_status(suite, root, results_dir, args.device)
    for s in selected:
        say(f"{s.name:<12}{s.status:<9}{s.seconds:7.0f} s  {s.reason}")
        if s.result is not None:
            for data in s.result["tables"][:2]:
                say(Table.from_json(data).text(WIDTH))
                say()
    # Suites run now, or all earlier results when only rendering.
    shown = suites if args.render_only else selected
    results = {s.name: s.result for s in shown if s.result is not None}
    written: list[Path] = []
    if results and plots_available():
        written = plot_all(results, results_dir / "img")
    elif results:
        say("matplotlib is not installed (pip install -e '.[bench]'): no plots")
    if docs is not None:
        for path in written:
            target = docs / "img" / path.name
            shutil.copyfile(path, target)
            say(f"wrote {target.relative_to(root)}")
        missing = update_docs(docs / "benchmarks.md", suites)
        say(
            f"updated {(docs / 'benchmarks.md').relative_to(root)}"
            + (f" (no markers for: {', '.join(missing)})" if missing else "")
        )
    where = _shown_path(results_dir)
    if selected:
        say(f"results: {where}/<suite>.json, logs: {where}/logs/<suite>.log")
    if written:
        say(f"plots: {_shown_path(results_dir / 'img')}/ ({', '.join(p.name for p in written)})")
    if docs is None and (selected or args.render_only):
        say("docs/benchmarks.md and docs/img/ unchanged (--write-docs to update them)")
    return 1 if any(s.status == "failed" for s in suites) else 0


def _shown_path(path: Path) -> str:
    """``path`` relative to the working directory when inside it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
