"""torch's own attention modules run unmodified on RaggedArrays: ``nn.MultiheadAttention``,
``nn.TransformerEncoderLayer``, ``nn.TransformerEncoder`` and ``nn.TransformerDecoderLayer``
call ``F.multi_head_attention_forward``, which runs ``ragged.attention`` on the sequence-first
view ``(L*, B, E)`` (``x.transpose(1, 0)``: metadata only).

Each row is compared with the module on every segment as a ``(1, L, C)`` tensor (float64,
outputs and parameter gradients) and compiled once over three batches (tests/models_harness.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
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
    grads,
    outputs,
)
from tests.optable import all_ops

MEMORY_LENGTHS = [2, 4, 1, 6]


class SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` called as ``attn(x, x, x)`` (torch's defaults: the weights
    are computed too); ``batch_first=False`` takes and returns the sequence-first view."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.attn = nn.MultiheadAttention(8, 2, batch_first=batch_first)

    def forward(self, x: Any) -> Any:
        if self.batch_first:
            return self.attn(x, x, x)[0]
        x = x.transpose(0, 1)
        return self.attn(x, x, x)[0].transpose(0, 1)


def encoder_layer(norm_first: bool, batch_first: bool = True) -> nn.Module:
    return nn.TransformerEncoderLayer(
        8, 2, 16, dropout=0.0, batch_first=batch_first, norm_first=norm_first
    )


class SequenceFirst(nn.Module):
    """``module`` (built with ``batch_first=False``) on the sequence-first view."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Any) -> Any:
        return self.module(x.transpose(0, 1)).transpose(0, 1)


# name -> (builder, whether one compiled graph covers three batches); docs/models.md's rows.
MATRIX: dict[str, tuple[Callable[[], nn.Module], bool]] = {
    "nn.MultiheadAttention(batch_first=True)": (lambda: SelfAttention(True), True),
    "nn.MultiheadAttention(batch_first=False)": (lambda: SelfAttention(False), True),
    "nn.TransformerEncoderLayer": (lambda: encoder_layer(False), True),
    "nn.TransformerEncoderLayer(norm_first=True)": (lambda: encoder_layer(True), True),
    "nn.TransformerEncoderLayer(batch_first=False)": (
        lambda: SequenceFirst(encoder_layer(False, batch_first=False)),
        True,
    ),
    "nn.TransformerEncoder(2 layers)": (
        lambda: nn.TransformerEncoder(encoder_layer(False), 2),
        True,
    ),
    "nn.TransformerDecoderLayer": (
        lambda: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
        True,
    ),
}
DECODERS = {"nn.TransformerDecoderLayer"}


def decode(causal: bool) -> Callable[[nn.Module, Any, Any], Any]:
    return lambda m, tgt, memory: m(tgt, memory, tgt_is_causal=causal)


def check_two_inputs(
    module: nn.Module,
    tgt: list[torch.Tensor],
    memory: list[torch.Tensor],
    call: Callable[[nn.Module, Any, Any], Any],
) -> None:
    """``call(module, tgt, memory)`` on two RaggedArrays of one batch equals the call on every
    segment ``b`` of both (as ``(1, L, C)`` tensors), with parameter gradients."""
    got = call(module, ragged.array(tgt), ragged.array(memory))
    assert isinstance(got, ragged.RaggedArray)
    got.values.pow(2).sum().backward()
    batched = grads(module)
    loss = torch.zeros((), dtype=torch.float64)
    for b, (t, m) in enumerate(zip(tgt, memory, strict=True)):
        expected = call(module, t[None], m[None])[0]
        torch.testing.assert_close(got[b], expected)
        loss = loss + expected.pow(2).sum()
    loss.backward()
    reference = grads(module)
    assert batched.keys() == reference.keys() and batched
    for name, grad in batched.items():
        torch.testing.assert_close(grad, reference[name], msg=name)


