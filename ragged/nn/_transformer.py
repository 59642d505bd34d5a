"""``RaggedTransformerEncoderLayer`` and ``RaggedTransformerEncoder``: ``nn.TransformerEncoder``
on RaggedArrays, without padding or masks."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._array import RaggedArray
from .._errors import value_error
from .._registry import public
from ..func._map import map as ragged_map
from ._attention import RaggedMultiheadAttention
from ._norm import RaggedLayerNorm

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


@public("nn", namespace="ragged.nn")
class RaggedTransformerEncoderLayer(torch.nn.Module):
    """``torch.nn.TransformerEncoderLayer`` on RaggedArrays ``(B, L*, d_model)``.

    Self-attention within each segment, then the feed-forward block on the packed rows, with
    residual connections and layer norms (post-norm, or pre-norm with ``norm_first``). The
    submodules and parameters have the names, shapes and initialisation of
    ``nn.TransformerEncoderLayer`` (``self_attn.in_proj_weight``, ``linear1``, ``norm1``, ...):
    ``load_state_dict`` takes a torch layer's state dict, and the two compute the same function
    (a torch layer needs padding and a key padding mask for it).

    Args:
        d_model: the row size.
        nhead: attention heads.
        dim_feedforward: hidden size of the feed-forward block.
        dropout: dropout probability (attention weights, feed-forward, residual branches).
        activation: ``"relu"``, ``"gelu"`` or a callable.
        layer_norm_eps: epsilon of the layer norms.
        norm_first: pre-norm (``x + sa(norm1(x))``) instead of post-norm.
        bias: biases in the linear layers and layer norms.
        num_kv_heads: key/value heads for grouped-query attention (``None``: ``nhead``).
        causal: causal attention within each segment.
        window: a sliding attention window; see
            [`RaggedMultiheadAttention`][ragged.nn.RaggedMultiheadAttention].
        alibi: ALiBi position biases.

    >>> import ragged, torch
    >>> torch.manual_seed(0) and None
    >>> mine = ragged.nn.RaggedTransformerEncoderLayer(8, 2, dim_feedforward=16).eval()
    >>> theirs = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
    >>> _ = mine.load_state_dict(theirs.eval().state_dict())
    >>> x = ragged.from_lengths(torch.randn(5, 8), [2, 3])
    >>> padded = theirs(x.to_padded(), src_key_padding_mask=~x.to_mask())
    >>> torch.allclose(mine(x).to_padded(), padded.masked_fill(~x.to_mask()[..., None], 0), atol=1e-5)
    True
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Tensor], Tensor] = F.relu,
        layer_norm_eps: float = 1e-5,
        norm_first: bool = False,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        num_kv_heads: int | None = None,
        causal: bool = False,
        window: tuple[int | None, int | None] | None = None,
        alibi: bool | Tensor = False,
    ) -> None:
        super().__init__()
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.self_attn = RaggedMultiheadAttention(
            d_model,
            nhead,
            num_kv_heads=num_kv_heads,
            causal=causal,
            window=window,
            alibi=alibi,
            bias=bias,
            dropout=dropout,
            **factory,
        )
        self.linear1 = torch.nn.Linear(d_model, dim_feedforward, bias=bias, **factory)
        self.dropout = torch.nn.Dropout(dropout)
        self.linear2 = torch.nn.Linear(dim_feedforward, d_model, bias=bias, **factory)
        self.norm_first = norm_first
        self.norm1 = RaggedLayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm2 = RaggedLayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.dropout1 = torch.nn.Dropout(dropout)
        self.dropout2 = torch.nn.Dropout(dropout)
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise value_error(
                    "RaggedTransformerEncoderLayer",
                    "activation",
                    f"must be one of {sorted(_ACTIVATIONS)} or a callable",
                    repr(activation),
                )
            activation = _ACTIVATIONS[activation]
        self.activation = activation

    def forward(
        self,
        src: RaggedArray,
        pair_bias: RaggedArray | None = None,
        *,
        causal: bool | None = None,
        document_ids: RaggedArray | None = None,
        prefix: int | Tensor | None = None,
    ) -> RaggedArray:
        """Encode ``src`` ``(B, L*, d_model)``; ``pair_bias`` ``(B, L*, L*, nhead)`` is added to
        the attention scores (see [`ragged.attention`][ragged.attention]); ``causal``
        (default: the layer's), ``document_ids`` and ``prefix`` go to the attention."""
        x = src
        masks = {"causal": causal, "document_ids": document_ids, "prefix": prefix}
        if self.norm_first:
            x = x + self._attention_block(self.norm1(x), pair_bias, masks)
            return x + self._feed_forward_block(self.norm2(x))
        x = self.norm1(x + self._attention_block(x, pair_bias, masks))
        return self.norm2(x + self._feed_forward_block(x))

    if TYPE_CHECKING:  # typed calls, the signature of forward (nn.Module.__call__ is Any)
        __call__ = forward

    def _attention_block(
        self, x: RaggedArray, pair_bias: RaggedArray | None, masks: dict[str, Any]
    ) -> RaggedArray:
        return ragged_map(self.dropout1, self.self_attn(x, pair_bias, **masks))

    def _feed_forward_block(self, x: RaggedArray) -> RaggedArray:
        return ragged_map(self._feed_forward, x)

    def _feed_forward(self, values: Tensor) -> Tensor:
        hidden = self.linear1(values)
        if self.activation is F.relu:
            # In place on the fresh hidden rows (the linear's backward does not need them):
            # saves a [rows, dim_feedforward] temporary, the layer's largest.
            hidden = F.relu(hidden, inplace=True)
        else:
            hidden = self.activation(hidden)
        hidden = self.dropout(hidden)
        return self.dropout2(self.linear2(hidden))


