"""Plain ``torch.compile(dynamic=True)`` of a train step on RaggedArrays (issue 27, item 3).

Users reach for ``torch.compile`` before ``ragged.jit``. Across batches of other sizes and
lengths a plain compile makes one graph, plus one for a batch of one segment (Dynamo specialises
sizes 0 and 1; ``ragged.dynamic_shapes()``, which ``ragged.jit`` enters, removes that one). The
third batch recompiling under Inductor on CPU is Inductor's own guard on the length of a float32
sum (``docs/guide.md``, "One graph across batches"), not ragged's: it is not in these graphs.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import ragged

LENGTHS = ([5, 3, 7], [4], [9, 2, 6, 1, 8])  # three segments, one, five of other lengths


class Step(torch.nn.Module):
    """Projections, causal ragged attention, a ragged mean: a model's loss on one batch."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x: ragged.RaggedArray) -> torch.Tensor:
        q, k, v = (t.reshape(-1, 2, 4) for t in self.qkv(x.values).chunk(3, dim=-1))
        heads = ragged.attention(
            x.with_values(q, axes=None),
            x.with_values(k, axes=None),
            x.with_values(v, axes=None),
            causal=True,
        )
        pooled = ragged.mean(heads.with_values(heads.values.reshape(-1, 8), axes=None), axis=1)
        return self.out(pooled).pow(2).sum()


def batches(seed: int = 0) -> list[ragged.RaggedArray]:
    gen = torch.Generator().manual_seed(seed)
    return [ragged.from_lengths(torch.randn(sum(n), 8, generator=gen), n) for n in LENGTHS]


def train(step: torch.nn.Module, fn: object) -> list[list[torch.Tensor]]:
    """The loss and gradients of every batch under ``fn`` (compiled or eager ``step``)."""
    results = []
    for x in batches():
        step.zero_grad()
        loss = fn(x)  # type: ignore[operator]
        loss.backward()
        results.append([loss.detach(), *(p.grad.clone() for p in step.parameters())])
    return results


@pytest.mark.parametrize("dynamic_shapes", [False, True], ids=["plain", "dynamic_shapes"])
def test_plain_compile_of_a_train_step_makes_one_graph_beyond_the_size_1_specialisation(
    dynamic_shapes,
):
    torch.manual_seed(0)
    step = Step()
    want = train(step, step)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")  # traces the backward too
    compiled = torch.compile(step, dynamic=True, backend=counter)
    if dynamic_shapes:
        with ragged.dynamic_shapes():
            got = train(step, compiled)
    else:
        got = train(step, compiled)
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # plain: the first batch's graph and one for the one-segment batch; the third batch of
    # other sizes and lengths reuses the first. Under ragged.dynamic_shapes(): one graph.
    assert counter.frame_count == (1 if dynamic_shapes else 2)
