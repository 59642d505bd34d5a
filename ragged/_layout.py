"""Layouts: the ragged axes anywhere after the batch axis, as metadata.

A RaggedArray stores ``values`` as ``[rows, *inner]``: one row per position of its last ragged
axis, the dense axes after. Its ``order`` (``None``: the storage order) is the logical order of
its non-batch axes: ``order[k]`` is the storage axis (``1..ndim-1``) that logical axis ``k + 1``
is. So ``(B, L*, H, D).transpose(1, 2)`` is ``(B, H, L*, D)`` with the same values and
``order == (2, 1, 3)``. Invariant: the inner axes are stored in their logical order (a swap of
two inner axes is a ``values.transpose``, a view), so an order only says where the ragged axes
sit among the inner ones; the ragged axes keep their relative order.

The sequence-first view ``(L*, B, *inner)`` of a one-level array in the storage order
(``x.transpose(0, 1)``, as ``nn.MultiheadAttention`` makes it) is the one order that moves the
batch axis: ``order == (0, 2, ..., ndim - 1)`` (logical axis 1 is the batch axis, storage axis 0;
logical axis 0 is the storage axis missing from ``order``, the ragged one). Its values are the
array's own (no copy); transposing it back gives the storage order again. Only the functions
that say so take it (``takes_sequence_first``: transposing back, sizes, the pointwise ops,
``F.linear``/``F.layer_norm`` over the last axis, ``F.multi_head_attention_forward``).

Ops written for the storage order refuse permuted arrays (``refuse_permuted``, called from
``ragged._versions.check_unchanged``, which every op calls first); the functions here, the
Tensor-style reshapes and the pointwise operators take them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ._errors import name_of
from ._flat import FlatArray
from ._shape import RaggedSize
from ._storage_order import pointwise as pointwise
from ._versions import refuse_permuted

if TYPE_CHECKING:
    from ._array import RaggedArray

__all__ = [
    "MOVES_BATCH",
    "is_sequence_first",
    "logical_dim",
    "logical_order",
    "merge_rows",
    "permute",
    "pointwise",
    "refuse_permuted",
    "reshape",
    "rowwise",
    "storage_dim",
    "unbind_dim",
    "view_or_rows",
]

MOVES_BATCH = (
    "moves the batch axis, which stays first on a RaggedArray (its segments are the rows of "
    "the batch); the one exception is the sequence-first view (L*, B, ...) of a one-level "
    "array in the storage order, x.transpose(0, 1), which transposes back the same way"
)


def is_sequence_first(x: Any) -> bool:
    """Whether ``x`` is a RaggedArray in the sequence-first view ``(L*, B, *inner)``."""
    order = getattr(x, "order", None)
    return order is not None and order[0] == 0


def _swaps_batch(dims: Sequence[int]) -> bool:
    """Whether ``dims`` swaps the first two axes and keeps the others in place."""
    return list(dims[:2]) == [1, 0] and all(d == i for i, d in enumerate(dims) if i > 1)


def _sequence_first(func: Any, x: RaggedArray, dims: Sequence[int]) -> RaggedArray:
    """``x`` permuted by ``dims`` that move the batch axis: the sequence-first view and back."""
    n = x.ndim
    if is_sequence_first(x):
        if _swaps_batch(dims):
            return build(x, x.values, None if x.axes is None else _swap(x.axes), range(1, n))
        raise TypeError(
            f"{_prefix(func)}`dims` {tuple(dims)}: a sequence-first array (L*, B, ...) only "
            "transposes back to (B, L*, ...) (x.transpose(0, 1)); other permutes take the "
            "batch-first array."
        )
    if _swaps_batch(dims) and x.order is None and x.ragged_ndim == 1:
        names = None if x.axes is None else _swap(x.axes)
        return build(x, x.values, names, (0, *range(2, n)))
    raise TypeError(f"{_prefix(func)}`dims` {tuple(dims)} {MOVES_BATCH}.")


def _swap(items: Sequence[Any]) -> tuple[Any, ...]:
    return (items[1], items[0], *items[2:])


def _prefix(func: Any) -> str:
    """``"name: "`` for an error of ``func``; nothing for ``None`` (the torch door's handlers
    add torch's name of the call themselves)."""
    return "" if func is None else f"{name_of(func)}: "


def logical_order(x: RaggedArray) -> tuple[int, ...]:
    """The storage axis of each logical non-batch axis (the identity when ``x.order`` is None)."""
    return x.order if x.order is not None else tuple(range(1, x.ndim))


def build(x: RaggedArray, values: Any, names: Any, order: Sequence[int]) -> RaggedArray:
    """``x``'s partition with new ``values``, ``names`` and ``order`` (stored as ``None`` when
    it is the identity)."""
    order = tuple(order)
    same = all(k == i + 1 for i, k in enumerate(order))
    return type(x)._trusted(values, x.partition, names, None if same else order)


def logical_dim(func: Any, dim: Any, n: int, name: str = "dim") -> int:
    """``dim`` as an axis in ``[0, n)`` (a ValueError naming ``func`` otherwise)."""
    if isinstance(dim, bool) or not isinstance(dim, int) or not -n <= dim < n:
        raise ValueError(f"{_prefix(func)}`{name}` must be an int in [{-n}, {n}), got {dim!r}.")
    return dim % n


def permute(func: Any, x: RaggedArray, dims: Sequence[Any]) -> RaggedArray:
    """``x`` with its logical axes in the order ``dims`` (torch's ``permute``), no copy.

    The batch axis stays first and the ragged axes keep their relative order; the inner axes
    move freely (``values.permute``, a view), and a ragged axis moves among them as metadata.
    """
    n = x.ndim
    dims = [logical_dim(func, d, n, "dims") for d in dims]
    if len(dims) != n or set(dims) != set(range(n)):
        raise ValueError(
            f"{_prefix(func)}`dims` must be a permutation of the {n} axes, got {tuple(dims)}."
        )
    if dims[0] != 0 or is_sequence_first(x):
        return _sequence_first(func, x, dims)
    nr = x.ragged_ndim
    old = logical_order(x)
    new = [old[d - 1] for d in dims[1:]]
    ragged = [k for k in new if k <= nr]
    # No sorted(): under dynamic=True the order ints of a compiled function's input are
    # symbolic, and Dynamo cannot sort them (it compares them, guarding on their values).
    if any(a > b for a, b in itertools.pairwise(ragged)):
        raise TypeError(
            f"{_prefix(func)}`dims` {tuple(dims)} reorders the ragged axes, which keep their "
            "order (each is ragged within the one before); ragged.transpose swaps the two "
            "ragged axes of a pair map."
        )
    inner = [k for k in new if k > nr]
    values = x.values
    if any(a > b for a, b in itertools.pairwise(inner)):
        lead = values.dim() - (n - 1 - nr) - 1  # vmap's batch dims before the rows
        keep = list(range(lead + 1))
        values = values.permute(*keep, *(lead + k - nr for k in inner))
    rank = {k: nr + 1 + i for i, k in enumerate(inner)}
    order = [k if k <= nr else rank[k] for k in new]
    names = None if x.axes is None else tuple(x.axes[d] for d in dims)
    return build(x, values, names, order)


def storage_dim(func: Any, x: RaggedArray, dim: Any) -> int:
    """Logical ``dim`` of ``x`` as a dim of its values; it must be an inner axis."""
    n = x.ndim
    d = logical_dim(func, dim, n)
    if d == 0:
        raise TypeError(f"{_prefix(func)}`dim` {dim} is the batch axis; an inner axis is needed.")
    k = logical_order(x)[d - 1]
    if k <= x.ragged_ndim:
        raise TypeError(
            f"{_prefix(func)}`dim` {dim} is a ragged axis (per-segment sizes); an inner axis "
            "is needed (ragged.map(fn, x) works on the rows)."
        )
    return k - x.ragged_ndim


def unbind_dim(func: Any, x: RaggedArray, dim: Any) -> tuple[RaggedArray, ...]:
    """``x.unbind(dim)`` along an inner axis: one array per index, that axis removed."""
    vd = storage_dim(func, x, dim)
    d = logical_dim(func, dim, x.ndim)
    k = vd + x.ragged_ndim
    order = [j - (j > k) for j in logical_order(x) if j != k]
    names = None if x.axes is None else tuple(a for i, a in enumerate(x.axes) if i != d)
    return tuple(build(x, v, names, order) for v in x.values.unbind(vd))


def _groups(func: Any, x: RaggedArray, shape: Sequence[Any]) -> list[list[Any]]:
    """The sizes of ``shape`` (after the batch) between its ragged axes, which must be those
    of ``x`` in order."""
    groups: list[list[Any]] = [[]]
    seen = 0
    for size in shape[1:]:
        if isinstance(size, RaggedSize):
            if seen >= x.ragged_ndim or not size.same_axis(x.partition, seen):
                raise ValueError(
                    f"{_prefix(func)}`shape` {tuple(shape)} has a ragged size of another array "
                    "(or out of order); use the array's own sizes, from x.shape."
                )
            seen += 1
            groups.append([])
        else:
            groups[-1].append(size)
    if seen != x.ragged_ndim:
        raise ValueError(
            f"{_prefix(func)}`shape` {tuple(shape)} must keep the {x.ragged_ndim} ragged "
            "axis/axes of the array (its RaggedSize entries, from x.shape), or merge the batch "
            "and all of them into rows (view(-1, C): a FlatArray)."
        )
    return groups


def view_or_rows(
    func: Any, x: RaggedArray, shape: Sequence[Any], *, view: bool
) -> RaggedArray | FlatArray:
    """``x.view(shape)`` / ``x.reshape(shape)``: ``reshape``, or the rows (``merge_rows``) for a
    shape without RaggedSize entries that starts with ``-1`` or the number of rows."""
    shape = tuple(shape)
    if shape and not any(isinstance(s, RaggedSize) for s in shape) and _rows_first(x, shape[0]):
        return merge_rows(func, x, shape, view=view)  # view(-1, C): a FlatArray of the rows
    return reshape(func, x, shape, view=view)


def reshape(func: Any, x: RaggedArray, shape: Sequence[Any], *, view: bool) -> RaggedArray:
    """``x.reshape(shape)`` / ``x.view(shape)``: the inner sizes between (and around) the ragged
    axes reshape among themselves; the batch and ragged axes stay (as their own sizes)."""
    shape = tuple(shape)
    if not shape or isinstance(shape[0], RaggedSize):
        raise ValueError(f"{_prefix(func)}`shape` must start with the batch size, got {shape}.")
    if not torch.compiler.is_compiling() and shape[0] != -1 and shape[0] != x.num_segments:
        raise ValueError(
            f"{_prefix(func)}`shape` must keep the batch size {x.num_segments} first, got "
            f"{shape[0]}."
        )
    target = _groups(func, x, shape)
    inner = x.values.shape[x.values.dim() - (x.ndim - 1 - x.ragged_ndim) :]
    source = _split_like(x, inner)
    sizes: list[Any] = []
    for want, have in zip(target, source, strict=True):
        known = [s for s in want if not (isinstance(s, int) and s == -1)]
        if len(known) < len(want) - 1:
            raise ValueError(f"{_prefix(func)}`shape` {shape} has more than one -1.")
        total = math.prod(have)
        if len(known) != len(want):
            fill = total // max(math.prod(known), 1)
            want = [fill if isinstance(s, int) and s == -1 else s for s in want]
        elif not torch.compiler.is_compiling() and math.prod(want) != total:
            raise ValueError(
                f"{_prefix(func)}`shape` {shape} does not fit the array's shape {tuple(x.shape)}: "
                "the inner sizes between its ragged axes must keep their number of entries."
            )
        sizes.extend(want)
    values = x.values
    lead = values.shape[: values.dim() - len(inner)]
    values = values.view(*lead, *sizes) if view else values.reshape(*lead, *sizes)
    order, inner_at, nr = [], x.ragged_ndim + 1, x.ragged_ndim
    for k, group in enumerate(target):
        for _ in group:
            order.append(inner_at)
            inner_at += 1
        if k < nr:
            order.append(k + 1)
    names = x.axes if x.axes is None or tuple(x.shape) == shape else None
    return build(x, values, names, order)


def merge_rows(func: Any, x: RaggedArray, shape: Sequence[Any], *, view: bool) -> FlatArray:
    """``x.view(-1, C)``: the batch and the ragged axes merged into the rows, a
    [`FlatArray`][ragged.FlatArray] ``(N, *sizes)`` (``N`` the number of rows; the sizes after
    it reshape the inner axes, whose number of entries they keep)."""
    if x.order is not None:
        raise TypeError(
            f"{_prefix(func)}`shape` {tuple(shape)} merges the batch and ragged axes of a "
            "permuted array (e.g. (B, H, L*, D)), whose rows are not its values' rows: move its "
            "axes back first (x.transpose(1, 2)), then view(-1, C)."
        )
    values = x.values
    inner = values.shape[values.dim() - (x.ndim - 1 - x.ragged_ndim) :]
    lead = values.shape[: values.dim() - len(inner) - 1]  # vmap's batch dims before the rows
    rows, *sizes = shape
    total = math.prod(inner)
    free = [k for k, s in enumerate(sizes) if isinstance(s, int) and s == -1]
    if len(free) > 1 or (free and isinstance(rows, int) and rows == -1):
        raise ValueError(f"{_prefix(func)}`shape` {tuple(shape)} has more than one -1.")
    if free:
        known = math.prod(s for k, s in enumerate(sizes) if k != free[0])
        sizes[free[0]] = total // max(known, 1)
    elif not torch.compiler.is_compiling() and math.prod(sizes) != total:
        raise ValueError(
            f"{_prefix(func)}`shape` {tuple(shape)} merges the batch and ragged axes into rows "
            f"(-1 first) and must keep the {total} entries of each row (inner shape "
            f"{tuple(inner)}); merging inner axes into the rows as well is not supported: "
            "reshape x.values, the [rows, ...] tensor."
        )
    target = (*lead, values.shape[len(lead)], *sizes)
    values = values.view(target) if view else values.reshape(target)
    return FlatArray._trusted(values, x.partition)


def _rows_first(x: RaggedArray, first: Any) -> bool:
    """Whether a shape starting with ``first`` (and no RaggedSize) merges the batch and ragged
    axes into rows: ``-1`` or the number of rows (any size under torch.compile, where the
    other reading, a shape without the ragged axes, is refused anyway)."""
    if isinstance(first, int) and first == -1:
        return True
    return torch.compiler.is_compiling() or first == x.partition.num_values


def _split_like(x: RaggedArray, inner: Sequence[Any]) -> list[list[Any]]:
    """The inner sizes of ``x`` grouped between its ragged axes (in the logical order)."""
    groups: list[list[Any]] = [[]]
    position = 0
    for k in logical_order(x):
        if k <= x.ragged_ndim:
            groups.append([])
        else:
            groups[-1].append(inner[position])
            position += 1
    return groups


def rowwise(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` (an op over the last axes of its first operand: ``F.linear``,
    ``F.layer_norm``) that also takes a sequence-first array, whose last axes are stored last:
    it runs on the storage order and its result is sequence-first again."""

    def lifted(input: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_sequence_first(input) or any(
            hasattr(a, "order") for a in (*args, *kwargs.values())
        ):
            return handler(input, *args, **kwargs)
        names = None if input.axes is None else _swap(input.axes)
        stored = type(input)._trusted(input.values, input.partition, names)
        out = handler(stored, *args, **kwargs)
        names = None if out.axes is None else _swap(out.axes)
        return type(out)._trusted(out.values, out.partition, names, (0, *range(2, out.ndim)))

    lifted.__wrapped__ = handler  # type: ignore[attr-defined]
    return lifted


def new_filled(x: RaggedArray, size: Sequence[Any], fill: Any, **options: Any) -> Any:
    """``x.new_full(size, fill)``: a dense tensor for a dense ``size``; a RaggedArray of the
    partition of ``size``'s RaggedSize entries (from one array's shape) otherwise."""
    size = tuple(size)
    ragged = [s for s in size if isinstance(s, RaggedSize)]
    if not ragged:
        return x.values.new_full(size, fill, **options)
    partition = ragged[0].partition
    source = type(x)._trusted(x.values, partition, None)  # only its partition is read
    groups = _groups(None, source, size)
    inner = [s for group in groups for s in group]
    values = x.values.new_full((partition.num_values, *inner), fill, **options)
    order, inner_at = [], len(ragged) + 1
    for k, group in enumerate(groups):
        for _ in group:
            order.append(inner_at)
            inner_at += 1
        if k < len(ragged):
            order.append(k + 1)
    return build(source, values, None, order)
