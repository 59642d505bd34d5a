"""``RaggedLayerNorm``: ``nn.LayerNorm`` over the inner axes of every row."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

import torch
import torch.nn.functional as F
from torch import Tensor

from .._array import RaggedArray
from .._registry import public
from ..func._map import map as ragged_map


@public("nn", namespace="ragged.nn")
class RaggedLayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` that also takes RaggedArrays ``(B, L*, *normalized_shape)``.

    Layer norm normalises each row on its own, so on a RaggedArray it runs once on the packed
    values (the partition object is kept). Same parameters and state dict as ``nn.LayerNorm``;
    a plain tensor input behaves exactly as there.

    >>> import ragged, torch
    >>> norm = ragged.nn.RaggedLayerNorm(4)
    >>> x = ragged.from_lengths(torch.randn(5, 4), [2, 0, 3])
    >>> y = norm(x)
    >>> y.partition is x.partition, torch.allclose(y.values, torch.nn.LayerNorm(4)(x.values))
    (True, True)
    """

    if TYPE_CHECKING:  # module calls are typed by their input (nn.Module.__call__ is Any)

        @overload
        def __call__(self, input: RaggedArray) -> RaggedArray: ...
        @overload
        def __call__(self, input: Tensor) -> Tensor: ...
        def __call__(self, input: Any) -> Any: ...

    def forward(self, input: Any) -> Any:
        if isinstance(input, RaggedArray):
            shape = tuple(self.normalized_shape)
            inner = tuple(input.values.shape[1:])
            if inner[len(inner) - len(shape) :] != shape or len(inner) < len(shape):
                raise ValueError(
                    f"RaggedLayerNorm: `input` must end in the normalized_shape {shape} (its inner "
                    f"axes), got inner shape {inner}."
                )
            return ragged_map(self._rows, input)
        if not isinstance(input, Tensor):
            raise TypeError(
                f"RaggedLayerNorm: `input` must be a RaggedArray or a Tensor, got "
                f"{type(input).__name__}."
            )
        return super().forward(input)

    def _rows(self, values: Tensor) -> Tensor:
        return F.layer_norm(values, self.normalized_shape, self.weight, self.bias, self.eps)
