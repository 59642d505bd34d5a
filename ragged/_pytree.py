"""Pytree registration: ``values`` is the only leaf; partition and names are the context.

Registered with ``torch.utils._pytree`` (which ``torch.func`` and ``torch.compile`` read) and
with optree under the ``"ragged"`` namespace. The context is ``(partition, axes, order)`` (``order``: the layout, ``ragged._layout``); partitions
compare by identity, so two trees match exactly when they share partition objects and names.
Unflattening never validates (``RaggedArray._trusted``): ``torch.func`` rebuilds nodes around
non-tensor leaves and batched values.
"""

from __future__ import annotations

from typing import Any

import optree
import torch.utils._pytree as torch_pytree

from ._array import RaggedArray
from ._axes import AxisNames
from ._flat import FlatArray
from ._partition import Partition

Context = tuple[Partition, AxisNames | None, tuple[int, ...] | None]


def is_ragged_leaf(node: Any) -> bool:
    """The ``is_leaf`` of tree maps that take RaggedArrays whole (not their ``values``).

    >>> import optree, ragged, torch
    >>> tree = {"x": ragged.array([[1.0], []]), "t": torch.ones(1)}
    >>> sorted(type(leaf).__name__ for leaf in optree.tree_leaves(tree, is_leaf=is_ragged_leaf, namespace="ragged"))
    ['RaggedArray', 'Tensor']
    """
    return isinstance(node, RaggedArray)


def _flatten(x: RaggedArray) -> tuple[list[Any], Context]:
    return [x.values], (x.partition, x.axes, x.order)


def _flatten_with_keys(x: RaggedArray) -> tuple[list[tuple[Any, Any]], Context]:
    return [(torch_pytree.GetAttrKey("values"), x.values)], (x.partition, x.axes, x.order)


def _unflatten(leaves: Any, context: Context) -> RaggedArray:
    (values,) = leaves
    partition, axes, order = context
    return RaggedArray._trusted(values, partition, axes, order)


def _optree_flatten(x: RaggedArray) -> tuple[tuple[Any], Context, tuple[str]]:
    return (x.values,), (x.partition, x.axes, x.order), ("values",)


def _optree_unflatten(context: Context, leaves: Any) -> RaggedArray:
    return _unflatten(leaves, context)


def _flatten_flat(x: FlatArray) -> tuple[list[Any], Partition]:
    return [x.values], x.partition


def _flatten_flat_with_keys(x: FlatArray) -> tuple[list[tuple[Any, Any]], Partition]:
    return [(torch_pytree.GetAttrKey("values"), x.values)], x.partition


def _unflatten_flat(leaves: Any, partition: Partition) -> FlatArray:
    (values,) = leaves
    return FlatArray._trusted(values, partition)


def _optree_flatten_flat(x: FlatArray) -> tuple[tuple[Any], Partition, tuple[str]]:
    return (x.values,), x.partition, ("values",)


def _optree_unflatten_flat(partition: Partition, leaves: Any) -> FlatArray:
    return _unflatten_flat(leaves, partition)


def register() -> None:
    """Register RaggedArray (and FlatArray, ``x.view(-1, C)``, whose context is its partition)
    with torch's pytree and optree's ``"ragged"`` namespace."""
    torch_pytree.register_pytree_node(
        RaggedArray,
        _flatten,
        _unflatten,
        serialized_type_name="ragged.RaggedArray",
        flatten_with_keys_fn=_flatten_with_keys,
    )
    optree.register_pytree_node(
        RaggedArray,  # type: ignore[arg-type]  # optree's stubs expect a Collection
        _optree_flatten,  # type: ignore[arg-type]
        _optree_unflatten,  # type: ignore[arg-type]
        namespace="ragged",
    )
    torch_pytree.register_pytree_node(
        FlatArray,
        _flatten_flat,
        _unflatten_flat,
        serialized_type_name="ragged.FlatArray",
        flatten_with_keys_fn=_flatten_flat_with_keys,
    )
    optree.register_pytree_node(
        FlatArray,  # type: ignore[arg-type]
        _optree_flatten_flat,  # type: ignore[arg-type]
        _optree_unflatten_flat,  # type: ignore[arg-type]
        namespace="ragged",
    )
