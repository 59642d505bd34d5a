"""What the trust checks cost: validating loads, and the version checks of eager ops.

Loading: ``torch.load`` of a RaggedArray (every level checked, ``ragged._validate``) against
``torch.load`` of the same tensors in a plain dict (nothing checked), from memory, for ``2**20``
rows of ``[*, 8]`` float32 values: 8192 log-normal segments, and ``2**20`` segments of one row
(the largest partition for these values). The check alone is timed too.

Version checks (``ragged._versions``): the eager-overhead cases of ``benchmarks/ops.py`` (B=4,
lengths [3, 8, 1, 5], D=8: ``x + y`` and ``ragged.sum``) against the plain torch op, with the
checks on, and with ``check_unchanged`` replaced by a no-op in this process (the difference is
the checks' cost); and one ``check_unchanged`` call alone.

Usage: ``python benchmarks/trust.py [--quick] [--metric cpu|wall] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ops import lognormal_lengths, tiny_cases

import ragged
import ragged.ops._elementwise as elementwise
import ragged.ops._reductions._reduce as reductions
from ragged import _validate, _versions
from ragged.bench import Table, compare, per_call, write_result


def _saved(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _check(x: ragged.RaggedArray) -> None:
    for level in x.partition.levels:
        names = ("offsets", "lengths", "row_ids", "max_length", "sum_squares", "columns", "unit")
        _validate.check_level("bench", {n: getattr(level, n) for n in names})
    _validate.check_levels("bench", x.partition.levels)
    _validate.check_array("bench", {"values": x.values, "partition": x.partition, "axes": x.axes})


def load_table(rows: int, repeat: int, metric: str) -> Table:
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(rows, 8, generator=gen)
    table = Table(
        f"Loading a RaggedArray ([{rows}, 8] float32) from memory, checked vs unchecked",
        ["segments", "checked load ms", "plain load ms", "ratio", "check alone ms"],
    )
    for num in (max(rows // 128, 1), rows):
        lengths = lognormal_lengths(num, rows, max_over_mean=7.65) if num < rows else [1] * rows
        x = ragged.from_lengths(values, lengths)
        level = x.partition.levels[0]
        plain = {"values": x.values, "offsets": level.offsets, "lengths": level.lengths}
        plain["row_ids"] = level.row_ids
        data, plain_data = _saved(x), _saved(plain)
        jobs: dict[str, Callable[[], Any]] = {
            "checked": lambda data=data: torch.load(io.BytesIO(data)),
            "plain": lambda plain_data=plain_data: torch.load(io.BytesIO(plain_data)),
            "check": lambda x=x: _check(x),
        }
        times = compare(jobs, repeat=repeat)
        checked, bare, alone = (
            times[k].median(metric) * 1e3 for k in ("checked", "plain", "check")
        )
        table.rows.append(
            [str(num), f"{checked:.1f}", f"{bare:.1f}", f"{checked / bare:.2f}x", f"{alone:.1f}"]
        )
        print(table.rows[-1], flush=True)
    table.notes.append(
        f"Median {metric} time of {repeat} calls, round-robin; ratio = checked / plain load. "
        "Both files hold the same tensors; the checked one is a RaggedArray."
    )
    return table


def overhead_table(number: int, repeat: int, metric: str) -> Table:
    table = Table(
        "Version checks on tiny inputs (B=4, lengths [3, 8, 1, 5], D=8)",
        [
            "op",
            "ragged us",
            "ragged without checks us",
            "checks us",
            "plain torch us",
            "ratio to torch",
            "target <= 3x",
        ],
    )

    def times(variants: dict[str, tuple[Callable[[], Any], bool]]) -> dict[str, float]:
        """Median per-call time (us) of each ``(fn, without_checks)`` variant, batches
        interleaved round-robin; the checks are swapped out around a batch, not a call."""
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(repeat):
            for name, (fn, without_checks) in variants.items():
                saved = elementwise.check_unchanged, reductions.check_unchanged
                if without_checks:
                    elementwise.check_unchanged = reductions.check_unchanged = _no_check
                try:
                    timing = per_call(fn, number=number, repeat=1)
                finally:
                    elementwise.check_unchanged, reductions.check_unchanged = saved
                samples[name].append(timing.median(metric))
        return {name: statistics.median(s) * 1e6 for name, s in samples.items()}

    for label, fn, torch_label, torch_fn, _ in tiny_cases(torch.device("cpu")):
        got = times({"with": (fn, False), "without": (fn, True), "torch": (torch_fn, False)})
        with_checks, without, plain = got["with"], got["without"], got["torch"]
        ratio = with_checks / plain
        table.rows.append(
            [
                label,
                f"{with_checks:.2f}",
                f"{without:.2f}",
                f"{with_checks - without:.2f}",
                f"{plain:.2f} (`{torch_label}`)",
                f"{ratio:.2f}x",
                "met" if ratio <= 3 else "missed",
            ]
        )
        print(table.rows[-1], flush=True)
    x = ragged.from_lengths(torch.randn(17, 8), [3, 8, 1, 5])
    y = x.with_values(torch.randn(17, 8))
    alone = times({"check": (lambda: _versions.check_unchanged("f", x, y), False)})["check"]
    table.notes += [
        f"Median per-call {metric} time over {repeat} batches of {number} calls, the variants' "
        "batches interleaved. `checks` = with - without (check_unchanged replaced by a no-op "
        "in the drivers around a batch); both include the constructor's version record.",
        f"`check_unchanged(func, x, y)` alone (values of both, their shared partition once): "
        f"{alone:.2f} us.",
    ]
    return table


def _no_check(*args: Any, **kwargs: Any) -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run on small data")
    parser.add_argument("--metric", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--json", help="write the result document here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, repeat, number, batches = (1 << 14, 3, 200, 3) if args.quick else (1 << 20, 7, 2000, 15)
    tables = [load_table(rows, repeat, args.metric), overhead_table(number, batches, args.metric)]
    for table in tables:
        print()
        print(table.text())
    if args.json:
        write_result(args.json, "trust", tables, quick=args.quick, metric=args.metric)


if __name__ == "__main__":
    main()
