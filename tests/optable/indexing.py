"""Op table entries: indexing (``ragged.ops._index`` and ``x[...]`` from ``ragged.ops._slicing``)."""

from __future__ import annotations

import math
from typing import Any

import torch

import ragged

from . import ErrorCase, OpInfo, PerSegment, Sample, ragged_randn
from .nested import (
    along,
    at_depth,
    nested_randn,
    per_row,
    pick,
    row_counts,
    take_position,
    tree,
    zip_at_depth,
)

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
        ok, j = take_position(i, size, mode)
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


def pad_to_samples(lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str):
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [
        Sample("clip2", (x, 2), {"clip": True, "value": 7.0}),  # static sizes (compile test)
        Sample("min2", (x, 2)),
        Sample("min4_value", (x, 4), {"value": -3.0}),
        Sample("zero", (x, 0)),
        Sample("named", (x.rename(*NAMES), 3)),
    ]


def pad_to_reference(
    segment: torch.Tensor, length: int, value: Any = 0, clip: bool = False
) -> torch.Tensor:
    if clip:
        segment = segment[:length]
    missing = max(length - segment.shape[0], 0)
    return torch.cat([segment, segment.new_full((missing, *segment.shape[1:]), value)])


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


# --- multi-level samples: along outer ragged axes, whole rows move --------------------------


def _row_values(x: ragged.RaggedArray) -> tuple[int, ...]:
    return tuple(x.values.shape[1:])


def _fill_leaf(x: ragged.RaggedArray) -> Any:
    """The fill of a value row (innermost axis): NaN rows."""
    return torch.full(_row_values(x), math.nan, dtype=x.dtype)


def _outer_axes(x: ragged.RaggedArray) -> list[int]:
    return list(range(1, x.ragged_ndim))


def take_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = nested_randn(structure, (3,), gen, dtype, layout)
    out = []
    for axis in _outer_axes(x):
        counts = row_counts(x, axis, gen)
        idx = per_row(x, axis, torch.randint(-4, 5, (sum(counts),), generator=gen), counts)
        for mode in ("fill", "clip", "wrap"):
            out.append(
                Sample(
                    f"axis{axis}_{mode}",
                    (x, idx),
                    {"axis": axis, "mode": mode},
                    expected=lambda a=axis, i=idx, m=mode: zip_at_depth(
                        tree(x),
                        tree(i),
                        a - 1,
                        lambda items, ix: [pick(items, int(j), m) for j in ix],
                    ),
                )
            )
        rows = x.partition.levels[axis - 1].num_rows
        dense = torch.randint(-3, 4, (rows, 2), generator=gen)
        one = torch.randint(-3, 4, (rows,), generator=gen)
        out += [
            Sample(
                f"axis{axis}_dense",
                (x, dense),
                {"axis": axis},
                expected=lambda a=axis, d=dense: zip_at_depth(
                    tree(x),
                    _split(_scalars(d.reshape(-1)), x, a, 2),
                    a - 1,
                    lambda items, ix: [pick(items, int(j)) for j in ix],
                ),
            ),
            Sample(
                f"axis{axis}_one",
                (x, one),
                {"axis": axis},
                expected=lambda a=axis, d=one: zip_at_depth(
                    tree(x),
                    _split(_scalars(d), x, a, 1),
                    a - 1,
                    lambda items, ix: pick(items, int(ix[0])),
                ),
            ),
        ]
    return out


def _scalars(t: torch.Tensor) -> list[torch.Tensor]:
    return [torch.tensor(v) for v in t.tolist()]


def _split(flat: list[Any], x: ragged.RaggedArray, axis: int, per: int) -> list[Any]:
    """``per`` entries for every row of axis ``axis - 1``, nested like ``x`` above it."""
    rows = x.partition.levels[axis - 1].num_rows
    chunks = [flat[r * per : (r + 1) * per] for r in range(rows)]
    holder = (
        ragged.from_nested_lengths(
            torch.zeros(rows), [level.lengths.tolist() for level in x.partition.levels[: axis - 1]]
        )
        if axis > 1
        else None
    )
    if holder is None:
        return chunks
    it = iter(chunks)
    return at_depth(tree(holder), axis - 2, lambda node: [next(it) for _ in node])


def filter_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = nested_randn(structure, (3,), gen, dtype, layout)
    out = []
    for axis in _outer_axes(x):
        level = x.partition.levels[axis - 1]
        flags = torch.rand(level.num_children, generator=gen) > 0.5
        mask = per_row(x, axis, flags, level.lengths.tolist())
        out.append(
            Sample(
                f"axis{axis}",
                (x, mask),
                expected=lambda a=axis, m=mask: zip_at_depth(
                    tree(x),
                    tree(m),
                    a - 1,
                    lambda items, f: [i for i, k in zip(items, f, strict=True) if k],
                ),
            )
        )
        keep_all = per_row(x, axis, torch.ones_like(flags), level.lengths.tolist())
        out.append(Sample(f"axis{axis}_all", (x, keep_all), expected=lambda: tree(x)))
    return out


