"""The harness of the model tests: a module on a ragged batch against the same module on every
segment as a ``(1, L, C)`` tensor, and one compiled graph across batches.

Every ``tests/test_models*.py`` file uses it, each with its own rows of the model matrix of
docs/models.md (``docs_rows`` keeps each file's rows and the docs in step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import ragged
import ragged.testing

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


COMPILE_LENGTHS = [[3, 1, 4], [2, 5], [1, 2, 6, 3, 2]]


def check_one_graph(module: nn.Module, channels: int = 8) -> None:
    """``module`` compiled once runs three batches of other sizes and lengths in one graph."""
    batches = [
        (ragged.array(batch(n, channels, seed=i)).float(),) for i, n in enumerate(COMPILE_LENGTHS)
    ]
    # A module's float attribute (LayerNorm's eps) would be lifted as a dynamic float input and
    # read back with .item() inside the norm's handler; specialised as the op table does. Dynamo
    # runs torch's recurrent modules eagerly (tensors or not) unless `allow_rnn` is set.
    config = torch._dynamo.config.patch(specialize_float=True, allow_rnn=True)
    with ragged.dynamic_shapes(), config:
        report = ragged.testing.check_compile(
            module, batches, backend="aot_eager", max_graphs=1, atol=1e-5, rtol=1e-5
        )
    assert report.graphs == 1


def docs_rows() -> dict[str, str]:
    """The rows of the model matrix in docs/models.md, by module name."""
    text = (Path(__file__).parents[1] / "docs" / "models.md").read_text()
    text = text.split("## Side by side")[0]  # the matrix, not the benchmark's table
    return {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}


def check_docs_rows(matrix: dict[str, tuple[Callable[[], nn.Module], bool]]) -> None:
    """docs/models.md has a row for every module of ``matrix`` and says how it compiles."""
    rows = docs_rows()
    for name, (_, one_graph) in matrix.items():
        assert name in rows, name
        assert ("one graph" in rows[name]) == one_graph, name
