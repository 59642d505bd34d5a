"""Model code written for tensors, run unmodified on RaggedArrays.

Each module runs once on a batch ``(B, L*, C)`` and once on every segment as a ``(1, L, C)``
tensor (the per-sequence reference): outputs, last states and parameter gradients must agree
(float64).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from torch import nn

import ragged

LENGTHS = [5, 1, 9, 3]


def batch(lengths: Sequence[int], channels: int, seed: int = 0) -> list[torch.Tensor]:
    """Per-segment float64 tensors ``(L_i, channels)`` from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(n, channels, dtype=torch.float64, generator=generator) for n in lengths]


def grads(module: nn.Module) -> dict[str, torch.Tensor]:
    """The parameter gradients of ``module`` (cleared afterwards)."""
    out = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    module.zero_grad()
    return out


def outputs(result: Any) -> list[Any]:
    """The tensors and RaggedArrays of a module's result, flattened (``(out, (h, c))``)."""
    if isinstance(result, (tuple, list)):
        return [leaf for item in result for leaf in outputs(item)]
    return [result]


def check_per_sequence(
    module: nn.Module,
    segments: list[torch.Tensor],
    call: Callable[[nn.Module, Any, int | None], Any] = lambda m, x, b: m(x),
) -> None:
    """``module`` on the batch equals ``module`` on each segment, with parameter gradients.

    ``call(module, x, b)`` runs the module on ``x`` (the RaggedArray, ``b=None``; or segment
    ``b`` as a ``(1, L, C)`` tensor). A RaggedArray output is compared segment by segment, a
    tensor output (a last state) along its batch axis 1 (torch's ``(layers, B, H)``).
    """
    x = ragged.array(segments)
    got = outputs(call(module, x, None))
    assert isinstance(got[0], ragged.RaggedArray)
    loss = sum((o.values if isinstance(o, ragged.RaggedArray) else o).pow(2).sum() for o in got)
    loss.backward()
    batched = grads(module)
    loss_ref = torch.zeros((), dtype=torch.float64)
    for b, segment in enumerate(segments):
        expected = outputs(call(module, segment[None], b))
        assert len(expected) == len(got)
        for g, e in zip(got, expected, strict=True):
            if isinstance(g, ragged.RaggedArray):
                torch.testing.assert_close(g[b], e[0])
            else:
                torch.testing.assert_close(g[:, b], e[:, 0])
        loss_ref = loss_ref + sum(e.pow(2).sum() for e in expected)
    loss_ref.backward()
    reference = grads(module)
    assert batched.keys() == reference.keys() and batched
    for name, grad in batched.items():
        torch.testing.assert_close(grad, reference[name], msg=name)


RECURRENT = [
    pytest.param(nn.RNN, {}, id="RNN"),
    pytest.param(nn.RNN, {"nonlinearity": "relu"}, id="RNN-relu"),
    pytest.param(nn.GRU, {}, id="GRU"),
    pytest.param(nn.LSTM, {}, id="LSTM"),
    pytest.param(nn.LSTM, {"proj_size": 3}, id="LSTM-proj"),
]


@pytest.mark.parametrize(("layers", "bidirectional"), [(1, False), (2, True)])
@pytest.mark.parametrize(("cls", "options"), RECURRENT)
def test_recurrent_modules_match_each_sequence(cls, options, layers, bidirectional) -> None:
    torch.manual_seed(0)
    module = cls(4, 6, num_layers=layers, bidirectional=bidirectional, batch_first=True, **options)
    check_per_sequence(module.double(), batch(LENGTHS, 4))


@pytest.mark.parametrize("cls", [nn.RNN, nn.GRU, nn.LSTM])
def test_recurrent_modules_take_an_initial_state(cls) -> None:
    torch.manual_seed(1)
    module = cls(3, 5, num_layers=2, bidirectional=True, batch_first=True).double()
    generator = torch.Generator().manual_seed(2)
    shape = (4, len(LENGTHS), 5)
    h0 = torch.randn(shape, dtype=torch.float64, generator=generator)
    c0 = torch.randn(shape, dtype=torch.float64, generator=generator)
    state = (h0, c0) if cls is nn.LSTM else h0

    def call(m: nn.Module, x: Any, b: int | None) -> Any:
        if b is None:
            return m(x, state)
        one = (h0[:, b : b + 1], c0[:, b : b + 1]) if cls is nn.LSTM else h0[:, b : b + 1]
        return m(x, one)

    check_per_sequence(module, batch(LENGTHS, 3, seed=3), call)


def test_recurrent_output_keeps_the_partition() -> None:
    x = ragged.array(batch([2, 4], 3))
    out, _ = nn.GRU(3, 2, batch_first=True).double()(x)
    assert out.partition is x.partition
    assert out.shape[-1] == 2


def test_recurrent_errors_name_the_layout() -> None:
    x = ragged.array(batch([2, 4], 3))
    with pytest.raises(ValueError, match=r"torch.gru: `batch_first` must be True"):
        torch.gru(x, torch.zeros(1, 2, 2), [], True, 1, 0.0, False, False, False)
    with pytest.raises(ValueError, match=r"no empty segment"):
        nn.GRU(3, 2, batch_first=True).double()(ragged.array(batch([2, 0], 3)))