@pytest.mark.parametrize("name", list(MATRIX))
def test_matrix_rows_match_each_sequence(name: str) -> None:
    torch.manual_seed(0)
    module = MATRIX[name][0]().double()
    if name in DECODERS:
        tgt, memory = batch(LENGTHS, 8, seed=5), batch(MEMORY_LENGTHS, 8, seed=6)
        check_two_inputs(module, tgt, memory, decode(False))
    else:
        check_per_sequence(module, batch(LENGTHS, 8, seed=5))


@pytest.mark.parametrize("name", [n for n, (_, one) in MATRIX.items() if one])
def test_matrix_rows_compile_to_one_graph(name: str) -> None:
    torch.manual_seed(0)
    module = MATRIX[name][0]()
    if name not in DECODERS:
        check_one_graph(module)
        return
    batches = [
        (
            ragged.array(batch(n, 8, seed=i)).float(),
            ragged.array(batch(n[::-1], 8, seed=i + 10)).float(),
        )
        for i, n in enumerate(COMPILE_LENGTHS)
    ]
    with ragged.dynamic_shapes(), torch._dynamo.config.patch(specialize_float=True):
        report = ragged.testing.check_compile(
            module, batches, backend="aot_eager", max_graphs=1, atol=1e-5, rtol=1e-5
        )
    assert report.graphs == 1


def test_the_docs_list_every_row() -> None:
    """docs/models.md has a row for every module of the matrix, and says how it compiles."""
    check_docs_rows(MATRIX)


def test_the_causal_decoder_layer_matches_each_sequence() -> None:
    """``tgt_is_causal=True`` with ``tgt_mask=None``: causal within each target segment."""
    torch.manual_seed(1)
    module = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double()
    tgt, memory = batch(LENGTHS, 8, seed=7), batch(MEMORY_LENGTHS, 8, seed=8)

    def call(m: nn.Module, t: Any, mem: Any) -> Any:
        if isinstance(t, ragged.RaggedArray):
            return m(t, mem, tgt_is_causal=True)
        mask = nn.Transformer.generate_square_subsequent_mask(t.shape[1], dtype=t.dtype)
        return m(t, mem, tgt_mask=mask, tgt_is_causal=True)

    check_two_inputs(module, tgt, memory, call)


# --- the sequence-first view and F.multi_head_attention_forward ---------------------------------


def test_the_sequence_first_view_is_metadata() -> None:
    x = ragged.array(batch(LENGTHS, 4))
    y = x.transpose(1, 0)
    assert y.values is x.values and y.partition is x.partition
    B, T, C = x.shape
    assert tuple(y.shape) == (T, B, C) and y.size(1) == B and y.dim() == 3
    for back in (y.transpose(1, 0), y.transpose(0, 1), y.permute(1, 0, 2), y.movedim(0, 1)):
        assert back.order is None and back.values is x.values
    named = x.rename("batch", "time", "channel")
    assert named.transpose(0, 1).axes == ("time", "batch", "channel")
    assert named.transpose(0, 1).transpose(0, 1).axes == named.axes
    # Pointwise ops, F.linear and F.layer_norm keep the view; the rows are those of x.
    weight = torch.randn(3, 4, dtype=torch.float64)
    bias = torch.randn(4, dtype=torch.float64)  # lines up with the last axis in both orders
    for f in (
        torch.relu,
        lambda t: t * 2 + 1,
        lambda t: t + bias,
        lambda t: F_linear(t, weight),
        layer_norm,
    ):
        got = f(y)
        assert got.order == y.order
        ragged.testing.assert_close(got.transpose(0, 1), f(x))


def F_linear(t: Any, weight: torch.Tensor) -> Any:
    return torch.nn.functional.linear(t, weight)


def layer_norm(t: Any) -> Any:
    return torch.nn.functional.layer_norm(t, (4,))


