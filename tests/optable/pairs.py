"""Op table entries: pair maps (``ragged.ops._pairs``): outer, pair_dot, transpose and the
triangle multiplicative update. Segment ``b`` of a pair map is its dense ``N_b x M_b`` block."""

from __future__ import annotations

from typing import Any

import torch

import ragged

from . import ErrorCase, OpInfo, Sample, pair_randn, ragged_randn

CATEGORY = "pair maps"
PAIR_NAMES = ("batch", "i", "j", "feat")


def _others(lengths: list[int]) -> list[int]:
    """Lengths of a second operand with the same number of segments (a rectangular map)."""
    return [(n * 2 + 1) % 5 for n in lengths]


def outer_reference(a: torch.Tensor, b: torch.Tensor, op: Any = torch.add) -> torch.Tensor:
    n, m = a.shape[0], b.shape[0]
    k = max(a.dim(), b.dim())  # inner axes broadcast right-aligned
    a = a.reshape(n, *[1] * (k - a.dim()), *a.shape[1:])
    b = b.reshape(m, *[1] * (k - b.dim()), *b.shape[1:])
    rows = a[:, None].expand(n, m, *a.shape[1:]).reshape(n * m, *a.shape[1:])
    cols = b[None].expand(n, m, *b.shape[1:]).reshape(n * m, *b.shape[1:])
    out = op(rows, cols)
    return out.reshape(n, m, *out.shape[1:])


def _concat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.cat([a, b], dim=-1)  # not a broadcasting op: outer hands it row batches


def outer_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    y = x.with_values(torch.randn(x.values.shape, generator=gen, dtype=dtype))
    rect = ragged_randn(_others(lengths), (3,), gen, dtype, layout)
    heads = ragged_randn(lengths, (2, 3), gen, dtype, layout)
    named = x.rename("batch", "i", "feat"), y.rename("batch", "j", "feat")
    return [
        Sample("add", (x, y)),
        Sample("mul", (x, y, torch.mul)),
        Sample("concat", (x, y, _concat)),
        Sample("rectangular", (x, rect, torch.sub)),
        Sample("broadcast_inner", (heads, x, torch.mul)),
        Sample("named", named),
    ]


