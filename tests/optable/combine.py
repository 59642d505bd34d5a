"""Op table entries: combining ops (``ragged.ops._combine``).

``concat`` along the ragged or an inner axis and ``stack`` are per-segment ops (segment ``b`` of
the result is ``torch.cat``/``torch.stack`` of segment ``b`` of every input). Along the batch
axis ``concat`` and ``split`` change the number of segments, so the table checks them as a round
trip (``concat(split(x))`` is ``x``); ``tests/test_combine.py`` checks them directly.
"""

from __future__ import annotations

from typing import Any

import torch

import ragged

from . import ErrorCase, OpInfo, Sample, ragged_randn, randn
from .nested import nested_randn, ragged_axes, random_below, tree, zip_at_depth

NAMES = ("batch", "seq", "feat")


def segment_dim(axis: Any, named: tuple[str, ...] = NAMES) -> int:
    """An array axis (int or name) -> the same axis of one segment (one axis fewer)."""
    if isinstance(axis, str):
        axis = named.index(axis)
    return axis - 1 if axis >= 0 else axis


def _concat(*arrays: ragged.RaggedArray, axis: Any) -> ragged.RaggedArray:
    return ragged.concat(arrays, axis=axis)


def _concat_reference(*segments: torch.Tensor, axis: Any) -> torch.Tensor:
    return torch.cat(segments, dim=segment_dim(axis))


def _concat_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    total = sum(lengths)
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    y = ragged_randn(lengths[1:] + lengths[:1], (3,), gen, dtype)  # same B, other lengths
    z = ragged_randn(lengths[::-1], (3,), gen, dtype, layout)
    narrow = x.with_values(randn((total, 2), gen, dtype))
    twin = ragged.from_lengths(randn((total, 3), gen, dtype), lengths)  # equal-valued partition
    return [
        Sample("ragged", (x, y), {"axis": 1}),
        Sample("ragged_three", (x, y, z), {"axis": 1}),
        Sample("ragged_same_partition", (x, x.with_values(twin.values)), {"axis": 1}),
        Sample("ragged_negative", (x, y), {"axis": -2}),
        Sample("named", (x.rename(*NAMES), y.rename(*NAMES)), {"axis": "seq"}),
        Sample("inner", (x, narrow), {"axis": 2}),
        Sample("inner_twin", (x, twin), {"axis": -1}),
        Sample("one", (x,), {"axis": 1}),
    ]


def _concat_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    """Along an outer ragged axis: every row's entries (whole subtrees) joined end to end."""
    x = nested_randn(structure, (3,), gen, dtype, layout)
    out = []
    for axis in ragged_axes(structure):
        y = random_below(x, axis, gen, dtype)
        z = random_below(x, axis, gen, dtype)

        def joined(a: int = axis, y: Any = y, z: Any = z) -> Any:
            pairs = zip_at_depth(tree(x), tree(y), a - 1, lambda p, q: [p, q])
            both = zip_at_depth(pairs, tree(z), a - 1, lambda pq, r: [*pq[0], *pq[1], *r])
            return both

        out.append(Sample(f"axis{axis}", (x, y, z), {"axis": axis}, joined))
        out.append(Sample(f"axis{axis}_self", (x, x), {"axis": axis}, lambda a=axis: _twice(x, a)))
    return out


def _twice(x: ragged.RaggedArray, axis: int) -> Any:
    return zip_at_depth(tree(x), tree(x), axis - 1, lambda p, q: [*p, *q])


def _split_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    """Splitting the batch axis of a multi-level array and joining the pieces back."""
    x = nested_randn(structure, (3,), gen, dtype, layout)
    return [
        Sample(f"chunks{k}", (x,), {"sizes": k}, expected=lambda: tree(x)) for k in (1, 2, 1000)
    ]


def _roundtrip(x: ragged.RaggedArray, sizes: Any) -> ragged.RaggedArray:
    return ragged.concat(ragged.split(x, sizes), axis=0)


def _roundtrip_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [
        Sample("chunks", (x,), {"sizes": 2}),
        Sample("one_chunk", (x,), {"sizes": 1000}),
        Sample("named", (x.rename(*NAMES),), {"sizes": 1}),
    ]


def _stack(*arrays: ragged.RaggedArray, axis: int, name: str | None = None) -> Any:
    return ragged.stack(arrays, axis=axis, name=name)


def _stack_reference(*segments: torch.Tensor, axis: int, name: str | None = None) -> torch.Tensor:
    return torch.stack(segments, dim=axis - 1 if axis >= 0 else axis)


def _stack_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    total = sum(lengths)
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    y = x.with_values(randn((total, 3), gen, dtype, layout))
    twin = ragged.from_lengths(randn((total, 3), gen, dtype), lengths)
    flat = ragged_randn(lengths, (), gen, dtype, layout)
    return [
        Sample("last", (x, y), {"axis": -1}),
        Sample("middle", (x, y, x), {"axis": 2}),
        Sample("twin", (x, twin), {"axis": 3}),
        Sample("flat", (flat, flat.with_values(randn((total,), gen, dtype))), {"axis": 2}),
        Sample("named", (x.rename(*NAMES), y.rename(*NAMES)), {"axis": -1, "name": "k"}),
    ]


