"""Op table entries: linear algebra (``ragged.ops._linalg``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import ragged

from . import ErrorCase, OpInfo, PerSegment, Sample, ragged_randn, randn
from .nested import leaves, map_leaves, nested_randn, reduce_axes, tree


def _x(lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str, *inner: int):
    return ragged_randn(lengths, inner, gen, dtype, layout)


def matmul_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = _x(lengths, gen, dtype, layout, 3)
    x4 = _x(lengths, gen, dtype, layout, 2, 3)
    x5 = _x(lengths, gen, dtype, layout, 2, 2, 3)
    return [
        Sample("right_2d", (x, randn((3, 4), gen, dtype))),
        Sample("right_1d", (x, randn((3,), gen, dtype))),
        Sample("right_inner_matrix", (x4, randn((3, 4), gen, dtype))),
        Sample("right_batched", (x5, randn((2, 3, 4), gen, dtype))),
        Sample("right_named", (x.rename("batch", "seq", "feat"), randn((3, 4), gen, dtype))),
        Sample("left_2d", (randn((4, 2), gen, dtype), x4)),
        Sample("left_1d", (randn((2,), gen, dtype), x4)),
        Sample("left_batched", (randn((2, 4, 2), gen, dtype), x5)),
    ]


def linear_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = _x(lengths, gen, dtype, layout, 3)
    x4 = _x(lengths, gen, dtype, layout, 2, 3)
    return [
        Sample("bias", (x, randn((4, 3), gen, dtype), randn((4,), gen, dtype))),
        Sample("no_bias", (x, randn((4, 3), gen, dtype))),
        Sample("inner_matrix", (x4, randn((4, 3), gen, dtype), randn((4,), gen, dtype))),
        Sample("vector_weight", (x, randn((3,), gen, dtype))),
    ]


def einsum_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    b = len(lengths)
    x = _x(lengths, gen, dtype, layout, 3)
    y = x.with_values(randn((x.values.shape[0], 4), gen, dtype))
    x4 = _x(lengths, gen, dtype, layout, 2, 3)
    y4 = x4.with_values(randn((x4.values.shape[0], 2, 4), gen, dtype))
    return [
        Sample("rowwise", ("bld,de->ble", x, randn((3, 4), gen, dtype))),
        Sample("rowwise_two_ragged", ("bld,ble->bled", x, y)),
        Sample("per_segment_vector", ("bld,bd->bl", x, PerSegment(randn((b, 3), gen, dtype)))),
        Sample("per_segment_weight", ("bld,bde->ble", x, PerSegment(randn((b, 3, 4), gen, dtype)))),
        Sample("segment_sum", ("bld->bd", x)),
        Sample("segment_gram", ("bld,ble->bde", x, y)),
        Sample("segment_dot", ("bld,bd->b", x, PerSegment(randn((b, 3), gen, dtype)))),
        Sample("segment_heads", ("blhd,blhe->bhde", x4, y4)),
        Sample("ellipsis", ("bl...d,de->bl...e", x4, randn((3, 4), gen, dtype))),
        Sample(
            "named", ("bld,de->ble", x.rename("batch", "seq", "feat"), randn((3, 4), gen, dtype))
        ),
    ]


def einsum_levels(
    structure: list[list[int]], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    """Multi-level operands: one subscript per ragged axis; the dense contraction runs per row
    and dropped ragged subscripts are summed over (kept axes aligned left)."""
    x = nested_randn(structure, (3,), gen, dtype, layout)
    y = x.with_values(randn((x.values.shape[0], 2), gen, dtype))
    nr = x.ragged_ndim
    lead = "b" + "ijk"[:nr]
    w = randn((3, 4), gen, dtype)
    per_segment = randn((x.num_segments, 3), gen, dtype)
    segments = list(range(x.num_segments))

    def sums(axes: set[int], fn: Any, shape: tuple[int, ...]) -> Any:
        def group(rows: list[Any]) -> Any:
            terms = [fn(c, leaf) for c, leaf in rows]
            return torch.stack(terms).sum(0) if terms else torch.zeros(shape, dtype=dtype)

        return [reduce_axes(s, nr, axes, group) for s in tree(x)]

    def pairs(b: int) -> Any:  # (coords, x row, y row) of segment b
        return list(zip(leaves(tree(x)[b]), leaves(tree(y)[b]), strict=True))

    def gram(b: int) -> torch.Tensor:
        return sum((torch.outer(p, q) for p, q in pairs(b)), torch.zeros(3, 2, dtype=dtype))

    return [
        Sample(
            "rowwise",
            (f"{lead}d,de->{lead}e", x, w),
            expected=lambda: map_leaves(tree(x), lambda r: r @ w),
        ),
        Sample(
            "rowwise_per_segment",
            (f"{lead}d,bd->{lead}", x, per_segment),
            expected=lambda: [
                map_leaves(seg, lambda r, b=b: r @ per_segment[b])
                for b, seg in zip(segments, tree(x), strict=True)
            ],
        ),
        Sample(
            "drop_innermost",
            (f"{lead}d->{lead[:-1]}d", x),
            expected=lambda: sums({nr}, lambda c, r: r, (3,)),
        ),
        Sample(
            "drop_outer",
            (f"{lead}d->b{lead[2:]}d", x),
            expected=lambda: sums({1}, lambda c, r: r, (3,)),
        ),
        Sample(
            "segment_gram",
            (f"{lead}d,{lead}e->bde", x, y),
            expected=lambda: [gram(b) for b in segments],
        ),
        Sample(
            "all_rows",
            (f"{lead}d,de->e", x, w),
            expected=lambda: list((x.values @ w).sum(0)),
        ),
    ]


def einsum_reference(equation: str, *segments: torch.Tensor) -> torch.Tensor:
    """The same einsum on one segment: drop the batch subscript 'b' everywhere."""
    return torch.einsum(equation.replace("b", ""), *segments)


X = ragged.array([[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]])  # (2, [1, 2], 2)
X4 = ragged.from_lengths(torch.ones(3, 2, 2), [1, 2])  # (2, [1, 2], 2, 2)
Y = ragged.array([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0]]])  # (2, [2, 1], 2)

MATMUL_ERRORS = [
    ErrorCase(
        lambda: ragged.matmul(X, X),
        NotImplementedError,
        f"ragged.matmul: {ragged.ops._linalg._matmul.RAGGED_RIGHT}",
    ),
    ErrorCase(
        lambda: X @ torch.ones(3, 4),
        ValueError,
        "ragged.matmul: `b` must have size 2 on axis 0 to contract the last inner axis of (2, [1, 2], 2), got shape (3, 4).",
    ),
    ErrorCase(
        lambda: X @ torch.ones(2, 4, dtype=torch.float64),
        TypeError,
        "ragged.matmul: `b` must have the dtype of the RaggedArray (torch.float32), got torch.float64.",
    ),
    ErrorCase(
        lambda: X @ torch.ones(2, 2, 4),
        ValueError,
        "ragged.matmul: `b` must have at most 0 batch axes (they broadcast against the inner axes of (2, [1, 2], 2) before its last two and may not reach the ragged axis); for one weight per segment use ragged.einsum('bld,bde->ble', x, w), got shape (2, 2, 4).",
    ),
    ErrorCase(
        lambda: torch.ones(4, 1) @ X,  # torch hands `t @ X` to RaggedArray as Tensor.matmul
        ValueError,
        "torch.Tensor.matmul: `other` must have at least two inner axes when `input` is dense (a @ segment contracts the segment's second-to-last axis, which would be the ragged axis); for a row-wise product write ragged.matmul(b, a.mT), got (2, [1, 2], 2).",
    ),
    ErrorCase(
        lambda: torch.ones(4, 3) @ X4,  # torch hands `t @ X` to RaggedArray as Tensor.matmul
        ValueError,
        "torch.Tensor.matmul: `input` must have size 2 on its last axis to contract the second-to-last inner axis of (2, [1, 2], 2, 2), got shape (4, 3).",
    ),
    ErrorCase(
        lambda: ragged.matmul(ragged.array([[1.0], [2.0]]), torch.ones(1)),
        ValueError,
        "ragged.matmul: `a` must have at least one inner axis to contract, got (2, [1, 1]).",
    ),
    ErrorCase(
        lambda: X @ [[1.0]],
        TypeError,
        "ragged.matmul: `b` must be a Tensor (the other operand is ragged), got list.",
    ),
    ErrorCase(
        lambda: ragged.matmul(torch.ones(2), torch.ones(2)),
        TypeError,
        "ragged.matmul: one operand must be a RaggedArray, got Tensor and Tensor.",
    ),
]

LINEAR_ERRORS = [
    ErrorCase(
        lambda: ragged.linear(X, torch.ones(4, 3)),
        ValueError,
        "ragged.linear: `weight` must have in_features = 2 (the last axis of (2, [1, 2], 2)), got shape (4, 3).",
    ),
    ErrorCase(
        lambda: ragged.linear(X, torch.ones(1, 4, 2)),
        TypeError,
        "ragged.linear: `weight` must be a 1-D or 2-D Tensor (out_features, in_features), got Tensor(shape=(1, 4, 2), dtype=torch.float32).",
    ),
    ErrorCase(
        lambda: ragged.linear(X.values, torch.ones(4, 2)),
        TypeError,
        "ragged.linear: `x` must be a RaggedArray, got Tensor(shape=(3, 2), dtype=torch.float32).",
    ),
]


def _einsum_error(equation: str, *operands: Any) -> Any:
    return lambda: ragged.einsum(equation, *operands)


EINSUM_ERRORS = [
    ErrorCase(
        _einsum_error("bld", X),
        ValueError,
        "ragged.einsum: `equation` must give the output explicitly after one '->', got 'bld'.",
    ),
    ErrorCase(
        _einsum_error("bld->bl", X, X),
        ValueError,
        "ragged.einsum: `equation` must have one subscript term per operand (2 operands), got 'bld->bl'.",
    ),
    ErrorCase(
        _einsum_error("bl2->bl", X),
        ValueError,
        "ragged.einsum: `equation` operand 0 has the subscript '2'; subscripts are letters and at most one '...', got 'bl2->bl'.",
    ),
    ErrorCase(
        _einsum_error("b->b", X),
        ValueError,
        "ragged.einsum: `equation` operand 0 is a RaggedArray: its first two subscripts must be letters for its batch and ragged axes, got 'b' in, got 'b->b'.",
    ),
    ErrorCase(
        _einsum_error("bld,ble->bde", X, Y.with_values(Y.values)),
        ValueError,
        "ragged.einsum: the operands have different ragged structure: (2, [1, 2], 2) vs (2, [2, 1], 2); elementwise ops need equal partitions.",
    ),
    ErrorCase(
        _einsum_error("bld,cle->bde", X, X),
        ValueError,
        "ragged.einsum: `equation` operand 1 is a RaggedArray: its first two subscripts must be the batch and ragged subscripts 'bl' of operand 0, got 'cle' in, got 'bld,cle->bde'.",
    ),
    ErrorCase(
        _einsum_error("bld,ld->bl", X, torch.ones(2, 2)),
        ValueError,
        "ragged.einsum: `equation` operand 1 is a dense tensor and uses the ragged subscript 'l' (a dense operand cannot span a ragged axis; make it a RaggedArray with the same partition), got 'bld,ld->bl'.",
    ),
    ErrorCase(
        _einsum_error("bld,de->ble", X, torch.ones(3, 4)),
        ValueError,
        "ragged.einsum: `equation` subscript 'd' has size 2 in operand 0 and 3 in operand 1, got 'bld,de->ble'.",
    ),
    ErrorCase(
        _einsum_error("bld,bd->bl", X, torch.ones(3, 2)),
        ValueError,
        "ragged.einsum: `equation` subscript 'b' has size 2 in operand 0 and 3 in operand 1, got 'bld,bd->bl'.",
    ),
    ErrorCase(
        _einsum_error("bld,de->lbe", X, torch.ones(2, 4)),
        ValueError,
        "ragged.einsum: `equation` output keeps the ragged subscript 'l', so it must start with the batch and ragged subscripts 'bl', got 'bld,de->lbe'.",
    ),
    ErrorCase(
        _einsum_error("bl->bl", X),
        ValueError,
        "ragged.einsum: `equation` operand 0 has 3 axes but its subscripts 'bl' name 2, got 'bl->bl'.",
    ),
    ErrorCase(
        _einsum_error("bld->blz", X),
        ValueError,
        "ragged.einsum: `equation` output subscript 'z' appears in no operand, got 'bld->blz'.",
    ),
    ErrorCase(
        _einsum_error("bld,de->ble", torch.ones(2, 2, 2), torch.ones(2, 4)),
        TypeError,
        "ragged.einsum: `operands` must include a RaggedArray (use torch.einsum otherwise), got only Tensors.",
    ),
]

OPS = [
    OpInfo(
        "matmul",
        ragged.matmul,
        torch.matmul,
        matmul_samples,
        errors=MATMUL_ERRORS,
    ),
    OpInfo(
        "linear",
        ragged.linear,
        F.linear,
        linear_samples,
        errors=LINEAR_ERRORS,
    ),
    OpInfo(
        "einsum",
        ragged.einsum,
        einsum_reference,
        einsum_samples,
        errors=EINSUM_ERRORS,
        fast_gradcheck=True,
        lift=False,
        levels=einsum_levels,
        levels_reason="an equation names every ragged axis: the multi-level samples spell them",
    ),
]
