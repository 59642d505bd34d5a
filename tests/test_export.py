"""torch.export (via ragged.export) and torch.func.functional_call with ragged inputs."""

import pytest
import torch

import ragged


class Pool(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x: ragged.RaggedArray) -> tuple[torch.Tensor, ragged.RaggedArray]:
        h = ragged.map(self.proj, x)
        h = h - ragged.mean(h, axis=1, keepdims=True, fill_value=0.0)
        return ragged.amax(h, axis=1, fill_value=0.0), h * 2


BATCHES = [[3, 1], [1], [0, 5, 2], [2, 2, 2, 7], [6]]


def batch(lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    return ragged.from_lengths(torch.randn(sum(lengths), 4, generator=gen), lengths)


def test_export_runs_on_any_batch_and_round_trips(tmp_path):
    model = Pool().eval()
    program = ragged.export(model, (batch([2, 3], 0),))
    path = tmp_path / "pool.pt2"
    program.save(path)
    loaded = ragged.load_exported(path)
    for i, lengths in enumerate(BATCHES):
        x = batch(lengths, i + 1)
        pooled, rows = model(x)
        for runner in (program, loaded):
            got_pooled, got_rows = runner(x)
            torch.testing.assert_close(got_pooled, pooled)
            assert got_rows.lengths.tolist() == lengths
            torch.testing.assert_close(got_rows.values, rows.values)


def test_export_rejects_other_argument_kinds():
    program = ragged.export(lambda x: x * 2, (batch([1, 2], 0),))
    with pytest.raises(TypeError, match="arguments differ"):
        program(torch.ones(3))


def test_functional_call_grad_and_ensemble():
    model = Pool()
    params = dict(model.named_parameters())
    x = batch([3, 0, 4], 7)

    def loss(p, x):
        pooled, _ = torch.func.functional_call(model, p, (x,))
        return (pooled**2).sum()

    grads = torch.func.grad(loss)(params, x)
    expected = torch.autograd.grad(loss(params, x), list(params.values()))
    for g, e in zip(grads.values(), expected, strict=True):
        torch.testing.assert_close(g, e)
    stacked = {k: torch.stack([v, v * 0.5]) for k, v in params.items()}
    per_member = torch.func.vmap(loss, in_dims=(0, None))(stacked, x)
    halves = {k: v * 0.5 for k, v in params.items()}
    torch.testing.assert_close(per_member, torch.stack([loss(params, x), loss(halves, x)]))