def pair_dot_reference(
    a: torch.Tensor, b: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    out = outer_reference(a, b, lambda u, v: (u * v).sum(-1))
    return out if scale is None else out * scale


def pair_dot_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    x = ragged_randn(lengths, (3,), gen, dtype, layout)
    y = x.with_values(torch.randn(x.values.shape, generator=gen, dtype=dtype))
    heads = ragged_randn(lengths, (2, 3), gen, dtype, layout)
    heads_y = heads.with_values(torch.randn(heads.values.shape, generator=gen, dtype=dtype))
    rect = ragged_randn(_others(lengths), (3,), gen, dtype, layout)
    return [
        Sample("square", (x, y)),
        Sample("self", (x, x), {"scale": 0.5}),
        Sample("heads", (heads, heads_y)),
        Sample("heads_against_shared", (heads, y)),
        Sample("rectangular", (x, rect)),
    ]


def pair_matmul_reference(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.einsum("ij...,j...d->i...d", p, v)


def pair_matmul_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    p = pair_randn(lengths, (2,), gen, dtype, layout)
    v = ragged_randn(lengths, (2, 3), gen, dtype, layout)
    plain = pair_randn(lengths, (), gen, dtype, layout)
    others = _others(lengths)
    rect = pair_randn(lengths, (), gen, dtype, layout, others)
    return [
        Sample("heads", (p, v)),
        Sample("no_batch", (plain, ragged_randn(lengths, (4,), gen, dtype, layout))),
        Sample("rectangular", (rect, ragged_randn(others, (3,), gen, dtype, layout))),
    ]


def transpose_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    return [
        Sample("square", (pair_randn(lengths, (3,), gen, dtype, layout),)),
        Sample("no_inner", (pair_randn(lengths, (), gen, dtype, layout),)),
        Sample("rectangular", (pair_randn(lengths, (2,), gen, dtype, layout, _others(lengths)),)),
    ]


def triangle_reference(a: torch.Tensor, b: torch.Tensor, *, outgoing: bool = True) -> torch.Tensor:
    equation = "ik...,jk...->ij..." if outgoing else "ki...,kj...->ij..."
    return torch.einsum(equation, a, b)


def triangle_samples(
    lengths: list[int], gen: torch.Generator, dtype: torch.dtype, layout: str
) -> list[Sample]:
    a = pair_randn(lengths, (3,), gen, dtype, layout)
    b = a.with_values(torch.randn(a.values.shape, generator=gen, dtype=dtype))
    a4 = pair_randn(lengths, (2, 2), gen, dtype, layout)
    b4 = a4.with_values(torch.randn(a4.values.shape, generator=gen, dtype=dtype))
    return [
        Sample("outgoing", (a, b)),
        Sample("incoming", (a, b), {"outgoing": False}),
        Sample("self", (a, a)),
        Sample("inner_two", (a4, b4), {"outgoing": False}),
        Sample("named", (a.rename(*PAIR_NAMES), b)),
    ]


X = ragged.array([[[1.0], [2.0]], [[3.0]]])  # (2, [2, 1], 1)
Z = ragged.outer(X, X)  # (2, [2, 1], [[2, 2], [1]], 1)
Z2 = ragged.outer(X, X.with_values(X.values.clone()))  # equal lengths, another partition
RECT = ragged.outer(X, ragged.array([[[1.0]], [[2.0], [3.0]]]))

TRIANGLE_ERRORS = [
    ErrorCase(
        lambda: ragged.triangle_multiply(Z.values, Z),
        TypeError,
        "ragged.triangle_multiply: `a` must be a RaggedArray, got Tensor.",
    ),
    ErrorCase(
        lambda: ragged.triangle_multiply(X, Z),
        ValueError,
        "ragged.triangle_multiply: `a` must be a pair map (B, N*, N*, ...), got 1 ragged axes.",
    ),
    ErrorCase(
        lambda: ragged.triangle_multiply(RECT, RECT),
        ValueError,
        "ragged.triangle_multiply: `a` must be a square pair map (N_b x N_b blocks), got N_b x M_b.",
    ),
    ErrorCase(
        lambda: ragged.triangle_multiply(Z, ragged.outer(X[:1], X[:1])),
        ValueError,
        "ragged.triangle_multiply: `b` must have the partition of a, got a different partition.",
    ),
    ErrorCase(
        lambda: ragged.triangle_multiply(Z, Z.with_values(Z.values.double())),
        ValueError,
        "ragged.triangle_multiply: `b` must have the inner shape and dtype of a ((1,), torch.float32), got ((1,), torch.float64).",
    ),
    ErrorCase(
        lambda: ragged.triangle_multiply(Z, Z.with_values(Z.values.expand(-1, 2), axes=None)),
        ValueError,
        "ragged.triangle_multiply: `b` must have the inner shape and dtype of a ((1,), torch.float32), got ((2,), torch.float32).",
    ),
    ErrorCase(
        lambda: ragged.triangle_multiply(
            Z.with_values(Z.values.long()), Z.with_values(Z.values.long())
        ),
        TypeError,
        "ragged.triangle_multiply: `a` must have a floating-point dtype, got torch.int64.",
    ),
]

PAIR_DOT_ERRORS = [
    ErrorCase(
        lambda: ragged.pair_dot(X, ragged.array([[[1.0, 2.0]], [[3.0, 4.0]]])),
        ValueError,
        "ragged.pair_dot: `y` must have the dtype and last axis size of x (torch.float32, 1), got (torch.float32, 2).",
    ),
    ErrorCase(
        lambda: ragged.pair_dot(X, X[:1]),
        ValueError,
        "ragged.pair_dot: `y` must have 2 segments like x, got 1.",
    ),
    ErrorCase(
        lambda: ragged.pair_dot(ragged.array([[1.0], [2.0]]), X),
        ValueError,
        "ragged.pair_dot: `x` must have an inner axis to contract, got no inner axes.",
    ),
    ErrorCase(
        lambda: ragged.pair_dot(Z, X),
        ValueError,
        "ragged.pair_dot: `y` must have the 1 outer ragged levels of `x` (the op runs in every "
        "row of ragged axis 1), got (2, [2, 1], 1).",
    ),
]

PAIR_MATMUL_ERRORS = [
    ErrorCase(
        lambda: ragged.pair_matmul(X, X),
        ValueError,
        "ragged.pair_matmul: `p` must be a pair map (B, N*, M*, ...), got 1 ragged axes.",
    ),
    ErrorCase(
        lambda: ragged.pair_matmul(Z, ragged.array([[[1.0]], [[2.0], [3.0]]])),
        ValueError,
        "ragged.pair_matmul: `v` must have the lengths of p's second ragged axis, got other lengths.",
    ),
    ErrorCase(
        lambda: ragged.pair_matmul(Z, X),
        ValueError,
        "ragged.pair_matmul: `v` must have inner shape (*(1,), D) and dtype torch.float32, got (1,) and torch.float32.",
    ),
    ErrorCase(
        lambda: ragged.pair_matmul(Z.values, X),
        TypeError,
        "ragged.pair_matmul: `p` must be a RaggedArray, got Tensor.",
    ),
]

OPS = [
    OpInfo(
        "outer",
        ragged.outer,
        outer_reference,
        outer_samples,
        fast_gradcheck=True,
        errors=[
            ErrorCase(
                lambda: ragged.outer(X, X[:1]),
                ValueError,
                "ragged.outer: `y` must have 2 segments like x, got 1.",
            ),
        ],
    ),
    OpInfo(
        "pair_dot",
        ragged.pair_dot,
        pair_dot_reference,
        pair_dot_samples,
        errors=PAIR_DOT_ERRORS,
        fast_gradcheck=True,
    ),
    OpInfo(
        "pair_matmul",
        ragged.pair_matmul,
        pair_matmul_reference,
        pair_matmul_samples,
        errors=PAIR_MATMUL_ERRORS,
    ),
    OpInfo("transpose", ragged.transpose, lambda z: z.transpose(0, 1), transpose_samples),
    OpInfo(
        "triangle_multiply",
        ragged.triangle_multiply,
        triangle_reference,
        triangle_samples,
        errors=TRIANGLE_ERRORS,
    ),
]
