"""Static checks of the public return types, run by ``mypy`` (``[tool.mypy] files``).

Not a test module (pytest does not collect it): ``assert_type`` fails type checking, not at
runtime, when a function's declared return type is not the one expected here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from typing_extensions import assert_type

import ragged
import ragged.data
import ragged.nn
from ragged import RaggedArray, RaggedShape, RaggedSize

x = ragged.array([[1.0, 2.0], [3.0]])

# Reductions: everything, or the ragged axis (of one ragged axis), is dense; others may not be.
assert_type(ragged.sum(x), Tensor)
assert_type(ragged.sum(x, 1), Tensor)
assert_type(ragged.mean(x, axis=1, keepdims=True), Tensor)
assert_type(ragged.amax(x, 2), Tensor | RaggedArray)
assert_type(ragged.logsumexp(x, "seq"), Tensor | RaggedArray)
assert_type(ragged.var(x, 1, correction=0), Tensor)
assert_type(ragged.std(x), Tensor)
assert_type(ragged.norm(x, axis=1), Tensor)
assert_type(ragged.norm(x, 1, 1), Tensor)
assert_type(ragged.argmax(x), Tensor)
assert_type(ragged.any(x > 0, 1), Tensor)

# Tensor-style methods, with torch's argument names.
assert_type(x.sum(1), Tensor)
assert_type(x.mean(dim=2), Tensor | RaggedArray)
assert_type(x.exp(), RaggedArray)
assert_type(x.float(), RaggedArray)
assert_type(x.softmax(1), RaggedArray)
assert_type(x.size(), RaggedShape)
assert_type(x.size(1), int | RaggedSize)
assert_type(x.dim(), int)

# Collation and ragged.nn layers.
assert_type(ragged.data.collate([torch.ones(2), torch.ones(3)]), RaggedArray)
assert_type(ragged.data.collate([{"tokens": torch.ones(2)}]), dict[str, Any])
layer = ragged.nn.RaggedTransformerEncoderLayer(8, 2, dim_feedforward=16)
assert_type(layer(x), RaggedArray)
assert_type(layer(x, causal=None, document_ids=x, prefix=1), RaggedArray)
encoder = ragged.nn.RaggedTransformerEncoder(layer, 2)
assert_type(encoder(x, None, causal=True, prefix=torch.ones(2)), RaggedArray)
attn = ragged.nn.RaggedMultiheadAttention(8, 2)
assert_type(attn(x, document_ids=x), RaggedArray)
assert_type(ragged.nn.RaggedLayerNorm(2)(x), RaggedArray)
assert_type(ragged.nn.RaggedLayerNorm(2)(torch.ones(2)), Tensor)
