"""Op table entries: reductions (``ragged.ops._reductions._reduce``)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

import ragged

from . import ErrorCase, OpInfo, Sample, axis_errors, ragged_randn
from .nested import nested_randn, reduce_axes, tree

NAMES = ("batch", "seq", "feat")


def segment_dims(axis: Any) -> tuple[int, ...]:
    """Array axes of a one-level ``(B, L*, D)`` sample -> dims of one ``(L, D)`` segment."""
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    dims = []
    for a in items:
        if isinstance(a, str):
            a = NAMES.index(a)
        dims.append(a - 1 if a >= 0 else a + 2)  # segment ndim = array ndim - 1
    return tuple(sorted(dims))


def reduction_reference(fn: Any, empty: Any) -> Any:
    """Per-segment reference of a reduction ``fn(segment, dims, keepdims, **kw)``."""

    def reference(
        segment: torch.Tensor,
        axis: Any = None,
        keepdims: bool = False,
        fill_value: Any = None,
        **kw: Any,
    ) -> torch.Tensor:
        dims = segment_dims(axis)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns on var/std with too few values
            if segment.shape[0] or 0 not in dims:
                return fn(segment, dims, keepdims, **kw)
            probe = fn(
                torch.ones((1, *segment.shape[1:]), dtype=segment.dtype), dims, keepdims, **kw
            )
        value = empty if fill_value is None else fill_value
        return torch.full(probe.shape, value, dtype=probe.dtype)

    return reference


def standard_samples(
    *, fill: Any = -3.0, extra: dict[str, Any] | None = None, inputs: str = "float"
) -> Any:
    extra = extra or {}

    def samples(
        lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        if inputs == "float":
            x = ragged_randn(lengths, (3,), gen, dtype, layout)
        else:  # integer-valued floats, so that zeros occur
            x = ragged_randn(lengths, (3,), gen, dtype, layout)
            x = x.with_values((x.values * 1.5).round().clamp(-1, 1))
        named = x.rename(*NAMES)
        out = [
            Sample("ragged", (x,), {"axis": 1, **extra}),
            Sample("ragged_keepdims", (x,), {"axis": 1, "keepdims": True, **extra}),
            Sample("inner", (x,), {"axis": -1, **extra}),
            Sample("ragged_inner", (x,), {"axis": (1, 2), **extra}),
            Sample("named", (named,), {"axis": "seq", **extra}),
        ]
        if fill is not None:
            out.append(Sample("fill", (x,), {"axis": 1, "fill_value": fill, **extra}))
        return out

    return samples


def _axis_sets(nr: int) -> list[tuple[int, ...]]:
    """Reduced axes along outer ragged axes of an ``nr``-level ``(B, ..., D)`` array."""
    inner = nr + 1
    sets = [(1,), (1, inner), tuple(range(1, nr + 1))]
    if nr == 3:
        sets += [(2,), (1, 2), (1, 3), (2, 3), (2, inner)]
    return sets


def reduction_levels(
    reference: Any, *, fill: Any = -3.0, extra: dict[str, Any] | None = None, inputs: str = "float"
) -> Any:
    """Reductions over sets of ragged axes with an outer one: the nested reference reduces
    every group (the rows that agree on the kept coordinates, kept axes aligned left) with the
    one-level ``reference``."""
    extra = extra or {}

    def samples(
        structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        x = nested_randn(structure, (3,), gen, dtype, layout)
        if inputs != "float":
            x = x.with_values((x.values * 1.5).round().clamp(-1, 1))
        nr = x.ragged_ndim
        out = []
        for axes in _axis_sets(nr):
            ragged_axes = {a for a in axes if a <= nr}
            dims = (1, *[a - nr + 1 for a in axes if a > nr])  # the same axes of one group
            kw = {"axis": axes, **extra}
            if fill is not None and axes == (1,):
                kw["fill_value"] = fill

            def group(rows: list[Any], dims: Any = dims, kw: Any = kw) -> Any:
                stacked = torch.stack([r for _, r in rows]) if rows else x.values[:0]
                call = {k: v for k, v in kw.items() if k != "axis"}
                return reference(stacked, axis=dims, **call)

            def expected(ragged_axes: Any = ragged_axes, group: Any = group) -> Any:
                return [reduce_axes(s, nr, ragged_axes, group) for s in tree(x)]

            out.append(Sample(f"axes{axes}", (x,), kw, expected=expected))
        return out

    return samples


BATCH_REDUCE = (
    "`axis` cannot reduce the batch axis without the ragged axis: segments have different "
    "lengths, so there is no common row to reduce into (reduce axes (0, 1) together for a "
    "global reduction, or the ragged axis 1 first), got 0."
)


def errors(op: Any, name: str) -> list[ErrorCase]:
    x = ragged.array([[1.0, 2.0], [3.0]])
    return [
        *axis_errors(op, name, batch=BATCH_REDUCE),
        ErrorCase(
            lambda: op(x, axis="seq"),
            ValueError,
            f"ragged.{name}: `axis` can be a name only for a named array, got 'seq'.",
        ),
    ]


def float_error(op: Any, name: str) -> ErrorCase:
    return ErrorCase(
        lambda: op(ragged.array([[1, 2]]), axis=1),
        TypeError,
        f"ragged.{name}: `x` must have a floating-point dtype, got torch.int64.",
    )


def _prod(t: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        t = torch.prod(t, d, keepdim=keep)
    return t


def _bool(op: Any) -> Any:
    def fn(t: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
        out = t != 0
        for d in sorted(dims, reverse=True):
            out = op(out, d, keepdim=keep)
        return out

    return fn


def entry(
    name: str,
    fn: Any,
    empty: Any,
    *,
    float_only: bool = True,
    nan_policy: str = "propagate",
    **kw: Any,
) -> OpInfo:
    op = getattr(ragged, name)
    errs = errors(op, name) + ([float_error(op, name)] if float_only else [])
    samples = kw.pop("samples", standard_samples())
    reference = reduction_reference(fn, empty)
    levels = reduction_levels(reference, **kw.pop("levels", {}))
    return OpInfo(
        name,
        op,
        reference,
        samples,
        errors=errs,
        levels=levels,
        # A kept axis after a reduced one (axis 1 of a nested array) reads the result's sizes.
        levels_compile=False,
        nan_policy=nan_policy,
        identity=empty,
        **kw,
    )


def _norm(ord: float) -> Any:
    return lambda t, d, k: torch.linalg.vector_norm(t, ord, d, keepdim=k)


OPS = [
    entry(
        "sum", lambda t, d, k: torch.sum(t, d, keepdim=k), 0, float_only=False, long_segment=True
    ),
    entry("mean", lambda t, d, k: torch.mean(t, d, keepdim=k), math.nan, long_segment=True),
    entry(
        "nansum",
        lambda t, d, k: torch.nansum(t, d, keepdim=k),
        0,
        nan_policy="omit",
        long_segment=True,
    ),
    entry(
        "nanmean",
        lambda t, d, k: torch.nanmean(t, d, keepdim=k),
        math.nan,
        nan_policy="omit",
        long_segment=True,
    ),
    entry("prod", _prod, 1, float_only=False),
    entry("amax", lambda t, d, k: torch.amax(t, d, keepdim=k), -math.inf, float_only=False),
    entry("amin", lambda t, d, k: torch.amin(t, d, keepdim=k), math.inf, float_only=False),
    entry("max", lambda t, d, k: torch.amax(t, d, keepdim=k), -math.inf, float_only=False),
    entry("min", lambda t, d, k: torch.amin(t, d, keepdim=k), math.inf, float_only=False),
    entry(
        "logsumexp",
        lambda t, d, k: torch.logsumexp(t, d, keepdim=k),
        -math.inf,
        long_segment=True,
    ),
    entry(
        "var",
        lambda t, d, k, correction=1: torch.var(t, d, correction=correction, keepdim=k),
        math.nan,
        long_segment=True,
    ),
    entry(
        "var",
        lambda t, d, k, correction=1: torch.var(t, d, correction=correction, keepdim=k),
        math.nan,
        samples=standard_samples(extra={"correction": 0}),
        levels={"extra": {"correction": 0}},
        variant="correction0",
        long_segment=True,
    ),
    entry(
        "std",
        lambda t, d, k, correction=1: torch.std(t, d, correction=correction, keepdim=k),
        math.nan,
        samples=standard_samples(extra={"correction": 0}),
        long_segment=True,
        levels={"extra": {"correction": 0}},
    ),
    *[
        OpInfo(
            "norm",
            lambda x, ord=o, **kw: ragged.norm(x, ord, **kw),
            reduction_reference(_norm(o), 0.0),
            standard_samples(),
            gradgrad=o not in (1, math.inf),
            long_segment=True,
            variant=f"ord{o}",
            levels=reduction_levels(reduction_reference(_norm(o), 0.0)),
            levels_compile=False,
            nan_policy="propagate",
            identity=0.0,
        )
        for o in (2, 1, math.inf, 3)
    ],
    entry(
        "any",
        _bool(torch.any),
        False,
        float_only=False,
        grad=False,
        samples=standard_samples(fill=None, inputs="ints"),
        levels={"fill": None, "inputs": "ints"},
        nan_policy="value",  # NaN is nonzero: true, counted
    ),
    entry(
        "all",
        _bool(torch.all),
        True,
        float_only=False,
        grad=False,
        samples=standard_samples(fill=None, inputs="ints"),
        levels={"fill": None, "inputs": "ints"},
        nan_policy="value",  # NaN is nonzero: true, counted
    ),
    entry(
        "count_nonzero",
        lambda t, d, k: torch.sum(t != 0, d, keepdim=k),
        0,
        float_only=False,
        grad=False,
        samples=standard_samples(fill=None, inputs="ints"),
        levels={"fill": None, "inputs": "ints"},
        nan_policy="value",  # NaN is nonzero: true, counted
    ),
]


def _arg_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    x = x.with_values((x.values * 1.5).round())  # ties occur: the first index must win
    return [
        Sample("ragged", (x,), {"axis": 1}),
        Sample("ragged_keepdims", (x,), {"axis": 1, "keepdims": True}),
        Sample("inner", (x,), {"axis": 2}),
        Sample("fill", (x,), {"axis": 1, "fill_value": 99}),
    ]


def _arg_reference(largest: bool) -> Any:
    def reference(
        segment: torch.Tensor, axis: Any, keepdims: bool = False, fill_value: Any = None
    ) -> torch.Tensor:
        dim = axis - 1
        if dim == 0 and segment.shape[0] == 0:
            shape = (1, *segment.shape[1:]) if keepdims else segment.shape[1:]
            return torch.full(shape, -1 if fill_value is None else fill_value, dtype=torch.int64)
        # first occurrence of the extreme value (torch.argmax's tie rule is unspecified)
        best = segment.amax(dim, keepdim=True) if largest else segment.amin(dim, keepdim=True)
        # NaN is the extreme where it occurs (torch.argmax points at the first NaN)
        hit = (segment == best) | (torch.isnan(segment) & torch.isnan(best))
        index = torch.arange(segment.shape[dim]).view(-1, *[1] * (segment.dim() - 1 - dim))
        first = torch.where(hit, index, segment.shape[dim]).amin(dim, keepdim=keepdims)
        return first

    return reference


def _arg_levels(largest: bool) -> Any:
    """argmax/argmin along an outer axis: the position along the axis (the row's index, not
    the rank within its column) of the first extreme of every column."""

    def samples(
        structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        x = nested_randn(structure, (3,), gen, dtype, layout)
        x = x.with_values((x.values * 1.5).round())  # ties: the first position must win
        nr = x.ragged_ndim
        out = []
        for axis in range(1, nr):

            def group(rows: list[Any], axis: int = axis) -> Any:
                if not rows:
                    return torch.full((3,), 99, dtype=torch.int64)
                leaves = torch.stack([r for _, r in rows])
                best = leaves.amax(0) if largest else leaves.amin(0)
                position = torch.tensor([c[axis - 1] for c, _ in rows])[:, None]
                return torch.where(leaves == best, position, 1 << 40).amin(0)

            def expected(axis: int = axis, group: Any = group) -> Any:
                return [reduce_axes(s, nr, {axis}, group) for s in tree(x)]

            out.append(Sample(f"axis{axis}", (x,), {"axis": axis, "fill_value": 99}, expected))
        return out

    return samples


for _name, _largest in (("argmax", True), ("argmin", False)):
    OPS.append(
        OpInfo(
            _name,
            getattr(ragged, _name),
            _arg_reference(_largest),
            _arg_samples,
            grad=False,
            gradgrad=False,
            forward_ad=False,
            levels=_arg_levels(_largest),
            levels_compile=False,
            nan_policy="value",  # the index of the first NaN (tests/test_nan.py)
            identity=-1,
            errors=[
                ErrorCase(
                    lambda op=getattr(ragged, _name): op(ragged.array([[1.0]]), axis=0),
                    ValueError,
                    f"ragged.{_name}: `axis` cannot be the batch axis (segments differ in length), got 0.",
                )
            ],
        )
    )


def _count_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [Sample("rows", (x,)), Sample("named", (x.rename(*NAMES),))]


OPS.append(
    OpInfo(
        "count",
        ragged.count,
        lambda segment: torch.tensor(segment.shape[0]),
        _count_samples,
        lift=False,
        levels=lambda structure, gen, dtype, layout: [
            Sample(
                "rows",
                (x := nested_randn(structure, (3,), gen, dtype, layout),),
                expected=lambda: [torch.tensor(len(s)) for s in tree(x)],
            )
        ],
        levels_reason="counts the rows of axis 1 (the segments' lengths), not of every row",
        grad=False,
        gradgrad=False,
        forward_ad=False,
        errors=[
            ErrorCase(
                lambda: ragged.count(torch.ones(2)),
                TypeError,
                "ragged.count: `x` must be a RaggedArray, got Tensor.",
            )
        ],
    )
)