def _errors() -> list[ErrorCase]:
    x = ragged.array([[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]])
    wide = ragged.array([[[1.0, 2.0, 3.0]], []])
    three = ragged.array([[[1.0, 2.0]], [], [[3.0, 4.0]]])
    other = ragged.array([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0]]])
    named = x.rename("batch", "seq", "feat")
    renamed = x.rename("batch", "time", "feat")
    concat, stack, split = "ragged.concat", "ragged.stack", "ragged.split"
    return [
        ErrorCase(
            lambda: ragged.concat([]),
            ValueError,
            f"{concat}: `arrays` must be a non-empty sequence of RaggedArrays, got an empty sequence.",
        ),
        ErrorCase(
            lambda: ragged.concat(x),
            TypeError,
            f"{concat}: `arrays` must be a non-empty sequence of RaggedArrays, got RaggedArray.",
        ),
        ErrorCase(
            lambda: ragged.concat([x, torch.ones(3, 2)]),
            TypeError,
            f"{concat}: `arrays` must contain only RaggedArrays, got Tensor(shape=(3, 2), dtype=torch.float32) at position 1.",
        ),
        ErrorCase(
            lambda: ragged.concat([x, wide]),
            ValueError,
            f"{concat}: `arrays` must have the same inner shape, got shapes (2, [1, 2], 2), (2, [1, 0], 3).",
        ),
        ErrorCase(
            lambda: ragged.concat([x, ragged.array([[1.0], [2.0]])]),
            ValueError,
            f"{concat}: `arrays` must have the same number of ragged and inner axes, got shapes (2, [1, 2], 2), (2, [1, 1]).",
        ),
        ErrorCase(
            lambda: ragged.concat([x, three], axis=1),
            ValueError,
            f"{concat}: `arrays` must have the same number of segments to concatenate along the ragged axis, got shapes (2, [1, 2], 2), (3, [1, 0, 1], 2).",
        ),
        ErrorCase(
            lambda: ragged.concat([x, other], axis=2),
            ValueError,
            f"{concat}: `arrays` must have equal partitions to concatenate along an inner axis, got shapes (2, [1, 2], 2), (2, [2, 1], 2).",
        ),
        ErrorCase(
            lambda: ragged.concat(
                [
                    ragged.from_lengths(torch.zeros(3, 2, 3), [1, 2]),
                    ragged.from_lengths(torch.zeros(3, 1, 4), [1, 2]),
                ],
                axis=2,
            ),
            ValueError,
            f"{concat}: `arrays` must have the same inner shape except along the concatenated axis 2, got shapes (2, [1, 2], 2, 3), (2, [1, 2], 1, 4).",
        ),
        ErrorCase(
            lambda: ragged.concat([named, renamed]),
            ValueError,
            f"{concat}: `arrays` must have the same axis names (or none), got names [('batch', 'seq', 'feat'), ('batch', 'time', 'feat')].",
        ),
        ErrorCase(
            lambda: ragged.concat([x, x], axis=3),
            ValueError,
            f"{concat}: `axis` must be in [-3, 3), got 3.",
        ),
        ErrorCase(
            lambda: ragged.stack([x, x], axis=1),
            ValueError,
            f"{stack}: `axis` must place the new axis among the inner axes of the 4-axis result (from 2 to 3, or from -2 to -1), got 1.",
        ),
        ErrorCase(
            lambda: ragged.stack([x, x], axis=-3),
            ValueError,
            f"{stack}: `axis` must place the new axis among the inner axes of the 4-axis result (from 2 to 3, or from -2 to -1), got -3.",
        ),
        ErrorCase(
            lambda: ragged.stack([x, x], axis="feat"),
            TypeError,
            f"{stack}: `axis` must be an int (the new axis has no name yet), got str.",
        ),
        ErrorCase(
            lambda: ragged.stack([x, other]),
            ValueError,
            f"{stack}: `arrays` must have equal partitions to stack, got shapes (2, [1, 2], 2), (2, [2, 1], 2).",
        ),
        ErrorCase(
            lambda: ragged.stack([named, named]),
            TypeError,
            f"{stack}: `name` must name the new axis of named arrays, got None.",
        ),
        ErrorCase(
            lambda: ragged.stack([x, x], name="k"),
            TypeError,
            f"{stack}: `name` can name the new axis of named arrays only, got 'k'.",
        ),
        ErrorCase(
            lambda: ragged.stack([named, named], name="seq"),
            ValueError,
            f"{stack}: `name` must differ from the inputs' axis names ('batch', 'seq', 'feat'), got 'seq'.",
        ),
        ErrorCase(
            lambda: ragged.split(x, [1, 2]),
            ValueError,
            f"{split}: `sizes` must be a positive int or a sequence of ints summing to 2 (the segments), got [1, 2] (sum 3).",
        ),
        ErrorCase(
            lambda: ragged.split(x, 0),
            ValueError,
            f"{split}: `sizes` must be a positive int or a sequence of ints summing to 2 (the segments), got 0.",
        ),
        ErrorCase(
            lambda: ragged.split(x, [1, -1, 2]),
            ValueError,
            f"{split}: `sizes` must be a positive int or a sequence of ints summing to 2 (the segments), got [1, -1, 2].",
        ),
        ErrorCase(
            lambda: ragged.split(x, torch.tensor([1, 1])),
            TypeError,
            f"{split}: `sizes` must be a positive int or a sequence of ints summing to 2 (the segments), got Tensor(shape=(2,), dtype=torch.int64).",
        ),
        ErrorCase(
            lambda: ragged.split(x.values, 1),
            TypeError,
            f"{split}: `x` must be a RaggedArray, got Tensor(shape=(3, 2), dtype=torch.float32).",
        ),
    ]


OPS = [
    OpInfo(
        "concat",
        _concat,
        _concat_reference,
        _concat_samples,
        errors=_errors(),
        levels=_concat_levels,
    ),
    OpInfo(
        "split",
        _roundtrip,
        lambda segment, sizes: segment,
        _roundtrip_samples,
        compile=False,  # split reads its split points: one documented sync
        data_dependent=True,
        variant="concat_roundtrip",
        levels=_split_levels,
    ),
    OpInfo("stack", _stack, _stack_reference, _stack_samples),
]
