"""On a CUDA device: every op of the op table without a host sync, attention on torch's fused
variable-length kernels against the CPU result.

Skipped without CUDA (the ``cuda`` marker, ``tests/conftest.py``); ``benchmarks/gpu_check.sh``
runs it on a GPU machine. The CPU-side counterparts are ``tests/test_host_reads.py`` (the same
samples on the meta device) and ``tests/test_attention_varlen.py`` (the kernel choice and calls).

Host syncs: each sample runs on CUDA (forward and, for differentiable ops, backward) under
``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronising CUDA call. The
ops allowed to synchronise are exactly those flagged ``data_dependent`` in the op table (their
output size depends on the data: ``docs/api.md``, column "size depends on data"); the known
offenders of ``tests.devices.KNOWN_HOST_READS`` are strict xfails. Arrays with equal partitions
share one partition object here (as a model's tensors do): two *distinct* equal partitions cost
one checked comparison of offsets, a documented host read (``Partition.equals``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import ragged
from ragged.kernels import _attention_varlen as varlen
from tests.devices import DEVICE_LENGTHS, KNOWN_HOST_READS, Mover, run_forward_backward
from tests.optable import all_ops
from tests.optable.attention import cross_lengths

pytestmark = pytest.mark.cuda
DEVICE = "cuda"  # the device under test (a constant, so the module can be dry-run elsewhere)


@contextlib.contextmanager
def sync_errors() -> Iterator[None]:
    """Raise on every synchronising CUDA call inside the block."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _tensors(out: Any) -> list[torch.Tensor]:
    """The values and offsets of every RaggedArray in ``out``, and its dense tensors."""
    outs = out if isinstance(out, tuple) else (out,)
    found = []
    for o in outs:
        if isinstance(o, ragged.RaggedArray):
            found += [o.values, *(level.offsets for level in o.partition.levels)]
        elif isinstance(o, torch.Tensor):
            found.append(o)
    return found


def _marks(info: Any) -> list[pytest.MarkDecorator]:
    reason = None if info.data_dependent else KNOWN_HOST_READS.get(info.id)
    return [pytest.mark.xfail(reason=reason, strict=True)] if reason else []


@pytest.mark.parametrize("info", [pytest.param(op, id=op.id, marks=_marks(op)) for op in all_ops()])
def test_op_runs_on_cuda_without_host_sync(info):
    for lengths in DEVICE_LENGTHS:
        gen = torch.Generator().manual_seed(0)
        for sample in info.samples(lengths, gen, torch.float64, "contiguous"):
            where = f"{info.id}[{sample.name}, lengths {lengths}]"
            # The values, against the same op on CPU (also the warm-up: kernels load lazily).
            want = _tensors(info.op(*sample.call_args(), **sample.kwargs))
            moved = Mover(DEVICE).sample(sample)
            got = _tensors(info.op(*moved.call_args(), **moved.kwargs))
            assert len(got) == len(want), where
            for g, w in zip(got, want, strict=True):
                assert g.device.type == DEVICE, where
                torch.testing.assert_close(
                    g.cpu(),
                    w,
                    atol=max(info.atol, 1e-7),
                    rtol=max(info.rtol, 1e-6),
                    equal_nan=True,
                    msg=lambda m, where=where: f"{where}: {m}",
                )
            fresh = Mover(DEVICE, share_equal=True).sample(sample)
            if info.data_dependent:  # allowed to read: documented
                run_forward_backward(info, fresh)
                continue
            try:
                with sync_errors():
                    run_forward_backward(info, fresh)
            except RuntimeError as error:
                if "synchroniz" in str(error):
                    pytest.fail(f"{where} synchronises with the host: {error}")
                raise


# --- attention on the fused kernels -----------------------------------------------------------

LENGTHS = [37, 0, 128, 1, 300, 5]
TOLERANCE = {
    torch.float16: 1e-2,
    torch.bfloat16: 4e-2,
    torch.float32: 1e-4,
    torch.float64: 1e-9,
}


def _supported(kernel: str | None) -> bool:
    """Whether this GPU runs ``kernel`` (flash needs compute capability 8.0 or newer)."""
    if kernel == varlen.FLASH:
        return torch.cuda.get_device_capability() >= (8, 0)
    return True


