"""``ragged.nn``: model building blocks on RaggedArrays ``(B, L*, E)``, with no padding.

The modules mirror their ``torch.nn`` counterparts (parameter names, shapes and initialisation),
so weights load from and into them with ``load_state_dict``; row-wise parts (linear layers,
feed-forward blocks, normalisation) run on the packed values through [`ragged.map`][ragged.map], and
attention runs within each segment through [`ragged.attention`][ragged.attention].

>>> import ragged, torch
>>> layer = ragged.nn.RaggedTransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
>>> x = ragged.from_lengths(torch.randn(5, 8), [2, 0, 3])
>>> layer(x).shape
RaggedShape(3, [2, 0, 3], 8)
"""

from ._attention import RaggedMultiheadAttention as RaggedMultiheadAttention
from ._attention import alibi_slopes as alibi_slopes
from ._norm import RaggedLayerNorm as RaggedLayerNorm
from ._transformer import RaggedTransformerEncoder as RaggedTransformerEncoder
from ._transformer import RaggedTransformerEncoderLayer as RaggedTransformerEncoderLayer

__all__ = [
    "RaggedLayerNorm",
    "RaggedMultiheadAttention",
    "RaggedTransformerEncoder",
    "RaggedTransformerEncoderLayer",
    "alibi_slopes",
]
