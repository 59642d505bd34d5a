"""The sum kernel's accumulation: speed against JAX and the copy floor, error against torch.

Usage: ``python tools/sum_blocks.py [--variants blocks-16,kahan] [--rounds 101]`` from a
checkout (a C compiler needed; JAX optional, its column is skipped without it).

The native sum (``rg_sum`` in ``ragged/kernels/_native.c``) keeps the accuracy contract of
docs/semantics.md ("Accuracy of long segments") by adding blocks of ``RG_BLOCK`` rows in
float32 and each block's sum into a float64 accumulator (``rg_add_rows``); built with
``-DRG_SUM_KAHAN`` it accumulates in float32 with Kahan compensation instead
(``rg_kahan_rows``). This builds one library per variant (``_native_build``'s flags plus the
variant's macros, into a temporary folder):

* ``blocks-N``: float32 blocks of N rows added in float64 (``-DRG_BLOCK=N``; the library's
  kernel is ``blocks-16``);
* ``kahan``: every row added with compensation (``-DRG_SUM_KAHAN``);

and, on the data of ``benchmarks/ops.py`` (values ``[2**20, 64]`` float32 in 8192 log-normal
segments, one thread pinned to one CPU), prints:

* speed: rounds of every variant, JAX's ``segment_sum`` (``jax.jit``, reading the same
  tensor through DLPack) and a copy into a warm buffer, in alternating order; each variant's
  median time and the median per-round ratio JAX / variant with its 95% interval
  (``Timing.paired_interval``), and the copy floor (half the copy) / variant;
* accuracy: the relative error against float64 of each variant and of ``torch.sum`` on
  float32 segments of 16 to 10^6 rows (the data of ``tests/test_accuracy.py``).
"""

import argparse
import ctypes
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import ragged
from ragged.bench import compare, pin_cpu
from ragged.kernels import _native_build

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: benchmarks.ops
from benchmarks.ops import MAX_OVER_MEAN, import_jax, jax_functions, make_data, shared

ROWS, SEGMENTS, WIDTH = 1 << 20, 8192, 64
ACCURACY_LENGTHS = (16, 64, 128, 1000, 10**6)
Sum = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def defines(variant: str) -> list[str]:
    """The macros that build ``variant`` (see the module's docstring)."""
    if variant == "kahan":
        return ["RG_SUM_KAHAN"]
    if variant.startswith("blocks-") and variant[7:].isdigit():
        return [f"RG_BLOCK={variant[7:]}"]
    sys.exit(f"sum_blocks.py: unknown variant {variant!r} (blocks-N, kahan)")


def build(variant: str, folder: Path) -> Sum:
    """The float32 segment sum of ``_native.c`` compiled as ``variant``."""
    compiler = _native_build._compiler()
    if compiler is None:
        sys.exit("sum_blocks.py: no C compiler ($CC, cc, gcc or clang)")
    target = folder / f"sum_{variant}.so"
    if not _native_build._build(compiler, target, defines=defines(variant)):
        sys.exit(f"sum_blocks.py: {compiler} failed on {_native_build._SOURCE} ({variant})")
    lib = ctypes.CDLL(str(target))
    _native_build._declare(lib)
    kernel = lib.rg_sum_f32

    def segment_sum(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        num, width = offsets.numel() - 1, values.shape[1]
        out = torch.empty(num, width)
        code = kernel(
            values.data_ptr(),
            values.stride(0),
            width,
            offsets.data_ptr(),
            num,
            values.shape[0],
            0,
            out.data_ptr(),
        )
        if code != 0:  # 1: offsets inconsistent with the rows, 2: out of memory
            raise RuntimeError(f"sum_blocks.py: rg_sum_f32 returned {code}")
        return out

    return segment_sum


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def speed(sums: dict[str, Sum], rounds: int, jax: Any) -> None:
    d = make_data(ROWS, SEGMENTS, WIDTH, max_over_mean=MAX_OVER_MEAN)  # the ops suite's data
    values, buffer = d.values, torch.empty_like(d.values)
    calls: dict[str, Callable[[], Any]] = {
        name: (lambda fn=fn: fn(values, d.offsets)) for name, fn in sums.items()
    }
    calls["copy"] = lambda: buffer.copy_(values)
    if jax is not None:  # as benchmarks/ops.py sets it up: jit, the same tensor through DLPack
        segment_sum = jax.jit(jax_functions(jax, "sum", d)["JAX segment_sum"])
        values_jax = shared(jax, values)
        calls["JAX segment_sum"] = lambda: jax.block_until_ready(segment_sum(values_jax))
    times = compare(calls, repeat=rounds, alternate=True)
    print(f"\nSpeed: [{ROWS}, {WIDTH}] float32, {SEGMENTS} segments, {rounds} rounds (ms: medians)")
    print("| variant | ms | copy floor / variant | JAX / variant (95% interval) |")
    print("|---|---|---|---|")
    for name in calls:
        if name == "copy" or name.startswith("JAX"):
            continue
        mine = times[name]
        floor = mine.paired(times["copy"], "wall") / 2
        jax_cell = "n/a (no JAX)"
        if jax is not None:
            low, high = mine.paired_interval(times["JAX segment_sum"], "wall")
            ratio = mine.paired(times["JAX segment_sum"], "wall")
            jax_cell = f"{ratio:.3f}x ({low:.3f}-{high:.3f})"
        print(f"| {name} | {1e3 * mine.median('wall'):.2f} | {floor:.0%} | {jax_cell} |")
    for name in ("copy", "JAX segment_sum"):
        if name in times:
            print(f"| {name} | {1e3 * times[name].median('wall'):.2f} | | |")


def accuracy(sums: dict[str, Sum]) -> None:
    gen = torch.Generator().manual_seed(0)
    data = {  # the data of tests/test_accuracy.py
        "uniform [0, 1)": torch.rand(10**6, 4, generator=gen),
        "N(100, 1)": torch.randn(10**6, 4, generator=gen) + 100,
    }
    print("\nRelative error against float64 (float32 values, 4 columns)")
    names = " | ".join(sums)
    print(f"| values | segment length | torch.sum | {names} |")
    print("|---" * (len(sums) + 3) + "|")
    for kind, values in data.items():
        for length in ACCURACY_LENGTHS:
            num = values.shape[0] // length
            segments = values[: num * length]
            want = segments.double().view(num, length, 4).sum(1)
            torch_error = relative_error(segments.view(num, length, 4).sum(1), want)
            offsets = ragged.from_lengths(segments, [length] * num).offsets
            ours = [relative_error(fn(segments, offsets), want) for fn in sums.values()]
            cells = " | ".join(f"{e:.1e}" for e in [torch_error, *ours])
            print(f"| {kind} | {length} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variants",
        default="blocks-16,kahan",
        help="comma-separated: blocks-N, kahan",
    )
    parser.add_argument("--rounds", type=int, default=101, help="head-to-head rounds")
    args = parser.parse_args()
    pin_cpu()
    torch.set_num_threads(1)
    jax = import_jax()
    with tempfile.TemporaryDirectory() as folder:
        sums = {v: build(v, Path(folder)) for v in args.variants.split(",")}
        accuracy(sums)
        speed(sums, args.rounds, jax)


if __name__ == "__main__":
    main()
