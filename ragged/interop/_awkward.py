"""Conversions to and from awkward arrays (PyPI ``awkward``, optional): ``from_awkward``,
``to_awkward``; ``ragged.array`` accepts an awkward array too.

An awkward array of var-length lists is a tree of *layouts*: ``ListOffsetArray`` (offsets and a
content), ``ListArray`` (starts, stops and a content), ``RegularArray`` (lists of one size) and,
at the bottom, ``NumpyArray`` (a numpy array, possibly with regular inner dimensions). That is a
RaggedArray's partition with other names: every var-length list level is a ragged axis whose
offsets are awkward's, and the numbers are the values.

Which awkward dimensions become ragged axes: every list dimension from the outermost down to the
innermost var-length one (a regular dimension above a var-length one becomes a ragged axis whose
lists all have its size); the regular dimensions below it become dense inner dimensions. An
array without a var-length dimension (``n * 3 * float64``) gets its first dimension ragged, as
``ragged.array`` treats nested lists of equal lengths. ``ragged_ndim`` asks for more ragged axes.

The values are shared where the layouts allow it: ``torch.from_numpy`` on awkward's buffer (CPU),
a view when a slice starts inside it. They are copied for a ``ListArray`` whose lists are not
back to back (awkward gathers them), indexed or option layouts (projected), read-only buffers
and ``dtype``/``device`` conversions. The offsets (``B + 1`` integers per level) are always
copied to int64 tensors that the array owns, as every factory does: a later write into
awkward's buffers cannot change the partition. ``to_awkward`` shares the values of a CPU array
and gives awkward copies of the offsets for the same reason.

awkward is imported when these functions run (``import ragged`` does not need it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._errors import Func, type_error, typename, value_error
from .._factories_dense import register_array_source
from .._partition import Partition, RowPartition
from .._registry import public

__all__ = ["from_awkward", "is_awkward", "to_awkward"]

_LISTS = ("ListOffsetArray", "ListArray", "RegularArray")


def _awkward(func: Func) -> Any:
    try:
        import awkward
    except ModuleNotFoundError as error:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            f"{func.__name__} needs awkward: pip install 'torch-ragged[awkward]'"
        ) from error
    return awkward


def is_awkward(obj: object) -> bool:
    """Whether ``obj`` is an awkward ``Array`` or layout (checked without importing awkward)."""
    return type(obj).__module__.partition(".")[0] == "awkward"


def _kind(node: Any) -> str:
    return type(node).__name__


def _unwrap(func: Func, node: Any, start: int, stop: int) -> tuple[Any, int, int]:
    """``node[start:stop]`` without the wrappers that do not change its values (indexing, option
    types without missing entries, empty arrays), as ``(layout, start, stop)`` of the layout to
    read next; a clear error for what has no RaggedArray form."""
    while True:
        kind = _kind(node)
        name = node.parameter("__array__")
        if name in ("string", "bytestring", "char", "byte"):
            raise type_error(
                func, "array", "must hold numbers, not strings", f"awkward {name} lists"
            )
        if kind in ("IndexedArray", "IndexedOptionArray", "ByteMaskedArray", "BitMaskedArray"):
            node = node[start:stop]  # the window only: entries outside it may be missing
            start, stop = 0, node.length
            missing = kind != "IndexedArray" and node.length
            if missing and node.mask_as_bool(valid_when=False).any():
                raise value_error(
                    func, "array", "must have no missing values (None)", "an option type"
                )
            node = node.project()  # gathers the entries (a copy)
        elif kind == "UnmaskedArray":
            node = node.content
        elif kind == "EmptyArray":  # lists that are all empty: no type, float64 like torch's
            import numpy as np

            node = node.to_NumpyArray(np.float64)
        elif kind in (*_LISTS, "NumpyArray"):
            return node, start, stop
        else:
            raise type_error(
                func, "array", "must be var-length or regular lists of numbers", f"awkward {kind}"
            )


def _var_depth(node: Any) -> int:
    """The number of list dimensions down to the innermost var-length one (0: none), from the
    layout's types."""
    depth = found = 0
    while True:
        kind = _kind(node)
        if kind in ("ListOffsetArray", "ListArray"):
            depth += 1
            found = depth
        elif kind == "RegularArray":
            depth += 1
        elif not hasattr(node, "content"):  # NumpyArray, EmptyArray, records, unions
            return found
        node = node.content


