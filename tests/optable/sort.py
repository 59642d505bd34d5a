"""Op table entries: sorting ops (``ragged.ops._sort``).

References are per-segment ``torch.sort(..., stable=True)`` / ``torch.topk`` /
``torch.unique_consecutive``. Samples with ties, NaNs and signed zeros check the exact stable
order (descending included); they skip gradcheck, since sorting is not differentiable where
values tie. ``topk``'s continuous samples compare against ``torch.topk`` itself.
"""

from __future__ import annotations

from typing import Any

import torch

import ragged

from . import ErrorCase, OpInfo, Sample, ragged_randn
from .combine import NAMES, segment_dim
from .nested import along, along_columns, column_levels, nested_randn, ragged_axes, subtrees_equal

NO_GRAD = {"grad": False, "gradgrad": False, "forward_ad": False}


def _ties(x: ragged.RaggedArray, gen: torch.Generator) -> ragged.RaggedArray:
    """Rounded values (many ties), some NaNs, ``-0.0`` next to ``0.0``, infinities."""
    v = (x.values * 1.5).round()
    draw = torch.rand(v.shape, generator=gen, dtype=torch.float64)
    v = torch.where(draw < 0.1, torch.nan, v)
    v = torch.where((draw >= 0.1) & (draw < 0.2), -0.0, v)
    v = torch.where((draw >= 0.2) & (draw < 0.25), -torch.inf, v)
    return x.with_values(v.to(x.dtype))


def _ties_seeded(x: ragged.RaggedArray) -> ragged.RaggedArray:
    return _ties(x, torch.Generator().manual_seed(1))


