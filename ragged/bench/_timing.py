"""Timing and memory measurement for the benchmark suites.

Every measurement records both wall-clock time and the process's CPU time (user + system, which
includes the page faults of fresh tensors). The suites run torch on one thread, so CPU time is
the work done by the op itself; on a shared machine it is steadier than wall time, which also
counts the time other processes held the core. Variants of one job are timed round-robin (one
call of each per round), so slow drifts in the machine's load hit all of them alike.

On an accelerator (``use_device``, the suites' ``--device``), every timed call is followed by
a synchronisation of the device, so wall time covers the kernels the call launched (CPU time
then only counts the host's share: suites report wall time there), and ``peak_memory``
reads the device allocator's high-water mark.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "Timing",
    "add_device_option",
    "compare",
    "peak_memory",
    "per_call",
    "pin_cpu",
    "synchronize",
    "use_device",
]

_device = torch.device("cpu")


def use_device(name: str | torch.device) -> torch.device:
    """Time on ``name`` from now on (a suite's ``--device``); returns the device.

    Timing then waits for the device after every call (``synchronize``), and
    ``peak_memory`` reads its allocator. Raises ``SystemExit`` with a clear message when torch
    does not see the device.

    >>> use_device("cpu")
    device(type='cpu')
    """
    global _device
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise SystemExit(f"--device {name}: {error}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"--device {name}: torch {torch.__version__} sees no CUDA device")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type not in ("cpu", "meta") and not torch.accelerator.is_available():
        raise SystemExit(f"--device {name}: torch sees no {device.type} accelerator")
    _device = device
    return device


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """Add the suites' common ``--device`` option (the runner passes it on to suites that have
    it, and skips the others on a device other than the CPU)."""
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the data lives and the timed calls run: cpu, cuda, cuda:1, ... "
        "(on an accelerator, timings synchronise it and report wall time)",
    )


def pin_cpu(cpus: int | set[int] | None = None) -> set[int]:
    """Run every thread of this process, and the threads it starts later, on ``cpus`` (one CPU
    number or a set; by default the last CPU this process may use); returns the set the calling
    thread could use before, so that a second call undoes the first.

    The suites time single-threaded contestants, but not all on the same thread: JAX runs its
    computations on a worker thread, torch on the caller's. Unpinned, the two may sit on
    different cores, and the cores of a virtual machine differ in speed (12% apart for a
    memory-bound reduction on this project's 2-core VM): one core for every contestant keeps
    that out of the ratios. Where the OS has no CPU affinity (macOS), nothing happens and the
    result is empty.

    >>> before = pin_cpu()
    >>> len(os.sched_getaffinity(0))
    1
    >>> _ = pin_cpu(before)  # undo
    >>> os.sched_getaffinity(0) == before
    True
    """
    if not hasattr(os, "sched_setaffinity"):
        return set()
    before = set(os.sched_getaffinity(0))
    wanted = {max(before)} if cpus is None else {cpus} if isinstance(cpus, int) else set(cpus)
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # the calling thread only
    for tid in threads:
        try:
            os.sched_setaffinity(tid, wanted)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
        except OSError as error:
            raise ValueError(
                f"pin_cpu: cpus: expected CPUs this process may use ({sorted(before)}), got "
                f"{sorted(wanted)} ({error})"
            ) from None
    return before


def synchronize() -> None:
    """Wait for the work queued on the timing device (nothing to wait for on CPU)."""
    if _device.type == "cuda":
        torch.cuda.synchronize(_device)
    elif _device.type not in ("cpu", "meta"):
        torch.accelerator.synchronize()


@dataclasses.dataclass(frozen=True)
class Timing:
    """Medians of one variant, in seconds, over ``len(cpu)`` timed calls."""

    wall: list[float]
    cpu: list[float]

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    def median(self, metric: str) -> float:
        """The median of ``metric`` (``"cpu"`` or ``"wall"``).

        >>> Timing([1.0, 3.0, 2.0], [0.5, 0.5, 0.7]).median("wall")
        2.0
        """
        return self.cpu_median if metric == "cpu" else self.wall_median

    def paired(self, other: Timing, metric: str) -> float:
        """The median over rounds of ``other``'s time over this one's: calls of one round ran
        side by side, so a drift of the machine's speed between rounds cancels out.

        >>> mine = Timing(wall=[1.0, 2.0, 4.0], cpu=[1.0, 2.0, 4.0])
        >>> theirs = Timing(wall=[3.0, 2.2, 4.4], cpu=[0.0, 0.0, 0.0])
        >>> mine.paired(theirs, "wall")  # per round: 3.0, 1.1, 1.1
        1.1
        """
        return statistics.median(self._ratios(other, metric, "paired"))

    def paired_interval(
        self, other: Timing, metric: str, level: float = 0.95
    ) -> tuple[float, float]:
        """A ``level`` confidence interval of :meth:`paired`'s median: order statistics of the
        per-round ratios chosen by the binomial distribution (no assumption on their shape;
        rounds taken as independent). With too few rounds for ``level``, the whole range.

        >>> mine = Timing(wall=[1.0] * 20, cpu=[1.0] * 20)
        >>> theirs = Timing(wall=[0.90 + 0.01 * i for i in range(20)], cpu=[1.0] * 20)
        >>> [round(r, 2) for r in mine.paired_interval(theirs, "wall")]  # median 1.0
        [0.95, 1.04]
        """
        if not 0.0 < level < 1.0:
            raise ValueError(f"Timing.paired_interval: level: expected in (0, 1), got {level}")
        ratios = sorted(self._ratios(other, metric, "paired_interval"))
        n = len(ratios)
        # The largest k with P(Binomial(n, 1/2) < k) <= (1 - level) / 2: the interval from
        # the k-th smallest to the k-th largest ratio covers the median with >= level.
        k, below = 0, 0.0
        while k < n // 2:
            below += math.comb(n, k) / 2.0**n
            if below > (1.0 - level) / 2.0:
                break
            k += 1
        k = max(k, 1)
        return ratios[k - 1], ratios[n - k]

    def _ratios(self, other: Timing, metric: str, method: str) -> list[float]:
        mine = self.cpu if metric == "cpu" else self.wall
        theirs = other.cpu if metric == "cpu" else other.wall
        if len(mine) != len(theirs):
            raise ValueError(
                f"Timing.{method}: other: expected as many timed calls as this one's "
                f"{len(mine)}, got {len(theirs)}"
            )
        return [b / a for a, b in zip(mine, theirs, strict=True)]

    def spread(self, metric: str) -> float:
        """Relative spread (max - min) / median: how noisy the measurement was."""
        values = self.cpu if metric == "cpu" else self.wall
        mid = statistics.median(values)
        return (max(values) - min(values)) / mid if mid else 0.0


def compare(
    variants: dict[str, Callable[[], Any]],
    *,
    repeat: int,
    warmup: int = 1,
    budget: float | None = None,
    estimates: dict[str, float] | None = None,
    alternate: bool = False,
) -> dict[str, Timing]:
    """Time every variant ``repeat`` times, round-robin, after ``warmup`` untimed calls each.

    With ``alternate``, every other round runs the variants in reverse order, so that none of
    them always follows the same neighbour (for head-to-head groups read with
    :meth:`Timing.paired`).

    With ``budget`` (seconds), a variant whose warm-up call took longer than ``budget /
    repeat`` (or whose ``estimates`` entry, seconds per call measured by the caller, is) is
    timed fewer times (at least 3): it sits out the last rounds. Results are
    dropped as soon as each call returns (so the next call allocates afresh, as in real use).
    The garbage collector is off while timing.

    >>> t = compare({"noop": lambda: None}, repeat=3)
    >>> len(t["noop"].cpu)
    3
    """
    counts = {}
    for name, fn in variants.items():
        start = time.perf_counter()
        for _ in range(warmup):
            fn()
        synchronize()
        took = (time.perf_counter() - start) / max(warmup, 1)
        if estimates and name in estimates:
            took = estimates[name]
        fits = repeat if budget is None or took <= 0 else int(budget / took)
        counts[name] = max(min(repeat, fits), min(repeat, 3))
    walls: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[float]] = {name: [] for name in variants}
    gc.collect()
    gc.disable()
    try:
        order = list(variants.items())
        for round_ in range(repeat):
            for name, fn in order[::-1] if alternate and round_ % 2 else order:
                if round_ >= counts[name]:
                    continue
                c0, w0 = time.process_time(), time.perf_counter()
                fn()
                synchronize()
                w1, c1 = time.perf_counter(), time.process_time()
                walls[name].append(w1 - w0)
                cpus[name].append(c1 - c0)
    finally:
        gc.enable()
    return {name: Timing(walls[name], cpus[name]) for name in variants}


def per_call(fn: Callable[[], Any], *, number: int, repeat: int) -> Timing:
    """Per-call time of a cheap ``fn``: ``repeat`` batches of ``number`` calls each.

    >>> per_call(lambda: None, number=10, repeat=3).cpu_median < 1e-3
    True
    """
    for _ in range(max(1, number // 10)):
        fn()
    synchronize()
    walls, cpus = [], []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(number):
                fn()
            synchronize()
            w1, c1 = time.perf_counter(), time.process_time()
            walls.append((w1 - w0) / number)
            cpus.append((c1 - c0) / number)
    finally:
        gc.enable()
    return Timing(walls, cpus)


_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_memory(fn: Callable[[], Any]) -> float | None:
    """Peak memory that one call of ``fn`` adds, in bytes (Linux only on CPU, else ``None``).

    On CPU: resets the process's high-water mark (``VmHWM``, by writing 5 to
    ``/proc/self/clear_refs``), calls ``fn`` and reads how far the mark rose above the resident
    size before the call. Large CPU tensors are mapped and unmapped per allocation by the default
    allocator, so this is the peak of the live tensors during the call. On CUDA
    (``use_device``): the rise of the caching allocator's peak of allocated bytes.
    """
    gc.collect()
    if _device.type == "cuda":
        synchronize()
        torch.cuda.reset_peak_memory_stats(_device)
        start = torch.cuda.memory_allocated(_device)
        kept = fn()
        synchronize()
        top = torch.cuda.max_memory_allocated(_device)
        del kept
        return float(max(0, top - start))
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return None
    before = _status_kib("VmRSS")
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    if before is None or peak is None:
        return None
    return max(0, peak - before) * 1024.0