@public("nn", namespace="ragged.nn")
class RaggedTransformerEncoder(torch.nn.Module):
    """A stack of ``num_layers`` copies of an encoder layer, like ``nn.TransformerEncoder``.

    Args:
        encoder_layer: the layer to copy (a [`RaggedTransformerEncoderLayer`][ragged.nn.RaggedTransformerEncoderLayer]).
        num_layers: how many copies (independent parameters).
        norm: optional final normalisation (e.g. a [`RaggedLayerNorm`][ragged.nn.RaggedLayerNorm]).

    >>> import ragged, torch
    >>> layer = ragged.nn.RaggedTransformerEncoderLayer(8, 2, dim_feedforward=16)
    >>> encoder = ragged.nn.RaggedTransformerEncoder(layer, num_layers=2)
    >>> encoder(ragged.from_lengths(torch.randn(5, 8), [2, 0, 3])).shape
    RaggedShape(3, [2, 0, 3], 8)
    """

    def __init__(
        self,
        encoder_layer: torch.nn.Module,
        num_layers: int,
        norm: torch.nn.Module | None = None,
    ) -> None:
        super().__init__()
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise value_error(
                "RaggedTransformerEncoder", "num_layers", "must be a positive int", num_layers
            )
        self.layers = torch.nn.ModuleList(copy.deepcopy(encoder_layer) for _ in range(num_layers))
        self.num_layers = num_layers
        self.norm = norm

    def forward(
        self,
        src: RaggedArray,
        pair_bias: RaggedArray | None = None,
        *,
        causal: bool | None = None,
        document_ids: RaggedArray | None = None,
        prefix: int | Tensor | None = None,
    ) -> RaggedArray:
        """Run every layer in turn; ``pair_bias``, ``causal`` (default: each layer's),
        ``document_ids`` and ``prefix`` go to each."""
        x = src
        for layer in self.layers:
            x = layer(x, pair_bias, causal=causal, document_ids=document_ids, prefix=prefix)
        if self.norm is not None:
            x = self.norm(x)
        return x

    if TYPE_CHECKING:  # typed calls, the signature of forward (nn.Module.__call__ is Any)
        __call__ = forward
