"""No op reads device memory on the host: checked on CPU, on the meta device.

A meta tensor has a shape, a dtype and no data, so every host read of tensor data fails on it
(``.item()``, ``.tolist()``, ``bool(t)``, ``torch.equal``, ``nonzero``, boolean-mask indexing,
``repeat_interleave`` without ``output_size``): on CUDA each of those is a host-device
synchronisation. Every op-table sample runs here on meta tensors, forward and (for
differentiable ops) backward, with equal partitions shared (as ``tests/test_cuda.py`` does under
``torch.cuda.set_sync_debug_mode("error")``). Ops flagged ``data_dependent`` (their output
size depends on the data: one documented read) are not run; the ops of
:data:`tests.devices.KNOWN_HOST_READS` are expected to fail until they are fixed.

What this cannot see: host-to-device copies of Python data (``torch.tensor(list,
device="cuda")``), which synchronise on CUDA but not on meta; ``tests/test_cuda.py`` covers
those on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from tests.devices import DEVICE_LENGTHS, KNOWN_HOST_READS, Mover, run_forward_backward
from tests.optable import all_ops

OPS = [op for op in all_ops() if not op.data_dependent]


def _marks(op_id: str) -> list[pytest.MarkDecorator]:
    reason = KNOWN_HOST_READS.get(op_id)
    return [pytest.mark.xfail(reason=reason, strict=True)] if reason else []


@pytest.mark.parametrize("info", [pytest.param(op, id=op.id, marks=_marks(op.id)) for op in OPS])
def test_op_reads_no_device_memory(info):
    for lengths in DEVICE_LENGTHS:
        for sample in info.samples(
            lengths, torch.Generator().manual_seed(0), torch.float64, "contiguous"
        ):
            meta = Mover("meta", share_equal=True).sample(sample)
            try:
                run_forward_backward(info, meta)
            except (RuntimeError, NotImplementedError) as error:
                pytest.fail(
                    f"{info.id}[{sample.name}, lengths {lengths}] reads the device: {error}"
                )


def test_known_host_reads_name_real_ops():
    ids = {op.id for op in all_ops()}
    assert set(KNOWN_HOST_READS) <= ids