def test_the_sequence_first_view_refuses_other_ops() -> None:
    x = ragged.array(batch([2, 3], 4))
    y = x.transpose(0, 1)
    with pytest.raises(TypeError, match=r"^torch\.sum: `input` is a sequence-first view"):
        torch.sum(y, 0)
    with pytest.raises(TypeError, match=r"^RaggedArray\.view: `input` is a sequence-first view"):
        y.view(2, 2)
    with pytest.raises(TypeError, match=r"^ragged\.softmax: `x` is a sequence-first view"):
        ragged.softmax(y, 0)
    with pytest.raises(TypeError, match=r"only transposes back"):
        y.transpose(1, 2)
    with pytest.raises(TypeError, match=r"^RaggedArray\.unbind: a sequence-first view"):
        y.unbind()
    with pytest.raises(TypeError, match=r"is a sequence-first view"):
        y + torch.ones(2, 4, dtype=torch.float64)  # a dense (B, E) would line up with the batch
    pair = ragged.outer(x[..., 0], x[..., 0])
    with pytest.raises(TypeError, match=r"moves the batch axis"):
        pair.transpose(0, 1)  # two ragged axes: no sequence-first view


@pytest.mark.parametrize("average", [True, False])
def test_mha_weights_and_cross_attention_match_each_sequence(average: bool) -> None:
    """Cross-attention with separate key/value widths (``kdim``, ``vdim``: separate
    projections), and the weights as a pair map (torch's defaults return them)."""
    torch.manual_seed(2)
    module = nn.MultiheadAttention(8, 2, batch_first=True, kdim=6, vdim=5).double()
    qs, ks, vs = batch(LENGTHS, 8, 1), batch(MEMORY_LENGTHS, 6, 2), batch(MEMORY_LENGTHS, 5, 3)
    q, k, v = (ragged.array(t) for t in (qs, ks, vs))
    out, weights = module(q, k, v, average_attn_weights=average)
    assert out.partition is q.partition
    for b in range(len(LENGTHS)):
        e_out, e_weights = module(
            qs[b][None], ks[b][None], vs[b][None], average_attn_weights=average
        )
        torch.testing.assert_close(out[b], e_out[0])
        if average:  # (B, Lq*, Lk*)
            got = torch.tensor(weights[b].to_list(), dtype=torch.float64)
        else:  # (B, H, Lq*, Lk*): the heads before the ragged axes (metadata)
            assert weights.shape[1] == 2
            stored = weights.permute(0, 2, 3, 1)[b].to_list()
            got = torch.tensor(stored, dtype=torch.float64).permute(2, 0, 1)
        torch.testing.assert_close(got, e_weights[0])


@pytest.mark.parametrize("kind", ["bool", "float", "causal"])
def test_mha_pair_masks_and_causal(kind: str) -> None:
    """F.multi_head_attention_forward called directly (nn.MultiheadAttention reads a mask's
    dtype with F._none_or_dtype, which takes Tensors only): a boolean pair mask (True: masked
    out, as torch), an additive one, and ``is_causal`` without a mask."""
    torch.manual_seed(3)
    module = nn.MultiheadAttention(8, 2).double()
    segments = batch(LENGTHS, 8, seed=4)
    x = ragged.array(segments).transpose(0, 1)
    positions = ragged.array([torch.arange(n) for n in LENGTHS])
    pairs = ragged.outer(positions, positions, torch.sub)  # i - j
    masks = {
        "bool": (pairs.with_values(pairs.values % 3 == 2), lambda d: d % 3 == 2),
        "float": (pairs.with_values(torch.sin(pairs.values.double())), torch.sin),
        "causal": (None, lambda d: d < 0),  # torch needs the mask with is_causal
    }
    mask, dense = masks[kind]
    args = (8, 2, module.in_proj_weight, module.in_proj_bias, None, None, False, 0.0)
    out_args = (module.out_proj.weight, module.out_proj.bias)
    out, weights = torch.nn.functional.multi_head_attention_forward(
        x, x, x, *args, *out_args, attn_mask=mask, is_causal=kind == "causal"
    )
    assert out.order == x.order
    for b, s in enumerate(segments):
        i = torch.arange(s.shape[0])
        one = dense((i[:, None] - i[None]).double() if kind == "float" else i[:, None] - i[None])
        e_out, e_w = torch.nn.functional.multi_head_attention_forward(
            s[:, None], s[:, None], s[:, None], *args, *out_args, attn_mask=one
        )
        torch.testing.assert_close(out.transpose(0, 1)[b], e_out[:, 0])
        torch.testing.assert_close(torch.tensor(weights[b].to_list(), dtype=e_w.dtype), e_w[0])


