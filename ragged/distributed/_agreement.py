"""Context-parallel attention's agreement check: one all-gather of a fingerprint per call."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import torch
import torch.distributed as dist

from .._array import RaggedArray
from .._errors import Func, value_error
from ._context_plan import ContextParallelPlan

Group = Any  # torch.distributed.ProcessGroup | None

_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_FIELDS = ("heads", "head size of q and k", "head size of v", "dtype", "causal", "scale", "plan")


def _plan_code(plan: ContextParallelPlan | None) -> int:
    """A 62-bit fingerprint of a plan's batch (its lengths, world size and strategy)."""
    if plan is None:
        return -1
    code = plan._cache.get("fingerprint")
    if code is None:
        text = repr((plan.lengths, plan.world_size, plan.causal, plan.strategy))
        code = plan._cache["fingerprint"] = zlib.crc32(text.encode()) | len(plan.lengths) << 32
    return int(code)


def agree(
    func: Func,
    q: RaggedArray,
    v: RaggedArray,
    plan: ContextParallelPlan | None,
    causal: bool,
    scale: float,
    group: Group,
    world: int,
) -> None:
    """Before any exchange, every rank checks that all ranks agree on the heads, head sizes,
    dtype, ``causal``, ``scale`` and plan (one all-gather of a few integers): a disagreement
    raises the same ``ValueError`` on every rank instead of a wrong result, an abort or a hang.
    """
    if world == 1:
        return
    dtype = _DTYPES.index(q.dtype) if q.dtype in _DTYPES else len(_DTYPES)
    mine = [
        int(q.values.shape[1]),
        int(q.values.shape[2]),
        int(v.values.shape[2]),
        dtype,
        int(causal),
        struct.unpack("<q", struct.pack("<d", scale))[0],
        _plan_code(plan),
    ]
    local = torch.tensor(mine, dtype=torch.int64, device=q.device)
    every = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(every, local, group=group)
    table = torch.stack(every).cpu().tolist()
    for f, name in enumerate(_FIELDS):
        seen = [row[f] for row in table]
        if any(x != seen[0] for x in seen):
            if name == "dtype":
                shown = [str(_DTYPES[x]) if x < len(_DTYPES) else "another" for x in seen]
            elif name == "scale":
                shown = [struct.unpack("<d", struct.pack("<q", x))[0] for x in seen]
            elif name == "plan":
                shown = ["none" if x == -1 else f"{x:#x}" for x in seen]
            else:
                shown = seen
            raise value_error(
                func,
                "q" if name != "plan" else "plan",
                f"must agree across the group's ranks on the {name}",
                "by rank " + ", ".join(f"{r}: {x}" for r, x in enumerate(shown)),
            )
