"""Nested references for multi-level arrays: arrays as trees of Python lists, ops as loops.

A multi-level RaggedArray ``(B, L1*, ..., Ln*, *inner)`` is a list of ``B`` segments, each a
nested list ``n`` deep whose leaves are the value rows (tensors of shape ``inner``). The
reference for an op along ragged axis ``k`` applies a function to every node at depth ``k - 1``
(a list of the entries along axis ``k``: leaves for the innermost axis, subtrees otherwise),
separately. Ops that combine entries across rows of an outer axis (reductions, softmax, scans,
sorts) work on the *columns* of a node: the entries that share a position below the axis
(columns align left, as in TensorFlow and Awkward).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

import ragged

Tree = Any  # a leaf tensor, or a list of trees


def tree(x: ragged.RaggedArray) -> list[Tree]:
    """``x`` as one nested list per segment (leaves are value rows)."""
    bounds = [level.offsets.tolist() for level in x.partition.levels]
    rows = list(x.values)

    def node(depth: int, index: int) -> Tree:
        start, end = bounds[depth][index], bounds[depth][index + 1]
        if depth == len(bounds) - 1:
            return rows[start:end]
        return [node(depth + 1, i) for i in range(start, end)]

    return [node(0, b) for b in range(x.num_segments)]


def from_tree(
    segments: list[Tree], depth: int, inner: tuple[int, ...], dtype: torch.dtype
) -> ragged.RaggedArray:
    """The RaggedArray of ``depth`` ragged levels holding ``segments``."""
    lengths: list[list[int]] = [[] for _ in range(depth)]
    leaves: list[torch.Tensor] = []

    def walk(node: Tree, level: int) -> None:
        lengths[level].append(len(node))
        for child in node:
            if level == depth - 1:
                leaves.append(child)
            else:
                walk(child, level + 1)

    for segment in segments:
        walk(segment, 0)
    values = torch.stack(leaves) if leaves else torch.zeros((0, *inner), dtype=dtype)
    return ragged.from_nested_lengths(values.to(dtype), lengths)


def at_depth(segments: list[Tree], depth: int, fn: Callable[[list[Tree]], Any]) -> list[Any]:
    """Replace every node at ``depth`` (0: the segments) by ``fn(node)``."""
    if depth == 0:
        return [fn(s) for s in segments]
    return [at_depth(s, depth - 1, fn) for s in segments]


def leaves(node: Tree) -> list[torch.Tensor]:
    if isinstance(node, torch.Tensor):
        return [node]
    return [leaf for child in node for leaf in leaves(child)]


def paths(node: Tree, prefix: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    """``(path, leaf)`` for every leaf of ``node``, in order."""
    if isinstance(node, torch.Tensor):
        return [(prefix, node)]
    return [item for i, child in enumerate(node) for item in paths(child, (*prefix, i))]


def replace_leaves(node: Tree, new: dict[tuple[int, ...], torch.Tensor], prefix=()) -> Tree:
    if isinstance(node, torch.Tensor):
        return new[prefix]
    return [replace_leaves(child, new, (*prefix, i)) for i, child in enumerate(node)]


def stack(items: list[torch.Tensor], like: torch.Tensor | None, inner: tuple[int, ...]) -> Any:
    if items:
        return torch.stack(items)
    dtype = like.dtype if like is not None else torch.float64
    return torch.zeros((0, *inner), dtype=dtype)


def columns(items: list[Tree], fn: Callable[[torch.Tensor], torch.Tensor], inner) -> list[Tree]:
    """Apply ``fn`` to every column of ``items`` (the leaves sharing a path), in item order;
    ``fn`` keeps the column's length. Leaves (the innermost axis): one column, the items."""
    if not items or isinstance(items[0], torch.Tensor):
        out = fn(stack(items, None, inner))
        return list(out)
    by_path: dict[tuple[int, ...], list[tuple[int, torch.Tensor]]] = {}
    for i, item in enumerate(items):
        for path, leaf in paths(item):
            by_path.setdefault(path, []).append((i, leaf))
    new: list[dict[tuple[int, ...], torch.Tensor]] = [{} for _ in items]
    for path, members in by_path.items():
        out = fn(torch.stack([leaf for _, leaf in members]))
        for (i, _), leaf in zip(members, out, strict=True):
            new[i][path] = leaf
    return [replace_leaves(item, new[i]) for i, item in enumerate(items)]