def test_mha_refusals_name_the_argument() -> None:
    x = ragged.array(batch([2, 3], 8))
    with pytest.raises(TypeError, match=r"`key_padding_mask` must be None on RaggedArrays"):
        nn.MultiheadAttention(8, 2, batch_first=True).double()(
            x, x, x, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool)
        )
    with pytest.raises(TypeError, match=r"`bias_k` is not supported on RaggedArrays"):
        nn.MultiheadAttention(8, 2, batch_first=True, add_bias_kv=True).double()(x, x, x)
    with pytest.raises(TypeError, match=r"`add_zero_attn` is not supported on RaggedArrays"):
        nn.MultiheadAttention(8, 2, batch_first=True, add_zero_attn=True).double()(x, x, x)
    with pytest.raises(TypeError, match=r"`attn_mask` must be a RaggedArray pair map"):
        nn.MultiheadAttention(8, 2, batch_first=True).double()(
            x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.float64)
        )
    with pytest.raises(ValueError, match=r"pass need_weights=False or call module.eval\(\)"):
        nn.MultiheadAttention(8, 2, batch_first=True, dropout=0.5).double()(x, x, x)
    with pytest.raises(TypeError, match=r"`query` must be a sequence-first RaggedArray"):
        nn.MultiheadAttention(8, 2).double()(x, x, x)  # batch_first=False: (L*, B, E) expected


def test_empty_segments_and_evaluation_mode() -> None:
    """Empty segments give no rows (and an empty weight block); in evaluation mode without
    gradients torch's fast paths are skipped (a RaggedArray has ``__torch_function__``)."""
    torch.manual_seed(4)
    segments = batch([3, 0, 2, 0], 8, seed=9)
    x = ragged.array(segments)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2).double().eval()
    with torch.no_grad():
        out = encoder(x)
        assert out.partition is x.partition
        for b, s in enumerate(segments):
            if len(s):
                torch.testing.assert_close(out[b], encoder(s[None])[0])
    attn = nn.MultiheadAttention(8, 2, batch_first=True).double()
    out, weights = attn(x, x, x)
    assert out.partition is x.partition
    assert weights.values.shape[0] == 3 * 3 + 2 * 2


def test_mha_dropout_in_training() -> None:
    """Dropout on the attention weights in training mode (``need_weights=False``): with
    ``p=1`` every weight is dropped and the output is the out-projection's bias; with
    ``p=0.5`` the output is not the evaluation-mode one, and the same seed draws the same
    mask; in evaluation mode no dropout."""
    torch.manual_seed(5)
    attn = nn.MultiheadAttention(8, 2, dropout=1.0, batch_first=True).double()
    torch.nn.init.normal_(attn.out_proj.bias)
    x = ragged.array(batch(LENGTHS, 8, seed=10))
    out, weights = attn(x, x, x, need_weights=False)
    assert weights is None
    torch.testing.assert_close(out.values, attn.out_proj.bias.expand_as(out.values))
    attn.dropout = 0.5
    torch.manual_seed(6)
    dropped = attn(x, x, x, need_weights=False)[0]
    torch.manual_seed(6)
    ragged.testing.assert_close(attn(x, x, x, need_weights=False)[0], dropped)
    attn.eval()
    kept = attn(x, x, x)[0]
    ragged.testing.assert_close(kept, attn(x, x, x, need_weights=False)[0])
    assert not torch.allclose(kept.values, dropped.values)


