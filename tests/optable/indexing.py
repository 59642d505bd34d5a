"""Op table entries: indexing (``ragged.ops._index`` and ``x[...]`` from ``ragged.ops._slicing``)."""

from __future__ import annotations

import math
from typing import Any

import torch

import ragged

from . import ErrorCase, OpInfo, PerSegment, Sample, ragged_randn

NAMES = ("batch", "seq", "feat")


# --- per-segment references -------------------------------------------------------------------


def _default_fill(dtype: torch.dtype) -> Any:
    return math.nan if dtype.is_floating_point else (False if dtype == torch.bool else 0)


def _segment_dim(axis: Any, segment: torch.Tensor) -> int:
    """Array axis of a one-level sample -> dim of one segment (which lacks the batch axis)."""
    if isinstance(axis, str):
        axis = NAMES.index(axis)
    return axis - 1 if axis >= 0 else axis + segment.dim()


def take_reference(
    segment: torch.Tensor,
    indices: torch.Tensor,
    axis: Any = 1,
    mode: str = "fill",
    fill_value: Any = None,
) -> torch.Tensor:
    """``jnp.take(segment, indices, axis, mode=mode)``, one index at a time."""
    dim = _segment_dim(axis, segment)
    size = segment.shape[dim]
    fill = _default_fill(segment.dtype) if fill_value is None else fill_value
    row_shape = segment.shape[:dim] + segment.shape[dim + 1 :]
    rows = []
    for i in indices.reshape(-1).tolist():
        if mode == "wrap":
            ok, j = size > 0, i % size if size else 0
        else:
            j = i + size if i < 0 else i
            if mode == "clip":
                ok, j = size > 0, min(max(j, 0), size - 1)
            else:
                ok = 0 <= j < size
        rows.append(segment.select(dim, j) if ok else torch.full(row_shape, fill).to(segment))
    if rows:
        out = torch.stack(rows, dim)
    else:
        out = segment.new_empty((*segment.shape[:dim], 0, *segment.shape[dim + 1 :]))
    return out.reshape(*segment.shape[:dim], *indices.shape, *segment.shape[dim + 1 :])


def _positions(length: int, index: slice) -> list[int]:
    return list(range(length))[index]


