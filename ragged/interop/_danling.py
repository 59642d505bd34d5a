"""DanLing's ``NestedTensor`` (PyPI ``danling``, optional, imported on first use):
``to_danling``, ``from_danling``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .._array import RaggedArray
from .._errors import type_error, typename, value_error
from .._partition import Partition, RowPartition
from .._registry import public
from ..ops._indexing._axis import one_level_array

if TYPE_CHECKING:
    from danling import NestedTensor


# --- DanLing NestedTensor ---------------------------------------------------------------------


def _danling() -> Any:
    try:
        import danling
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "ragged: DanLing conversions need the `danling` package (pip install torch-ragged[danling])."
        ) from err
    return danling


@public("interop")
def from_danling(nt: NestedTensor) -> RaggedArray:
    """A RaggedArray sharing the packed values of a DanLing ``NestedTensor``.

    Only the first element dim may vary (DanLing tensors ragged in several dims need a
    multi-level partition). DanLing keeps its offsets on the host, so the result knows its
    maximum length and nothing is read from the device.

    >>> import ragged, torch
    >>> from danling import NestedTensor
    >>> ragged.from_danling(NestedTensor(torch.tensor([1, 2, 3]), torch.tensor([4]))).to_list()
    [[1, 2, 3], [4]]
    """
    func = from_danling
    danling = _danling()
    if not isinstance(nt, danling.NestedTensor):
        raise type_error(func, "nt", "must be a danling.NestedTensor", typename(nt))
    if not nt.batch_first:
        raise value_error(func, "nt", "must be batch_first", "batch_first=False")
    offsets = nt.packed_offsets().to(torch.int64)  # on the host by DanLing's design
    values = nt.concat
    sizes = nt.element_sizes()
    num = offsets.shape[0] - 1
    if num and sizes.shape[1] == 0:
        raise value_error(func, "nt", "must hold tensors of at least 1 dim", "0-dim elements")
    if num and sizes.shape[1] > 1 and bool((sizes[:, 1:] != sizes[:1, 1:]).any()):
        raise value_error(
            func,
            "nt",
            "must be ragged in its first element dim only",
            f"element shapes {sizes.tolist()}",
        )
    lengths = torch.diff(offsets)
    longest = int(lengths.max()) if num else 0
    level = RowPartition.from_lengths(lengths.to(values.device), values.shape[0], longest)
    return RaggedArray(values, Partition((level,)))


@public("interop")
def to_danling(x: RaggedArray) -> NestedTensor:
    """A DanLing ``NestedTensor`` over the values of ``x`` (differentiable, values not copied).

    DanLing keeps offsets and element shapes on the host: for values on an accelerator this
    copies the offsets to the host (one sync).

    >>> import ragged, torch
    >>> nt = ragged.to_danling(ragged.array([[1.0, 2.0], [3.0]]))
    >>> nt.tensor
    tensor([[1., 2.],
            [3., 0.]])
    """
    func = to_danling
    danling = _danling()
    x = one_level_array(func, x)
    offsets = x.offsets.cpu()
    lengths = torch.diff(offsets)
    inner = torch.tensor(list(x.inner_shape), dtype=torch.int64)
    shapes = torch.cat([lengths[:, None], inner.expand(lengths.shape[0], inner.shape[0])], 1)
    return danling.NestedTensor.from_packed(x.values, offsets, shapes)
