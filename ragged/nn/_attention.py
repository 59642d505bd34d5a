"""``RaggedMultiheadAttention``: multi-head self-attention within each segment."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._array import RaggedArray
from .._errors import type_error, typename, value_error
from .._registry import public
from ..func._map import map as ragged_map
from ..ops._attention import attention


@public("nn", namespace="ragged.nn")
class RaggedMultiheadAttention(torch.nn.Module):
    """Multi-head self-attention over RaggedArrays ``(B, L*, E)``: each segment attends to
    itself only.

    The parameters are those of ``torch.nn.MultiheadAttention`` with one embedding size
    (``in_proj_weight [3E, E]``, ``in_proj_bias [3E]``, ``out_proj``), initialised the same way,
    so a state dict loads either way. There is no ``batch_first`` and no masks: the partition
    says which rows belong together. The projections run once on the packed rows
    ([`ragged.map`][ragged.map]); attention is [`ragged.attention`][ragged.attention].

    Args:
        embed_dim: ``E``, the size of each row.
        num_heads: heads; ``E`` must be divisible by it.
        bias: add biases to the input and output projections.
        dropout: dropout probability on the attention weights in training mode.

    >>> import ragged, torch
    >>> mha = ragged.nn.RaggedMultiheadAttention(8, num_heads=2)
    >>> x = ragged.from_lengths(torch.randn(5, 8), [2, 0, 3])
    >>> mha(x).shape
    RaggedShape(3, [2, 0, 3], 8)
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        bias: bool = True,
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        func = "RaggedMultiheadAttention"
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise value_error(
                func,
                "num_heads",
                f"must be positive and divide embed_dim = {embed_dim}",
                num_heads,
            )
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        # Created in nn.MultiheadAttention's order, so one seed gives the same weights.
        self.in_proj_weight = torch.nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))
        if bias:
            self.in_proj_bias = torch.nn.Parameter(torch.empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        torch.nn.init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            torch.nn.init.zeros_(self.in_proj_bias)
            torch.nn.init.zeros_(self.out_proj.bias)

    if TYPE_CHECKING:  # typed calls (nn.Module.__call__ is Any)

        def __call__(
            self, x: RaggedArray, pair_bias: RaggedArray | None = None, *, causal: bool = False
        ) -> RaggedArray: ...

    def forward(
        self, x: RaggedArray, pair_bias: RaggedArray | None = None, *, causal: bool = False
    ) -> RaggedArray:
        """Self-attention of every segment of ``x`` ``(B, L*, E)``.

        Args:
            x: the rows, ``(B, L*, E)``.
            pair_bias: optional additive bias ``(B, L*, L*, num_heads)`` on the scores (see
                [`ragged.attention`][ragged.attention]; e.g. relative positions, or ``-inf`` to mask pairs).
            causal: row ``i`` attends to rows ``j <= i`` of its segment only.

        Returns:
            ``(B, L*, E)`` with the partition object of ``x``.
        """
        func = "RaggedMultiheadAttention.forward"
        if not isinstance(x, RaggedArray):
            raise type_error(func, "x", "must be a RaggedArray (B, L*, E)", typename(x))
        if x.values.dim() != 2 or x.values.shape[1] != self.embed_dim:
            raise value_error(func, "x", f"must have shape (B, L*, {self.embed_dim})", x.shape)
        qkv = ragged_map(_project, x, weight=self.in_proj_weight, bias=self.in_proj_bias)
        rows = qkv.values.view(-1, 3, self.num_heads, self.head_dim)
        q, k, v = (RaggedArray(t, x.partition) for t in rows.unbind(1))
        dropout = self.dropout if self.training and self.dropout > 0 else None
        out = attention(q, k, v, causal=causal, bias=pair_bias, dropout_p=dropout)
        merged = RaggedArray(out.values.reshape(-1, self.embed_dim), x.partition, x.axes)
        return ragged_map(self.out_proj, merged)


def _project(values: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return F.linear(values, weight, bias)
