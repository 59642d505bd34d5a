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

from . import Sample, randn

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


def columns(
    items: list[Tree], fn: Callable[..., torch.Tensor], inner, *, members: bool = False
) -> list[Tree]:
    """Apply ``fn`` to every column of ``items`` (the leaves sharing a path), in item order;
    ``fn`` keeps the column's length. Leaves (the innermost axis): one column, the items. With
    ``members``, ``fn`` also gets the item index of every entry of the column."""
    if not items or isinstance(items[0], torch.Tensor):
        column = stack(items, None, inner)
        index = torch.arange(len(items))
        return list(fn(column, index) if members else fn(column))
    by_path: dict[tuple[int, ...], list[tuple[int, torch.Tensor]]] = {}
    for i, item in enumerate(items):
        for path, leaf in paths(item):
            by_path.setdefault(path, []).append((i, leaf))
    new: list[dict[tuple[int, ...], torch.Tensor]] = [{} for _ in items]
    for path, entries in by_path.items():
        column = torch.stack([leaf for _, leaf in entries])
        index = torch.tensor([i for i, _ in entries])
        out = fn(column, index) if members else fn(column)
        for (i, _), leaf in zip(entries, out, strict=True):
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
    fn: Callable[[list[tuple[tuple[int, ...], torch.Tensor]]], Any],
) -> Tree:
    """Reduce the ragged ``axes`` (1-based) of one segment: a group is the rows that agree on
    every other coordinate; kept axes align left. ``fn`` gets a group's rows with their full
    coordinates (an empty list for a node with no rows) and returns its result."""
    kept_nodes: set[tuple[int, ...]] = set()
    groups: dict[tuple[int, ...], list[tuple[tuple[int, ...], torch.Tensor]]] = {}
    for coords, leaf in coordinates(segment):
        key = tuple(c for a, c in enumerate(coords, 1) if a not in axes)
        kept_nodes.add(key)
        if leaf is not None:
            groups.setdefault(key, []).append((coords, leaf))
    depth = nr - len(axes)

    def build(prefix: tuple[int, ...]) -> Tree:
        if len(prefix) == depth:
            return fn(groups.get(prefix, []))
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


# --- samples ----------------------------------------------------------------------------------


def nested_randn(
    structure: list[list[int]],
    inner: tuple[int, ...],
    gen: torch.Generator,
    dtype: torch.dtype,
    layout: str = "contiguous",
) -> ragged.RaggedArray:
    """A multi-level array with the nested lengths ``structure`` and random values."""
    values = randn((sum(structure[-1]), *inner), gen, dtype, layout)
    return ragged.from_nested_lengths(values, structure)


def ragged_axes(structure: list[list[int]]) -> list[int]:
    """The outer ragged axes of an array with ``structure`` (all but the innermost)."""
    return list(range(1, len(structure)))


def along(x: ragged.RaggedArray, axis: int, fn: Callable[[list[Tree]], Any]) -> list[Any]:
    """``fn`` on every row of ragged ``axis`` (the list of its entries), as a nested result."""
    return at_depth(tree(x), axis - 1, fn)


def along_columns(
    x: ragged.RaggedArray, axis: int, fn: Callable[..., torch.Tensor], *, members: bool = False
) -> list[Any]:
    """``fn`` on every column of every row of ragged ``axis`` (length-preserving)."""
    inner = tuple(x.values.shape[1:])
    return along(x, axis, lambda items: columns(items, fn, inner, members=members))


def column_levels(
    reference: Callable[..., Any],
    variants: list[dict[str, Any]],
    *,
    inner: tuple[int, ...] = (3,),
    prepare: Callable[[ragged.RaggedArray], ragged.RaggedArray] | None = None,
) -> Callable[..., list[Any]]:
    """Multi-level samples of an op that keeps the structure and acts on columns (softmax,
    scans, sort): along every outer ragged axis, each ``variants`` kwargs; the nested reference
    is the one-level ``reference`` on every column (as one segment, ``axis=1``)."""

    def samples(
        structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Any]:
        x = nested_randn(structure, inner, gen, dtype, layout)
        if prepare is not None:
            x = prepare(x)
        out = []
        for axis in ragged_axes(structure):
            for k, kw in enumerate(variants):
                out.append(
                    Sample(
                        f"axis{axis}_{k}",
                        (x,),
                        {"axis": axis, **kw},
                        expected=lambda a=axis, kw=kw: along_columns(
                            x, a, lambda col: reference(col, axis=1, **kw)
                        ),
                    )
                )
        return out

    return samples