def _host_offsets(offsets: Any) -> Any:
    """A fresh int64 numpy copy of ``offsets``, starting at 0 (the partition owns it)."""
    import numpy as np

    offsets = offsets.astype(np.int64, copy=True)
    if len(offsets) and offsets[0] != 0:
        offsets -= offsets[0]
    return offsets


def _tensor(array: Any) -> Tensor:
    """``torch.from_numpy``, sharing memory unless the buffer is read-only (then a copy)."""
    import numpy as np

    if not array.flags.writeable:
        array = np.array(array)
    return torch.from_numpy(array)


def _level(offsets: Any) -> RowPartition:
    import numpy as np

    lengths = np.diff(offsets)
    max_length = int(lengths.max()) if len(lengths) else 0
    squares = int((lengths * lengths).sum())
    total = int(offsets[-1])
    return RowPartition.from_offsets(_tensor(offsets), total, max_length, squares)


@public("interop")
def from_awkward(
    array: Any,
    *,
    axes: Sequence[str] | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    ragged_ndim: int | None = None,
) -> RaggedArray:
    """A RaggedArray from an awkward array of (nested) lists of numbers.

    Every list dimension from the outermost down to the innermost var-length one becomes a
    ragged axis (a regular dimension above it becomes a ragged axis whose lists all have its
    size); regular dimensions below it become dense inner dimensions. The values are shared
    with awkward's buffer where the layouts allow (see the module notes for the copies); the
    offsets are copied (the array owns its index tensors). ``ragged.array(ak_array)`` calls
    this.

    Args:
        array: an ``ak.Array`` (or a layout) of CPU lists: ``ListOffsetArray``, ``ListArray``,
            ``RegularArray`` and ``NumpyArray`` layouts at any depth; option types without
            missing values and indexed layouts are resolved. Records, unions, strings and
            missing values raise.
        axes: optional unique names, one per logical axis.
        dtype: convert the values to this dtype (a copy).
        device: put the values on this device (a copy).
        ragged_ndim: the number of ragged axes, when more than the default (regular
            dimensions below the innermost var-length one then become ragged too).

    >>> import ragged
    >>> ak = __import__("pytest").importorskip("awkward")
    >>> x = ragged.from_awkward(ak.Array([[[1.0, 2.0], []], [], [[3.0]]]))
    >>> x.shape
    RaggedShape(3, [2, 0, 1], [[2, 0], [], [1]])
    >>> pairs = ak.to_regular(ak.Array([[[1, 2], [3, 4]], [[5, 6]]]), axis=2)
    >>> str(pairs.type), ragged.from_awkward(pairs).shape
    ('2 * var * 2 * int64', RaggedShape(2, [2, 1], 2))
    """
    func = from_awkward
    ak = _awkward(func)
    if not is_awkward(array):
        raise type_error(func, "array", "must be an awkward Array", typename(array))
    if isinstance(array, ak.Record):
        raise type_error(func, "array", "must be an awkward Array, not a Record", "Record")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise type_error(func, "dtype", "must be a torch.dtype", typename(dtype))
    node = ak.to_layout(array)
    if ak.backend(node) != "cpu":
        raise value_error(func, "array", "must be on awkward's cpu backend", ak.backend(node))
    wanted = _var_depth(node)
    if ragged_ndim is not None:
        if isinstance(ragged_ndim, bool) or not isinstance(ragged_ndim, int):
            raise type_error(func, "ragged_ndim", "must be an int or None", typename(ragged_ndim))
        if ragged_ndim < max(wanted, 1):
            raise value_error(
                func,
                "ragged_ndim",
                f"must be at least the var-length depth of `array` ({max(wanted, 1)})",
                ragged_ndim,
            )
        wanted = ragged_ndim
    wanted = max(wanted, 1)
    levels: list[RowPartition] = []
    dense: list[int] = []
    start, stop = 0, node.length
    rows = stop  # rows of values: the children of the last ragged axis
    while True:
        node, start, stop = _unwrap(func, node, start, stop)
        kind = _kind(node)
        if kind == "NumpyArray":
            if len(levels) < wanted and node.data.ndim > 1:
                node = node.to_RegularArray()  # an inner numpy dimension becomes a ragged axis
                continue
            break
        if len(levels) == wanted and kind != "RegularArray":  # pragma: no cover - by _var_depth
            raise AssertionError("a var-length list below the ragged axes")
        if kind == "RegularArray":
            size = node.size
            if len(levels) < wanted:
                import numpy as np

                levels.append(_level(np.arange(stop - start + 1, dtype=np.int64) * size))
                rows = (stop - start) * size
            else:
                dense.append(size)
            start, stop = start * size, stop * size
        else:
            if kind == "ListArray":
                starts = node.starts.data[start:stop]
                stops = node.stops.data[start:stop]
                if len(starts) > 1 and (starts[1:] != stops[:-1]).any():
                    node = node[start:stop].to_ListOffsetArray64(True)  # gathers the content
                    start, stop = 0, node.length
                    continue
                import numpy as np

                offsets = np.concatenate([starts[:1], stops]) if len(starts) else starts[:0]
                if not len(offsets):
                    offsets = np.zeros(1, dtype=np.int64)
            else:
                offsets = node.offsets.data[start : stop + 1]
            first, last = int(offsets[0]), int(offsets[-1])
            levels.append(_level(_host_offsets(offsets)))
            start, stop = first, last
            rows = last - first
        node = node.content
    if not levels and stop == start:  # an empty array without list types (``ak.Array([])``)
        import numpy as np

        levels.append(_level(np.zeros(1, dtype=np.int64)))
        rows = 0
    if len(levels) < wanted and ragged_ndim is not None and levels:
        raise value_error(
            func,
            "ragged_ndim",
            f"must be at most the number of list dimensions of `array` ({len(levels)})",
            ragged_ndim,
        )
    if len(levels) < wanted:
        raise value_error(
            func,
            "array",
            "must have at least one list dimension (a batch of segments)",
            str(array.type) if hasattr(array, "type") else _kind(node),
        )
    data = node.data[start:stop]
    if data.dtype.kind not in "biufc":  # datetimes, timedeltas, strings: torch has none
        expected = (
            "must hold numbers or booleans (torch has no such dtype; convert first, e.g. "
            "ak.values_astype(array, numpy.int64) for datetimes)"
        )
        raise type_error(func, "array", expected, f"numpy dtype {data.dtype}")
    values = _tensor(data)
    if dense:
        values = values.reshape(rows, *dense, *data.shape[1:])
    out = RaggedArray(values, Partition(tuple(levels)))
    if dtype is not None or device is not None:
        out = out.to(device=device, dtype=dtype)
    if axes is not None:
        out = out.rename(*axes)
    return out


