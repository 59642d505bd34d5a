"""Plain ``torch.nn`` modules on RaggedArrays, and one module through every transform.

The same module (written only with torch functions and ``nn`` layers) runs eagerly, under
``torch.func.grad`` with ``functional_call``, under ``torch.func.vmap`` over stacked parameters
(an ensemble) and under ``torch.compile(fullgraph=True, dynamic=True)`` in one graph across
batch sizes and lengths with no host sync; each against a per-segment reference.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ragged
import ragged.testing
from tests.optable import ragged_randn

D = 6


def batch(lengths: list[int], seed: int = 0, dtype: torch.dtype = torch.float64) -> Any:
    return ragged_randn(lengths, (D,), torch.Generator().manual_seed(seed), dtype)


class Block(nn.Module):
    """A pre-norm MLP block with a residual, written with torch functions only."""

    def __init__(self, dim: int = D, hidden: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: Any) -> Any:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Pool(nn.Module):
    """Attention pooling over each segment's rows: ``softmax(score, dim=1)``, ``sum(dim=1)``."""

    def __init__(self, dim: int = D) -> None:
        super().__init__()
        self.score = nn.Linear(dim, 1)

    def forward(self, x: Any) -> Any:
        weights = torch.softmax(self.score(x), dim=1)
        return torch.sum(weights * x, dim=1)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.pool = Pool()
        self.head = nn.Linear(D, 3)

    def forward(self, x: Any) -> Any:
        return self.head(self.pool(self.block(x)))


def per_segment(module: nn.Module, x: ragged.RaggedArray, pooled: bool = False) -> list[Any]:
    """The module on each segment as a dense batch of one ``(1, L, D)``."""
    return [module(segment[None])[0] for segment in x.unbind() if segment.shape[0] or not pooled]


MODULES = {
    "Linear": lambda: nn.Linear(D, 4),
    "LayerNorm": lambda: nn.LayerNorm(D),
    "RMSNorm": lambda: nn.RMSNorm(D),
    "GELU": nn.GELU,
    "SiLU": nn.SiLU,
    "ReLU": nn.ReLU,
    "Tanh": nn.Tanh,
    "Sigmoid": nn.Sigmoid,
    "Dropout (eval)": lambda: nn.Dropout(0.3).eval(),
    "Sequential": lambda: nn.Sequential(
        nn.Linear(D, 8), nn.GELU(), nn.Dropout(0.1).eval(), nn.LayerNorm(8), nn.Linear(8, D)
    ),
    "Block": Block,
}


@pytest.mark.parametrize("name", list(MODULES))
def test_modules_match_every_segment(name: str) -> None:
    torch.manual_seed(0)
    module = MODULES[name]().double()
    x = batch([3, 0, 5, 1])
    out = module(x)
    assert isinstance(out, ragged.RaggedArray) and out.partition is x.partition
    for got, expected in zip(out.unbind(), per_segment(module, x), strict=True):
        torch.testing.assert_close(got, expected)


def test_embedding_takes_integer_arrays() -> None:
    torch.manual_seed(0)
    emb = nn.Embedding(10, D)
    tokens = ragged.from_lengths(torch.randint(0, 10, (7,)), [3, 0, 4])
    out = emb(tokens)
    assert out.shape.to_list() == [3, [3, 0, 4], D]
    for got, segment in zip(out.unbind(), tokens.unbind(), strict=True):
        torch.testing.assert_close(got, emb(segment))


def test_pooling_head_and_model_match_every_segment() -> None:
    torch.manual_seed(0)
    model = Model().double()
    x = batch([3, 2, 5, 1])  # no empty segment: a softmax over no rows pools to zeros
    out = model(x)
    assert out.shape == (4, 3)
    expected = torch.stack(per_segment(model, x, pooled=True))
    torch.testing.assert_close(out, expected)
    empty = model(batch([3, 0, 2]))
    torch.testing.assert_close(empty[1], model.head(torch.zeros(D, dtype=torch.float64)))


def _loss(model: nn.Module, params: dict[str, Any], x: Any) -> torch.Tensor:
    return torch.func.functional_call(model, params, (x,)).square().sum()


def test_grad_and_functional_call_match_autograd() -> None:
    torch.manual_seed(0)
    model = Model().double()
    x = batch([3, 0, 5, 1])
    params = {k: v.detach() for k, v in model.named_parameters()}
    grads = torch.func.grad(lambda p: _loss(model, p, x))(params)
    model.zero_grad()
    model(x).square().sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad)
    gx = torch.func.grad(lambda x: model(x).square().sum())(x)
    assert isinstance(gx, ragged.RaggedArray) and gx.partition is x.partition


def test_vmap_over_an_ensemble_of_parameters() -> None:
    torch.manual_seed(0)
    model = Model().double()
    x = batch([3, 0, 5, 1])
    params = {k: v.detach() for k, v in model.named_parameters()}
    stacked = {k: torch.stack([v, v + 0.1, v - 0.2]) for k, v in params.items()}
    outs = torch.func.vmap(lambda p: torch.func.functional_call(model, p, (x,)))(stacked)
    grads = torch.func.vmap(torch.func.grad(lambda p: _loss(model, p, x)))(stacked)
    for k in range(3):
        member = {name: value[k] for name, value in stacked.items()}
        torch.testing.assert_close(outs[k], torch.func.functional_call(model, member, (x,)))
        expected = torch.func.grad(lambda p: _loss(model, p, x))(member)
        for name in params:
            torch.testing.assert_close(grads[name][k], expected[name])


def _compile_report(fn: Any, batches: list[Any], **options: Any) -> Any:
    return ragged.testing.check_compile(
        fn, batches, backend="aot_eager", max_graphs=4, allow_unbacked=True, **options
    )


def test_compiles_to_one_graph_across_batches_with_gradients() -> None:
    torch.manual_seed(0)
    model = Model()
    batches = []
    for seed, lengths in enumerate([[3, 0, 5, 2], [1], [4, 4], [0, 2, 7, 1, 3], [2, 9]]):
        x = batch(lengths, seed, torch.float32)
        batches.append((x.with_values(x.values.requires_grad_()),))
    tolerances = {"atol": 1e-5, "rtol": 1e-5, "grad": True}
    # torch 2.13 under dynamic=True lifts a float module attribute (nn.LayerNorm's eps) as a
    # graph input and reads it back (.item() on a CPU scalar; with aot_eager a second graph),
    # for dense tensors too. Specialised floats: one graph, no host read at all.
    with ragged.dynamic_shapes(), torch._dynamo.config.patch(specialize_float=True):
        report = _compile_report(lambda x: model(x), batches, **tolerances)
    assert (report.graphs, report.syncs, report.unbacked) == (1, [], [])
    # Lifted floats: no graph and no host read beyond the same model's on dense tensors.
    with ragged.dynamic_shapes():
        lifted = _compile_report(lambda x: model(x), batches, **tolerances)
    dense = [(torch.randn(1, n, D),) for n in (3, 5, 8, 2)]
    baseline = _compile_report(lambda x: model.head(model.block(x).mean(1)), dense)
    assert lifted.graphs <= baseline.graphs and len(lifted.syncs) <= len(baseline.syncs)
    assert not lifted.unbacked


def test_a_training_step_changes_the_parameters() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 8), nn.SiLU(), nn.RMSNorm(8), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = batch([3, 0, 5, 1], dtype=torch.float32)
    target = x.with_values(torch.ones(x.values.shape[0], 1))
    losses = []
    for _ in range(5):
        loss = F.mse_loss(model(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
