"""Dynamic micro-batching: total cost of the DP planner against greedy packing.

For a global batch of sample lengths drawn from a few distributions, compare
``ragged.data.plan_microbatches`` with two greedy baselines under the same token cap:

* greedy (arrival order): fill a micro-batch in the sampler's order until the next sample
  would break the cap (what a fixed token-budget loop does);
* greedy (sorted): the same after sorting by length.

Cost per micro-batch (``ragged.data.MicrobatchCost``): padded execution
``n * (a * max(L) + b * max(L)**2) + c`` and packed/ragged execution
``a * sum(L) + b * sum(L**2) + c``. Prints total cost (lower is better), micro-batch counts and
planning time. Runs in a few seconds: ``python benchmarks/microbatch.py [--n 512] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import time

import torch

from ragged.bench._report import Table, write_result
from ragged.data import MicrobatchCost, plan_cost, plan_microbatches


def distributions(n: int, gen: torch.Generator) -> dict[str, list[int]]:
    uniform = torch.randint(16, 1024, (n,), generator=gen)
    lognormal = torch.exp(torch.randn(n, generator=gen, dtype=torch.float64) * 0.9 + 5.0)
    short = torch.randint(16, 128, (n,), generator=gen)
    long = torch.randint(768, 2048, (n,), generator=gen)
    bimodal = torch.where(torch.rand(n, generator=gen) < 0.85, short, long)
    return {
        "uniform 16-1024": uniform.tolist(),
        "log-normal (median 150)": lognormal.clamp(8, 4096).round().long().tolist(),
        "bimodal 85% short": bimodal.tolist(),
    }


def greedy(lengths: list[int], order: list[int], cost: MicrobatchCost, cap: int) -> list[list[int]]:
    plan: list[list[int]] = []
    batch: list[int] = []
    for i in order:
        candidate = [lengths[j] for j in [*batch, i]]
        if batch and cost.tokens(candidate) > cap:
            plan.append(batch)
            batch = []
        batch.append(i)
    if batch:
        plan.append(batch)
    return plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512, help="samples in the global batch")
    parser.add_argument("--max-tokens", type=int, default=16384, help="token cap per micro-batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a 128-sample batch")
    parser.add_argument("--json", help="write the result document here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = 128 if args.quick else args.n
    gen = torch.Generator().manual_seed(args.seed)
    # a: per token; b: attention (per squared token, ~1/(12 d) for width d = 1024 relative to
    # the linear layers); c: fixed cost of a micro-batch, in tokens.
    models = {
        "padded": MicrobatchCost(a=1.0, b=1 / 12288, c=2048.0, padded=True),
        "packed": MicrobatchCost(a=1.0, b=1 / 12288, c=2048.0),
    }
    table = Table(
        f"Micro-batch plans: {n} samples, cap {args.max_tokens} tokens per micro-batch",
        ["lengths", "cost model", "planner", "total cost", "micro-batches", "plan ms", "vs DP"],
    )
    for name, lengths in distributions(n, gen).items():
        arrival = list(range(len(lengths)))
        by_length = sorted(arrival, key=lengths.__getitem__)
        for model_name, cost in models.items():
            start = time.perf_counter()
            dp = plan_microbatches(lengths, max_tokens=args.max_tokens, cost=cost)
            elapsed = 1000 * (time.perf_counter() - start)
            rows = [
                ("DP (ragged.data)", dp, elapsed),
                ("greedy arrival", greedy(lengths, arrival, cost, args.max_tokens), None),
                ("greedy sorted", greedy(lengths, by_length, cost, args.max_tokens), None),
            ]
            best = plan_cost(lengths, dp, cost)
            for label, plan, ms in rows:
                total = plan_cost(lengths, plan, cost)
                table.rows.append(
                    [
                        name,
                        model_name,
                        label,
                        f"{total:,.0f}",
                        str(len(plan)),
                        "" if ms is None else f"{ms:.1f}",
                        "1.00x" if plan is dp else f"{total / best:.2f}x",
                    ]
                )
    table.notes.append(
        "Cost per micro-batch: padded n * (a * max L + b * max L^2) + c, packed "
        "a * sum L + b * sum L^2 + c, with a = 1, b = 1/12288, c = 2048 (in tokens). Lower is "
        "better; 'vs DP' is the plan's cost over the DP plan's."
    )
    print(table.text())
    if args.json:
        write_result(
            args.json,
            "microbatch",
            [table],
            quick=args.quick,
            metric="plan cost (cost-model units)",
        )


if __name__ == "__main__":
    main()