@public("interop")
def to_awkward(x: RaggedArray) -> Any:
    """An awkward array with the segments of ``x``: one var-length list dimension per ragged axis
    (``ListOffsetArray`` layouts over the partition's offsets) and the inner dimensions regular
    (a ``NumpyArray`` of shape ``[total, *inner]``).

    A CPU array's values are shared with the result (no copy; detached from autograd), its
    offsets copied (so awkward's buffers cannot change the partition); other devices are copied
    to the CPU. Every ragged axis comes back var-length,
    also one that was a regular dimension in awkward. Dtypes without a numpy equivalent
    (bfloat16) raise: convert first.

    >>> import ragged, torch
    >>> ak = __import__("pytest").importorskip("awkward")
    >>> y = ragged.to_awkward(ragged.from_lengths(torch.arange(6.0).view(3, 2), [2, 0, 1]))
    >>> y.tolist(), str(y.type)
    ([[[0.0, 1.0], [2.0, 3.0]], [], [[4.0, 5.0]]], '3 * var * 2 * float32')
    """
    func = to_awkward
    ak = _awkward(func)
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", typename(x))
    values = x.values.detach()
    if values.dtype == torch.bfloat16:
        raise type_error(
            func, "x", "must have a dtype numpy has (convert bfloat16 first)", values.dtype
        )
    values = values.cpu().resolve_conj().resolve_neg()
    content = ak.contents.NumpyArray(values.numpy())
    for level in reversed(x.partition.levels):
        offsets = level.offsets.detach().cpu().numpy().copy()
        content = ak.contents.ListOffsetArray(ak.index.Index64(offsets), content)
    return ak.Array(content)


register_array_source(is_awkward, from_awkward)  # ragged.array(awkward_array)