@pytest.mark.parametrize(
    ("dtype", "width", "kernel"),
    [
        (torch.float16, 64, varlen.FLASH),
        (torch.bfloat16, 32, varlen.FLASH),
        (torch.float16, 40, varlen.FLASH),
        (torch.float32, 16, varlen.EFFICIENT),
        (torch.float32, 12, varlen.EFFICIENT),
        (torch.float32, 6, None),  # not a multiple of 4: the tiled path
        (torch.float64, 8, None),  # no fused kernel for float64: the tiled path
    ],
)
@pytest.mark.parametrize("kind", ["self", "causal", "cross", "scale"])
def test_attention_on_cuda_matches_cpu(dtype, width, kernel, kind):
    gen = torch.Generator().manual_seed(0)
    heads = 3
    key_lengths = cross_lengths(LENGTHS) if kind == "cross" else LENGTHS
    if kind == "cross":  # a segment with queries and no keys
        key_lengths = [*key_lengths[:-1], 0]

    def draw(lengths: list[int]) -> ragged.RaggedArray:
        values = torch.randn((sum(lengths), heads, width), generator=gen, dtype=torch.float64)
        return ragged.from_lengths(values, lengths)

    q = draw(LENGTHS)
    k = q if kind != "cross" else draw(key_lengths)
    v = k.with_values(torch.randn(k.values.shape, generator=gen, dtype=torch.float64))
    kwargs = {"causal": kind == "causal", "scale": 0.2 if kind == "scale" else None}
    leaves = [x.values.requires_grad_() for x in (q, k, v) if not x.values.requires_grad]
    want = ragged.attention(q, k, v, **kwargs).values
    cotangent = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    want_grads = torch.autograd.grad(want, leaves, cotangent)

    mover = Mover(DEVICE)
    qc, kc, vc = (mover(x) for x in (q, k, v))
    cuda_leaves = [x.to(DEVICE, dtype).detach().requires_grad_() for x in leaves]
    by_id = {id(a): b for a, b in zip(leaves, cuda_leaves, strict=True)}
    qc, kc, vc = (
        y.with_values(by_id[id(x.values)]) for x, y in zip((q, k, v), (qc, kc, vc), strict=True)
    )
    key_level = qc.partition.levels[0] if kind != "cross" else kc.partition.levels[0]
    chosen = varlen.select(
        qc.values,
        kc.values,
        vc.values,
        qc.partition.levels[0],
        key_level,
        bias=False,
        causal=kwargs["causal"],
        dropout_p=0.0,
    )
    if _supported(kernel):
        assert chosen == kernel
    with sync_errors():  # the fused kernels and the tiled fallback: no host read
        out = ragged.attention(qc, kc, vc, **kwargs)
        grads = torch.autograd.grad(out.values, cuda_leaves, cotangent.to(DEVICE, dtype))
    tol = TOLERANCE[dtype]
    assert out.partition is qc.partition and out.dtype == dtype
    torch.testing.assert_close(out.values.double().cpu(), want, atol=tol, rtol=tol)
    for got, expected in zip(grads, want_grads, strict=True):
        scale = max(1.0, float(expected.abs().max()))
        torch.testing.assert_close(got.double().cpu(), expected, atol=tol * scale, rtol=tol)


def test_attention_dropout_on_the_fused_kernel():
    """Dropout runs inside the kernel: rows change, the expectation is kept (loosely)."""
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(sum(LENGTHS), 2, 64, generator=gen).to(DEVICE, torch.float16)
    x = ragged.from_lengths(values, LENGTHS)
    clean = ragged.attention(x, x, x).values.float()
    noisy = torch.stack(
        [ragged.attention(x, x, x, dropout_p=0.5).values.float() for _ in range(64)]
    )
    assert not torch.equal(noisy[0], clean) and torch.isfinite(noisy).all()
    err = (noisy.mean(0) - clean).abs().mean() / clean.abs().mean()
    assert err < 0.25, float(err)


def test_attention_compiles_on_cuda_to_one_graph():
    """Under torch.compile the flash kernel is traced: one graph across batches (its max length
    is a symbolic size), forward and backward."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("inductor")
    fn = torch.compile(
        lambda x: ragged.attention(x, x, x, causal=True), backend=counter, dynamic=True
    )
    gen = torch.Generator().manual_seed(2)
    with ragged.dynamic_shapes():
        for lengths in ([5, 0, 17], [40, 3], [2, 9, 9, 1]):
            values = torch.randn(sum(lengths), 2, 32, generator=gen).to(DEVICE, torch.bfloat16)
            x = ragged.from_lengths(values.requires_grad_(), lengths)
            out = fn(x)
            (grad,) = torch.autograd.grad(out.values.float().sum(), x.values)
            assert torch.isfinite(grad).all()
            want = ragged.attention(x, x, x, causal=True).values
            torch.testing.assert_close(out.values, want, atol=4e-2, rtol=4e-2)
    assert counter.frame_count == 1
