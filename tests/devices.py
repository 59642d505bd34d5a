"""Moving op-table samples to another device (CUDA, or meta to find host reads on CPU)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

import ragged
from ragged._partition import RowPartition
from tests.optable import PerSegment, Sample


class Mover:
    """Moves sample arguments to ``device``, keeping what the sample shares shared.

    A partition (or a level, e.g. the rows of a pair map that are also a query partition)
    shared by two arguments stays one object on the device, so ops take the same identity fast
    paths as on CPU. With ``share_equal``, partitions and levels that are *equal in value* also
    become one object: then no op needs to compare offsets (the checked comparison of two
    distinct equal partitions reads the device; see ``Partition.equals``).
    """

    def __init__(self, device: str | torch.device, *, share_equal: bool = False) -> None:
        self.device = torch.device(device)
        self.share_equal = share_equal
        self._levels: dict[int, RowPartition] = {}
        self._partitions: dict[int, ragged.Partition] = {}
        self._equal: dict[tuple[Any, ...], Any] = {}
        self._keep: list[Any] = []  # the originals stay alive, so their ids stay unique

    def level(self, level: RowPartition) -> RowPartition:
        found = self._levels.get(id(level))
        if found is not None:
            return found
        columns = None if level.columns is None else self.level(level.columns)
        key = (
            "level",
            tuple(level.offsets.tolist()),
            level.max_length,
            level.sum_squares,
            level.unit,
            id(columns),
        )
        if self.share_equal:
            found = self._equal.get(key)
        if found is None:
            found = dataclasses.replace(
                level,
                offsets=level.offsets.to(self.device),
                lengths=level.lengths.to(self.device),
                row_ids=level.row_ids.to(self.device),
                columns=columns,
            )
            self._equal.setdefault(key, found)
        self._levels[id(level)] = found
        self._keep.append(level)
        return found

    def partition(self, partition: ragged.Partition) -> ragged.Partition:
        found = self._partitions.get(id(partition))
        if found is not None:
            return found
        levels = tuple(self.level(level) for level in partition.levels)
        key = ("partition", *(id(level) for level in levels))
        if self.share_equal:
            found = self._equal.get(key)
        if found is None:
            found = ragged.Partition(levels)
            self._equal.setdefault(key, found)
        self._partitions[id(partition)] = found
        self._keep.append(partition)
        return found

    def __call__(self, x: Any) -> Any:
        if isinstance(x, ragged.RaggedArray):
            return ragged.RaggedArray(x.values.to(self.device), self.partition(x.partition), x.axes)
        if isinstance(x, ragged.Partition):
            return self.partition(x)
        if isinstance(x, RowPartition):
            return self.level(x)
        if isinstance(x, PerSegment):
            return PerSegment(x.tensor.to(self.device))
        if isinstance(x, torch.Tensor):
            return x.to(self.device)
        if isinstance(x, torch.Generator):
            if self.device.type == "meta":
                return None  # meta tensors draw nothing
            return torch.Generator(self.device).manual_seed(x.initial_seed())
        if isinstance(x, tuple):
            return tuple(self(a) for a in x)
        if isinstance(x, list):
            return [self(a) for a in x]
        if isinstance(x, dict):
            return {k: self(v) for k, v in x.items()}
        return x

    def sample(self, sample: Sample) -> Sample:
        return Sample(sample.name, self(sample.args), self(sample.kwargs))


def float_leaves(sample: Sample) -> tuple[Sample, list[torch.Tensor]]:
    """``sample`` with the values of its floating-point RaggedArrays as fresh leaves that
    require grad (arrays sharing values share the leaf), and those leaves."""
    leaves: dict[int, torch.Tensor] = {}

    def leaf(x: Any) -> Any:
        if isinstance(x, ragged.RaggedArray) and x.values.is_floating_point():
            if id(x.values) not in leaves:
                leaves[id(x.values)] = x.values.detach().clone().requires_grad_()
            return x.with_values(leaves[id(x.values)])
        if isinstance(x, (tuple, list)):
            return type(x)(leaf(a) for a in x)
        return x

    out = Sample(sample.name, leaf(sample.args), sample.kwargs)
    return out, list(leaves.values())


def differentiable_outputs(out: Any) -> list[torch.Tensor]:
    """The floating-point tensors of an op's result that carry a gradient."""
    outs = out if isinstance(out, tuple) else (out,)
    tensors = [o.values if isinstance(o, ragged.RaggedArray) else o for o in outs]
    return [
        t
        for t in tensors
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]


def run_forward_backward(info: Any, sample: Sample) -> Any:
    """``info.op`` on ``sample`` and, for a differentiable op, one backward pass to the values
    of its floating-point RaggedArrays. Returns the op's result."""
    sample, leaves = float_leaves(sample)
    out = info.op(*sample.call_args(), **sample.kwargs)
    outs = differentiable_outputs(out)
    if info.grad and outs and leaves:
        cotangents = [torch.ones_like(o) for o in outs]
        torch.autograd.grad(outs, leaves, cotangents, allow_unused=True)
    return out


# Lengths the device tests draw samples for: empty segments, one segment, zero segments.
DEVICE_LENGTHS = ([3, 0, 5, 1], [4], [])

# Ops that read device memory on the host although their output size does not depend on the
# data (they are not flagged ``data_dependent``): found on the meta device
# (tests/test_host_reads.py); on CUDA each is a host-device synchronisation. Strict xfails:
# fixing one makes its test pass and fail the xfail, so remove the entry then.
KNOWN_HOST_READS = {
    "outer": "eager pair-block grouping reads the lengths (ragged/kernels/_pairblocks.py)",
    "pair_dot": "eager pair-block grouping reads the lengths (ragged/kernels/_pairblocks.py)",
    "pair_matmul": "eager pair-block grouping reads the lengths (ragged/kernels/_pairblocks.py)",
    "triangle_multiply": "eager pair-block grouping reads the lengths (_pairblocks.py)",
    "transpose": "Partition.outer of a rectangular map reads its number of pairs",
    "take-raise": "mode='raise' reads the indices to raise on one out of range",
}