def sort_samples(ties: bool) -> Any:
    def samples(
        lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        x = ragged_randn(lengths, (3,), gen, dtype, layout)
        flat = ragged_randn(lengths, (), gen, dtype, layout)
        square = ragged_randn(lengths, (2, 2), gen, dtype, layout)
        if ties:
            x, flat, square = _ties(x, gen), _ties(flat, gen), _ties(square, gen)
        out = [
            Sample("ragged", (x,), {}),
            Sample("descending", (x,), {"axis": 1, "descending": True}),
            Sample("flat", (flat,), {"axis": 1}),
            Sample("flat_descending", (flat,), {"descending": True}),
            Sample("square", (square,), {"axis": -3}),
            Sample("inner", (x,), {"axis": -1, "descending": True}),
            Sample("named", (x.rename(*NAMES),), {"axis": "seq", "stable": False}),
        ]
        if ties:
            as_float32 = x.to(torch.float32)  # the combined-key path (float64 takes two sorts)
            out += [
                Sample("float32", (as_float32,), {}),
                Sample("float32_descending", (as_float32,), {"descending": True}),
                Sample("ints", (x.with_values(x.values.nan_to_num(0).clamp(-9, 9).long()),), {}),
            ]
        return out

    return samples


def _sort_reference(indices: bool) -> Any:
    def reference(
        segment: torch.Tensor, axis: Any = 1, descending: bool = False, stable: bool = True
    ) -> torch.Tensor:
        out = torch.sort(segment, dim=segment_dim(axis), descending=descending, stable=True)
        return out.indices if indices else out.values

    return reference


def _unknown_max(x: ragged.RaggedArray) -> ragged.RaggedArray:
    """``x`` with a partition that does not know its maximum length."""
    lengths = torch.tensor(x.lengths.tolist(), dtype=torch.int64)
    return ragged.from_lengths(x.values, lengths, validate=False)


def topk_samples(ties: bool) -> Any:
    def samples(
        lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        x = ragged_randn(lengths, (3,), gen, dtype, layout)
        flat = ragged_randn(lengths, (), gen, dtype, layout)
        if ties:
            x, flat = _ties(x, gen), _ties(flat, gen)
        return [
            Sample("k2", (x, 2), {}),
            Sample("k1_smallest", (x, 1), {"largest": False}),
            Sample("k0", (x, 0), {}),
            Sample("k_long", (flat, 4), {"sorted": False}),
            Sample("known_max", (x, 100), {}),  # max_length known <= k: a full sort, no sync
            Sample("unknown_max", (_unknown_max(x), 100), {}),
            Sample("inner", (x, 2), {"axis": 2, "largest": False}),
            Sample("inner_k_over", (x, 5), {"axis": -1}),
            Sample("named", (x.rename(*NAMES), 3), {"axis": "seq"}),
        ]

    return samples


def _topk_reference(stable_ties: bool) -> Any:
    def reference(
        segment: torch.Tensor, k: int, axis: Any = 1, largest: bool = True, sorted: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dim = segment_dim(axis)
        size = min(k, segment.shape[dim])
        if stable_ties:  # the documented order: the first min(k, L) of a stable sort
            out = torch.sort(segment, dim=dim, descending=largest, stable=True)
            return out.values.narrow(dim, 0, size), out.indices.narrow(dim, 0, size)
        out = torch.topk(segment, size, dim=dim, largest=largest, sorted=True)
        return out.values, out.indices

    return reference


def unique_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    def runs(inner: tuple[int, ...], dtype_: torch.dtype) -> ragged.RaggedArray:
        x = ragged_randn(lengths, inner, gen, dtype, layout)
        return x.with_values((x.values > 0.3).to(dtype_))  # few distinct values: long runs

    flat = runs((), dtype)
    return [
        Sample("flat", (flat,), {}),
        Sample("counts", (flat,), {"return_counts": True}),
        Sample("inverse_counts", (flat,), {"return_inverse": True, "return_counts": True}),
        Sample("rows", (runs((2,), dtype),), {"return_inverse": True}),
        Sample("ints", (runs((), torch.int64),), {"return_counts": True}),
        Sample("nan", (flat.with_values(flat.values * torch.nan),), {"return_counts": True}),
        Sample("named", (flat.rename("batch", "seq"),), {"axis": "seq"}),
    ]


def _unique_reference(
    segment: torch.Tensor, axis: Any = 1, return_inverse: bool = False, return_counts: bool = False
) -> Any:
    return torch.unique_consecutive(
        segment, return_inverse=return_inverse, return_counts=return_counts, dim=0
    )


def _argsort_column(descending: bool) -> Any:
    """argsort of one column: the rows' positions along the axis (not ranks in the column)."""

    def fn(column: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
        order = torch.sort(column, dim=0, descending=descending, stable=True).indices
        return members[order]

    return fn


def argsort_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = _ties(nested_randn(structure, (3,), gen, dtype, layout), gen)
    out = []
    for axis in ragged_axes(structure):
        for descending in (False, True):
            out.append(
                Sample(
                    f"axis{axis}_{descending}",
                    (x,),
                    {"axis": axis, "descending": descending},
                    expected=lambda a=axis, d=descending: along_columns(
                        x, a, _argsort_column(d), members=True
                    ),
                )
            )
    return out


def topk_levels(ties: bool) -> Any:
    """topk along an outer axis: the first ``k`` rows of the column-wise sort (and argsort)."""

    def samples(
        structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        x = nested_randn(structure, (3,), gen, dtype, layout)
        x = _ties(x, gen) if ties else x
        out = []
        for axis in ragged_axes(structure):
            for k, largest in ((1, True), (2, False), (100, True)):

                def expected(a: int = axis, k: int = k, largest: bool = largest) -> Any:
                    values = along_columns(
                        x, a, lambda c: torch.sort(c, dim=0, descending=largest, stable=True).values
                    )
                    index = along_columns(x, a, _argsort_column(largest), members=True)
                    cut = lambda rows: rows[:k]
                    return [_at(values, a - 1, cut), _at(index, a - 1, cut)]

                out.append(
                    Sample(f"axis{axis}_k{k}", (x, k), {"axis": axis, "largest": largest}, expected)
                )
        return out

    return samples


def _at(segments: list[Any], depth: int, fn: Any) -> list[Any]:
    if depth == 0:
        return [fn(s) for s in segments]
    return [_at(s, depth - 1, fn) for s in segments]


def _run_lengths(heads: list[int], total: int) -> list[torch.Tensor]:
    ends = [*heads[1:], total] if heads else []
    return [torch.tensor(e - h) for h, e in zip(heads, ends, strict=True)]


def unique_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    """Runs of equal whole rows (equal subtrees) along an outer axis."""
    x = nested_randn(structure, (), gen, dtype, layout)
    x = x.with_values((x.values > 0.3).to(dtype))  # few distinct values: repeated rows occur
    out = []
    for axis in ragged_axes(structure):

        def heads(items: list[Any]) -> list[int]:
            return [
                i for i in range(len(items)) if i == 0 or not subtrees_equal(items[i], items[i - 1])
            ]

        def expected(a: int = axis) -> Any:
            kept = along(x, a, lambda items: [items[i] for i in heads(items)])
            inverse = along(
                x,
                a,
                lambda items: [
                    torch.tensor(sum(h <= i for h in heads(items)) - 1) for i in range(len(items))
                ],
            )
            counts = along(x, a, lambda items: _run_lengths(heads(items), len(items)))
            return [kept, inverse, counts]

        kw = {"axis": axis, "return_inverse": True, "return_counts": True}
        out.append(Sample(f"axis{axis}", (x,), kw, expected))
    return out


def _errors(name: str) -> list[ErrorCase]:
    op = getattr(ragged, name)
    func = f"ragged.{name}"
    x = ragged.array([[1.0, 2.0], [3.0]])
    args: tuple[Any, ...] = (1,) if name == "topk" else ()
    out = [
        ErrorCase(
            lambda: op(x, *args, axis=0),
            ValueError,
            f"{func}: `axis` cannot be the batch axis (sort within segments: axis 1), got 0.",
        ),
        ErrorCase(
            lambda: op(ragged.array([[1j, 2j]]), *args),
            TypeError,
            f"{func}: `x` must have a dtype among torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, got torch.complex64.",
        ),
        ErrorCase(
            lambda: op(x.values, *args),
            TypeError,
            f"{func}: `x` must be a RaggedArray, got Tensor(shape=(3,), dtype=torch.float32).",
        ),
        ErrorCase(
            lambda: op(x, *args, axis=2), ValueError, f"{func}: `axis` must be in [-2, 2), got 2."
        ),
    ]
    flag = "largest" if name == "topk" else "descending"
    out.append(
        ErrorCase(
            lambda: op(x, *args, **{flag: 1}),
            TypeError,
            f"{func}: `{flag}` must be a bool, got int.",
        )
    )
    if name == "topk":
        out += [
            ErrorCase(
                lambda: ragged.topk(x, -1),
                ValueError,
                "ragged.topk: `k` must be a non-negative int, got -1.",
            ),
            ErrorCase(
                lambda: ragged.topk(x, 1.5),
                ValueError,
                "ragged.topk: `k` must be a non-negative int, got 1.5.",
            ),
        ]
    return out


_UNIQUE_ERRORS = [
    ErrorCase(
        lambda: ragged.unique_consecutive(ragged.array([[[1.0]], [[2.0]]]), axis=2),
        ValueError,
        "ragged.unique_consecutive: `axis` must be a ragged axis (1 to 1: runs are collapsed within the rows of the axis above), got 2.",
    ),
    ErrorCase(
        lambda: ragged.unique_consecutive(torch.ones(3)),
        TypeError,
        "ragged.unique_consecutive: `x` must be a RaggedArray, got Tensor(shape=(3,), dtype=torch.float32).",
    ),
    ErrorCase(
        lambda: ragged.unique_consecutive(ragged.array([[1.0]]), return_counts=None),
        TypeError,
        "ragged.unique_consecutive: `return_counts` must be a bool, got NoneType.",
    ),
]

OPS = [
    OpInfo(
        "sort",
        ragged.sort,
        _sort_reference(indices=False),
        sort_samples(ties=False),
        errors=_errors("sort"),
        levels=column_levels(_sort_reference(indices=False), [{}, {"descending": True}]),
    ),
    OpInfo(
        "sort",
        ragged.sort,
        _sort_reference(indices=False),
        sort_samples(ties=True),
        variant="ties",
        levels=column_levels(
            _sort_reference(indices=False), [{}, {"descending": True}], prepare=_ties_seeded
        ),
        **NO_GRAD,
    ),
    OpInfo(
        "argsort",
        ragged.argsort,
        _sort_reference(indices=True),
        sort_samples(ties=True),
        errors=_errors("argsort"),
        levels=argsort_levels,
        **NO_GRAD,
    ),
    OpInfo(
        "topk",
        ragged.topk,
        _topk_reference(stable_ties=False),
        topk_samples(ties=False),
        compile=False,  # the output size depends on the lengths: one documented sync
        data_dependent=True,
        errors=_errors("topk"),
        levels=topk_levels(ties=False),
    ),
    OpInfo(
        "topk",
        ragged.topk,
        _topk_reference(stable_ties=True),
        topk_samples(ties=True),
        compile=False,
        data_dependent=True,
        variant="ties",
        levels=topk_levels(ties=True),
        **NO_GRAD,
    ),
    OpInfo(
        "unique_consecutive",
        ragged.unique_consecutive,
        _unique_reference,
        unique_samples,
        levels=unique_levels,
        vmap=False,  # the output size depends on the values
        compile=False,
        data_dependent=True,
        errors=_UNIQUE_ERRORS,
        **NO_GRAD,
    ),
]
