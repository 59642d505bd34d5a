"""Model code written for tensors, run unmodified on RaggedArrays.

Each module runs once on a batch ``(B, L*, C)`` and once on every segment as a ``(1, L, C)``
tensor (the per-sequence reference): outputs, last states and parameter gradients must agree
(float64).
"""

from __future__ import annotations

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
    outputs,
)

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


@pytest.mark.parametrize("lengths", [[0, 3, 0, 2], [0, 0]])
@pytest.mark.parametrize("cls", [nn.RNN, nn.GRU, nn.LSTM])
def test_recurrent_empty_segments_keep_their_initial_state(cls, lengths) -> None:
    torch.manual_seed(4)
    module = cls(3, 5, num_layers=2, bidirectional=True, batch_first=True).double()
    generator = torch.Generator().manual_seed(5)
    h0 = torch.randn(4, len(lengths), 5, dtype=torch.float64, generator=generator)
    c0 = torch.randn(4, len(lengths), 5, dtype=torch.float64, generator=generator)
    state = (h0, c0) if cls is nn.LSTM else h0
    segments = batch(lengths, 3, seed=6)
    out, last = module(ragged.array(segments), state)
    last = last if cls is nn.LSTM else (last,)
    initial = (h0, c0) if cls is nn.LSTM else (h0,)
    assert out.shape[-1] == 10
    for b, segment in enumerate(segments):
        one = tuple(h[:, b : b + 1] for h in initial)
        if segment.shape[0] == 0:
            expected_out = segment.new_zeros(0, 10)
            expected_last = one
        else:
            expected_out, expected_last = module(segment[None], one if cls is nn.LSTM else one[0])
            expected_out = expected_out[0]
            expected_last = expected_last if cls is nn.LSTM else (expected_last,)
        torch.testing.assert_close(out[b], expected_out)
        for got, expected in zip(last, expected_last, strict=True):
            torch.testing.assert_close(got[:, b], expected[:, 0])


def per_segment_diff(segment: torch.Tensor, n: int, dim: int, pre: Any, post: Any) -> torch.Tensor:
    """``torch.diff`` of one segment ``(L, C)`` (``dim`` of the batch, minus one)."""
    return torch.diff(segment, n, dim - 1, prepend=pre, append=post)


@pytest.mark.parametrize("n", [0, 1, 2])
@pytest.mark.parametrize("dim", [1, -1, 2])
@pytest.mark.parametrize("ends", [False, True])
def test_diff_matches_each_segment(n: int, dim: int, ends: bool) -> None:
    lengths = [0, 1, 2, 5]
    segments = batch(lengths, 3, seed=n)
    x = ragged.array(segments)
    if dim == -1:
        x = x[..., 0]
        segments = [s[:, 0] for s in segments]
    inner = dim == 2
    pre = (x[..., :1] if inner else x[:, :1]) - 1 if ends else None
    post = x * 2 if ends else None
    got = torch.diff(x, n, dim, prepend=pre, append=post)
    for b, segment in enumerate(segments):
        p = (segment[:, :1] if inner else segment[:1]) - 1 if ends else None
        q = segment * 2 if ends else None
        axis = 1 if dim == -1 else dim
        torch.testing.assert_close(got[b], per_segment_diff(segment, n, axis, p, q))
    assert x.diff(n, dim).shape == torch.diff(x, n, dim).shape


def test_diff_and_addmm_differentiate() -> None:
    x = ragged.array(batch([3, 0, 4], 2)).requires_grad_()
    w = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)

    def f(values: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        rows = x.with_values(values)
        out = torch.addmm(b, torch.diff(rows, dim=1, prepend=rows[:, :1]), w, beta=0.5)
        return out.values

    torch.autograd.gradcheck(f, (x.values, w, b))


def test_addmm_matches_each_segment() -> None:
    segments = batch([4, 0, 2], 3)
    x = ragged.array(segments)
    w = torch.randn(3, 2, dtype=torch.float64)
    bias = torch.randn(2, dtype=torch.float64)
    got = torch.addmm(bias, x, w, beta=2.0, alpha=0.5)
    assert got.partition is x.partition
    for b, segment in enumerate(segments):
        torch.testing.assert_close(got[b], torch.addmm(bias, segment, w, beta=2.0, alpha=0.5))


def test_diff_and_addmm_errors() -> None:
    x = ragged.array(batch([2, 1], 3))
    with pytest.raises(ValueError, match=r"torch.diff: `dim` cannot be the batch axis"):
        torch.diff(x, dim=0)
    with pytest.raises(TypeError, match=r"torch.diff: `prepend` must be a RaggedArray"):
        torch.diff(x, dim=1, prepend=torch.zeros(1, 3))
    with pytest.raises(TypeError, match=r"torch.addmm: `mat2` must be a dense Tensor"):
        torch.addmm(torch.zeros(3), x, x)


def test_addmm_compiles_to_one_graph() -> None:
    w = torch.randn(3, 2)
    bias = torch.randn(2)

    def f(x: ragged.RaggedArray) -> Any:
        return torch.addmm(bias, x, w), torch.addmm(bias, x * 2, w, beta=0.5), x.diff(1, dim=-1)

    batches = [
        (ragged.array(batch(lengths, 3, seed=i)).float(),)
        for i, lengths in enumerate(COMPILE_LENGTHS)
    ]
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(f, batches, backend="aot_eager", max_graphs=1)
    assert report.graphs == 1


# --- the model matrix: module rows compared with per-sequence runs, and compiled ---------------


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))