def subtrees_equal(a: Tree, b: Tree) -> bool:
    """Same structure and equal values (NaN never equal), as ``unique_consecutive`` compares."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and bool((a == b).all())
    return (
        isinstance(b, list)
        and len(a) == len(b)
        and all(subtrees_equal(p, q) for p, q in zip(a, b, strict=True))
    )


def zip_at_depth(
    segments: list[Tree], others: list[Tree], depth: int, fn: Callable[[Any, Any], Any]
) -> list[Any]:
    """``fn(node, other)`` for every pair of nodes at ``depth`` of two trees of equal upper
    structure (0: the segments)."""
    if depth == 0:
        return [fn(s, o) for s, o in zip(segments, others, strict=True)]
    return [zip_at_depth(s, o, depth - 1, fn) for s, o in zip(segments, others, strict=True)]


def take_position(index: int, size: int, mode: str) -> tuple[bool, int]:
    """Where ``index`` lands in a row of ``size`` entries under ``take``'s ``mode``: whether it
    is in range, and the position."""
    if mode == "wrap":
        return size > 0, index % size if size else 0
    j = index + size if index < 0 else index
    if mode == "clip":
        return size > 0, min(max(j, 0), size - 1)
    return 0 <= j < size, j


def pick(items: list[Tree], index: int, mode: str = "fill", fill: Any = None) -> Any:
    """Entry ``index`` of a row under ``take``'s modes; out of range: ``fill`` (an empty row for
    subtrees)."""
    ok, j = take_position(index, len(items), mode)
    if ok:
        return items[j]
    return [] if fill is None else fill


def row_counts(x: ragged.RaggedArray, axis: int, gen: torch.Generator, high: int = 4) -> list[int]:
    """A random count for every row of ragged ``axis - 1`` of ``x`` (for per-row lists)."""
    rows = x.partition.levels[axis - 1].num_rows
    return torch.randint(0, high, (rows,), generator=gen).tolist()


def per_row(
    x: ragged.RaggedArray, axis: int, values: torch.Tensor, counts: list[int]
) -> ragged.RaggedArray:
    """A RaggedArray with ``x``'s levels above ``axis`` and ``counts`` entries per row of axis
    ``axis - 1`` (``values`` in order): per-row indices, flags or sizes."""
    upper = [level.lengths.tolist() for level in x.partition.levels[: axis - 1]]
    return ragged.from_nested_lengths(values, [*upper, counts])


def random_below(
    x: ragged.RaggedArray, axis: int, gen: torch.Generator, dtype: torch.dtype
) -> ragged.RaggedArray:
    """An array with ``x``'s levels above ``axis`` (equal values, other objects), its inner
    shape, and random lengths from ``axis`` down."""
    levels = x.partition.levels
    structure = [level.lengths.tolist() for level in levels[: axis - 1]]
    rows = levels[axis - 1].num_rows
    for _ in range(axis - 1, len(levels)):
        structure.append(torch.randint(0, 3, (rows,), generator=gen).tolist())
        rows = sum(structure[-1])
    return nested_randn(structure, tuple(x.values.shape[1:]), gen, dtype)


def map_leaves(node: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``fn`` on every leaf (value row) of a tree, keeping its structure."""
    if isinstance(node, torch.Tensor):
        return fn(node)
    return [map_leaves(child, fn) for child in node]


def map_coords(node: Any, fn: Callable[[tuple[int, ...], torch.Tensor], Any], prefix=()) -> Any:
    """``fn(coordinates, leaf)`` on every leaf of a segment, keeping its structure."""
    if isinstance(node, torch.Tensor):
        return fn(prefix, node)
    return [map_coords(child, fn, (*prefix, i)) for i, child in enumerate(node)]
