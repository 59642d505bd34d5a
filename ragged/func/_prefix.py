"""JAX-style pytree prefixes: one setting per leaf of a tree, given once for a whole subtree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.utils._pytree as pytree

from .._errors import Func, type_error, value_error
from .._pytree import is_ragged_leaf


def setting_leaf(prefix: Any) -> bool:
    """Ints, bools and ``None`` (``in_axes``, ``out_axes``, ``out_ragged``) are settings."""
    return prefix is None or isinstance(prefix, (int, bool))


def names_leaf(prefix: Any) -> bool:
    """Axis names are settings: ``None``, ``"keep"`` or a non-empty sequence of strings.

    >>> names_leaf(("batch", "seq")), names_leaf("keep"), names_leaf([("b", "l"), None])
    (True, True, False)
    """
    if prefix is None or isinstance(prefix, str):
        return True
    return (
        isinstance(prefix, (tuple, list))
        and len(prefix) > 0
        and all(isinstance(n, str) for n in prefix)
    )


def prefix_leaves(
    func: Func,
    param: str,
    prefix: Any,
    tree: Any,
    is_setting: Callable[[Any], bool] = setting_leaf,
) -> list[Any]:
    """Broadcast ``prefix`` over ``tree``: one setting per leaf (RaggedArrays are leaves).

    >>> prefix_leaves("f", "in_axes", (0, None), ([1, 2], 3))
    [0, 0, None]
    """
    if is_setting(prefix):
        return [prefix] * len(pytree.tree_leaves(tree, is_leaf=is_ragged_leaf))
    if isinstance(prefix, (tuple, list)) and isinstance(tree, (tuple, list)):
        if len(prefix) != len(tree):
            raise value_error(func, param, f"must have {len(tree)} entries to match", len(prefix))
        return [
            leaf
            for p, t in zip(prefix, tree, strict=True)
            for leaf in prefix_leaves(func, param, p, t, is_setting)
        ]
    if isinstance(prefix, dict) and isinstance(tree, dict):
        if set(prefix) != set(tree):
            raise value_error(func, param, f"must have the keys {sorted(tree)}", sorted(prefix))
        return [
            leaf
            for key in tree
            for leaf in prefix_leaves(func, param, prefix[key], tree[key], is_setting)
        ]
    raise type_error(func, param, "must be a setting or a pytree prefix of its tree", repr(prefix))
