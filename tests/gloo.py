"""Run checks on a local gloo process group: one forked process per rank.

One group per call runs every check in turn (process start-up dominates the cost); a barrier
keeps the ranks in step between checks.
"""

import datetime
import socket
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

Check = Callable[[int, int], None]  # check(rank, world)


def _worker(rank: int, world: int, port: int, checks: Sequence[Check]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        for check in checks:
            check(rank, world)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_checks(checks: Sequence[Check], world: int) -> None:
    """Run ``checks`` on ``world`` ranks; a failing check fails the call.

    fork: the children inherit the imported modules (spawn re-imports torch in each child).
    """
    args = (world, _free_port(), checks)
    mp.start_processes(_worker, args=args, nprocs=world, start_method="fork")
