"""Causal attention on a variable-length batch: ragged against the alternatives and the matmul rate.

Data (issue 27): ``B=32`` sequences with log-normal lengths in [8, 512] (median 96, one of
512), 8 heads of 64, float32, causal, on the CPU. Contestants, timed round-robin in one process
(``ragged.bench.compare``, alternating order), forward (``no_grad``) and forward+backward
(gradients of ``q``, ``k``, ``v`` for a fixed output gradient):

* ``ragged.attention``: the RaggedArrays ``(B, L*, H, Dh)`` (on CPU the native tiled kernel,
  ``ragged/kernels/_native_attention.py``);
* ``ragged, bucket path``: the same call with the native kernel switched off
  (``_native_attention.ENABLED = False``): length buckets on torch's CPU flash kernel, the path
  before it and its fallback;
* ``SDPA loop``: one ``F.scaled_dot_product_attention(is_causal=True)`` per sequence
  (split, attend, concatenate);
* ``flex_attention``: torch's ``flex_attention`` compiled (``torch.compile``, Inductor), on the
  packed batch ``(1, H, T, Dh)`` with a document-causal ``BlockMask`` (forward only: torch
  2.13 has no CPU backward for it); its compile time is reported apart;
* ``padded SDPA``: the batch padded to ``(B, H, Lmax, Dh)`` with a boolean mask (causal and
  key padding);
* ``NJT SDPA``: a ``torch.nested`` jagged tensor with ``is_causal=True``, where torch runs it
  (else the row says why).

Useful FLOPs count the causal half of ``Q K^T`` and ``P V`` (``4 * Dh * L (L + 1) / 2`` per head
and sequence), the backward as 2.5x the forward. The same thread's rate on a
``[512, 64] @ [64, 512]`` matmul (the shape of one attention tile) is measured in the same run:
the table gives each contestant's useful GFLOP/s, its share of that rate and its time over
``ragged.attention``'s (the median over rounds of the per-round ratios: above 1 is slower).

With ``--threads N`` (N > 1) a second table gives ``ragged.attention``'s speed on N threads over
one thread, from paired rounds in the same process, beside what N concurrent one-thread matmul
streams give over one (the machine is shared: that ceiling moves with its load).

Run: ``python benchmarks/attention.py [--quick] [--threads 1] [--reps 15] [--no-flex]
[--json out.json] [--profile]`` (``--quick``: 8 sequences up to 256 rows, 5 rounds, no flex;
``--profile``: also the share of the native kernel's time inside the GEMM calls).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import ragged
from ragged.bench import Table, compare, per_call, pin_cpu, write_result
from ragged.kernels import _native_attention as native_attention

HEADS, HEAD_DIM = 8, 64
TILE = 512  # the matmul tile: [TILE, HEAD_DIM] @ [HEAD_DIM, TILE]


def lengths_for(n: int, high: int, seed: int) -> list[int]:
    """Log-normal lengths (median ``high / 5.3``, sigma 0.9) clipped to [8, high], one of ``high``."""
    gen = torch.Generator().manual_seed(seed)
    draw = torch.exp(torch.randn(n, generator=gen, dtype=torch.float64) * 0.9)
    lengths = (draw * high / 5.3).clamp(8, high).round().long().tolist()
    lengths[int(torch.randint(n, (1,), generator=gen))] = high
    return lengths


def useful_flops(lengths: list[int]) -> float:
    """Forward FLOPs of causal attention: the causal half of ``Q K^T`` and of ``P V``."""
    return float(sum(4 * HEAD_DIM * HEADS * n * (n + 1) // 2 for n in lengths))


def matmul_rate(reps: int) -> float:
    """GFLOP/s of one ``[512, 64] @ [64, 512]`` float32 matmul on this thread."""
    a, b = torch.randn(TILE, HEAD_DIM), torch.randn(HEAD_DIM, TILE)
    timing = per_call(lambda: a @ b, number=200, repeat=max(reps, 5))
    return 2 * TILE * HEAD_DIM * TILE / min(timing.wall) / 1e9


class Batch:
    """One batch in every layout, with the leaf tensors the backward differentiates."""

    def __init__(self, lengths: list[int], seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        total = sum(lengths)
        self.lengths = lengths
        self.q, self.k, self.v = (
            torch.randn(total, HEADS, HEAD_DIM, generator=gen) for _ in range(3)
        )
        self.grad = torch.randn(total, HEADS, HEAD_DIM, generator=gen)
        self.template = ragged.from_lengths(self.q, lengths)
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        self.offsets = offsets
        longest = max(lengths)
        self.longest = longest
        valid = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]  # [B, Lmax]
        causal = torch.ones(longest, longest, dtype=torch.bool).tril()
        self.padded_mask = causal[None, None] & valid[:, None, None, :]
        self.valid = valid
        self.document = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def leaves(self, grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(t.detach().requires_grad_(grad) for t in (self.q, self.k, self.v))  # type: ignore[return-value]

    def pad(self, t: torch.Tensor) -> torch.Tensor:
        """``[T, H, Dh]`` rows to ``[B, H, Lmax, Dh]``."""
        out = t.new_zeros(len(self.lengths), self.longest, HEADS, HEAD_DIM)
        out[self.valid] = t
        return out.transpose(1, 2)


def ragged_attention(batch: Batch, grad: bool, native: bool = True) -> Callable[[], Any]:
    def run() -> Any:
        q, k, v = batch.leaves(grad)
        before = native_attention.ENABLED
        native_attention.ENABLED = native
        try:
            out = ragged.attention(
                batch.template.with_values(q),
                batch.template.with_values(k),
                batch.template.with_values(v),
                causal=True,
            ).values
            if grad:
                torch.autograd.backward(out, batch.grad)
        finally:
            native_attention.ENABLED = before
        return out

    return run


def bucket_path(batch: Batch, grad: bool) -> Callable[[], Any]:
    """``ragged.attention`` with the native kernel switched off: the length buckets on torch's
    CPU flash kernel (the path before the native kernel, and its fallback)."""
    return ragged_attention(batch, grad, native=False)


def sdpa_loop(batch: Batch, grad: bool) -> Callable[[], Any]:
    def run() -> Any:
        q, k, v = batch.leaves(grad)
        outs = []
        for lo, hi in zip(batch.offsets[:-1], batch.offsets[1:], strict=True):
            qs, ks, vs = (t[lo:hi].transpose(0, 1) for t in (q, k, v))
            outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1))
        out = torch.cat(outs)
        if grad:
            torch.autograd.backward(out, batch.grad)
        return out

    return run


def padded_sdpa(batch: Batch, grad: bool) -> Callable[[], Any]:
    def run() -> Any:
        q, k, v = batch.leaves(grad)
        out = F.scaled_dot_product_attention(
            batch.pad(q), batch.pad(k), batch.pad(v), attn_mask=batch.padded_mask
        )
        out = out.transpose(1, 2)[batch.valid]
        if grad:
            torch.autograd.backward(out, batch.grad)
        return out

    return run


def nested_sdpa(batch: Batch, grad: bool) -> Callable[[], Any]:
    # torch logs why each backend declines before raising; the table gives the error.
    logging.getLogger("torch.nested._internal.sdpa").setLevel(logging.ERROR)
    offsets = torch.tensor(batch.offsets)

    def run() -> Any:
        q, k, v = batch.leaves(grad)
        nq, nk, nv = (
            torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in (q, k, v)
        )
        out = F.scaled_dot_product_attention(nq, nk, nv, is_causal=True).transpose(1, 2).values()
        if grad:
            torch.autograd.backward(out, batch.grad)
        return out

    return run


def flex(batch: Batch) -> Callable[[], Any]:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    document, total = batch.document, sum(batch.lengths)

    def document_causal(b: Any, h: Any, i: Any, j: Any) -> Any:
        return (document[i] == document[j]) & (j <= i)

    mask = create_block_mask(document_causal, 1, 1, total, total, device="cpu")
    compiled = torch.compile(flex_attention, dynamic=False)
    q, k, v = (t[None].transpose(1, 2).contiguous() for t in (batch.q, batch.k, batch.v))

    def run() -> Any:
        with torch.no_grad():
            return compiled(q, k, v, block_mask=mask)

    return run


def with_threads(count: int, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run with ``torch.set_num_threads(count)``."""

    def run() -> Any:
        before = torch.get_num_threads()
        torch.set_num_threads(count)
        try:
            return fn()
        finally:
            torch.set_num_threads(before)

    return run


