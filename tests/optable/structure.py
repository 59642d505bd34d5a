"""Op table entries: the structure of ragged levels (``ragged.ops._structure``).

One-level samples compare with per-segment references (merging the ragged axis with an inner
one, splitting it into rows of a dense axis, positions, combinations of rows); the multi-level
samples merge and split ragged levels, against nested loops.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

import ragged

from . import ErrorCase, OpInfo, Sample, ragged_randn
from .nested import along, nested_randn, per_row, tree

NAMES = ("batch", "seq", "feat")


# --- flatten ----------------------------------------------------------------------------------


def flatten_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (2, 3), gen, dtype, layout)
    return [
        Sample("ragged_inner", (x,), {"axis": 1}),
        Sample("inner_inner", (x,), {"axis": 2}),
        Sample("named", (x.rename("batch", "seq", "pair", "feat"),), {"axis": "seq"}),
    ]


def flatten_reference(segment: torch.Tensor, axis: Any = 1) -> torch.Tensor:
    if isinstance(axis, str):
        axis = 1
    return segment.flatten(axis - 1, axis)


def flatten_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = nested_randn(structure, (3,), gen, dtype, layout)
    out = [
        Sample(
            "axis0",
            (x,),
            {"axis": 0},
            expected=lambda: [item for segment in tree(x) for item in segment],
        )
    ]
    for axis in range(1, x.ragged_ndim):
        out.append(
            Sample(
                f"axis{axis}",
                (x,),
                {"axis": axis},
                expected=lambda a=axis: along(x, a, lambda items: [c for it in items for c in it]),
            )
        )
    return out


# --- unflatten --------------------------------------------------------------------------------


def unflatten_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn([2 * n for n in lengths], (3,), gen, dtype, layout)
    return [
        Sample("pairs", (x, 2), {"axis": 1, "validate": False}),
        Sample("negative_axis", (x, 2), {"axis": -2, "validate": False}),
        Sample("named", (x.rename(*NAMES), 2), {"axis": "seq", "name": "pair", "validate": False}),
    ]


def unflatten_checked_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn([2 * n for n in lengths], (3,), gen, dtype, layout)
    return [
        Sample("checked", (x, 2), {"axis": 1}),
        Sample("named", (x.rename(*NAMES), 2), {"axis": "seq", "name": "pair"}),
    ]


def unflatten_reference(segment: torch.Tensor, counts: int, **kwargs: Any) -> torch.Tensor:
    return segment.reshape(segment.shape[0] // counts, counts, *segment.shape[1:])


def unflatten_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    """Splitting a merged level back: ``unflatten(flatten(x, k), counts, k)`` is ``x``."""
    x = nested_randn(structure, (3,), gen, dtype, layout)
    levels = x.partition.levels
    out = [Sample("axis0", (ragged.flatten(x, 0), x.lengths), {"axis": 0}, lambda: tree(x))]
    for axis in range(1, x.ragged_ndim):
        counts = per_row(x, axis, levels[axis].lengths, levels[axis - 1].lengths.tolist())
        merged = ragged.flatten(x, axis)
        out.append(Sample(f"axis{axis}", (merged, counts), {"axis": axis}, lambda: tree(x)))
    return out


# --- local_index ------------------------------------------------------------------------------


def local_index_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [
        Sample("innermost", (x,)),
        Sample("axis1", (x,), {"axis": 1}),
        Sample("named", (x.rename(*NAMES),), {"axis": "seq"}),
    ]


def local_index_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = nested_randn(structure, (3,), gen, dtype, layout)
    positions = lambda items: [torch.tensor(i) for i in range(len(items))]
    return [
        Sample(f"axis{axis}", (x,), {"axis": axis}, lambda a=axis: along(x, a, positions))
        for axis in range(1, x.ragged_ndim + 1)
    ]


# --- combinations -----------------------------------------------------------------------------


def _tuples(length: int, n: int, replacement: bool) -> list[tuple[int, ...]]:
    pick = itertools.combinations_with_replacement if replacement else itertools.combinations
    return list(pick(range(length), n))


def combinations_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [
        Sample("pairs", (x, 2)),  # sizes from the partition's sum(L^2): no read
        Sample("pairs_replacement", (x, 2), {"replacement": True}),
        Sample("single", (x, 1)),
        Sample("named", (x.rename(*NAMES), 2), {"axis": "seq"}),
    ]


def combinations_read_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    unknown = ragged.from_lengths(
        x.values, torch.tensor(lengths, dtype=torch.int64), validate=False
    )
    return [Sample("triples", (x, 3)), Sample("pairs_unknown_squares", (unknown, 2))]


def combinations_reference(
    segment: torch.Tensor, n: int, axis: Any = 1, replacement: bool = False
) -> tuple[torch.Tensor, ...]:
    tuples = _tuples(segment.shape[0], n, replacement)
    return tuple(segment[[t[j] for t in tuples]] for j in range(n))


def combinations_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = nested_randn(structure, (3,), gen, dtype, layout)
    out = []
    for axis in range(1, x.ragged_ndim):
        for n, replacement in ((2, False), (3, False), (2, True)):

            def expected(a: int = axis, n: int = n, r: bool = replacement) -> Any:
                return [
                    along(x, a, lambda items, j=j: [items[t[j]] for t in _tuples(len(items), n, r)])
                    for j in range(n)
                ]

            kw = {"axis": axis, "replacement": replacement}
            out.append(Sample(f"axis{axis}_n{n}_{replacement}", (x, n), kw, expected))
    return out


# --- errors -----------------------------------------------------------------------------------

_X = ragged.array([[1.0, 2.0], [3.0]])
_D = ragged.array([[[1.0, 2.0], [3.0]], [[4.0]]])  # (2, [2, 1], [[2, 1], [1]])
_N = _X.rename("batch", "seq")

FLATTEN_ERRORS = [
    ErrorCase(
        lambda: ragged.flatten(_X),
        ValueError,
        "ragged.flatten: `axis` must have an axis after it to merge with (at most 0), got 1.",
    ),
    ErrorCase(
        lambda: ragged.flatten(_X.values),
        TypeError,
        "ragged.flatten: `x` must be a RaggedArray, got Tensor(shape=(3,), dtype=torch.float32).",
    ),
]

UNFLATTEN_ERRORS = [
    ErrorCase(
        lambda: ragged.unflatten(_X, ragged.array([[1], [1]])),
        ValueError,
        "ragged.unflatten: `counts` must be non-negative and sum to the length of every row of "
        "axis 1, got other sums.",
    ),
    ErrorCase(
        lambda: ragged.unflatten(_X, ragged.array([[1.0], [1.0]])),
        TypeError,
        "ragged.unflatten: `counts` must have an integer dtype, got torch.float32.",
    ),
    ErrorCase(
        lambda: ragged.unflatten(_D, 2, axis=1),
        ValueError,
        "ragged.unflatten: `counts` can be an int only for the innermost ragged axis 2, and "
        "positive (rows of a new dense axis), got 2 for axis 1.",
    ),
    ErrorCase(
        lambda: ragged.unflatten(_X, 2),
        ValueError,
        "ragged.unflatten: `counts` must divide the length of every row of the innermost axis, "
        "got 2.",
    ),
    ErrorCase(
        lambda: ragged.unflatten(_N, ragged.array([[2], [1]])),
        TypeError,
        "ragged.unflatten: `name` must name the new axis of a named array, got None.",
    ),
    ErrorCase(
        lambda: ragged.unflatten(_X, torch.tensor([3]), axis=0),
        ValueError,
        "ragged.unflatten: `counts` must be non-negative and sum to 2 (B), got other sums.",
    ),
    ErrorCase(
        lambda: ragged.unflatten(_X, ragged.array([[[2]], [[1]]], ragged_ndim=2)),
        ValueError,
        "ragged.unflatten: `counts` must have 1 ragged axes and no inner axes (group sizes per "
        "row of axis 0), got 2 ragged axes, 3 axes.",
    ),
]

LOCAL_INDEX_ERRORS = [
    ErrorCase(
        lambda: ragged.local_index(_D, axis=0),
        ValueError,
        "ragged.local_index: `axis` must be a ragged axis (1 to 2, or a name), got 0.",
    ),
]

COMBINATIONS_ERRORS = [
    ErrorCase(
        lambda: ragged.combinations(_X, 0),
        ValueError,
        "ragged.combinations: `n` must be an int >= 1, got 0.",
    ),
    ErrorCase(
        lambda: ragged.combinations(_X, 2, replacement=1),
        TypeError,
        "ragged.combinations: `replacement` must be a bool, got int.",
    ),
    ErrorCase(
        lambda: ragged.combinations(_X, 2, axis=0),
        ValueError,
        "ragged.combinations: `axis` must be a ragged axis (1 to 1, or a name), got 0.",
    ),
]

NO_GRAD = {"grad": False, "gradgrad": False, "forward_ad": False}

OPS = [
    OpInfo(
        "flatten",
        ragged.flatten,
        flatten_reference,
        flatten_samples,
        errors=FLATTEN_ERRORS,
        levels=flatten_levels,
    ),
    OpInfo(
        "unflatten",
        ragged.unflatten,
        unflatten_reference,
        unflatten_samples,
        errors=UNFLATTEN_ERRORS,
        levels=unflatten_levels,
        compile=True,  # the check reads one flag in eager mode only
    ),
    OpInfo(
        "unflatten",
        ragged.unflatten,
        unflatten_reference,
        unflatten_checked_samples,
        data_dependent=True,  # the check reads one flag (not under torch.compile)
        variant="checked",
    ),
    OpInfo(
        "local_index",
        ragged.local_index,
        lambda segment, axis=None: torch.arange(segment.shape[0]),
        local_index_samples,
        errors=LOCAL_INDEX_ERRORS,
        levels=local_index_levels,
        **NO_GRAD,
    ),
    OpInfo(
        "combinations",
        ragged.combinations,
        combinations_reference,
        combinations_samples,
        errors=COMBINATIONS_ERRORS,
        levels=combinations_levels,
        levels_compile=False,  # whole rows along an outer axis: their sizes are read
    ),
    OpInfo(
        "combinations",
        ragged.combinations,
        combinations_reference,
        combinations_read_samples,
        data_dependent=True,  # the output size is read once
        variant="read",
    ),
]
