"""HF transformers' Llama and BERT, unmodified, on RaggedArrays: the decoder layer with its
rotary embeddings, and the whole ``LlamaModel`` and ``BertModel`` on ``inputs_embeds``.

Each row runs once on a batch ``(B, L*, C)`` and once on every segment as a ``(1, L, C)`` tensor
with its own positions ``0..L-1`` (the per-sequence reference): outputs and parameter gradients
must agree (float64). The positions are written once, as tensor code that runs on both:
``x.new_ones(x.shape[:2], dtype=torch.long).cumsum(1) - 1``. The whole models take what they
document for packed inputs and no attention mask: BERT ``position_ids``; Llama makes its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import ragged
import ragged.testing
from tests.models_harness import (
    LENGTHS,
    batch,
    check_docs_rows,
    check_one_graph,
    check_per_sequence,
)

transformers = pytest.importorskip("transformers")
from transformers.models.bert import modeling_bert  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

LLAMA = {
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,  # grouped-query attention: SDPA with enable_gqa
    "num_hidden_layers": 2,
    "vocab_size": 32,
    "attn_implementation": "sdpa",
}
BERT = {
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32,
    "max_position_embeddings": 32,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "attn_implementation": "sdpa",
}


def positions(x: Any) -> Any:
    """``0..L-1`` in every segment: a ``(B, L*)`` RaggedArray, or ``(1, L)`` for a tensor."""
    return x.new_ones(x.shape[:2], dtype=torch.long).cumsum(1) - 1


class LlamaLayer(nn.Module):
    """``LlamaDecoderLayer`` with the rotary ``(cos, sin)`` that ``LlamaModel`` computes for it
    (``LlamaRotaryEmbedding`` on the positions); no attention mask (HF makes it causal)."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.LlamaConfig(**LLAMA)
        self.layer = modeling_llama.LlamaDecoderLayer(config, 0)
        self.rotary = modeling_llama.LlamaRotaryEmbedding(config)

    def forward(self, x: Any) -> Any:
        return self.layer(x, position_embeddings=self.rotary(x, positions(x)))


class LlamaModel(nn.Module):
    """``LlamaModel(inputs_embeds=x, use_cache=False)``: the last hidden state. The model makes
    its own positions, ``torch.arange(T).unsqueeze(0)`` (a ``(B, L*)`` RaggedArray of the
    positions of every segment: ``tests/test_ragged_index.py``).

    ``use_cache=False`` as in training: a ``DynamicCache`` adds its (int) length to the ragged
    size ``T`` to size the mask, which has one length per segment."""

    def __init__(self) -> None:
        super().__init__()
        self.model = modeling_llama.LlamaModel(transformers.LlamaConfig(**LLAMA))

    def forward(self, x: Any) -> Any:
        return self.model(inputs_embeds=x, use_cache=False).last_hidden_state


class BertModel(nn.Module):
    """``BertModel(inputs_embeds=x, position_ids=p)``: the last hidden state and the pooler
    output ``(B, C)`` (as ``(1, B, C)``: the harness compares dense outputs along axis 1).

    ``position_ids`` is needed: without it BERT slices its dense buffer
    ``self.position_ids[:, :seq_length]``, and a slice bound goes through ``__index__`` (one int),
    which a ragged size cannot give; ``token_type_ids`` is left out (the buffer is gathered with
    the ragged positions)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = modeling_bert.BertModel(transformers.BertConfig(**BERT))

    def forward(self, x: Any) -> Any:
        out = self.model(inputs_embeds=x, position_ids=positions(x))
        return out.last_hidden_state, out.pooler_output[None]


# name -> (builder, whether one compiled graph covers three batches): rows of the matrix of
# docs/models.md ("test_the_docs_list_every_row" keeps the two in step).
MATRIX: dict[str, tuple[Callable[[], nn.Module], bool]] = {
    "HF LlamaDecoderLayer": (LlamaLayer, True),
    "HF LlamaModel": (LlamaModel, True),
    "HF BertModel": (BertModel, True),
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


def test_iteration_under_compile_is_refused() -> None:
    """HF's ``ModelOutput`` calls ``iter()`` on its first field and takes a TypeError as "not a
    container of key/value pairs"; iterating would read every length."""
    x = ragged.array(batch([2, 3], 4))

    def f(x: Any) -> Any:
        try:
            return torch.stack([s.sum() for s in x])
        except TypeError as error:
            return str(error)

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    assert "iterating the segments under torch.compile" in compiled(x)
    torch.testing.assert_close(f(x), torch.stack([x[0].sum(), x[1].sum()]))
    torch._dynamo.reset()


