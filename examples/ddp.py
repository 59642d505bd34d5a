"""Data-parallel training on ragged batches: DDP with the gloo backend in 2 local processes.

* Every rank builds the same ``TokenBudgetBatchSampler`` (same seed), so all ranks agree on the
  global batches. Each rank loads only its token-balanced contiguous share of every global batch
  (``ragged.distributed.shard``), collated without padding by ``ragged.data.collate``.
* The model runs per token, with a per-sequence context from ``ragged.mean`` over the ragged
  axis. The loss is the global per-token mean, ``ragged.distributed.global_mean``: ranks hold
  different numbers of tokens, and averaging their local means would weight tokens unequally.
* On the first step each rank checks that its synchronised gradients equal the gradients of a
  single-process run on the whole global batch (rebuilt with ``ragged.distributed.all_gather``),
  and that all ranks hold the same gradients.

Run: ``python examples/ddp.py`` (under a minute), or ``--small`` for CI.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import socket
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, Sampler

import ragged
from ragged.data import TokenBudgetBatchSampler, collate
from ragged.distributed import all_gather, global_mean, shard

FEATURES = 8


def say(line: str) -> None:
    """Print one whole line (ranks print concurrently)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Sequences(Dataset):
    """Synthetic sequences: per-token targets that depend on the token and on its sequence."""

    def __init__(self, lengths: list[int], seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.lengths = lengths
        self.x = [torch.randn(n, FEATURES, generator=gen) for n in lengths]
        w_token = torch.randn(FEATURES, generator=gen)
        w_context = torch.randn(FEATURES, generator=gen)
        self.y = [torch.tanh(x @ w_token) + (x @ w_context).mean() for x in self.x]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i]}


class RankBatches(Sampler[list[int]]):
    """This rank's token-balanced share of every global batch of ``batches``.

    A global batch with fewer samples than ranks is skipped (a rank would get no sample).
    """

    def __init__(self, batches: Sampler[list[int]], lengths: list[int], world: int, rank: int):
        self.batches, self.lengths, self.world, self.rank = batches, lengths, world, rank

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches:
            if len(batch) >= self.world:
                mine = shard([self.lengths[i] for i in batch], self.world, self.rank)
                yield [batch[i] for i in mine]


class TokenModel(torch.nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.embed = torch.nn.Linear(FEATURES, hidden)
        self.head = torch.nn.Linear(2 * hidden, 1)

    def forward(self, x: ragged.RaggedArray) -> torch.Tensor:
        h = x.with_values(torch.tanh(self.embed(x.values)))
        context = ragged.mean(h, axis=1, fill_value=0.0)  # (B, hidden) per sequence
        per_token = torch.cat([h.values, context[h.segment_ids()]], dim=1)
        return self.head(per_token).squeeze(-1)  # [tokens]


def loss_sum(model: torch.nn.Module, batch: dict[str, ragged.RaggedArray]) -> torch.Tensor:
    return ((model(batch["x"]) - batch["y"].values) ** 2).sum()


def check_first_step(model, batch, rank: int, world: int) -> None:
    """DDP gradients == single-process gradients on the global batch; equal on every rank."""
    # The ranks' shares in rank order are the global batch: all_gather rebuilds it.
    global_batch = {key: all_gather(value) for key, value in batch.items()}
    reference = TokenModel()
    reference.load_state_dict(model.module.state_dict())
    (loss_sum(reference, global_batch) / global_batch["x"].values.shape[0]).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.module.parameters()])
    expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    every = [torch.empty_like(grads) for _ in range(world)]
    dist.all_gather(every, grads)
    in_sync = all(torch.equal(g, every[0]) for g in every)
    matches = torch.allclose(grads, expected, rtol=1e-4, atol=1e-6)
    say(
        f"[rank {rank}] first step: gradients equal on all ranks: {in_sync}; "
        f"equal to one process on the whole global batch: {matches}"
    )
    if not (in_sync and matches):
        raise RuntimeError("gradient check failed")


def run(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        train(rank, world, args)
    finally:
        dist.destroy_process_group()


def train(rank: int, world: int, args: argparse.Namespace) -> None:
    gen = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(1, args.max_length + 1, (args.sequences,), generator=gen).tolist()
    data = Sequences(lengths, args.seed)
    # Same seed on every rank: the same global batches, each split into per-rank shares.
    batches = TokenBudgetBatchSampler(
        lengths, args.tokens_per_step, generator=torch.Generator().manual_seed(args.seed)
    )
    ragged_collate = functools.partial(collate, ragged_keys=["x", "y"])
    loader = DataLoader(
        data, batch_sampler=RankBatches(batches, lengths, world, rank), collate_fn=ragged_collate
    )
    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.parallel.DistributedDataParallel(TokenModel())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    step = 0
    for epoch in range(args.epochs):
        for batch in loader:
            tokens = batch["x"].values.shape[0]
            local = loss_sum(model, batch)
            loss = global_mean(local, tokens)  # sum over ranks / tokens over ranks
            optimizer.zero_grad()
            loss.backward()  # DDP averages gradients; global_mean scales for it
            if step == 0:
                check_first_step(model, batch, rank, world)
            optimizer.step()
            if step % args.print_every == 0:
                say(
                    f"[rank {rank}] epoch {epoch} step {step:3d}: {batch['x'].num_segments:2d} "
                    f"sequences, {tokens:4d} tokens, local loss {local.item() / tokens:.4f}, "
                    f"global loss {loss.item():.4f}"
                )
            step += 1
    if rank == 0:
        say(f"done: {step} steps on {world} ranks")


def main() -> None:
    parser = argparse.ArgumentParser(description="DDP training on ragged batches (gloo, CPU).")
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.sequences = 64 if args.small else 512
    args.max_length = 24 if args.small else 96
    args.tokens_per_step = 256 if args.small else 1024
    args.epochs = 1 if args.small else 3
    args.print_every = 2 if args.small else 10
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(
        f"DDP on {args.world_size} gloo processes: {args.sequences} sequences of 1-"
        f"{args.max_length} tokens, global batches of <= {args.tokens_per_step} tokens "
        "(TokenBudgetBatchSampler), each rank's token-balanced share collated without padding",
        flush=True,
    )
    mp.spawn(run, args=(args.world_size, port, args), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
