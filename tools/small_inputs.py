"""Small inputs: the eager dispatch of the segment kernels against each path it chooses from.

Usage: ``python tools/small_inputs.py [--ops sum,cummax] [--grad]`` from a checkout (one thread,
pinned to one CPU; each time is the minimum over 7 batches of calls, robust on a shared
machine). For every op and input it times ``ragged`` as it dispatches, then the same call with
the composite ops forced and with the native kernels forced (as ``tests/paths.py`` forces
them), forward only (nothing to differentiate) or, with ``--grad``, forward and
``out.sum().backward()``. The dispatch should be about the faster of the two: the thresholds
in ``ragged/kernels/_segment.py`` come from this table (docs/benchmarks.md, "Small inputs").
Run it on two checkouts to compare their dispatch.
"""

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ragged
from ragged.bench import pin_cpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.paths
from tests.paths import use_path

OPS: dict[str, Callable[[Any], Any]] = {
    "sum": lambda x: ragged.sum(x, axis=1),
    "mean": lambda x: ragged.mean(x, axis=1),
    "max": lambda x: ragged.max(x, axis=1),
    "var": lambda x: ragged.var(x, axis=1),
    "logsumexp": lambda x: ragged.logsumexp(x, axis=1),
    "softmax": lambda x: ragged.softmax(x, axis=1),
    "log_softmax": lambda x: ragged.log_softmax(x, axis=1),
    "cumsum": lambda x: ragged.cumsum(x, axis=1),
    "cummax": lambda x: ragged.cummax(x, axis=1),
    "logcumsumexp": lambda x: ragged.logcumsumexp(x, axis=1),
}
# (label, segment lengths, inner size): tiny, then 256, 1024 and 4096 rows.
INPUTS = [
    ("[3, 8, 1, 5] x 8", [3, 8, 1, 5], 8),
    ("32 x 8 rows x 8", [8] * 32, 8),
    ("128 x 8 rows x 8", [8] * 128, 8),
    ("16 x 64 rows x 64", [64] * 16, 64),
    ("512 x 8 rows x 8", [8] * 512, 8),
]


@contextlib.contextmanager
def forced(path: str) -> Iterator[None]:
    """Route the segment kernels through ``path`` ("composite" or "native") inside the block,
    as the tests force them (``tests/paths.py``, this checkout's own thresholds)."""
    with pytest.MonkeyPatch.context() as patch:
        use_path(path, patch)
        yield


def per_call(fn: Callable[[], Any], number: int, repeat: int = 7) -> float:
    for _ in range(max(3, number // 10)):
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def job(op: Callable[[Any], Any], x: Any, grad: bool) -> Callable[[], Any]:
    def run() -> Any:
        out = op(x)
        out = out.values if isinstance(out, ragged.RaggedArray) else out
        out = out[0] if isinstance(out, tuple) else out
        if grad:
            out.sum().backward()
        return out

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset")
    parser.add_argument("--grad", action="store_true", help="forward and backward")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pin_cpu()
    gen = torch.Generator().manual_seed(0)
    mode = "forward+backward" if args.grad else "forward"
    print(f"us per call, {mode}: ragged's dispatch / composite forced / native forced")
    print(f"{'input':20s} " + " ".join(f"{name:>22s}" for name in args.ops.split(",")))
    for label, lengths, inner in INPUTS:
        values = torch.randn(sum(lengths), inner, generator=gen, requires_grad=args.grad)
        x = ragged.from_lengths(values, lengths)
        number = max(20, 20000 // (values.numel() // 16 + 50))
        cells = []
        for name in args.ops.split(","):
            fn = job(OPS[name], x, args.grad)
            times = [per_call(fn, number)]
            for path in ("composite", "native"):
                with forced(path):
                    times.append(per_call(fn, number))
            cells.append("/".join(f"{t * 1e6:.0f}" for t in times))
        print(f"{label:20s} " + " ".join(f"{c:>22s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