def _row_op_levels(make: Any) -> Any:
    """Samples of a whole-row op along each outer axis: ``make(x, axis)`` gives
    ``(name, args, kwargs, row_fn)`` items; the reference applies ``row_fn`` to every row."""

    def samples(
        structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        x = nested_randn(structure, (3,), gen, dtype, layout)
        out = []
        for axis in _outer_axes(x):
            for name, args, kwargs, fn in make(x, axis):
                out.append(
                    Sample(
                        f"axis{axis}_{name}",
                        (x, *args),
                        kwargs,
                        lambda a=axis, f=fn: along(x, a, f),
                    )
                )
        return out

    return samples


pad_levels = _row_op_levels(
    lambda x, axis: [
        ("both", ((1, 2),), {"axis": axis}, lambda items: [[], *items, [], []]),
        ("after", ((0, 1),), {"axis": axis, "value": 5.0}, lambda items: [*items, []]),
    ]
)
truncate_levels = _row_op_levels(
    lambda x, axis: [
        (f"len{k}", (k,), {"axis": axis}, lambda items, k=k: items[:k]) for k in (0, 1, 100)
    ]
)
first_levels = _row_op_levels(
    lambda x, axis: [("first", (), {"axis": axis}, lambda items: pick(items, 0))]
)
last_levels = _row_op_levels(
    lambda x, axis: [("last", (), {"axis": axis}, lambda items: pick(items, -1))]
)
pad_to_levels = _row_op_levels(
    lambda x, axis: [
        ("min2", (2,), {"axis": axis}, lambda items: [*items, *[[]] * (2 - len(items))]),
        (
            "clip1",
            (1,),
            {"axis": axis, "clip": True},
            lambda items: [*items[:1], *[[]] * (1 - len(items))],
        ),
        ("min0", (0,), {"axis": axis}, lambda items: items),
    ]
)


def getitem_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = nested_randn(structure, (3,), gen, dtype, layout)
    nr = x.ragged_ndim
    out = []
    for axis in _outer_axes(x):
        lead = (_ALL,) * axis
        cases = [
            ("slice", slice(1, None), lambda items: items[1:]),
            ("reverse", slice(None, None, -1), lambda items: items[::-1]),
            ("step", slice(-1, None, -2), lambda items: items[-1::-2]),
            ("int", 0, lambda items: pick(items, 0)),
            ("last", -1, lambda items: pick(items, -1)),
            ("tensor", torch.tensor([1, -1]), lambda items: [pick(items, 1), pick(items, -1)]),
        ]
        for name, item, fn in cases:
            out.append(
                Sample(
                    f"axis{axis}_{name}",
                    (x,),
                    {"index": (*lead, item)},
                    lambda a=axis, f=fn: along(x, a, f),
                )
            )
    # an outer slice and an innermost row: x[:, 1:, -1] (for three levels x[:, :, 1:, -1])
    lead = (_ALL,) * (nr - 1)

    def inner_last(items: list[Any]) -> Any:
        return [pick(row, -1, fill=_fill_leaf(x)) for row in items[1:]]

    out.append(
        Sample(
            "outer_slice_inner_int",
            (x,),
            {"index": (*lead, slice(1, None), -1)},
            lambda: along(x, nr - 1, inner_last),
        )
    )
    return out


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

PAD_TO_ERRORS = [
    ErrorCase(
        lambda: ragged.pad_to(_X, -1),
        ValueError,
        "ragged.pad_to: `length` must be non-negative, got -1.",
    ),
    ErrorCase(
        lambda: ragged.pad_to(_X, 2.0),
        TypeError,
        "ragged.pad_to: `length` must be an int, got float.",
    ),
    ErrorCase(
        lambda: ragged.pad_to(_X, 2, clip=1),
        TypeError,
        "ragged.pad_to: `clip` must be a bool, got int.",
    ),
    ErrorCase(
        lambda: ragged.pad_to(_XN, 2, axis="d"),
        ValueError,
        "ragged.pad_to: `axis` must be a ragged axis (1 to 1, or a name), got 'd'.",
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
        levels=take_levels,
        levels_compile=False,  # whole rows along an outer axis: their sizes are read once
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
        levels=filter_levels,
    ),
    OpInfo("pad", ragged.pad, pad_reference, pad_samples, errors=PAD_ERRORS, levels=pad_levels),
    OpInfo(
        "pad_to",
        ragged.pad_to,
        pad_to_reference,
        pad_to_samples,
        errors=PAD_TO_ERRORS,
        levels=pad_to_levels,
        # min-length padding reads the new total unless every row is known to fit
        data_dependent=True,
        levels_compile=False,
    ),
    OpInfo(
        "truncate",
        ragged.truncate,
        lambda segment, max_len: segment[:max_len],
        truncate_samples,
        compile=False,
        data_dependent=True,
        errors=TRUNCATE_ERRORS,
        levels=truncate_levels,
    ),
    OpInfo(
        "first",
        ragged.first,
        _end_reference(False),
        end_samples,
        levels=first_levels,
        levels_compile=False,  # a whole row along an outer axis: its sizes are read once
    ),
    OpInfo(
        "last",
        ragged.last,
        _end_reference(True),
        end_samples,
        levels=last_levels,
        levels_compile=False,
    ),
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
        levels=getitem_levels,
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