def column_positions(items: list[Tree]) -> list[Tree]:
    """Each leaf's item index (its position along the axis), in the shape of ``items``."""
    if not items or isinstance(items[0], torch.Tensor):
        return [torch.tensor(i) for i in range(len(items))]
    return [
        replace_leaves(item, {p: torch.tensor(i) for p, _ in paths(item)})
        for i, item in enumerate(items)
    ]


def union_reduce(items: list[Tree], fn: Callable[[torch.Tensor], torch.Tensor], empty) -> Tree:
    """Reduce ``items`` over their axis: leaves by ``fn`` of a column, nodes by left-aligned
    union (a node has as many children as its longest merged row)."""
    if not items:
        return empty()
    if isinstance(items[0], torch.Tensor):
        return fn(torch.stack(items))
    width = max(len(item) for item in items)
    return [union_reduce([it[j] for it in items if len(it) > j], fn, empty) for j in range(width)]


def coordinates(segment: Tree) -> list[tuple[tuple[int, ...], torch.Tensor | None]]:
    """Every node of a segment with its coordinates (leaves carry their row, lists ``None``)."""
    out: list[tuple[tuple[int, ...], torch.Tensor | None]] = []

    def walk(node: Tree, prefix: tuple[int, ...]) -> None:
        out.append((prefix, node if isinstance(node, torch.Tensor) else None))
        if not isinstance(node, torch.Tensor):
            for i, child in enumerate(node):
                walk(child, (*prefix, i))

    walk(segment, ())
    return out


def reduce_axes(
    segment: Tree,
    nr: int,
    axes: set[int],
    fn: Callable[[torch.Tensor], torch.Tensor],
    fill: Callable[[], torch.Tensor],
) -> Tree:
    """Reduce the ragged ``axes`` (1-based) of one segment: a group is the rows that agree on
    every other coordinate; kept axes align left."""
    kept_nodes: set[tuple[int, ...]] = set()
    groups: dict[tuple[int, ...], list[torch.Tensor]] = {}
    for coords, leaf in coordinates(segment):
        key = tuple(c for a, c in enumerate(coords, 1) if a not in axes)
        kept_nodes.add(key)
        if leaf is not None:
            groups.setdefault(key, []).append(leaf)
    depth = nr - len(axes)

    def build(prefix: tuple[int, ...]) -> Tree:
        if len(prefix) == depth:
            rows = groups.get(prefix, [])
            return fn(torch.stack(rows)) if rows else fill()
        width = 0
        for k in itertools.count():
            if (*prefix, k) not in kept_nodes:
                break
            width = k + 1
        return [build((*prefix, k)) for k in range(width)]

    return build(())


def assert_trees_close(got: Any, expected: Any, **kwargs: Any) -> None:
    """Equal structure and close leaves."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{type(got)} != tensor"
        torch.testing.assert_close(got, expected, equal_nan=True, **kwargs)
        return
    assert isinstance(got, list), f"{type(got)} != list"
    assert len(got) == len(expected), f"{len(got)} != {len(expected)}"
    for g, e in zip(got, expected, strict=True):
        assert_trees_close(g, e, **kwargs)


def to_tree(out: Any) -> Any:
    """A result as trees: a RaggedArray as its segments, a tensor as its rows."""
    if isinstance(out, ragged.RaggedArray):
        return tree(out)
    if isinstance(out, torch.Tensor):
        return list(out)
    if isinstance(out, (tuple, list)):
        return [to_tree(o) for o in out]
    return out
