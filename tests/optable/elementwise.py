"""Op table entries: elementwise ops (``ragged.ops._elementwise``)."""

from __future__ import annotations

from typing import Any

import torch

import ragged

from . import ErrorCase, OpInfo, PerSegment, Sample, ragged_randn, randn
from .nested import coordinates, map_coords, nested_randn, tree


def binary_samples(*, positive: bool = False, exponent: bool = False) -> Any:
    def samples(
        lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        x = ragged_randn(lengths, (3,), gen, dtype, layout)
        y = ragged_randn(lengths, (3,), gen, dtype)
        if positive:
            x = x.with_values(x.values.abs() + 0.5)
            y = y.with_values(y.values.abs() + 0.5)
        twin = ragged.from_lengths(y.values, lengths)  # equal-valued, distinct partition object
        b = len(lengths)
        scalar = 2.0 if exponent else 1.5

        def dense(shape: tuple[int, ...]) -> torch.Tensor:
            t = randn(shape, gen, dtype)
            return t.abs() + 0.5 if positive else t

        return [
            Sample("ragged_ragged", (x, x.with_values(y.values))),
            Sample("ragged_scalar", (x, scalar)),
            Sample("scalar_ragged", (scalar, x) if not exponent else (1.5, x)),
            Sample("ragged_dense_inner", (x, dense((3,)))),
            Sample("ragged_per_segment", (x, PerSegment(dense((b, 1, 3))))),
            Sample("ragged_per_segment_scalar", (x, PerSegment(dense((b, 1, 1))))),
            Sample("ragged_equal_partition", (x, twin)),
        ]

    return samples


def int_samples(*, bools: bool = False) -> Any:
    dtype_ = torch.bool if bools else torch.int64

    def samples(
        lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        x = ragged_randn(lengths, (2,), gen, dtype_, layout)
        y = ragged_randn(lengths, (2,), gen, dtype_)
        return [
            Sample("ragged_ragged", (x, x.with_values(y.values))),
            Sample("ragged_scalar", (x, True if bools else 3)),
            Sample("ragged_dense_inner", (x, randn((2,), gen, dtype_))),
        ]

    return samples


def unary_samples(dtype_override: torch.dtype | None = None) -> Any:
    def samples(
        lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
    ) -> list[Sample]:
        return [
            Sample("ragged", (ragged_randn(lengths, (3,), gen, dtype_override or dtype, layout),))
        ]

    return samples


def _errors(op: Any, name: str) -> list[ErrorCase]:
    x = ragged.array([[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]])
    y = ragged.array([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0]]])
    func = f"ragged.{name}"
    return [
        ErrorCase(
            lambda: op(x, torch.ones(2, 2)),
            ValueError,
            f"{func}: `other` of shape (2, 2) lines up its axis 0 with the ragged axis 1 of (2, [1, 2], 2), which needs size 1; for a per-segment operand write other[:, None, ...] (shape (B, 1, ...)), or name the axes of both operands.",
        ),
        ErrorCase(
            lambda: op(x, y),
            ValueError,
            f"{func}: the operands have different ragged structure: (2, [1, 2], 2) vs (2, [2, 1], 2); elementwise ops need equal partitions.",
        ),
        ErrorCase(
            lambda: op(x, torch.ones(3)),
            ValueError,
            f"{func}: inner shapes (2,) and (3,) do not broadcast ((2, [1, 2], 2) vs (3,)).",
        ),
        ErrorCase(
            lambda: op(x, torch.ones(3, 1, 2)),
            ValueError,
            f"{func}: `other` of shape (3, 1, 2) has 3 entries on the batch axis of (2, [1, 2], 2), expected 2 or 1.",
        ),
        ErrorCase(
            lambda: op(x, "a"),
            TypeError,
            f"{func}: `other` must be a RaggedArray, Tensor or number, got str.",
        ),
    ]


def binary(name: str, ref: Any, **kw: Any) -> OpInfo:
    op = getattr(ragged, name)
    samples = kw.pop("samples", binary_samples())
    return OpInfo(name, op, ref, samples, errors=_errors(op, name), **kw)


NO_GRAD = {"grad": False, "gradgrad": False, "forward_ad": False}


def tensors(op: Any) -> Any:
    """A reference taking numbers on either side (torch ops want a tensor first)."""

    def reference(a: Any, b: Any) -> torch.Tensor:
        like = a if isinstance(a, torch.Tensor) else b
        return op(torch.as_tensor(a, dtype=like.dtype), torch.as_tensor(b, dtype=like.dtype))

    return reference