def _positive_steps(items: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[Any, ...]:
    """Torch lacks negative slice steps: spell such a slice as the list of its positions."""
    out, dim = [], 0
    for item in items:
        if isinstance(item, slice) and item.step is not None and item.step < 0:
            item = _positions(shape[dim], item)
        out.append(item)
        dim += item is not None
    return tuple(out)


def getitem_reference(segment: torch.Tensor, index: tuple[Any, ...]) -> Any:
    """``x[index]`` on one segment: drop the batch entry; out-of-range rows fill with NaN."""
    if index[0] is Ellipsis:
        return segment[index]
    ragged_entry, rest = index[1], _positive_steps(index[2:], segment.shape[1:])
    if isinstance(ragged_entry, slice):
        picked = segment[_positions(segment.shape[0], ragged_entry)]
        return picked[(slice(None), *rest)]
    if isinstance(ragged_entry, int):
        row = take_reference(segment, torch.tensor(ragged_entry))
        return row[rest]
    if isinstance(ragged_entry, ragged.RaggedArray):  # per-segment index: the sample's own
        raise AssertionError("ragged indices are passed as arguments, not in the index")
    return take_reference(segment, ragged_entry)[(slice(None), *rest)]


# --- samples ----------------------------------------------------------------------------------


def _ragged_indices(
    lengths: list[int], gen: torch.Generator, *, in_range: bool = False
) -> ragged.RaggedArray:
    """Up to 4 indices per segment: anywhere in [-7, 7], or in range (none for empty segments)."""
    counts, values = [], []
    for length in lengths:
        count = int(torch.randint(0, 5, (), generator=gen))
        if in_range:
            count = count if length else 0
            drawn = torch.randint(-length, max(length, 1), (count,), generator=gen)
        else:
            drawn = torch.randint(-7, 8, (count,), generator=gen)
        counts.append(count)
        values += drawn.tolist()
    return ragged.from_lengths(torch.tensor(values, dtype=torch.int64), counts)


def take_samples(lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str):
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    b = len(lengths)
    idx = _ragged_indices(lengths, gen)
    dense = torch.randint(-7, 8, (b, 4), generator=gen)
    dense3 = torch.randint(-7, 8, (b, 2, 2), generator=gen)
    return [
        Sample("ragged", (x, idx)),
        Sample("ragged_fill", (x, idx), {"fill_value": -3.0}),
        Sample("ragged_clip", (x, idx), {"mode": "clip"}),
        Sample("ragged_wrap", (x, idx), {"mode": "wrap"}),
        Sample("named", (x.rename(*NAMES), idx), {"axis": "seq"}),
        Sample("dense", (x, PerSegment(dense))),
        Sample("dense_clip", (x, PerSegment(dense)), {"mode": "clip", "fill_value": 0.0}),
        Sample("dense_3d", (x, PerSegment(dense3)), {"mode": "wrap"}),
        Sample("inner", (x, torch.tensor([2, 0, -1, 2])), {"axis": 2}),
        Sample("inner_fill", (x, torch.tensor([[3, 0], [-4, 1]])), {"axis": -1}),
        Sample("inner_clip", (x, torch.tensor([5, -5])), {"axis": 2, "mode": "clip"}),
    ]


def take_raise_samples(lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str):
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [
        Sample("ragged_raise", (x, _ragged_indices(lengths, gen, in_range=True)), {"mode": "raise"})
    ]


def filter_samples(lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str):
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    flags = torch.rand(sum(lengths), generator=gen) > 0.5
    return [
        Sample("same_partition", (x, x[..., 0].with_values(flags))),
        Sample("equal_partition", (x, ragged.from_lengths(flags, lengths))),
        Sample("keep_all", (x, x[..., 0].with_values(torch.ones_like(flags)))),
        Sample("named", (x.rename(*NAMES), x[..., 0].with_values(flags))),
    ]


def pad_samples(lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str):
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [
        Sample("before_after", (x, (1, 2))),
        Sample("int", (x, 2), {"value": -3.0}),
        Sample("after", (x, (0, 1)), {"value": 7.0}),
        Sample("zero", (x, 0)),
        Sample("named", (x.rename(*NAMES), (2, 0))),
    ]


def pad_reference(segment: torch.Tensor, pad: Any, value: Any = 0) -> torch.Tensor:
    before, after = (pad, pad) if isinstance(pad, int) else pad
    full = segment.new_full((before + after, *segment.shape[1:]), value)
    return torch.cat([full[:before], segment, full[before:]])


def truncate_samples(lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str):
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [Sample(f"len{k}", (x, k)) for k in (0, 1, 3, 100)]


def end_samples(lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str):
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [Sample("default", (x,)), Sample("fill", (x,), {"fill_value": -3.0})]


def _end_reference(last: bool) -> Any:
    def reference(segment: torch.Tensor, fill_value: Any = None) -> torch.Tensor:
        return take_reference(segment, torch.tensor(-1 if last else 0), fill_value=fill_value)

    return reference


def _getitem_samples(*indices: tuple[Any, ...], inner: tuple[int, ...] = (3, 4)) -> Any:
    def samples(lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str):
        x = ragged_randn(lengths, inner, gen, dtype, layout)
        return [Sample(str(k), (x,), {"index": index}) for k, index in enumerate(indices)]

    return samples


def getitem(x: ragged.RaggedArray, index: Any) -> Any:
    return x[index]


_ALL = slice(None)
INNER_INDICES = (
    (_ALL, _ALL, 0),
    (Ellipsis, slice(1, 3)),
    (Ellipsis, None),
    (_ALL, _ALL, torch.tensor([2, 0, 2])),
    (Ellipsis, 1, slice(None, None, 2)),
    (_ALL, _ALL, None, -1, torch.tensor([[0, 3]])),
    (_ALL, _ALL, slice(None, None, -2), 1),
)
SLICE_INDICES = (
    (_ALL, slice(1, None)),
    (_ALL, slice(None, 2)),
    (_ALL, slice(-2, None)),
    (_ALL, slice(1, -1)),
    (_ALL, slice(None, None, 2)),
    (_ALL, slice(-1, 0, -2)),
    (_ALL, slice(None, None, -1)),
    (_ALL, slice(3, -7, -1), 0),
)
ROW_INDICES = (
    (_ALL, 0),
    (_ALL, 2),
    (_ALL, -1),
    (_ALL, -3, 1),
    (_ALL, torch.tensor([0, -1, 4])),
    (_ALL, torch.tensor([1, -2]), slice(0, 2)),
)


def ragged_index_samples(lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str):
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    flags = torch.rand(sum(lengths), generator=gen) > 0.5
    return [
        Sample("positions", (x, _ragged_indices(lengths, gen))),
        Sample("flags", (x, ragged.from_lengths(flags, lengths))),
    ]


def ragged_index_reference(segment: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    if index.dtype == torch.bool:
        return segment[index]
    return take_reference(segment, index)


# --- errors -----------------------------------------------------------------------------------

_X = ragged.array([[1.0, 2.0], [3.0]])
_XN = ragged.array([[[1.0, 2.0]], [[3.0, 4.0]]], axes=("b", "l", "d"))
_I = ragged.array([[0], [0]])

TAKE_ERRORS = [
    ErrorCase(
        lambda: ragged.take(_X, _I, axis=0),
        ValueError,
        "ragged.take: `axis` cannot be the batch axis (pick segments with x[indices]), got 0.",
    ),
    ErrorCase(
        lambda: ragged.take(_X, _I, mode="nearest"),
        ValueError,
        "ragged.take: `mode` must be one of 'fill', 'clip', 'wrap', 'raise', got 'nearest'.",
    ),
    ErrorCase(
        lambda: ragged.take(_X, ragged.array([[0.0], [1.0]])),
        TypeError,
        "ragged.take: `indices` must have an integer dtype, got torch.float32.",
    ),
    ErrorCase(
        lambda: ragged.take(_X, ragged.array([[0]])),
        ValueError,
        "ragged.take: `indices` must have 2 segments (one per segment of x), got 1.",
    ),
    ErrorCase(
        lambda: ragged.take(_X, torch.zeros(3, 1, dtype=torch.int64)),
        ValueError,
        "ragged.take: `indices` must have shape (2, ...) (one row per segment), got (3, 1).",
    ),
    ErrorCase(
        lambda: ragged.take(_X, [0, 1]),
        TypeError,
        "ragged.take: `indices` must be a RaggedArray or a Tensor, got list.",
    ),
    ErrorCase(
        lambda: ragged.take(_X, torch.tensor([[5], [0]]), mode="raise"),
        IndexError,
        "ragged.take: index out of range (mode='raise').",
    ),
    ErrorCase(
        lambda: ragged.take(_XN, _I, axis=2),
        TypeError,
        "ragged.take: `indices` must be a Tensor for an inner axis, got RaggedArray.",
    ),
    ErrorCase(
        lambda: ragged.take(_XN, torch.zeros(2, 2, dtype=torch.int64), axis="d"),
        ValueError,
        "ragged.take: `indices` must be 0-D or 1-D for a named array ('b', 'l', 'd') (more would "
        "add unnamed axes; drop the names with x.rename(None) first), got (2, 2).",
    ),
    ErrorCase(
        lambda: ragged.take(ragged.array([[1, 2]]), torch.tensor([[3]]), fill_value=math.nan),
        ValueError,
        "ragged.take: `fill_value` must be representable in torch.int64, got nan.",
    ),
    ErrorCase(
        lambda: ragged.take(_X, torch.zeros(2, 1, dtype=torch.int64, device="meta")),
        ValueError,
        "ragged.take: `indices` must be on the device of x (cpu), got meta.",
    ),
    ErrorCase(
        lambda: ragged.take(_X.values, _I),
        TypeError,
        "ragged.take: `x` must be a RaggedArray, got Tensor.",
    ),
]

FILTER_ERRORS = [
    ErrorCase(
        lambda: ragged.filter(_X, _X),
        TypeError,
        "ragged.filter: `mask` must have dtype torch.bool, got torch.float32.",
    ),
    ErrorCase(
        lambda: ragged.filter(_XN, _XN > 1),
        ValueError,
        "ragged.filter: `mask` must have shape (B, L*) (one flag per row), got 3 axes.",
    ),
    ErrorCase(
        lambda: ragged.filter(_X, ragged.array([[True], [True, False]])),
        ValueError,
        "ragged.filter: the operands have different ragged structure: (2, [2, 1]) vs "
        "(2, [1, 2]); elementwise ops need equal partitions.",
    ),
    ErrorCase(
        lambda: ragged.filter(_X, torch.tensor([True, False, True])),
        TypeError,
        "ragged.filter: `mask` must be a RaggedArray, got Tensor.",
    ),
]

PAD_ERRORS = [
    ErrorCase(
        lambda: ragged.pad(_X, (1, -1)),
        ValueError,
        "ragged.pad: `pad` must be non-negative, got (1, -1).",
    ),
    ErrorCase(
        lambda: ragged.pad(_X, (1, 2, 3)),
        TypeError,
        "ragged.pad: `pad` must be an int or a pair of ints (before, after), got (1, 2, 3).",
    ),
    ErrorCase(
        lambda: ragged.pad(_X, 1, value="a"),
        TypeError,
        "ragged.pad: `value` must be a number or a 0-D tensor, got str.",
    ),
]

TRUNCATE_ERRORS = [
    ErrorCase(
        lambda: ragged.truncate(_X, -1),
        ValueError,
        "ragged.truncate: `max_len` must be non-negative, got -1.",
    ),
    ErrorCase(
        lambda: ragged.truncate(_X, 1.5),
        TypeError,
        "ragged.truncate: `max_len` must be an int, got float.",
    ),
]

_G = "RaggedArray.__getitem__"
GETITEM_ERRORS = [
    ErrorCase(
        lambda: _X[None, :],
        IndexError,
        f"{_G}: a new axis (None) can only be added after the ragged axis (or as x[:, None] alone, before it), got (None, slice(None, None, None)).",
    ),
    ErrorCase(
        lambda: _X[:, None, 0],
        IndexError,
        f"{_G}: a new axis (None) can only be added after the ragged axis (or as x[:, None] alone, before it), got (slice(None, None, None), None, 0).",
    ),
    ErrorCase(
        lambda: _X[:, :, 0],
        IndexError,
        f"{_G}: too many indices for an array of 2 axes: 3 were indexed.",
    ),
    ErrorCase(
        lambda: _X[..., ...],
        IndexError,
        f"{_G}: an index can have only one ellipsis (...), got (Ellipsis, Ellipsis).",
    ),
    ErrorCase(
        lambda: _XN[..., None],
        ValueError,
        f"{_G}: `index` would add unnamed axes to the named array ('b', 'l', 'd'); drop the "
        "names first (x.rename(None)[...]) or name the result with x.with_values(v, axes=...), "
        "got (Ellipsis, None).",
    ),
    ErrorCase(
        lambda: _X[:, ::0],
        ValueError,
        f"{_G}: slice step cannot be zero.",
    ),
    ErrorCase(
        lambda: _X[:, 0.5],
        TypeError,
        f"{_G}: `index` entries must be ints, slices, None, ..., tensors or RaggedArrays, got float.",
    ),
    ErrorCase(
        lambda: _X[:, torch.tensor([True, False])],
        TypeError,
        f"{_G}: a boolean mask of the ragged axis must be a RaggedArray (one flag per row of "
        "each segment), got a dense tensor of shape (2,).",
    ),
    ErrorCase(
        lambda: ragged.array([[[1.0, 2.0]]])[:, torch.tensor([0]), torch.tensor([0])],
        IndexError,
        f"{_G}: a tensor index on the ragged axis cannot be combined with tensor indices on "
        "inner axes, got (slice(None, None, None), tensor([0]), tensor([0])).",
    ),
    ErrorCase(
        lambda: _XN[:, :, [0.5]],
        TypeError,
        f"{_G}: tensor indices must be integer or boolean, got torch.float32.",
    ),
    ErrorCase(
        lambda: _XN[:, :, _I],
        IndexError,
        f"{_G}: a RaggedArray can only index the ragged axis, not inner axes.",
    ),
    ErrorCase(
        lambda: _X[:, True],
        TypeError,
        f"{_G}: `index` entries cannot be bools, got True.",
    ),
]


# --- the table --------------------------------------------------------------------------------

OPS = [
    OpInfo(
        "take",
        ragged.take,
        take_reference,
        take_samples,
        errors=TAKE_ERRORS,
    ),
    OpInfo(
        "take",
        ragged.take,
        take_reference,
        take_raise_samples,
        compile=False,  # mode="raise" reads one flag back
        variant="raise",
    ),
    OpInfo(
        "filter",
        ragged.filter,
        lambda segment, mask: segment[mask],
        filter_samples,
        compile=False,
        data_dependent=True,
        errors=FILTER_ERRORS,
    ),
    OpInfo("pad", ragged.pad, pad_reference, pad_samples, errors=PAD_ERRORS),
    OpInfo(
        "truncate",
        ragged.truncate,
        lambda segment, max_len: segment[:max_len],
        truncate_samples,
        compile=False,
        data_dependent=True,
        errors=TRUNCATE_ERRORS,
    ),
    OpInfo("first", ragged.first, _end_reference(False), end_samples),
    OpInfo("last", ragged.last, _end_reference(True), end_samples),
    OpInfo(
        "RaggedArray.__getitem__",
        getitem,
        getitem_reference,
        _getitem_samples(*INNER_INDICES),
        variant="inner",
        errors=GETITEM_ERRORS,
    ),
    OpInfo(
        "RaggedArray.__getitem__",
        getitem,
        getitem_reference,
        _getitem_samples(*SLICE_INDICES),
        compile=False,
        data_dependent=True,
        variant="slice",
    ),
    OpInfo(
        "RaggedArray.__getitem__",
        getitem,
        getitem_reference,
        _getitem_samples(*ROW_INDICES),
        variant="row",
    ),
    OpInfo(
        "RaggedArray.__getitem__",
        getitem,
        ragged_index_reference,
        ragged_index_samples,
        compile=False,  # boolean flags: data-dependent size
        data_dependent=True,
        variant="ragged_index",
    ),
]
