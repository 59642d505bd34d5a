"""``RaggedArray.segment_ids``: a property whose old call spelling still works, with a warning.

``x.segment_ids`` was a method; it is a property like ``offsets`` and ``lengths``. The tensor it
returns in eager mode is a ``SegmentIds``, a plain int64 tensor in every respect (torch
functions on it return plain tensors; it prints, copies and pickles as one) except that calling
it, ``x.segment_ids()``, returns the plain tensor with a ``DeprecationWarning``. While compiling
the property returns the plain tensor (Dynamo does not trace the subclass).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

__all__ = ["SegmentIds", "segment_ids_view"]

CALLED = (
    "RaggedArray.segment_ids is a property, like offsets and lengths: write x.segment_ids "
    "instead of x.segment_ids() (the call will stop working in a later release)."
)


class SegmentIds(Tensor):
    """The tensor ``x.segment_ids`` returns in eager mode; callable for the old spelling.

    >>> import ragged
    >>> ids = ragged.array([[1, 2], [], [3]]).segment_ids
    >>> ids, type(ids + 0).__name__
    (tensor([0, 0, 2]), 'Tensor')
    """

    # torch functions on it return plain tensors
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    def __call__(self) -> Tensor:
        warnings.warn(CALLED, DeprecationWarning, stacklevel=2)
        return self.as_subclass(Tensor)

    def __repr__(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        return repr(self.as_subclass(Tensor))

    def __deepcopy__(self, memo: dict[int, Any]) -> Tensor:
        return self.as_subclass(Tensor).clone()

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.as_subclass(Tensor).__reduce_ex__(protocol)


def segment_ids_view(ids: Tensor) -> Tensor:
    """``ids`` as ``x.segment_ids`` returns it: a ``SegmentIds`` view, or ``ids`` while compiling."""
    if torch.compiler.is_compiling():
        return ids
    return ids.as_subclass(SegmentIds)
