"""Attention written by hand on RaggedArrays: ``q @ k.transpose(-2, -1)`` is a pair map.

Scores of ``(B, H, L*, Dh)`` arrays are stored as ``sum_b H * N_b * M_b`` values (never padded);
``softmax(dim=-1)``, ``masked_fill`` with a causal pair mask, dropout and ``att @ v`` work on
them, as do ``torch.bmm`` / ``torch.baddbmm`` on ``(B, L*, C)``. Every result is compared with
the same torch code run on each segment (float64), with gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ragged
import ragged.testing
from tests.models_harness import (
    COMPILE_LENGTHS,
    LENGTHS,
    batch,
    check_docs_rows,
    check_one_graph,
    check_per_sequence,
)


def heads(x: Any, n_head: int) -> Any:
    """``(B, T, C) -> (B, H, T, C // H)`` in nanoGPT's spelling (a tensor or a RaggedArray)."""
    B, T, C = x.size()
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)


def scores_per_segment(att: ragged.RaggedArray, b: int, m: int) -> torch.Tensor:
    """Segment ``b`` (``m`` columns) of a ``(B, H, N*, M*)`` pair map as ``(H, N_b, m)``."""
    block = att.permute(0, 2, 3, 1)[b]  # (N_b, M_b*, H): the storage order indexes
    return block.values.unflatten(0, (block.num_segments, m)).permute(2, 0, 1)


