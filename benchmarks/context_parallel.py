"""Context-parallel attention: the balanced (DCP-style) planner against the static split.

Two parts:

* **Plans** (exact, no timing): for skewed length mixes and 8, 64 and 512 simulated ranks
  (weak scaling: ``--tokens-per-rank`` tokens per rank), the max/mean attention work per rank
  (query-key pairs, causal triangles counted exactly) and the key/value bytes moved in the
  forward pass, counted from the plans of ``ragged.distributed.plan_context_parallel``:
  ``"balanced"`` against ``"static"`` (equal contiguous token shards passed round a ring, as
  ring attention does). The static layout with only the needed rows sent is listed too (a
  stronger baseline than the ring).
* **Wall time**: forward + backward of ``ragged.distributed.context_parallel_attention`` on 2
  and 4 gloo processes on this machine (one thread each), balanced against static, on one
  skewed batch; barrier to barrier on rank 0 (the slowest rank's time), median of repeats, the
  two plans interleaved.

Run: ``python benchmarks/context_parallel.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import datetime
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ragged
from ragged.bench._report import Table, write_result
from ragged.distributed import context_parallel_attention, plan_context_parallel

KV_ROW_BYTES = 8 * (128 + 128) * 2  # 8 key/value heads of width 128 in bf16: 4 KiB per row
# Per-token cost of a transformer layer's linear layers relative to one attention pair:
# 24 d^2 FLOPs per token against 4 d per query-key pair, for model width d = 4096.
TOKEN_COST = 6 * 4096


def sample_lengths(mix: str, total: int, gen: torch.Generator) -> list[int]:
    """Sequence lengths of a mix, drawn until they hold exactly ``total`` tokens."""
    lengths: list[int] = []
    remaining = total
    while remaining > 0:
        if mix == "log-normal":  # median 1024, sigma 1.5, at most 128k
            n = float(torch.exp(torch.randn((), generator=gen, dtype=torch.float64) * 1.5 + 6.93))
        elif mix == "bimodal":  # 85%: 256-2k, 15%: 16k-128k
            short = float(torch.rand((), generator=gen)) < 0.85
            low, high = (256, 2048) if short else (16384, 131072)
            n = float(torch.randint(low, high + 1, (), generator=gen))
        else:  # "chat + documents": median 200 (sigma 1.0), 2% documents of 32k-128k
            if float(torch.rand((), generator=gen)) < 0.02:
                n = float(torch.randint(32768, 131073, (), generator=gen))
            else:
                n = float(torch.exp(torch.randn((), generator=gen, dtype=torch.float64) + 5.3))
        length = min(max(1, round(min(n, 131072))), remaining)
        lengths.append(length)
        remaining -= length
    order = torch.randperm(len(lengths), generator=gen).tolist()  # arrival order
    return [lengths[i] for i in order]


MIXES = ("log-normal", "bimodal", "chat + documents")


def ratio(work: list[int]) -> float:
    return max(work) / (sum(work) / len(work))


def needed_rows(plan: Any) -> int:
    """Key/value rows a layout needs from other ranks when only those are sent: each run
    needs the rows of its sequence outside itself that it attends to (the static layout holds
    at most one run per sequence per rank)."""
    total = 0
    for rank in range(plan.world_size):
        for s, a, e in plan.runs(rank):
            total += a if plan.causal else plan.lengths[s] - (e - a)
    return total


def plan_tables(args: argparse.Namespace) -> tuple[list[Table], list[dict[str, Any]]]:
    worlds = [8, 64] if args.quick else [8, 64, 512]
    tokens_per_rank = 2048 if args.quick else args.tokens_per_rank
    work_table = Table(
        f"Attention work per rank, max / mean (weak scaling: {tokens_per_rank} tokens per rank)",
        [
            "lengths",
            "mask",
            "ranks",
            "sequences",
            "static",
            "balanced",
            "bound speedup",
            "balanced tokens max/mean",
            "plan ms",
        ],
    )
    bytes_table = Table(
        "Key/value bytes moved in the forward pass, all ranks (GiB)",
        [
            "lengths",
            "mask",
            "ranks",
            "static ring",
            "static, needed rows only",
            "balanced",
            "ring / balanced",
        ],
    )
    layer_table = Table(
        "Whole-layer balance, causal: cost = 6 d * tokens + pairs per rank (d = 4096), max / mean",
        [
            "lengths",
            "ranks",
            "static",
            "balanced (attention only)",
            f"balanced (token_cost={TOKEN_COST})",
            "its attention max/mean",
            "its tokens max/mean",
        ],
    )
    points = []
    gib = 2.0**30
    for mix in MIXES:
        for world in worlds:
            gen = torch.Generator().manual_seed(args.seed + world)
            lengths = sample_lengths(mix, world * tokens_per_rank, gen)
            for causal in (True, False):
                start = time.perf_counter()
                plan = plan_context_parallel(lengths, world, causal=causal)
                plan_ms = 1e3 * (time.perf_counter() - start)
                static = plan_context_parallel(lengths, world, causal=causal, strategy="static")
                s_work, b_work = static.attention_pairs(), plan.attention_pairs()
                mask = "causal" if causal else "full"
                work_table.rows.append(
                    [
                        mix,
                        mask,
                        str(world),
                        str(len(lengths)),
                        f"{ratio(s_work):.2f}",
                        f"{ratio(b_work):.3f}",
                        f"{max(s_work) / max(b_work):.2f}x",
                        f"{ratio(plan.tokens()):.2f}",
                        f"{plan_ms:.0f}",
                    ]
                )
                ring = sum(static.kv_rows_received()) * KV_ROW_BYTES
                needed = needed_rows(static) * KV_ROW_BYTES
                moved = sum(plan.kv_rows_received()) * KV_ROW_BYTES
                bytes_table.rows.append(
                    [
                        mix,
                        mask,
                        str(world),
                        f"{ring / gib:.2f}",
                        f"{needed / gib:.2f}",
                        f"{moved / gib:.2f}",
                        f"{ring / moved:.0f}x" if moved else "inf",
                    ]
                )
                if causal:

                    def layer(p: Any) -> float:
                        costs = [
                            TOKEN_COST * t + w
                            for t, w in zip(p.tokens(), p.attention_pairs(), strict=True)
                        ]
                        return ratio(costs)

                    weighed = plan_context_parallel(
                        lengths, world, causal=True, token_cost=float(TOKEN_COST)
                    )
                    layer_table.rows.append(
                        [
                            mix,
                            str(world),
                            f"{layer(static):.2f}",
                            f"{layer(plan):.2f}",
                            f"{layer(weighed):.3f}",
                            f"{ratio(weighed.attention_pairs()):.2f}",
                            f"{ratio(weighed.tokens()):.2f}",
                        ]
                    )
                points.append(
                    {
                        "mix": mix,
                        "causal": causal,
                        "ranks": world,
                        "static_max_over_mean": ratio(s_work),
                        "balanced_max_over_mean": ratio(b_work),
                        "static_ring_bytes": ring,
                        "static_needed_bytes": needed,
                        "balanced_bytes": moved,
                    }
                )
    work_table.notes += [
        "Work: query-key pairs per rank (attention FLOPs are 4 * heads * width times that, "
        "forward), causal triangles counted exactly; computed from the plans, not timed.",
        "Bound speedup: static max / balanced max, the speedup of the attention step when it is "
        "bound by the busiest rank's work (DCP reports 1.19-2.45x measured attention speedups "
        "under causal masks).",
        "Balanced tokens max/mean: the planner balances attention work only (token_cost=0), so "
        "rows per rank (activation memory, per-token layers) vary; pass token_cost to weigh them.",
    ]
    bytes_table.notes += [
        f"A key/value row is {KV_ROW_BYTES} bytes (8 heads, width 128, bf16, keys and values). "
        "The backward sends as many gradient bytes back. Static ring: every shard passed to "
        "every other rank (ring attention); needed rows only: the same layout with direct "
        "messages of the rows each run attends to.",
    ]
    layer_table.notes.append(
        "Balancing attention alone leaves the per-token layers (and activation memory) "
        "unbalanced; token_cost balances the whole layer instead, at the price of attention "
        "balance."
    )
    return [work_table, bytes_table, layer_table], points


# --- wall time on gloo processes ----------------------------------------------------------------


def timed_batch(quick: bool) -> list[int]:
    gen = torch.Generator().manual_seed(1)
    long = 1024 if quick else 3072
    short = torch.exp(torch.randn(48 if quick else 96, generator=gen) * 0.8 + 4.0)
    return [long, *short.clamp(4, 512).round().long().tolist()]


def _timer(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    try:
        lengths = timed_batch(args.quick)
        heads, width = 4, 64
        gen = torch.Generator().manual_seed(0)
        x = ragged.from_lengths(torch.randn(sum(lengths), heads, width, generator=gen), lengths)
        plans = timed_plans(lengths, world, args.token_cost)
        local = {name: p.shard(x, rank) for name, p in plans.items()}
        times: dict[str, list[float]] = {name: [] for name in plans}
        cpu: dict[str, list[float]] = {name: [] for name in plans}
        repeats = 3 if args.quick else args.repeats
        for i in range(repeats + 1):  # the first round warms up (plans, buffers)
            for name, plan in plans.items():
                q = local[name].with_values(local[name].values.detach().requires_grad_(True))
                dist.barrier()
                start, start_cpu = time.perf_counter(), time.thread_time()
                y = context_parallel_attention(q, q, q, causal=True, plan=plan)
                y.values.sum().backward()
                used = time.thread_time() - start_cpu
                dist.barrier()
                if i:
                    times[name].append(time.perf_counter() - start)
                    cpu[name].append(used)
        # Every rank's median CPU time of its own work (this thread: kernels and packing).
        mine = {name: statistics.median(c) for name, c in cpu.items()}
        every: list[Any] = [None] * world
        dist.all_gather_object(every, mine)
        if rank == 0:
            result = {name: statistics.median(t) for name, t in times.items()}
            for name in plans:
                result[f"{name}_cpu_max"] = max(e[name] for e in every)
                result[f"{name}_cpu_mean"] = sum(e[name] for e in every) / world
            out.put(result)
    finally:
        dist.destroy_process_group()


def timed_plans(lengths: list[int], world: int, token_cost: float) -> dict[str, Any]:
    return {
        "static": plan_context_parallel(lengths, world, causal=True, strategy="static"),
        "balanced": plan_context_parallel(lengths, world, causal=True),
        "balanced, fitted cost": plan_context_parallel(
            lengths, world, causal=True, token_cost=token_cost
        ),
    }


def single_process(lengths: list[int], repeats: int) -> float:
    """Median CPU time of ``ragged.attention`` forward + backward on one batch."""
    x = ragged.from_lengths(torch.randn(sum(lengths), 4, 64), lengths)
    times = []
    for _ in range(repeats + 1):
        q = x.with_values(x.values.detach().requires_grad_(True))
        start = time.thread_time()
        ragged.attention(q, q, q, causal=True).values.sum().backward()
        times.append(time.thread_time() - start)
    return statistics.median(times[1:])


def fit_token_cost(repeats: int) -> float:
    """The attention kernel's cost of a row in query-key pairs, fitted on this machine from
    two batches of 8192 tokens: ``time = a * tokens + b * pairs`` gives ``a / b``."""
    short, longer = [16] * 512, [64] * 128
    t_short, t_long = single_process(short, repeats), single_process(longer, repeats)
    p_short, p_long = (sum(n * (n + 1) // 2 for n in lengths) for lengths in (short, longer))
    per_pair = (t_long - t_short) / (p_long - p_short)
    per_token = (t_short - per_pair * p_short) / sum(short)
    return max(0.0, per_token / per_pair) if per_pair > 0 else 0.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wall_table(args: argparse.Namespace) -> tuple[Table, list[dict[str, Any]]]:
    lengths = timed_batch(args.quick)
    repeats = 3 if args.quick else args.repeats
    table = Table(
        f"Forward + backward on gloo processes, causal, {len(lengths)} sequences "
        f"({sum(lengths)} tokens, longest {max(lengths)}), 4 heads of width 64, float32",
        [
            "processes",
            "plan",
            "work max/mean",
            "wall ms",
            "busiest rank CPU ms",
            "mean rank CPU ms",
            "static / balanced (wall)",
            "static / balanced (busiest CPU)",
        ],
    )
    points = []
    args.token_cost = fit_token_cost(repeats)
    context = mp.get_context("fork")
    for world in (2, 4):
        queue = context.SimpleQueue()
        mp.start_processes(
            _timer, args=(world, _free_port(), args, queue), nprocs=world, start_method="fork"
        )
        got = queue.get()
        for name, plan in timed_plans(lengths, world, args.token_cost).items():
            first = name == "static"
            table.rows.append(
                [
                    str(world),
                    name,
                    f"{ratio(plan.attention_pairs()):.3f}",
                    f"{1e3 * got[name]:.0f}",
                    f"{1e3 * got[f'{name}_cpu_max']:.0f}",
                    f"{1e3 * got[f'{name}_cpu_mean']:.0f}",
                    "" if first else f"{got['static'] / got[name]:.2f}x",
                    "" if first else f"{got['static_cpu_max'] / got[f'{name}_cpu_max']:.2f}x",
                ]
            )
        points.append(
            {
                "processes": world,
                **{f"{key}_s": got[key] for key in ("static", "balanced", "balanced, fitted cost")},
            }
        )
    alone = single_process(lengths, repeats)
    table.notes += [
        f"One process, ragged.attention on the whole batch: {1e3 * alone:.0f} ms CPU.",
        "Work max/mean counts query-key pairs. The kernel also costs per row (softmax, output, "
        f"backward): fitted here as {args.token_cost:.0f} pairs per row from two one-process "
        "runs (8192 tokens in sequences of 16 and of 64); 'balanced, fitted cost' plans with "
        "that token_cost.",
        "Wall: barrier to barrier on rank 0 (the slowest rank's time), median of "
        f"{repeats} repeats, the plans interleaved. Busiest rank CPU: the largest of the ranks' "
        "median CPU times of their own thread (kernels, packing, sending), what the step would "
        "take with a core per rank. One thread per process on a 2-core machine shared with "
        "other jobs: the wall times include waiting for a core (4 processes time-share 2 "
        "cores), so they are noisy and understate the gap.",
    ]
    return table, points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batches, fewer ranks")
    parser.add_argument("--tokens-per-rank", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the result document here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tables, plan_points = plan_tables(args)
    wall, wall_points = wall_table(args)
    tables.append(wall)
    for table in tables:
        print(table.text())
        print()
    if args.json:
        write_result(
            args.json,
            "context_parallel",
            tables,
            quick=args.quick,
            metric="wall",
            plots={"plans": plan_points, "wall": wall_points},
        )


if __name__ == "__main__":
    main()