def test_the_docs_list_every_row() -> None:
    """docs/models.md has a row for every module of the matrix, and says how it compiles."""
    check_docs_rows(MATRIX)


# --- the calls these models make, one by one ----------------------------------------------------


def test_rotate_half_on_the_head_first_layout() -> None:
    """HF's ``rotate_half`` on ``(B, H, L*, Dh)``: slices of the last axis and ``torch.cat``
    along it keep the layout; the result equals the per-segment tensor computation."""
    segments = batch(LENGTHS, 8, seed=1)
    x = ragged.array(segments)
    B, T, _ = x.shape
    q = x.view(B, T, 2, 4).transpose(1, 2)
    got = modeling_llama.rotate_half(q)
    assert got.order == q.order and got.shape[1] == 2 and got.shape[3] == 4
    for b, segment in enumerate(segments):
        one = segment.view(1, -1, 2, 4).transpose(1, 2)
        torch.testing.assert_close(
            got.transpose(1, 2)[b], modeling_llama.rotate_half(one)[0].transpose(0, 1)
        )


def test_trailing_index_keeps_names_and_refuses_other_axes() -> None:
    x = ragged.from_lengths(torch.arange(24.0).reshape(6, 2, 2), [2, 4]).rename("b", "l", "h", "d")
    q = x.transpose(1, 2)  # (B, H, L*, D)
    assert q[..., 0].axes == ("b", "h", "l") and q[:, :, :, 1:].axes == q.axes
    ragged.testing.assert_close(q[..., 1].transpose(1, 2), x[..., 1])
    with pytest.raises(TypeError, match=r"has its ragged axis moved"):
        q[:, 0]  # an inner axis before the ragged one
    with pytest.raises(TypeError, match=r"has its ragged axis moved"):
        torch.cat([q, q], dim=1)


def test_permuted_arrays_are_refused_under_compile_too() -> None:
    """The layout is static: while torch.compile traces, an op written for the storage order
    refuses a permuted array as in eager mode (it once read it in storage order there)."""
    q = ragged.array(batch([3, 2], 2))[..., None].transpose(1, 2)  # (B, 2, L*, 1)

    def call(q: Any) -> Any:
        return ragged.concat([q, q], axis=3)

    with pytest.raises(TypeError, match=r"has its ragged axis moved"):
        call(q)
    compiled = torch.compile(call, backend="eager", fullgraph=True)
    try:
        with pytest.raises(Exception, match=r"has its ragged axis moved"):
            compiled(q)
    finally:
        torch._dynamo.reset()


def test_ragged_size_compares_with_itself() -> None:
    """HF's SDPA wrapper asks ``kv_length > q_length`` (the same ragged size for self-attention)."""
    size = ragged.array([[1.0, 2.0], [3.0]]).shape[1]
    assert not size > size and size >= size and not size < size and size <= size
    other = ragged.array([[1.0], [3.0, 4.0]]).shape[1]
    with pytest.raises(TypeError, match=r"ragged size.*itself"):
        _ = size > other


@pytest.mark.parametrize("inner", [(), (3,)])
def test_gather_a_dense_buffer_with_ragged_positions(inner: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(3)
    lengths = [2, 0, 3]
    source = torch.randn(3, 6, *[k + 1 for k in inner], dtype=torch.float64, generator=generator)
    source.requires_grad_()
    index = ragged.array([torch.randint(-6, 6, (n, *inner), generator=generator) for n in lengths])
    got = torch.gather(source, 1, index)
    assert got.partition is index.partition
    got.values.pow(2).sum().backward()
    grad = source.grad.clone()
    source.grad = None
    for b in range(len(lengths)):
        expected = torch.gather(source[b : b + 1], 1, index[b][None] % 6)[0]
        torch.testing.assert_close(got[b], expected)
        expected.pow(2).sum().backward()
    torch.testing.assert_close(grad, source.grad)


def test_gather_errors() -> None:
    index = ragged.array([torch.arange(2), torch.arange(3)])
    with pytest.raises(TypeError, match=r"^torch.gather: `input` must be a dense Tensor"):
        torch.gather(index, 1, index)
    with pytest.raises(ValueError, match=r"^torch.gather: `dim` must be 1"):
        torch.gather(torch.zeros(2, 4), 0, index)
    with pytest.raises(ValueError, match=r"^torch.gather: `index` .* must fit `input`"):
        torch.gather(torch.zeros(3, 4), 1, index)
    with pytest.raises(TypeError, match=r"^torch.gather: `index` must hold int64"):
        torch.gather(torch.zeros(2, 4), 1, index.int())
