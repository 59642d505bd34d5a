"""Data-parallel training on ragged batches: DDP with the gloo backend.

* Every rank builds the same rank-aware ``TokenBudgetBatchSampler`` (same seed; its
  ``num_replicas`` and ``rank`` come from the process group): each global step deals one batch
  of at most ``--tokens-per-rank`` tokens to every rank, batches of similar cost together, and
  every rank gets the same number of batches (DDP would hang otherwise). Batches are collated
  without padding by ``ragged.data.collate``.
* The model runs per token, with a per-sequence context from ``ragged.mean`` over the ragged
  axis. The loss is the global per-token mean, ``ragged.distributed.global_mean``: ranks hold
  different numbers of tokens, and averaging their local means would weight tokens unequally.
* On the first step each rank checks that its synchronised gradients equal the gradients of a
  single-process run on the whole global batch (rebuilt with ``ragged.distributed.all_gather``),
  and that all ranks hold the same gradients.

Run it either way:

* ``python examples/ddp.py [--world-size 2]``: spawns the processes itself (127.0.0.1, a free
  port);
* ``torchrun --nproc_per_node=2 examples/ddp.py`` (or ``python -m torch.distributed.run``):
  joins the group torchrun set up (``env://``); across machines, e.g.
  ``torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29400
  examples/ddp.py`` on every node.

Under a minute either way; ``--small`` for CI.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import socket
import sys

import torch
import torch.distributed as dist

# The first DistributedDataParallel imports torch.distributed.nn.functional (torch 2.13), whose
# functions take ``group=group.WORLD`` as a default argument, evaluated at import. Imported after
# init_process_group, they hold the default group past destroy_process_group: its gloo threads
# and rank 0's store server then live on into interpreter shutdown, where tearing them down
# sometimes aborts a finished run. Imported here, before any group, the defaults are None.
import torch.distributed.nn.functional
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset

import ragged
from ragged.data import TokenBudgetBatchSampler, collate
from ragged.distributed import all_gather, global_mean

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


class TokenModel(torch.nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.embed = torch.nn.Linear(FEATURES, hidden)
        self.head = torch.nn.Linear(2 * hidden, 1)

    def forward(self, x: ragged.RaggedArray) -> torch.Tensor:
        h = x.with_values(torch.tanh(self.embed(x.values)))
        context = ragged.mean(h, axis=1, fill_value=0.0)  # (B, hidden) per sequence
        per_token = torch.cat([h.values, context[h.segment_ids]], dim=1)
        return self.head(per_token).squeeze(-1)  # [tokens]


def loss_sum(model: torch.nn.Module, batch: dict[str, ragged.RaggedArray]) -> torch.Tensor:
    return ((model(batch["x"]) - batch["y"].values) ** 2).sum()


def check_first_step(model, batch, rank: int, world: int) -> None:
    """DDP gradients == single-process gradients on the global batch; equal on every rank."""
    # The ranks' batches of this step, in rank order, are the global batch: all_gather.
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


TIMEOUT = datetime.timedelta(seconds=120)


def run(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    """One spawned process: join the group on 127.0.0.1 and train."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=TIMEOUT
    )
    try:
        train(args)
        dist.barrier()  # no rank tears down the group while another still talks to it
    finally:
        dist.destroy_process_group()


def run_under_torchrun(args: argparse.Namespace) -> None:
    """A process started by torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT are in the environment."""
    dist.init_process_group("gloo", init_method="env://", timeout=TIMEOUT)
    try:
        train(args)
        dist.barrier()  # no rank tears down the group while another still talks to it
    finally:
        dist.destroy_process_group()


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(1, args.max_length + 1, (args.sequences,), generator=gen).tolist()
    data = Sequences(lengths, args.seed)
    # Rank-aware: num_replicas and rank from the process group, the same seed on every rank.
    sampler = TokenBudgetBatchSampler(lengths, args.tokens_per_rank, seed=args.seed)
    ragged_collate = functools.partial(collate, ragged_keys=["x", "y"])
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=ragged_collate)
    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.parallel.DistributedDataParallel(TokenModel())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="DDP training on ragged batches (gloo, CPU).")
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.sequences = 64 if args.small else 512
    args.max_length = 24 if args.small else 96
    args.tokens_per_rank = 128 if args.small else 512
    args.epochs = 1 if args.small else 3
    args.print_every = 2 if args.small else 10
    return args


def free_port() -> int:
    """A port of 127.0.0.1 that was free a moment ago (rank 0 binds it for the store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    args = parse_args()
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    )
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.world_size
    if not under_torchrun or os.environ.get("RANK") == "0":
        say(
            f"DDP on {world} gloo processes ({'torchrun, env://' if under_torchrun else 'spawned'}"
            f"): {args.sequences} sequences of 1-{args.max_length} tokens, batches of <= "
            f"{args.tokens_per_rank} tokens per rank (rank-aware TokenBudgetBatchSampler), "
            "collated without padding"
        )
    if under_torchrun:
        run_under_torchrun(args)
        return
    port = free_port()
    mp.spawn(run, args=(args.world_size, port, args), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