def keepdims_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    """``x - sum(x, axes, keepdims=True)``: a keepdims result broadcasts back against ``x``
    (size-1 levels and size-1 inner axes line up with the reduced ragged axes)."""
    x = nested_randn(structure, (3,), gen, dtype, layout)
    nr = x.ragged_ndim
    sets = [(nr,), (1,), tuple(range(1, nr + 1))] + ([(2,), (1, 3)] if nr == 3 else [])
    out = []
    for axes in sets:
        kept = ragged.sum(x, axis=axes, keepdims=True)

        def expected(axes: tuple[int, ...] = axes) -> Any:
            result = []
            for segment in tree(x):
                totals: dict[tuple[int, ...], torch.Tensor] = {}
                for coords, leaf in coordinates(segment):
                    if leaf is not None:
                        key = tuple(c for a, c in enumerate(coords, 1) if a not in axes)
                        totals[key] = totals.get(key, 0) + leaf
                result.append(
                    map_coords(
                        segment,
                        lambda c, leaf, t=totals: (
                            leaf - t[tuple(v for a, v in enumerate(c, 1) if a not in axes)]
                        ),
                    )
                )
            return result

        out.append(Sample(f"axes{axes}", (x, kept), expected=expected))
    return out


OPS = [
    binary("add", tensors(torch.add), nan_policy="propagate"),
    binary(
        "subtract",
        tensors(torch.sub),
        levels=keepdims_levels,
        levels_compile=False,
        nan_policy="propagate",
    ),
    binary("multiply", tensors(torch.mul), nan_policy="propagate"),
    binary(
        "divide",
        tensors(torch.true_divide),
        samples=binary_samples(positive=True),
        nan_policy="propagate",
    ),
    binary(
        "power",
        tensors(torch.pow),
        samples=binary_samples(positive=True, exponent=True),
        nan_policy="value",  # nan ** 0 and 1 ** nan are 1
    ),
    binary("maximum", tensors(torch.maximum), nan_policy="propagate"),
    binary("minimum", tensors(torch.minimum), nan_policy="propagate"),
    binary(
        "floor_divide",
        tensors(torch.floor_divide),
        samples=binary_samples(positive=True),
        nan_policy="propagate",
        **NO_GRAD,
    ),
    binary(
        "remainder",
        tensors(torch.remainder),
        samples=binary_samples(positive=True),
        nan_policy="propagate",
        **NO_GRAD,
    ),
    *[
        binary(n, tensors(getattr(torch, n)), nan_policy="value", **NO_GRAD)
        for n in ("eq", "ne", "lt", "le", "gt", "ge")
    ],
    *[
        binary(n, tensors(getattr(torch, n)), samples=int_samples(bools=True), **NO_GRAD)
        for n in ("logical_and", "logical_or", "logical_xor")
    ],
    *[
        binary(n, tensors(getattr(torch, n)), samples=int_samples(), **NO_GRAD)
        for n in ("bitwise_and", "bitwise_or", "bitwise_xor")
    ],
    OpInfo("negative", ragged.negative, torch.neg, unary_samples(), nan_policy="propagate"),
    OpInfo("abs", ragged.abs, torch.abs, unary_samples(), nan_policy="propagate"),
    OpInfo(
        "bitwise_not",
        ragged.bitwise_not,
        torch.bitwise_not,
        unary_samples(torch.int64),
        **NO_GRAD,
    ),
    OpInfo(
        "logical_not",
        ragged.logical_not,
        torch.logical_not,
        unary_samples(),
        **NO_GRAD,
    ),
]


def _where_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    y = ragged_randn(lengths, (3,), gen, dtype)
    cond = x > 0
    return [
        Sample("ragged_all", (cond, x, x.with_values(y.values))),
        Sample("ragged_scalar", (cond, x, 0.0)),
        Sample("dense_other", (cond, x, randn((3,), gen, dtype))),
    ]


OPS.append(
    OpInfo(
        "where",
        ragged.where,
        lambda c, a, b: torch.where(c, a, torch.as_tensor(b, dtype=torch.float64)),
        _where_samples,
    )
)


def _apply_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    return [
        Sample("sin", (torch.sin, x)),
        Sample("clamp_kwargs", (torch.clamp, x), {"min": -0.5}),
        Sample("binary_dense", (torch.atan2, x, randn((3,), gen, dtype))),
    ]


OPS.append(
    OpInfo(
        "apply",
        ragged.apply,
        lambda fn, *args, **kw: fn(*args, **kw),
        _apply_samples,
        errors=[
            ErrorCase(
                lambda: ragged.apply(lambda v: v.sum(0), ragged.array([[1.0, 2.0]])),
                ValueError,
                "ragged.apply: `fn` must return one row per value row (2), got shape ().",
            ),
            ErrorCase(
                lambda: ragged.apply(torch.sin, torch.ones(2)),
                TypeError,
                "ragged.apply: at least one positional argument must be a RaggedArray.",
            ),
        ],
    )
)
