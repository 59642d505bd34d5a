"""``ragged.map``: apply a row-wise function to the flat values of RaggedArrays."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from .._array import RaggedArray
from .._axes import transformed
from .._broadcast import same_partition
from .._errors import type_error, value_error
from .._registry import public
from ._prefix import names_leaf, prefix_leaves


@public("transforms")
def map(f: Callable[..., Any], *xs: Any, axes: Any = "keep", **static: Any) -> Any:
    """Apply a row-wise function ``f`` to the values of RaggedArrays that share a partition.

    ``f`` sees every RaggedArray argument as its flat ``values`` (``[total, *inner]``) and must
    treat rows independently (an ``nn.Module`` on features, an activation, a lambda). Every
    tensor it returns must keep the leading size ``total``; each becomes a RaggedArray with the
    input's partition object. Non-RaggedArray positional arguments and ``static`` keyword
    arguments are passed through unchanged. ``f`` may return any pytree of tensors.

    Use [`ragged.vmap`][ragged.vmap] instead when ``f`` needs a whole segment (e.g. attention).

    Args:
        f: the row-wise function.
        *xs: RaggedArrays (sharing one partition) and other arguments.
        axes: axis names of the results, a pytree prefix of ``f``'s output (names, ``None`` or
            ``"keep"`` per output). By default (``"keep"``) an output with as many axes as the
            first RaggedArray argument keeps its names; when ``f`` changes the number of axes
            of a named array, give that output's names (or ``None``): names are never dropped
            silently.
        **static: keyword arguments for ``f`` (``axes`` is reserved for the names).

    Returns:
        A RaggedArray, or the pytree ``f`` returned with its tensors wrapped.

    Raises:
        ValueError: no RaggedArray argument, different partitions, ``f`` changed the leading
            dimension, or ``f`` changed the number of axes of a named array without ``axes=``.

    >>> import ragged, torch
    >>> x = ragged.array([[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]])
    >>> layer = torch.nn.Linear(2, 3)
    >>> ragged.map(layer, x).shape
    RaggedShape(2, [1, 2], 3)
    >>> out = ragged.map(lambda v: {"relu": v.relu(), "norm": v.norm(dim=-1)}, x)
    >>> out["norm"].shape
    RaggedShape(2, [1, 2])
    >>> named = x.rename("batch", "seq", "feat")
    >>> ragged.map(lambda v: v.sum(-1), named, axes=("batch", "seq")).axes
    ('batch', 'seq')
    >>> pair = ragged.map(lambda v: (v, v.sum(-1)), named, axes=("keep", ("batch", "seq")))
    >>> [p.axes for p in pair]
    [('batch', 'seq', 'feat'), ('batch', 'seq')]
    """
    func = map
    if not callable(f):
        raise type_error(func, "f", "must be callable", type(f).__name__)
    ragged_args = [x for x in xs if isinstance(x, RaggedArray)]
    if not ragged_args:
        raise value_error(func, "xs", "must include at least one RaggedArray", "none")
    first = ragged_args[0]
    for other in ragged_args[1:]:
        if other.partition is not first.partition:
            same_partition(func, first, other)
    args = [x.values if isinstance(x, RaggedArray) else x for x in xs]
    out = f(*args, **static)
    total = first.values.shape[0]

    leaves, spec = pytree.tree_flatten(out)
    names_per_leaf = prefix_leaves(map, "axes", axes, out, names_leaf)

    def wrap(leaf: Any, names_spec: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        if leaf.dim() == 0 or leaf.shape[0] != total:
            raise value_error(
                func,
                "f",
                f"must keep the leading dimension ({total} rows) of every output",
                f"shape {tuple(leaf.shape)}",
            )
        ndim = first.ragged_ndim + leaf.dim()
        names = transformed(map, first.axes, first.ndim, ndim, names_spec)
        return RaggedArray(leaf, first.partition, names)

    return pytree.tree_unflatten(
        [wrap(leaf, n) for leaf, n in zip(leaves, names_per_leaf, strict=True)], spec
    )