def matmul_streams(count: int, calls: int = 100) -> Callable[[], Any]:
    """``count`` threads making ``count * calls`` one-thread ``[512, 64] @ [64, 512]`` matmuls
    between them, each taking the next from a shared counter (as the kernel's threads take work
    items: a slower or shared core takes fewer), torch releasing the GIL inside them: what the
    cores give to independent work."""
    a, b = torch.randn(TILE, HEAD_DIM), torch.randn(HEAD_DIM, TILE)

    def run() -> None:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        taken = itertools.count()
        total = count * calls

        def stream() -> None:
            torch.set_num_threads(1)  # OpenMP's thread count is per thread: set it in this one
            while next(taken) < total:
                a @ b

        try:
            workers = [threading.Thread(target=stream) for _ in range(count)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        finally:
            torch.set_num_threads(before)

    return run


def scaling(batch: Batch, threads: int, reps: int) -> Table:
    """``threads`` against one thread, in paired rounds of one process (every variant once per
    round, so that all see the same load): ``ragged.attention`` forward and forward+backward,
    and ``threads`` concurrent one-thread matmul streams against one (the ceiling the machine
    gives to independent work at that moment)."""
    table = Table(
        f"Speed with {threads} threads over one thread (paired rounds, medians)",
        ["work", "1 thread ms", f"{threads} threads ms", "speedup", "CPU time ratio"],
    )
    jobs = {
        "ragged.attention forward": ragged_attention(batch, False),
        "ragged.attention forward+backward": ragged_attention(batch, True),
    }
    calls: dict[str, Callable[[], Any]] = {}
    for name, fn in jobs.items():
        calls[f"{name} 1"], calls[f"{name} n"] = with_threads(1, fn), with_threads(threads, fn)
    streams = f"matmul: {threads} one-thread streams against one (per matmul)"
    calls[f"{streams} 1"], calls[f"{streams} n"] = matmul_streams(1), matmul_streams(threads)
    times = compare(calls, repeat=reps, alternate=True)
    for name in [*jobs, streams]:
        one, many = times[f"{name} 1"], times[f"{name} n"]
        work = threads if name == streams else 1  # the streams do `threads` times the work
        table.rows.append(
            [
                name,
                f"{1e3 * one.median('wall'):.1f}",
                f"{1e3 * many.median('wall') / work:.1f}",
                f"{work * many.paired(one, 'wall'):.2f}x",
                f"{one.paired(many, 'cpu') / work:.2f}",
            ]
        )
    table.notes.append(
        "speedup: the median over rounds of the one-thread time over the many-thread time (for "
        "the matmul streams, per matmul); CPU time ratio: the process's CPU time with many threads "
        "over one thread's (1.00: the split adds no work)."
    )
    return table


def where_time_goes(batch: Batch, reps: int) -> str:
    """The share of the native kernel's time inside torch's GEMM calls (the rest: the softmax,
    rescaling and writes in C), forward and backward, the median of ``reps`` calls each."""
    q, k, v = batch.q, batch.k, batch.v
    offsets = batch.template.partition.levels[0].offsets
    scale = HEAD_DIM**-0.5
    out, lse = native_attention.forward(q, k, v, offsets, offsets, scale, True)
    calls = {
        "forward": lambda: native_attention.forward(q, k, v, offsets, offsets, scale, True),
        "backward": lambda: native_attention.backward(
            batch.grad, q, k, v, out, lse, offsets, offsets, scale, True
        ),
    }
    lines = []
    micro = native_attention.MICRO_KERNEL
    if native_attention.micro_kernel():  # no GEMM calls there: profile the BLAS tiles
        lines.append("float32 runs the micro-kernel (no GEMM calls); the BLAS tiles:")
        native_attention.MICRO_KERNEL = False
    try:
        for name, call in calls.items():
            shares = sorted(native_attention.profile(call)[1] for _ in range(reps))
            lines.append(f"native {name}: {shares[len(shares) // 2]:.0%} of the time in GEMM calls")
    finally:
        native_attention.MICRO_KERNEL = micro
    return "\n".join(lines)


def reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:90] if text else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 sequences up to 256 rows, 5 rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (pinned CPUs)")
    parser.add_argument("--reps", type=int, default=15, help="timed rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-flex", action="store_true", help="skip compiled flex_attention")
    parser.add_argument("--json", help="write the result document here")
    parser.add_argument(
        "--profile", action="store_true", help="also the GEMM share of the native kernel's time"
    )
    args = parser.parse_args()
    if hasattr(os, "sched_getaffinity"):  # the last `threads` CPUs this process may use
        pin_cpu(set(sorted(os.sched_getaffinity(0))[-args.threads :]))
    torch.set_num_threads(args.threads)
    n, high, reps = (8, 256, 5) if args.quick else (32, 512, args.reps)
    batch = Batch(lengths_for(n, high, args.seed), args.seed)
    forward = useful_flops(batch.lengths)

    # Every contestant's output against ragged's first (a benchmark of wrong answers is moot).
    want = ragged_attention(batch, False)()
    notes: dict[str, str] = {}
    modes: dict[str, dict[str, Callable[[], Any]]] = {"forward": {}, "forward+backward": {}}
    makers = {
        "ragged.attention": ragged_attention,
        "ragged, bucket path": bucket_path,
        "SDPA loop": sdpa_loop,
        "padded SDPA": padded_sdpa,
        "NJT SDPA": nested_sdpa,
    }
    for name, make in makers.items():
        for mode, grad in (("forward", False), ("forward+backward", True)):
            fn = make(batch, grad)
            try:
                got = fn()
                if not grad:
                    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            except Exception as error:  # the row reports it
                notes[f"{name} {mode}"] = reason(error)
                continue
            modes[mode][name] = fn
    compile_seconds = None
    if not (args.no_flex or args.quick):
        start = time.perf_counter()
        try:
            fn = flex(batch)
            got = fn()[0].transpose(0, 1)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            modes["forward"]["flex_attention (compiled)"] = fn
            compile_seconds = time.perf_counter() - start
        except Exception as error:  # the row reports it
            notes["flex_attention (compiled) forward"] = reason(error)
        notes["flex_attention (compiled) forward+backward"] = "no CPU backward in torch 2.13"

    rate = matmul_rate(reps)
    table = Table(
        f"Causal attention, B={n}, T={sum(batch.lengths)} rows (max {high}), {HEADS} heads of "
        f"{HEAD_DIM}, float32, {args.threads} thread(s); matmul tile rate {rate:.1f} GFLOP/s",
        ["mode", "contestant", "ms", "GFLOP/s", "of matmul rate", "time / ragged's"],
    )
    for mode, calls in modes.items():
        flops = forward * (1.0 if mode == "forward" else 3.5)
        times = compare(calls, repeat=reps, alternate=True) if calls else {}
        mine = times.get("ragged.attention")
        for name in [*makers, "flex_attention (compiled)"]:
            if name not in calls:
                if f"{name} {mode}" in notes:
                    table.rows.append([mode, name, "-", "-", "-", notes[f"{name} {mode}"]])
                continue
            t = times[name].median("wall")
            ratio = "1.00x" if mine is None else f"{mine.paired(times[name], 'wall'):.2f}x"
            gflops = flops / t / 1e9
            table.rows.append(
                [mode, name, f"{1e3 * t:.1f}", f"{gflops:.1f}", f"{gflops / rate:.0%}", ratio]
            )
    table.notes.append(
        "Useful FLOPs: the causal half of Q K^T and P V, backward counted as 2.5x the forward; "
        f"matmul rate: the best of {max(reps, 5)} batches of 200 [512, 64] @ [64, 512] matmuls "
        "on the same thread(s); times are wall-clock medians of round-robin rounds."
    )
    if compile_seconds is not None:
        table.notes.append(f"flex_attention: compile and first call {compile_seconds:.0f} s.")
    print(table.text())
    tables = [table]
    if args.threads > 1:
        tables.append(scaling(batch, args.threads, reps))
        print(tables[-1].text())
    if args.profile:
        print(where_time_goes(batch, reps))
    if args.json:
        write_result(args.json, "attention", tables, quick=args.quick, metric="wall")


if __name__ == "__main__":
    main()