class CausalSelfAttention(nn.Module):
    """Causal self-attention in nanoGPT's plain-torch style (written for this test): a fused
    qkv projection split along the channels, heads by ``view`` + ``transpose(1, 2)``, SDPA."""

    def __init__(self, n_embd: int = 8, n_head: int = 2) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x: Any) -> Any:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        heads = (B, T, self.n_head, C // self.n_head)
        q, k, v = (t.view(*heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    """A pre-norm transformer block in nanoGPT's style: attention and MLP with residuals."""

    def __init__(self, n_embd: int = 8) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )

    def forward(self, x: Any) -> Any:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def hf(name: str) -> Callable[[], nn.Module]:
    """A tiny random HF ``transformers`` module (the test skips without transformers)."""

    def build() -> nn.Module:
        transformers = pytest.importorskip("transformers")
        bert = transformers.BertConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2)
        llama = transformers.LlamaConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2)
        layer = transformers.BertConfig(
            hidden_size=8,
            intermediate_size=16,
            num_attention_heads=2,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            attn_implementation="sdpa",
        )
        from transformers.models.bert import modeling_bert
        from transformers.models.llama import modeling_llama

        modules = {
            "BertIntermediate": lambda: modeling_bert.BertIntermediate(bert),
            "BertLayer": lambda: modeling_bert.BertLayer(layer),
            "LlamaMLP": lambda: modeling_llama.LlamaMLP(llama),
            "LlamaRMSNorm": lambda: modeling_llama.LlamaRMSNorm(8),
        }
        return modules[name]()

    return build


# name -> (builder, whether one compiled graph covers three batches). Rows are the matrix of
# docs/models.md ("test_the_docs_list_every_row" keeps the two in step).
MATRIX: dict[str, tuple[Callable[[], nn.Module], bool]] = {
    "nn.Linear / GELU MLP": (mlp, True),
    "nn.LayerNorm": (lambda: nn.LayerNorm(8), True),
    "nn.RNN": (lambda: nn.RNN(8, 6, batch_first=True), True),
    "nn.GRU": (lambda: nn.GRU(8, 6, num_layers=2, bidirectional=True, batch_first=True), True),
    "nn.LSTM": (lambda: nn.LSTM(8, 6, num_layers=2, bidirectional=True, batch_first=True), True),
    "nanoGPT-style CausalSelfAttention": (CausalSelfAttention, True),
    "nanoGPT-style Block": (Block, True),
    "HF BertIntermediate": (hf("BertIntermediate"), True),
    "HF BertLayer": (hf("BertLayer"), True),
    "HF LlamaMLP": (hf("LlamaMLP"), True),
    "HF LlamaRMSNorm": (hf("LlamaRMSNorm"), True),
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


@pytest.mark.parametrize("cls", [nn.GRU, nn.LSTM])
def test_recurrent_gradients_under_compile(cls: type[nn.Module]) -> None:
    """Compiled, the recurrence is one opaque op whose backward recomputes the forward with
    autograd: input and parameter gradients equal eager mode's, batch after batch, one graph."""
    import torch._dynamo.testing

    torch.manual_seed(0)
    module = cls(3, 4, num_layers=2, bidirectional=True, batch_first=True).double()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(module, backend=counter, dynamic=True, fullgraph=True)
    with ragged.dynamic_shapes(), torch._dynamo.config.patch(allow_rnn=True):
        run_both(compiled, module)
    assert sum(1 for graph in counter.graphs if len(graph.graph.nodes)) == 1


def run_both(compiled: Any, module: nn.Module) -> None:
    """``compiled`` and ``module`` give the same input and parameter gradients on two batches."""
    for i, lengths in enumerate([[3, 0, 4], [2, 5]]):
        found = []
        for run in (compiled, module):
            x = ragged.array(batch(lengths, 3, seed=i))
            values = x.values.detach().requires_grad_()
            x = x.with_values(values)
            out = outputs(run(x))
            loss = out[0].values.pow(2).sum() + sum(h.pow(3).sum() for h in out[1:])
            loss.backward()
            found.append([values.grad, *(p.grad.clone() for p in module.parameters())])
            module.zero_grad()
        for got, expected in zip(*found, strict=True):
            torch.testing.assert_close(got, expected)


def test_the_docs_list_every_row() -> None:
    """docs/models.md has a row for every module of the matrix, and says how it compiles."""
    check_docs_rows(MATRIX)


# --- F.scaled_dot_product_attention in torch's one-head layout (B, L*, E) ----------------------


@pytest.mark.parametrize("kind", ["none", "bool", "float"])
def test_sdpa_cross_attention_with_a_pair_mask(kind: str) -> None:
    qs = batch([3, 1, 4], 4, seed=7)
    ks = batch([2, 5, 1], 4, seed=8)
    vs = batch([2, 5, 1], 4, seed=9)
    q, k, v = (ragged.array(t).requires_grad_() for t in (qs, ks, vs))
    rows_q = ragged.array([torch.arange(n, dtype=torch.float64) for n in (3, 1, 4)])
    rows_k = ragged.array([torch.arange(n, dtype=torch.float64) for n in (2, 5, 1)])
    scores = ragged.outer(rows_q, rows_k)  # (B, Lq*, Lk*): i + j
    transforms = {
        "none": None,
        # Query 1 of the last segment (one key) sees none: zeros, as torch gives.
        "bool": lambda t: t % 3 != 1,
        "float": torch.sin,
    }
    transform = transforms[kind]
    mask = None if transform is None else scores.with_values(transform(scores.values))
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.7)
    assert got.partition is q.partition
    got.values.pow(2).sum().backward()
    for b in range(3):
        segment = [t[b].detach().clone().requires_grad_() for t in (q, k, v)]
        pairs = torch.arange(len(qs[b]))[:, None] + torch.arange(len(ks[b]))[None]
        one = None if transform is None else transform(pairs.double())[None]
        expected = F.scaled_dot_product_attention(
            *(t[None] for t in segment), attn_mask=one, scale=0.7
        )[0]
        torch.testing.assert_close(got[b], expected)
        expected.pow(2).sum().backward()
        for array, part in zip((q, k, v), segment, strict=True):
            torch.testing.assert_close(array.with_values(array.values.grad)[b], part.grad)