def manual_attention(q: Any, k: Any, v: Any, causal: bool, p: float = 0.0) -> Any:
    """nanoGPT's manual path, the same code for tensors and RaggedArrays."""
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    if causal:
        att = att.masked_fill(torch.ones_like(att).tril() == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    att = F.dropout(att, p)
    return att @ v


@pytest.mark.parametrize("n_head", [1, 2])
def test_scores_are_a_pair_map_without_padding(n_head: int) -> None:
    segments = batch(LENGTHS, 8)
    q = heads(ragged.array(segments), n_head)
    att = q @ q.transpose(-2, -1)
    assert att.values.shape == (sum(n * n for n in LENGTHS), n_head)  # sum_b L_b^2 per head
    assert att.values.numel() == n_head * sum(n * n for n in LENGTHS)
    assert att.ndim == 4 and att.ragged_ndim == 2
    for b, segment in enumerate(segments):
        s = heads(segment[None], n_head)[0]
        torch.testing.assert_close(
            scores_per_segment(att, b, len(segment)), s @ s.transpose(-2, -1)
        )


def test_cross_scores_have_the_pairs_of_both_partitions() -> None:
    """q and k of different partitions of the same batch: ``N_b x M_b`` blocks."""
    queries, keys = batch([2, 4, 1], 8, seed=1), batch([3, 1, 5], 8, seed=2)
    q, k = heads(ragged.array(queries), 2), heads(ragged.array(keys), 2)
    att = q @ k.transpose(-2, -1)
    assert att.values.shape == (2 * 3 + 4 * 1 + 1 * 5, 2)
    for b, (qs, ks) in enumerate(zip(queries, keys, strict=True)):
        qh, kh = heads(qs[None], 2)[0], heads(ks[None], 2)[0]
        torch.testing.assert_close(scores_per_segment(att, b, len(ks)), qh @ kh.transpose(-2, -1))


@pytest.mark.parametrize("causal", [False, True])
def test_manual_attention_equals_sdpa_per_segment(causal: bool) -> None:
    segments = batch(LENGTHS, 8)
    a = ragged.array(segments)
    x = heads(a, 2)
    y = manual_attention(x, x, x, causal)
    assert y.shape[1] == 2 and y.order == x.order  # (B, H, L*, Dh), the layout of q
    out = y.transpose(1, 2).contiguous().view(*a.size())
    for b, segment in enumerate(segments):
        s = heads(segment[None], 2)
        expected = F.scaled_dot_product_attention(s, s, s, is_causal=causal)
        torch.testing.assert_close(out[b], expected.transpose(1, 2).reshape(-1, 8))


def test_cross_attention_equals_sdpa_with_gradients() -> None:
    lengths_q, lengths_kv = [2, 4, 1], [3, 1, 5]
    qv = torch.cat(batch(lengths_q, 8, seed=3)).requires_grad_()
    kv = torch.cat(batch(lengths_kv, 8, seed=4)).requires_grad_()

    def f(qv: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        q = heads(ragged.from_lengths(qv, lengths_q), 2)
        k = heads(ragged.from_lengths(kv, lengths_kv), 2)
        y = manual_attention(q, k, k * 2.0, causal=False)
        return y.transpose(1, 2).values

    torch.autograd.gradcheck(f, (qv, kv))
    got = torch.autograd.grad(f(qv, kv).pow(2).sum(), (qv, kv))
    ref = []
    for qs, ks in zip(qv.split(lengths_q), kv.split(lengths_kv), strict=True):
        q, k = heads(qs[None], 2), heads(ks[None], 2)
        ref.append(F.scaled_dot_product_attention(q, k, k * 2.0).transpose(1, 2)[0])
    torch.testing.assert_close(f(qv, kv), torch.cat(ref))
    expected = torch.autograd.grad(torch.cat(ref).pow(2).sum(), (qv, kv))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_causal_chain_gradcheck() -> None:
    lengths = [3, 1, 2]
    values = torch.cat(batch(lengths, 4, seed=6)).requires_grad_()

    def f(values: torch.Tensor) -> torch.Tensor:
        x = heads(ragged.from_lengths(values, lengths), 2)
        return manual_attention(x, x, x, causal=True).transpose(1, 2).values

    torch.autograd.gradcheck(f, (values,))


def test_torch_func_grad_through_the_chain() -> None:
    """``torch.func.grad`` takes and returns the RaggedArray; it equals autograd's gradient."""

    def loss(x: Any) -> Any:
        return manual_attention(heads(x, 2), heads(x, 2), heads(x, 2), True).values.pow(2).sum()

    lengths = [3, 1, 2]
    x = ragged.array(batch(lengths, 4, seed=10))
    got = torch.func.grad(loss)(x)
    values = x.values.clone().requires_grad_()
    loss(ragged.from_lengths(values, lengths)).backward()
    assert isinstance(got, ragged.RaggedArray) and got.partition is x.partition
    torch.testing.assert_close(got.values, values.grad)


@pytest.mark.parametrize("diagonal", [-1, 0, 1])
@pytest.mark.parametrize("upper", [False, True])
def test_tril_triu_of_a_pair_map_per_segment(diagonal: int, upper: bool) -> None:
    queries, keys = batch([2, 4, 0, 3], 4, seed=7), batch([3, 1, 2, 3], 4, seed=8)
    q, k = heads(ragged.array(queries), 2), heads(ragged.array(keys), 2)
    att = q @ k.transpose(-2, -1)
    got = att.triu(diagonal) if upper else torch.tril(att, diagonal)
    for b, (qs, ks) in enumerate(zip(queries, keys, strict=True)):
        qh, kh = heads(qs[None], 2)[0], heads(ks[None], 2)[0]
        s = qh @ kh.transpose(-2, -1)
        expected = s.triu(diagonal) if upper else s.tril(diagonal)
        torch.testing.assert_close(scores_per_segment(got, b, len(ks)), expected)


def test_ones_like_and_zeros_like_keep_the_layout() -> None:
    x = heads(ragged.array(batch([2, 0, 3], 4)), 2)
    att = x @ x.transpose(-2, -1)
    for like, fill in ((torch.ones_like, 1.0), (torch.zeros_like, 0.0)):
        for a in (x, att):
            made = like(a, dtype=torch.float32)
            assert made.partition is a.partition and made.order == a.order
            assert made.dtype == torch.float32 and bool((made.values == fill).all())
            assert made.values.shape == a.values.shape


def test_tril_on_two_inner_axes_and_its_error() -> None:
    x = ragged.array([torch.randn(n, 3, 3, dtype=torch.float64) for n in (2, 1)])
    for b in range(2):
        torch.testing.assert_close(torch.tril(x, -1)[b], x[b].tril(-1))
    with pytest.raises(ValueError, match=r"torch\.tril: `input` must have two inner axes last"):
        torch.tril(ragged.array(batch([2, 1], 3)))


# --- torch.bmm / torch.baddbmm / torch.matmul on (B, L*, C) ----------------------------------


def per_segment_grads(
    fn: Callable[..., Any], segments: list[torch.Tensor], weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fn`` on the batch and on every segment; the values and gradients of both."""
    values = torch.cat(segments).requires_grad_()
    w = weight.clone().requires_grad_()
    lengths = [len(s) for s in segments]
    got = fn(ragged.from_lengths(values, lengths), w).values
    g = torch.autograd.grad(got.pow(2).sum(), (values, w))
    ref = [
        fn(s[None], w[b : b + 1] if w.dim() == 3 else w)[0]
        for b, s in enumerate(values.split(lengths))
    ]
    expected = torch.cat([r.reshape(-1, *got.shape[1:]) for r in ref])
    torch.testing.assert_close(got, expected)
    e = torch.autograd.grad(expected.pow(2).sum(), (values, w))
    torch.testing.assert_close(g[0], e[0])
    torch.testing.assert_close(g[1], e[1])
    return got, g[0], g[1]


def _bmm_pairs(x: Any, w: torch.Tensor) -> Any:
    p = torch.bmm(x @ w, x.transpose(1, 2))  # (B, L*, L*), stored as sum L^2 values
    return torch.bmm(torch.softmax(p, dim=-1), x)  # (B, L*, C)


def _baddbmm(x: Any, w: torch.Tensor) -> Any:
    p = torch.bmm(x, x.transpose(1, 2))
    return torch.baddbmm(p, x @ w, x.transpose(1, 2), beta=0.5, alpha=2.0)


@pytest.mark.parametrize(
    ("fn", "weight"),
    [
        pytest.param(_bmm_pairs, torch.randn(4, 4, dtype=torch.float64), id="bmm-pairs"),
        pytest.param(_baddbmm, torch.randn(4, 4, dtype=torch.float64), id="baddbmm"),
        pytest.param(
            lambda x, w: torch.bmm(x, w), torch.randn(4, 4, 3, dtype=torch.float64), id="bmm-dense"
        ),
        pytest.param(
            lambda x, w: torch.matmul(x, w), torch.randn(4, 3, dtype=torch.float64), id="matmul"
        ),
    ],
)
def test_bmm_family_matches_each_segment(fn: Callable[..., Any], weight: torch.Tensor) -> None:
    per_segment_grads(fn, batch(LENGTHS, 4, seed=9), weight)


def test_a_dense_matrix_multiplies_the_rows_in_the_head_first_layout() -> None:
    segments = batch(LENGTHS, 8)
    q = heads(ragged.array(segments), 2)  # (B, H, L*, 4)
    w = torch.randn(4, 3, dtype=torch.float64)
    out = q @ w
    assert out.order == q.order and out.shape[-1] == 3
    for b, segment in enumerate(segments):
        expected = heads(segment[None], 2) @ w
        torch.testing.assert_close(out.transpose(1, 2)[b], expected[0].transpose(0, 1))
    with pytest.raises(TypeError, match="has its ragged axis moved"):
        q.transpose(-2, -1) @ torch.randn(3, 4, dtype=torch.float64)  # (B, H, 4, L*) @ w


def test_bmm_errors_name_the_shapes() -> None:
    x = ragged.array(batch([2, 1], 4))
    with pytest.raises(ValueError, match=r"torch\.bmm: `input` and `mat2` must be the pair map"):
        torch.bmm(x, x)
    with pytest.raises(TypeError, match=r"torch\.bmm: `input` must be a RaggedArray"):
        torch.bmm(torch.randn(2, 3, 4, dtype=torch.float64), x)
    with pytest.raises(TypeError, match=r"torch\.baddbmm: `input` must be a RaggedArray"):
        torch.baddbmm(torch.randn(2, 2, dtype=torch.float64), x, x.transpose(1, 2))
    with pytest.raises(NotImplementedError, match="not a pair-map product"):
        heads(x, 2) @ heads(x, 2)
    y = ragged.array(batch([2, 1], 6))
    with pytest.raises(ValueError, match=r"ragged\.matmul: the axes before the matrix axes"):
        heads(x, 2) @ heads(y, 3).transpose(-2, -1)
    with pytest.raises(ValueError, match=r"`y` must have 2 segments like x"):
        heads(x, 2) @ heads(ragged.array(batch([2, 1, 3], 4)), 2).transpose(-2, -1)


# --- the model row: nanoGPT's manual-attention fallback --------------------------------------


class ManualCausalSelfAttention(nn.Module):
    """Causal self-attention in nanoGPT's plain style with the manual attention path (written
    for this test). nanoGPT masks with a dense ``(1, 1, N, N)`` buffer sliced by ``T``
    (``self.bias[:, :, :T, :T] == 0``); a ragged ``T`` has one length per segment and cannot
    slice a tensor, so the mask is the lower triangle of the scores themselves, which is the
    same for tensors (docs/models.md, "What to write differently")."""

    def __init__(self, n_embd: int = 8, n_head: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x: Any) -> Any:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = self.attend(q, k, v)
        y = att.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def attend(self, q: Any, k: Any, v: Any) -> Any:
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(torch.ones_like(att).tril() == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        return att @ v


class MatmulCausalSelfAttention(ManualCausalSelfAttention):
    """The same with ``torch.matmul`` for the ``@`` operator: Dynamo (torch 2.13) traces ``@``
    only between tensors, and ``torch.matmul`` reaches RaggedArray's ``__torch_function__``."""

    def attend(self, q: Any, k: Any, v: Any) -> Any:
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(torch.ones_like(att).tril() == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        return torch.matmul(att, v)


MATRIX: dict[str, tuple[Callable[[], nn.Module], bool]] = {
    "nanoGPT-style CausalSelfAttention (manual attention, `@`)": (
        ManualCausalSelfAttention,
        False,
    ),
    "nanoGPT-style CausalSelfAttention (manual attention, torch.matmul)": (
        MatmulCausalSelfAttention,
        True,
    ),
}


@pytest.mark.parametrize("name", list(MATRIX))
def test_matrix_rows_match_each_sequence(name: str) -> None:
    torch.manual_seed(0)
    check_per_sequence(MATRIX[name][0]().double(), batch(LENGTHS, 8, seed=5))


@pytest.mark.parametrize("name", [n for n, (_, one) in MATRIX.items() if one])
def test_matrix_rows_compile_to_one_graph(name: str) -> None:
    torch.manual_seed(0)
    check_one_graph(MATRIX[name][0]())


def test_the_operator_breaks_the_graph_and_still_runs() -> None:
    """Dynamo (torch 2.13) has no rule for ``@`` between two non-tensor objects: compiled code
    breaks the graph there and still matches eager mode; ``fullgraph=True`` fails. When Dynamo
    learns ``@``, this fails: then docs/models.md's note and the matrix row can go."""

    def scores(x: Any) -> Any:
        q = heads(x, 2)
        return (q @ q.transpose(-2, -1)) * 0.5

    q = ragged.array(batch(COMPILE_LENGTHS[0], 8))
    torch._dynamo.reset()
    try:
        with torch.no_grad():  # resuming after a break, Dynamo would read `.grad` and warn
            strict = torch.compile(scores, backend="eager", dynamic=True, fullgraph=True)
            with pytest.raises(torch._dynamo.exc.Unsupported, match="builtin operator"):
                strict(q)
            torch._dynamo.reset()  # the two share the cache of `scores`' code
            compiled = torch.compile(scores, backend="eager", dynamic=True)
            ragged.testing.assert_close(compiled(q), scores(q))
    finally:
        torch._dynamo.reset()


def test_dropout_on_the_scores_keeps_the_pair_map() -> None:
    torch.manual_seed(0)
    x = heads(ragged.array(batch(LENGTHS, 8)), 2)
    att = F.softmax(x @ x.transpose(-2, -1), dim=-1)
    dropped = F.dropout(att, 0.5)
    assert dropped.partition is att.partition and dropped.order == att.order
    kept = dropped.values != 0
    torch.testing.assert_close(dropped.values[kept], att.values[kept] * 2.0)


def test_the_docs_list_every_row() -> None:
    """docs/models.md has a row for every module of the matrix, and says how it compiles."""
    check_docs_rows(MATRIX)