def test_sequence_first_encoder_and_decoder() -> None:
    """``batch_first=False`` (torch's default) on the sequence-first view: the encoder reads
    its sequence length with ``src.size(0)``, a ragged size."""
    torch.manual_seed(7)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)  # torch warns else
    check_per_sequence(SequenceFirst(encoder).double(), batch(LENGTHS, 8))
    decoder = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0).double()

    def call(m: nn.Module, t: Any, mem: Any) -> Any:
        return m(t.transpose(0, 1), mem.transpose(0, 1)).transpose(0, 1)

    check_two_inputs(decoder, batch(LENGTHS, 8, seed=1), batch(MEMORY_LENGTHS, 8, seed=2), call)


# --- every op of the op table on the sequence-first view: answers or refuses -------------------

OPS = [info for info in all_ops() if info.lift]


def _sequence_first(args: tuple[Any, ...]) -> tuple[tuple[Any, ...], bool]:
    """The sample's one-level arrays in the storage order as sequence-first views; whether any
    was."""
    out = [
        a.transpose(0, 1)
        if isinstance(a, ragged.RaggedArray) and a.ragged_ndim == 1 and a.order is None
        else a
        for a in args
    ]
    return tuple(out), any(o is not a for o, a in zip(out, args, strict=True))


def _back(result: Any) -> Any:
    if isinstance(result, ragged.RaggedArray) and result.order is not None:
        return result.transpose(0, 1)
    if isinstance(result, tuple):
        return tuple(_back(r) for r in result)
    return result


@pytest.mark.parametrize("info", OPS, ids=[f"{i.name}{i.variant}" for i in OPS])
def test_op_on_the_sequence_first_view_answers_or_refuses(info: Any) -> None:
    """No op reads the sequence-first view as if it were batch-first: it refuses it with the
    sequence-first error, or answers as on the storage order (transposed alike)."""
    samples = info.samples([2, 0, 3], torch.Generator().manual_seed(0), torch.float64, "contiguous")
    tried = 0
    for sample in samples:
        args, moved = _sequence_first(sample.call_args())
        if not moved:
            continue
        tried += 1
        try:
            got = info.op(*args, **sample.kwargs)
        except TypeError as error:
            if "is a sequence-first view" in str(error):
                continue
            raise
        want = info.op(*sample.call_args(), **sample.kwargs)
        for g, w in zip(outputs(_back(got)), outputs(want), strict=True):
            if isinstance(w, ragged.RaggedArray):
                ragged.testing.assert_close(g, w, equal_nan=True)
            else:
                torch.testing.assert_close(g, w, equal_nan=True)
    if tried == 0:
        pytest.skip("no sample has a one-level array")


def test_torch_func_ensemble_and_grad() -> None:
    """``torch.func``: ``vmap`` over an ensemble of encoder layers (stacked parameters) equals
    each layer's run, and ``grad`` of a loss equals autograd's parameter gradients."""
    torch.manual_seed(8)
    x = ragged.array(batch(LENGTHS, 8, seed=11))
    layers = [
        nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double()
        for _ in range(3)
    ]
    params, buffers = torch.func.stack_module_state(layers)
    base = copy.deepcopy(layers[0]).to("meta")

    def run(p: Any, b: Any, x: Any) -> Any:
        return torch.func.functional_call(base, (p, b), (x,))

    out = torch.func.vmap(run, in_dims=(0, 0, None))(params, buffers, x)
    for i, layer in enumerate(layers):
        torch.testing.assert_close(out.values[i], layer(x).values)

    def loss(p: Any) -> Any:
        return torch.func.functional_call(layers[0], p, (x,)).values.pow(2).sum()

    got = torch.func.grad(loss)(dict(layers[0].named_parameters()))
    layers[0](x).values.pow(2).sum().backward()
    expected = grads(layers[0])
    assert got.keys() == expected.keys()
    for name, g in got.items():
        torch.testing.assert_close(g, expected[name], msg=name)