def test_sdpa_refuses_a_dense_mask() -> None:
    x = ragged.array(batch([2, 3], 4))
    with pytest.raises(TypeError, match=r"`attn_mask` must be a RaggedArray pair map"):
        F.scaled_dot_product_attention(x, x, x, attn_mask=torch.ones(3, 3, dtype=torch.bool))


def test_sdpa_with_a_pair_mask_compiles_to_one_graph() -> None:
    def f(x: ragged.RaggedArray) -> Any:
        rows = x[..., 0]
        pairs = ragged.outer(rows, rows)  # x_i * x_j: every query keeps itself (x_i^2 >= 0)
        mask = pairs.with_values(pairs.values > -0.5)
        return F.scaled_dot_product_attention(x, x, x, attn_mask=mask)

    batches = [
        (ragged.array(batch(lengths, 4, seed=i)).float(),)
        for i, lengths in enumerate(COMPILE_LENGTHS)
    ]
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(f, batches, backend="aot_eager", max_graphs=1)
    assert report.graphs == 1


@pytest.mark.parametrize(
    ("heads", "kv_heads", "causal"), [(2, 2, True), (4, 2, False), (4, 1, True)]
)
def test_sdpa_in_the_head_first_layout(heads: int, kv_heads: int, causal: bool) -> None:
    """``(B, H, L*, Dh)`` from ``transpose(1, 2)`` of ``(B, L*, H, Dh)``, grouped-query heads."""
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    stored = {
        name: [torch.randn(n, h, 4, dtype=torch.float64, generator=generator) for n in LENGTHS]
        for name, h in (("q", heads), ("k", kv_heads), ("v", kv_heads))
    }
    q, k, v = (ragged.array(stored[n]).transpose(1, 2) for n in ("q", "k", "v"))
    gqa = heads != kv_heads
    got = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa, scale=0.3)
    assert got.shape[1] == heads and got.order == q.order
    values = got.transpose(1, 2)
    for b in range(len(LENGTHS)):
        one = [stored[n][b].transpose(0, 1)[None] for n in ("q", "k", "v")]
        expected = F.scaled_dot_product_attention(
            *one, is_causal=causal, enable_gqa=gqa, scale=0.3
        )[0]
        torch.testing.assert_close(values[b], expected.transpose(0, 1))
    if gqa:
        with pytest.raises(ValueError, match=r"unless enable_gqa=True"):
            F.scaled_dot_product_attention(q, k, v)
