"""ragged.nn: the modules match their torch.nn counterparts on padded batches, load their
weights, and work under torch.func and torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ragged
import ragged.testing
from ragged.nn import (
    RaggedLayerNorm,
    RaggedMultiheadAttention,
    RaggedTransformerEncoder,
    RaggedTransformerEncoderLayer,
)
from tests.optable.attention import pair_bias

LENGTHS = [5, 0, 1, 12, 3, 70]


def rows(lengths=LENGTHS, width=16, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return ragged.from_lengths(
        torch.randn(sum(lengths), width, generator=gen, dtype=dtype), lengths
    )


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch_with_copied_weights(norm_first, activation):
    torch.manual_seed(0)
    theirs = torch.nn.TransformerEncoderLayer(
        16, 4, 32, dropout=0.1, activation=activation, norm_first=norm_first, batch_first=True
    )
    theirs = theirs.double().eval()
    mine = RaggedTransformerEncoderLayer(
        16, 4, 32, dropout=0.1, activation=activation, norm_first=norm_first
    )
    mine = mine.double().eval()
    mine.load_state_dict(theirs.state_dict())
    x = rows()
    with torch.no_grad():
        expected = theirs(x.to_padded(), src_key_padding_mask=~x.to_mask())[x.to_mask()]
    out = mine(x)
    assert out.partition is x.partition
    torch.testing.assert_close(out.values, expected)
    assert set(mine.state_dict()) == set(theirs.state_dict())


def test_same_seed_same_initialisation_as_torch():
    torch.manual_seed(3)
    theirs = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    torch.manual_seed(3)
    mine = RaggedTransformerEncoderLayer(16, 4, 32)
    for name, value in theirs.state_dict().items():
        torch.testing.assert_close(mine.state_dict()[name], value, msg=name)


def test_encoder_stack_matches_torch():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    theirs = torch.nn.TransformerEncoder(
        layer, 3, norm=torch.nn.LayerNorm(16), enable_nested_tensor=False
    )
    theirs = theirs.double().eval()
    mine = RaggedTransformerEncoder(
        RaggedTransformerEncoderLayer(16, 2, 32, dropout=0.0), 3, norm=RaggedLayerNorm(16)
    )
    mine = mine.double().eval()
    mine.load_state_dict(theirs.state_dict())
    x = rows()
    with torch.no_grad():
        expected = theirs(x.to_padded(), src_key_padding_mask=~x.to_mask())[x.to_mask()]
    torch.testing.assert_close(mine(x).values, expected)


def test_multihead_attention_matches_torch():
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True).double()
    mine = RaggedMultiheadAttention(16, 4).double()
    mine.load_state_dict(theirs.state_dict())
    x = rows()
    padded, mask = x.to_padded(), x.to_mask()
    expected, _ = theirs(padded, padded, padded, key_padding_mask=~mask, need_weights=False)
    torch.testing.assert_close(mine(x).values, expected[mask])


def test_multihead_attention_causal_and_pair_bias():
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True).double()
    mine = RaggedMultiheadAttention(16, 4).double()
    mine.load_state_dict(theirs.state_dict())
    x = rows([4, 0, 6])
    bias = pair_bias(x, x, torch.randn(52, 4, dtype=torch.float64))
    out = mine(x, bias, causal=True)
    for b, segment in enumerate(x.unbind()):
        n = segment.shape[0]
        if not n:
            continue
        mask = bias[b].values.view(n, n, 4).permute(2, 0, 1)
        mask = mask.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        expected, _ = theirs(segment, segment, segment, attn_mask=mask, need_weights=False)
        torch.testing.assert_close(out[b], expected)


def test_layer_norm_on_ragged_and_dense():
    norm = RaggedLayerNorm(16).double()
    x = rows()
    torch.testing.assert_close(
        norm(x).values, F.layer_norm(x.values, (16,), norm.weight, norm.bias)
    )
    torch.testing.assert_close(norm(x.values), norm(x).values)
    with pytest.raises(TypeError, match="must be a RaggedArray or a Tensor"):
        norm([1.0])


def test_functional_call_and_grad_of_parameters():
    torch.manual_seed(0)
    layer = RaggedTransformerEncoderLayer(16, 4, 32, dropout=0.0).double()
    x = rows()
    params = {k: v.detach() for k, v in layer.named_parameters()}
    out = torch.func.functional_call(layer, params, (x,))
    torch.testing.assert_close(out.values, layer(x).values)

    def loss(p):
        return (torch.func.functional_call(layer, p, (x,)).values ** 2).sum()

    grads = torch.func.grad(loss)(params)
    layer.zero_grad()
    loss(dict(layer.named_parameters())).backward()
    for name, param in layer.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, msg=name)


def test_training_step_with_dropout_and_gradients_to_inputs():
    torch.manual_seed(0)
    encoder = RaggedTransformerEncoder(RaggedTransformerEncoderLayer(16, 4, 32, dropout=0.2), 2)
    x = rows(dtype=torch.float32)
    x = x.with_values(x.values.requires_grad_())
    out = encoder.train()(x)
    out.values.sum().backward()
    assert torch.isfinite(x.values.grad).all()
    assert all(p.grad is not None for p in encoder.parameters())


def test_errors():
    with pytest.raises(ValueError, match="must be positive and divide embed_dim = 10"):
        RaggedMultiheadAttention(10, 4)
    mha = RaggedMultiheadAttention(16, 4)
    with pytest.raises(TypeError, match="must be a RaggedArray"):
        mha(torch.zeros(3, 16))
    with pytest.raises(ValueError, match=r"must have shape \(B, L\*, 16\)"):
        mha(rows(width=8, dtype=torch.float32))
    with pytest.raises(ValueError, match="must be one of"):
        RaggedTransformerEncoderLayer(16, 4, activation="swish")
    with pytest.raises(ValueError, match="must be a positive int"):
        RaggedTransformerEncoder(RaggedTransformerEncoderLayer(16, 4), 0)


def test_encoder_layer_compiles_once():
    torch.manual_seed(0)
    layer = RaggedTransformerEncoderLayer(16, 4, 32, dropout=0.0)
    shapes = [[3, 0, 5, 2], [1], [4, 4], [0, 2, 7, 1, 3, 6], [2, 9]]
    batches = [(rows(n, seed=i, dtype=torch.float32),) for i, n in enumerate(shapes)]
    # With dynamic=True Dynamo first traces module float attributes (dropout p, LayerNorm eps)
    # as symbols, then restarts its analysis once to specialise them (check_compile would count
    # that restart as a second graph; it is not a recompilation). specialize_float skips it.
    with ragged.dynamic_shapes(), torch._dynamo.config.patch(specialize_float=True):
        report = ragged.testing.check_compile(layer, batches, grad=True, atol=1e-4, rtol=1e-4)
    assert report.graphs == 1


def _padded_attention(module, x, *, causal, window, slopes, documents=None):
    """``module``'s self-attention on the padded batch with SDPA, ``enable_gqa`` and the dense
    mask of its variants (the reference)."""
    heads, kv_heads, width = module.num_heads, module.num_kv_heads, module.head_dim
    padded, real = x.to_padded(), x.to_mask()
    b, n, _ = padded.shape
    projected = F.linear(padded, module.in_proj_weight, module.in_proj_bias)
    q, k, v = projected.split((heads * width, kv_heads * width, kv_heads * width), dim=-1)
    q, k, v = (t.view(b, n, -1, width).transpose(1, 2) for t in (q, k, v))
    i, j = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
    keep = real.view(b, 1, 1, n) & ((j <= i) if causal else True)
    if window is not None:
        keep = keep & (j >= i - window[0]) & (j <= i + window[1])
    if documents is not None:
        ids = documents.to_padded(fill_value=-1)
        keep = keep & (ids[:, None, :, None] == ids[:, None, None, :])
    keep = keep | ~real.view(b, 1, n, 1)  # padded query rows: anything, dropped below
    add = torch.zeros(b, heads, n, n, dtype=padded.dtype)
    if slopes is not None:
        add = add - slopes.view(1, -1, 1, 1) * (j - i).abs()
    mask = add.masked_fill(~keep, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    out = module.out_proj(out.transpose(1, 2).reshape(b, n, -1))
    return out[real]


@pytest.mark.parametrize(
    ("kv_heads", "causal", "window", "alibi"),
    [(2, True, (3, 0), True), (1, False, (2, 1), False), (4, False, None, True)],
)
def test_multihead_attention_variants_match_padded_sdpa(kv_heads, causal, window, alibi):
    torch.manual_seed(0)
    mine = RaggedMultiheadAttention(
        16, 4, num_kv_heads=kv_heads, causal=causal, window=window, alibi=alibi
    ).double()
    assert mine.in_proj_weight.shape == ((4 + 2 * kv_heads) * 4, 16)
    slopes = mine.alibi_slopes
    if alibi:
        torch.testing.assert_close(slopes, ragged.nn.alibi_slopes(4).double())
        assert "alibi_slopes" in mine.state_dict()
    else:
        assert slopes is None and "alibi_slopes" not in mine.state_dict()
    x = rows([4, 0, 9, 1])
    expected = _padded_attention(mine, x, causal=causal, window=window, slopes=slopes)
    torch.testing.assert_close(mine(x).values, expected)
    ids = ragged.RaggedArray(torch.arange(x.values.shape[0]) // 3, x.partition)
    expected = _padded_attention(
        mine, x, causal=causal, window=window, slopes=slopes, documents=ids
    )
    torch.testing.assert_close(mine(x, document_ids=ids).values, expected)


def test_encoder_layer_takes_the_attention_variants():
    torch.manual_seed(0)
    layer = RaggedTransformerEncoderLayer(
        16, 4, 32, dropout=0.0, num_kv_heads=2, causal=True, window=(2, 0), alibi=True
    ).double()
    attn = layer.self_attn
    assert (attn.num_kv_heads, attn.causal, attn.window) == (2, True, (2, 0))
    x = rows([3, 0, 6])
    expected = layer.norm1(x + attn(x))  # post-norm: the attention block first
    hidden = layer.norm1(x + layer.self_attn(x, causal=True))
    torch.testing.assert_close(hidden.values, expected.values)
    encoder = RaggedTransformerEncoder(layer, 2)
    out = encoder(x, prefix=torch.tensor([1, 0, 2]))
    assert out.partition is x.partition
    (grad,) = torch.autograd.grad(out.values.sum(), attn.in_proj_weight, allow_unused=True)
    assert grad is None  # the encoder holds copies: the original layer is not used
    with pytest.raises(ValueError, match="must be positive and divide num_heads = 4"):
        RaggedMultiheadAttention(16, 4, num_kv_heads=3)


def test_alibi_slopes_follow_the_paper():
    torch.testing.assert_close(ragged.nn.alibi_slopes(8), 2.0 ** (-torch.arange(1, 9.0)))
    # Not a power of two: the 8 slopes of H=8, then every other of H=16.
    twelve = ragged.nn.alibi_slopes(12)
    torch.testing.assert_close(twelve[:8], ragged.nn.alibi_slopes(8))
    torch.testing.assert_close(twelve[8:], ragged.nn.alibi_slopes(16)[0::2][:4])
    with pytest.raises(ValueError, match="must be a positive int"):
        ragged.nn.alibi_slopes(0)
