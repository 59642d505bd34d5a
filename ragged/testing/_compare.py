"""``assert_close`` for pytrees that may hold RaggedArrays."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from .._array import RaggedArray
from .._pytree import is_ragged_leaf
from .._registry import public


@public("testing", namespace="ragged.testing")
def assert_close(actual: Any, expected: Any, **kwargs: Any) -> None:
    """Assert two pytrees are close: RaggedArrays must have equal partitions and names.

    Partitions are compared by value (offsets), values with ``torch.testing.assert_close``
    (``kwargs`` are passed on: ``rtol``, ``atol``, ``equal_nan``, ...).

    >>> import ragged, torch
    >>> a = ragged.array([[1.0], [2.0, 3.0]])
    >>> assert_close({"x": a}, {"x": ragged.array([[1.0], [2.0, 3.0]])})
    >>> assert_close(a, ragged.array([[1.0, 2.0], [3.0]]))
    Traceback (most recent call last):
    AssertionError: partitions differ: RaggedShape(2, [1, 2]) vs RaggedShape(2, [2, 1])
    """
    actual_leaves, actual_spec = pytree.tree_flatten(actual, is_leaf=is_ragged_leaf)
    expected_leaves, expected_spec = pytree.tree_flatten(expected, is_leaf=is_ragged_leaf)
    if len(actual_leaves) != len(expected_leaves):
        raise AssertionError(f"tree structures differ: {actual_spec} vs {expected_spec}")
    for a, e in zip(actual_leaves, expected_leaves, strict=True):
        if isinstance(a, RaggedArray) or isinstance(e, RaggedArray):
            if not (isinstance(a, RaggedArray) and isinstance(e, RaggedArray)):
                raise AssertionError(
                    f"one is a RaggedArray, the other {type(a).__name__}/{type(e).__name__}"
                )
            if not a.partition.equals(e.partition):
                raise AssertionError(f"partitions differ: {a.shape} vs {e.shape}")
            if a.axes != e.axes:
                raise AssertionError(f"axis names differ: {a.axes} vs {e.axes}")
            torch.testing.assert_close(a.values, e.values, **kwargs)
        else:
            torch.testing.assert_close(a, e, **kwargs)
