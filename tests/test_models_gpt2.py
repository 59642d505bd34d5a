"""HF GPT-2's MLP and block on RaggedArrays, unmodified: rows of the model matrix.

GPT-2's ``Conv1D`` merges the batch and ragged axes (``x.view(-1, C)``, a FlatArray of the
rows), multiplies with ``torch.addmm`` and views the result back with ``x.size()[:-1] +
(nf,)``; its attention goes through HF's SDPA wrapper on the head-first layout.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.models_harness import (
    LENGTHS,
    batch,
    check_docs_rows,
    check_one_graph,
    check_per_sequence,
)


def gpt2(name: str) -> Callable[[], nn.Module]:
    """A tiny random HF GPT-2 module (n_embd 8, 2 heads, SDPA, no dropout)."""

    def build() -> nn.Module:
        transformers = pytest.importorskip("transformers")
        from transformers.models.gpt2 import modeling_gpt2

        config = transformers.GPT2Config(
            n_embd=8,
            n_head=2,
            n_layer=1,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            attn_implementation="sdpa",
        )
        modules = {
            "GPT2MLP": lambda: modeling_gpt2.GPT2MLP(32, config),
            "GPT2Block": lambda: modeling_gpt2.GPT2Block(config),
        }
        return modules[name]()

    return build


# name -> (builder, whether one compiled graph covers three batches): rows of docs/models.md.
MATRIX: dict[str, tuple[Callable[[], nn.Module], bool]] = {
    "HF GPT2MLP": (gpt2("GPT2MLP"), True),
    "HF GPT2Block": (gpt2("GPT2Block"), True),
}


@pytest.mark.parametrize("name", list(MATRIX))
def test_matrix_rows_match_each_sequence(name: str) -> None:
    torch.manual_seed(0)
    module = MATRIX[name][0]().double()
    check_per_sequence(module, batch(LENGTHS, 8, seed=5))


@pytest.mark.parametrize("name", [n for n, (_, one) in MATRIX.items() if one])
def test_matrix_rows_compile_to_one_graph(name: str) -> None:
    torch.manual_seed(0)
    check_one_graph(MATRIX[name][0]())


def test_the_docs_list_every_row() -> None:
    check_docs_rows(MATRIX)
