"""torch's shape idioms from model code (nanoGPT, HF BERT / GPT-2 / Llama) on RaggedArrays.

Each idiom runs unchanged on a RaggedArray and on every segment (a dense tensor with a batch
axis of one), and the results and gradients agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import ragged
from tests.optable import check_one_graph

LENGTHS = [5, 1, 9, 3]
C, NH = 12, 3  # embedding width and heads
HS = C // NH


def nanogpt_heads(x: Any) -> Any:
    """nanoGPT's CausalSelfAttention up to the attention, then back (no attention itself)."""
    B, T, C3 = x.size()
    q, k, v = x.split(C3 // 3, dim=2)
    q = q.view(B, T, NH, C3 // 3 // NH).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(B, T, NH, C3 // 3 // NH).transpose(1, 2)
    v = v.view(B, T, NH, C3 // 3 // NH).transpose(1, 2)
    y = (q * 0.5 + k.sigmoid()) * v
    return y.transpose(1, 2).contiguous().view(B, T, C3 // 3)


def hf_heads(x: Any) -> Any:
    """HF BERT / Llama: ``input_shape = x.shape[:-1]``, ``view(hidden_shape).transpose(1, 2)``,
    then ``reshape(*input_shape, -1)``."""
    input_shape = x.shape[:-1]
    hidden_shape = (*input_shape, -1, HS)
    q = x.view(hidden_shape).transpose(1, 2)  # (B, H, L*, Dh)
    q = torch.tanh(q) * 2
    return q.transpose(1, 2).reshape(*input_shape, -1).contiguous()


def gpt2_size_out(x: Any) -> Any:
    """GPT-2's ``size()[:-1] + (nf,)`` as a reshape of the inner axis."""
    size_out = x.size()[:-1] + (2, C // 2)  # noqa: RUF005  (the idiom under test)
    return x.reshape(size_out).flatten(-2)


CONV_W = torch.randn(C, C, dtype=torch.float64, generator=torch.Generator().manual_seed(9))


def gpt2_conv1d(x: Any) -> Any:
    """GPT-2's ``Conv1D``: ``view(-1, C)`` (the rows), ``addmm``, ``view(size_out)`` back."""
    size_out = x.size()[:-1] + (C,)  # noqa: RUF005  (GPT-2's spelling)
    y = torch.addmm(CONV_W[0], x.view(-1, x.size(-1)), CONV_W)
    y = torch.matmul(torch.tanh(y.view(size_out)).flatten(0, 1), CONV_W)  # flatten(0, 1) too
    return y.view(size_out)


def inner_family(x: Any) -> Any:
    """flatten / unflatten / chunk / unbind / squeeze / unsqueeze / expand / permute on inner
    axes, around the ragged axis."""
    y = x.unflatten(-1, (NH, HS))  # (B, T, H, D)
    a, b = y.chunk(2, dim=-1)  # (B, T, H, D/2) each
    first, *_ = y.unbind(dim=2)  # (B, T, D)
    z = (a - b).unsqueeze(2).squeeze(2) + first[..., : HS // 2].unsqueeze(2).expand(-1, -1, NH, -1)
    z = z.permute(0, 2, 3, 1).movedim(-1, 2)  # (B, H, T, D/2)
    return z.swapaxes(1, 2).flatten(2)


IDIOMS = [nanogpt_heads, hf_heads, gpt2_size_out, gpt2_conv1d, inner_family]
WIDTHS = {nanogpt_heads: 3 * C}


def _values(lengths: list[int], width: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(sum(lengths), width, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("idiom", IDIOMS, ids=lambda f: f.__name__)
def test_idiom_matches_segments_with_gradients(idiom: Callable[[Any], Any]) -> None:
    width = WIDTHS.get(idiom, C)
    values = _values(LENGTHS, width, 0).requires_grad_()
    x = ragged.from_lengths(values, LENGTHS)
    out = idiom(x)
    assert out.partition is x.partition and out.order is None
    weights = torch.randn_like(out.values)
    (grad,) = torch.autograd.grad((out.values * weights).sum(), values)
    for b, (start, length) in enumerate(zip([0, 5, 6, 15], LENGTHS, strict=True)):
        segment = values[start : start + length].detach().requires_grad_()
        want = idiom(segment[None])[0]  # the same code on a batch of one tensor
        torch.testing.assert_close(out.unbind()[b], want)
        w = weights[start : start + length]
        (want_grad,) = torch.autograd.grad((want * w).sum(), segment)
        torch.testing.assert_close(grad[start : start + length], want_grad)


def test_two_level_heads() -> None:
    """``(B, S*, T*, C)``: heads before the inner ragged axis and back, per row of tokens."""
    x = ragged.from_nested_lengths(_values([2, 3, 1, 4, 2], C, 1), [[2, 0, 3], [2, 3, 1, 4, 2]])
    B, S, T, _ = x.shape
    q = x.view(B, S, T, NH, HS).transpose(2, 3)  # (B, S*, H, T*, Dh)
    assert q.shape[2] == NH and q.shape[3] is not T and q.shape[3] == T
    assert q.values.data_ptr() == x.values.data_ptr()
    out = (q * 3).transpose(2, 3).reshape(B, S, T, -1)
    torch.testing.assert_close(out.values, x.values * 3)
    with pytest.raises(TypeError, match="reorders the ragged axes"):
        q.transpose(1, 3)


def test_merging_batch_and_ragged_gives_the_rows() -> None:
    x = ragged.from_lengths(_values(LENGTHS, C, 2), LENGTHS)
    flat = x.view(-1, x.size(-1))
    assert isinstance(flat, ragged.FlatArray) and flat.shape == (sum(LENGTHS), C)
    with pytest.raises(ValueError, match=r"^FlatArray\.view: .*ragged size of another array"):
        flat.view(ragged.from_lengths(_values(LENGTHS, C, 2), LENGTHS).shape)
    other = ragged.from_lengths(_values(LENGTHS, C, 2), LENGTHS)
    with pytest.raises(ValueError, match="ragged size of another array"):
        x.view(other.shape)
    with pytest.raises(TypeError, match="is a ragged axis"):
        x.split(2, dim=1)


def test_hf_sdpa_wrapper_comparison() -> None:
    """HF's ``is_causal = q_length > 1 and ...`` on ``query.shape[2]`` of ``(B, H, L*, Dh)``."""
    x = ragged.from_lengths(_values(LENGTHS, C, 3), LENGTHS)
    query = x.view(*x.shape[:-1], NH, HS).transpose(1, 2)
    q_length = query.shape[2]
    assert (q_length > 1 and True) is True
    assert F.relu(query).shape == query.shape


def test_attention_idiom_chain_compiles_to_one_graph() -> None:
    """view -> transpose(1, 2) -> pointwise -> transpose(1, 2) -> reshape: one graph for three
    batches of different sizes and lengths (no guard on the lengths, no host read)."""
    batches = [
        (ragged.from_lengths(_values(lengths, C, seed).float(), lengths),)
        for seed, lengths in enumerate([[5, 1, 9, 3], [2], [4, 4, 1, 7, 2, 6]])
    ]
    check_one_graph(hf_heads, batches, backend="aot_eager")
    check_one_graph(gpt2_conv1d, [(b.double(),) for (b,) in batches], backend="aot_eager")


def test_idioms_under_torch_func() -> None:
    """grad through the head-first chain, and vmap over an ensemble of scales applied in the
    permuted layout, agree with autograd and with a loop."""
    x = ragged.from_lengths(_values(LENGTHS, C, 4), LENGTHS)

    def loss(values: torch.Tensor) -> torch.Tensor:
        return (hf_heads(x.with_values(values)).values ** 2).sum()

    grad = torch.func.grad(loss)(x.values)
    values = x.values.clone().requires_grad_()
    (want,) = torch.autograd.grad(loss(values), values)
    torch.testing.assert_close(grad, want)

    def scaled(w: torch.Tensor) -> torch.Tensor:
        q = x.view(*x.shape[:-1], NH, HS).transpose(1, 2) * w  # (B, H, L*, Dh)
        return q.transpose(1, 2).reshape(*x.shape[:-1], -1).values.sum(0)

    ws = torch.tensor([0.5, 2.0, -1.0], dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(scaled)(ws), torch.stack([scaled(w) for w in ws]))
