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
def alibi_slopes(num_heads: int) -> Tensor:
    """The ALiBi slopes of the paper (Press et al., 2022) for ``num_heads`` heads, float32 ``[H]``.

    A geometric sequence starting at ``2 ** (-8 / H)`` with that ratio; for ``H`` not a power of
    two, the slopes of the next lower power of two followed by every other slope of the next
    higher one (the paper's recipe). Pass them as ``ragged.attention(..., alibi=slopes)``.

    >>> import ragged
    >>> ragged.nn.alibi_slopes(4)
    tensor([0.2500, 0.0625, 0.0156, 0.0039])
    >>> ragged.nn.alibi_slopes(6).shape
    torch.Size([6])
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
        raise value_error(alibi_slopes, "num_heads", "must be a positive int", num_heads)

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 1 << (num_heads.bit_length() - 1)  # the largest power of two <= num_heads
    slopes = power_of_two(closest)
    if closest < num_heads:
        slopes += power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


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
        num_heads: query heads; ``E`` must be divisible by it.
        num_kv_heads: key/value heads (grouped-query attention; 1: multi-query); must divide
            ``num_heads``. Default ``num_heads``. With fewer, ``in_proj_weight`` is
            ``[(H + 2 H_kv) E / H, E]`` (queries, then keys, then values).
        causal: each row attends to rows ``j <= i`` of its segment (the default of ``forward``).
        window: ``(left, right)`` sliding-window attention (see
            [`ragged.attention`][ragged.attention]).
        alibi: add ALiBi biases: ``True`` for the paper's slopes
            ([`alibi_slopes`][ragged.nn.alibi_slopes]), or a tensor of ``num_heads`` slopes;
            kept as the buffer ``alibi_slopes`` (not trained).
        bias: add biases to the input and output projections.
        dropout: dropout probability on the attention weights in training mode.

    >>> import ragged, torch
    >>> mha = ragged.nn.RaggedMultiheadAttention(8, num_heads=2)
    >>> x = ragged.from_lengths(torch.randn(5, 8), [2, 0, 3])
    >>> mha(x).shape
    RaggedShape(3, [2, 0, 3], 8)
    >>> gqa = ragged.nn.RaggedMultiheadAttention(8, 4, num_kv_heads=2, causal=True, window=(2, 0))
    >>> gqa.in_proj_weight.shape, gqa(x).shape
    (torch.Size([16, 8]), RaggedShape(3, [2, 0, 3], 8))
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        causal: bool = False,
        window: tuple[int | None, int | None] | None = None,
        alibi: bool | Tensor = False,
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
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if (
            isinstance(kv_heads, bool)
            or not isinstance(kv_heads, int)
            or kv_heads <= 0
            or (num_heads % kv_heads)
        ):
            raise value_error(
                func,
                "num_kv_heads",
                f"must be positive and divide num_heads = {num_heads}",
                kv_heads,
            )
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = kv_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.causal = causal
        self.window = window
        # Created in nn.MultiheadAttention's order, so one seed gives the same weights.
        rows = (num_heads + 2 * kv_heads) * self.head_dim
        self.in_proj_weight = torch.nn.Parameter(torch.empty(rows, embed_dim, **factory))
        if bias:
            self.in_proj_bias = torch.nn.Parameter(torch.empty(rows, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        slopes = None
        if isinstance(alibi, Tensor):
            if alibi.shape != (num_heads,):
                raise value_error(
                    func,
                    "alibi",
                    f"must be True, False or [{num_heads}] slopes",
                    tuple(alibi.shape),
                )
            slopes = alibi.detach().clone()
        elif alibi:
            slopes = alibi_slopes(num_heads)
        if slopes is not None:
            slopes = slopes.to(device=device, dtype=dtype or torch.get_default_dtype())
        self.register_buffer("alibi_slopes", slopes)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        torch.nn.init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            torch.nn.init.zeros_(self.in_proj_bias)
            torch.nn.init.zeros_(self.out_proj.bias)

    def forward(
        self,
        x: RaggedArray,
        pair_bias: RaggedArray | None = None,
        *,
        causal: bool | None = None,
        document_ids: RaggedArray | None = None,
        prefix: int | Tensor | None = None,
    ) -> RaggedArray:
        """Self-attention of every segment of ``x`` ``(B, L*, E)``.

        Args:
            x: the rows, ``(B, L*, E)``.
            pair_bias: optional additive bias ``(B, L*, L*, num_heads)`` on the scores (see
                [`ragged.attention`][ragged.attention]; e.g. relative positions, or ``-inf`` to mask pairs).
            causal: row ``i`` attends to rows ``j <= i`` of its segment only (default: the
                module's ``causal``).
            document_ids: ``(B, L*)`` ids: rows attend within their document only.
            prefix: prefix-LM lengths (with causal attention).

        Returns:
            ``(B, L*, E)`` with the partition object of ``x``.
        """
        func = "RaggedMultiheadAttention.forward"
        if not isinstance(x, RaggedArray):
            raise type_error(func, "x", "must be a RaggedArray (B, L*, E)", typename(x))
        if x.values.dim() != 2 or x.values.shape[1] != self.embed_dim:
            raise value_error(func, "x", f"must have shape (B, L*, {self.embed_dim})", x.shape)
        qkv = ragged_map(_project, x, weight=self.in_proj_weight, bias=self.in_proj_bias)
        heads, kv_heads, width = self.num_heads, self.num_kv_heads, self.head_dim
        rows = qkv.values.view(-1, heads + 2 * kv_heads, width)
        parts = rows.split((heads, kv_heads, kv_heads), dim=1)
        q, k, v = (RaggedArray(t, x.partition) for t in parts)
        dropout = self.dropout if self.training and self.dropout > 0 else None
        out = attention(
            q,
            k,
            v,
            causal=self.causal if causal is None else causal,
            bias=pair_bias,
            dropout_p=dropout,
            window=self.window,
            alibi=self._buffers.get("alibi_slopes"),
            document_ids=document_ids,
            prefix=prefix,
        )
        merged = RaggedArray(out.values.reshape(-1, self.embed_dim), x.partition, x.axes)
        return ragged_map(self.out_proj, merged)

    if TYPE_CHECKING:  # typed calls, the signature of forward (nn.Module.__call__ is Any)
        __call__ = forward


def _project(values: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return F.linear(values, weight, bias)
