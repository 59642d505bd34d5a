"""PyTorch Geometric: the ``(x, batch)`` segment-id vector or a ``Batch`` (``to_pyg``,
``from_pyg``). ``torch_geometric`` is optional: a ``Batch`` is recognised only when PyG is already
imported (``sys.modules``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._errors import Func, name_of, type_error, typename, value_error
from .._factory_checks import readable, segment_ids_level
from .._partition import Partition, RowPartition
from .._registry import public
from ..ops._indexing._axis import one_level_array

# --- PyTorch Geometric ------------------------------------------------------------------------


@public("interop")
def to_pyg(x: RaggedArray) -> tuple[Tensor, Tensor]:
    """PyG's ``(x, batch)``: the values and the graph (segment) of each row; no copy, no sync.

    >>> import ragged
    >>> values, batch = ragged.to_pyg(ragged.array([[1.0, 2.0], [], [3.0]]))
    >>> values, batch
    (tensor([1., 2., 3.]), tensor([0, 0, 2]))
    """
    x = one_level_array(to_pyg, x)
    return x.values, x.segment_ids


@public("interop")
def from_pyg(
    x: Any,
    batch: Tensor | None = None,
    num_graphs: int | None = None,
    *,
    validate: bool = True,
    key: str = "x",
) -> RaggedArray:
    """A RaggedArray of graphs from PyG's node features and sorted ``batch`` vector, or from a
    ``torch_geometric.data.Batch``.

    A ``Batch`` gives its node attribute ``key`` (default the features ``x``; ``"pos"`` for
    coordinates) split by its ``ptr`` offsets: nothing is read from the device and empty graphs
    are kept. Its other arguments must be left out.

    Args:
        x: ``[num_nodes, *inner]`` node (or edge) features, or a PyG ``Batch``.
        batch: int ``[num_nodes]``, the graph of each node, sorted (PyG's ``Batch.batch``).
        num_graphs: the number of graphs. ``None`` reads ``batch[-1] + 1`` once (one host
            sync); graphs after the last node's graph are then lost, so pass it when the batch
            can end with empty graphs (``Batch.num_graphs``).
        validate: check that ``batch`` is sorted and in range (one small read from the
            device). With ``validate=False`` an unsorted ``batch`` gives wrong graphs (each
            graph gets as many rows as ids name it), never an out-of-bounds access.

    >>> import ragged, torch
    >>> ragged.from_pyg(torch.arange(3.0), torch.tensor([0, 0, 2])).to_list()
    [[0.0, 1.0], [], [2.0]]
    >>> ragged.from_pyg(torch.arange(3.0), torch.tensor([0, 0, 2]), num_graphs=4).lengths
    tensor([2, 0, 1, 0])
    """
    func = from_pyg
    if _is_pyg_batch(x):
        if batch is not None or num_graphs is not None:
            raise TypeError(
                f"{name_of(func)}: pass a PyG Batch alone (no `batch` or `num_graphs`)."
            )
        return _from_pyg_batch(func, x, key)
    if key != "x":
        raise TypeError(f"{name_of(func)}: `key` applies to a PyG Batch only.")
    if batch is None:
        raise type_error(func, "batch", "must be an integer Tensor (x is not a PyG Batch)", "None")
    if not isinstance(x, Tensor) or x.dim() == 0:
        raise type_error(func, "x", "must be a Tensor with at least 1 dim", typename(x))
    if not isinstance(batch, Tensor) or batch.dtype.is_floating_point or batch.dtype == torch.bool:
        raise type_error(func, "batch", "must be an integer Tensor", typename(batch))
    total = x.shape[0]
    if tuple(batch.shape) != (total,):
        raise value_error(
            func,
            "batch",
            f"must have shape ({total},) (one graph per row of x)",
            tuple(batch.shape),
        )
    if batch.device != x.device:
        raise value_error(func, "batch", f"must be on {x.device}", batch.device)
    if num_graphs is not None and (
        isinstance(num_graphs, bool) or not isinstance(num_graphs, int) or num_graphs < 0
    ):
        raise type_error(func, "num_graphs", "must be a non-negative int or None", repr(num_graphs))
    ids = batch.to(torch.int64)
    if num_graphs is None and total:  # the one extra read
        readable(func, "batch", ids, "pass num_graphs, and validate=False")
        num = max(int(ids[-1]) + 1, 0)
    else:
        num = num_graphs or 0
    level = segment_ids_level(func, "batch", ids, num, validate)
    return RaggedArray(x, Partition((level,)))


def _is_pyg_batch(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch_geometric.data.Batch`` (PyG is imported if it is one)."""
    module = sys.modules.get("torch_geometric.data")
    return module is not None and isinstance(obj, module.Batch)


def _from_pyg_batch(func: Func, data: Any, key: str) -> RaggedArray:
    values = getattr(data, key, None)
    if not isinstance(values, Tensor) or values.dim() == 0:
        raise value_error(
            func, "key", "must name a node attribute (a tensor) of the Batch", repr(key)
        )
    total = values.shape[0]
    if total != data.num_nodes:
        raise value_error(
            func,
            "key",
            f"must name a node attribute ({data.num_nodes} rows)",
            f"{key!r}: {total} rows",
        )
    ptr = getattr(data, "ptr", None)
    if ptr is None:  # a Batch not made by from_data_list: fall back to its batch vector
        return from_pyg(values, data.batch, data.num_graphs)
    level = RowPartition.from_offsets(ptr.to(values.device, torch.int64), total)
    return RaggedArray(values, Partition((level,)))
