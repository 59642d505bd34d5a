"""The op table: one record per public op, driving the generic tests and the docs' matrix.

Each :class:`OpInfo` names an op, its per-segment reference, how to build sample inputs and
which transforms it supports; the op's family and axis rule come from its declaration in the
registry (``ragged._registry``). ``tests/test_optable.py`` runs every entry against
its reference on hypothesis-drawn partitions (empty segments, zero segments, one segment, one
long segment, non-contiguous values), in float64, with gradcheck and error inputs;
``tools/generate.py`` renders the support matrix in ``docs/api.md`` from the same records.

The reference semantics: an op is the same torch computation applied to every segment
separately. For sample arguments, a RaggedArray becomes its segment ``b``, a :class:`PerSegment`
dense tensor becomes its row ``b``, and anything else is passed unchanged. If the op returns a
RaggedArray, its segment ``b`` must equal the reference's result for segment ``b``; if it
returns a dense tensor, its row ``b`` must.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

import ragged
import ragged.testing


@dataclasses.dataclass(frozen=True)
class PerSegment:
    """A dense argument whose axis 0 indexes segments (its row ``b`` goes to segment ``b``)."""

    tensor: torch.Tensor


@dataclasses.dataclass
class Sample:
    """One call: ``op(*args, **kwargs)``. ``name`` tells variants apart in test ids.

    Multi-level samples (``OpInfo.levels``) carry ``expected``: the nested reference of the
    call's result (``tests/optable/nested.py``), computed by loops over the rows.
    """

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    expected: Callable[[], Any] | None = None

    def call_args(self) -> tuple[Any, ...]:
        return tuple(a.tensor if isinstance(a, PerSegment) else a for a in self.args)


@dataclasses.dataclass(frozen=True)
class ErrorCase:
    """A bad call and the exact error it must raise."""

    make: Callable[[], Any]
    error: type[Exception]
    message: str


# A sample builder gets per-segment lengths, a generator, the float dtype to use and a layout
# ("contiguous", "strided", "transposed"); it returns the op's variants. The variants' kwargs
# and inner shapes must not depend on the lengths (compile tests rely on it).
SampleFn = Callable[[list[int], torch.Generator, torch.dtype, str], list[Sample]]
# A multi-level sample builder gets nested lengths ``[l0, l1, ...]`` (``ragged.from_nested_lengths``)
# instead, and returns samples along the outer ragged axes with their nested ``expected``.
LevelSampleFn = Callable[[list[list[int]], torch.Generator, torch.dtype, str], list[Sample]]


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """One public op.

    Attributes:
        name: ``ragged.<name>``.
        op: the callable under test.
        reference: ``reference(*segment_args, **kwargs)`` for one segment.
        samples: builds the variants to test.
        grad: differentiable in the floating-point RaggedArray arguments (gradcheck).
        gradgrad: second derivatives (double backward, hessian).
        forward_ad: forward-mode AD (jvp, jacfwd).
        vmap: ``torch.func.vmap`` over a leading batch of values.
        compile: one graph across batches under ``torch.compile(fullgraph, dynamic)``.
        data_dependent: the output size depends on the data (a documented host sync).
        long_segment: float32 results on a long segment are within 10x of torch's own error
            against float64 (reductions and the statistics built on them; ``test_optable``).
        errors: bad calls and their exact messages.
        atol, rtol: comparison tolerances in float64.
        variant: tells apart entries of one op (e.g. ``norm`` per ``ord``).
        lift: the samples also run on two- and three-level arrays (``tests/optable/levels.py``):
            every one-level RaggedArray argument gets outer levels on top, so that its
            segments are the rows of the innermost ragged axis, and the reference runs on each
            row; ``False`` (with ``levels_reason``) for ops whose one-level samples are not
            per-row on a multi-level array.
        levels: builds samples along outer ragged axes of multi-level arrays.
        levels_compile: the first ``levels`` sample compiles to one graph across nested
            batches (default: ``compile and not data_dependent``).
        levels_reason: why the op has no multi-level samples of its own, or is not lifted.
        fast_gradcheck: ``gradcheck``/``gradgradcheck`` in fast mode (the Jacobian against a
            random projection instead of column by column), for ops whose many samples would
            take tens of seconds in full (attention, pair maps); the full check runs on the
            first sample.
        nan_policy: what a NaN in a segment does (``tests/optable/values.py`` checks it, and
            runs the samples with NaN, infinities, signed zeros and large magnitudes against
            the reference): "propagate" (the segment's result holds a NaN), "omit" (NaN counts
            as missing: a segment with a number in every reduced column has no NaN result) or
            "value" (torch gives NaN a defined result: comparisons, truthiness, indices,
            ``1 ** nan``); ``None``: no value policy declared.
        identity: a reduction's result for an empty segment (``None``: not a reduction).
        extreme_reference: the reference on extreme values where the op decides otherwise
            than torch on purpose (documented in ``docs/semantics.md``); ``None``: ``reference``.
    """

    name: str
    op: Callable[..., Any]
    reference: Callable[..., Any]
    samples: SampleFn
    grad: bool = True
    gradgrad: bool = True
    forward_ad: bool = True
    vmap: bool = True
    compile: bool = True
    data_dependent: bool = False
    long_segment: bool = False
    errors: Sequence[ErrorCase] = ()
    atol: float = 1e-9
    rtol: float = 1e-7
    variant: str = ""
    lift: bool = True
    levels: LevelSampleFn | None = None
    levels_compile: bool | None = None
    levels_reason: str = ""
    fast_gradcheck: bool = False
    nan_policy: str | None = None
    identity: Any = None
    extreme_reference: Callable[..., Any] | None = None

    @property
    def id(self) -> str:
        return f"{self.name}-{self.variant}" if self.variant else self.name

    @property
    def spec(self) -> Any:
        """The op's declaration in the registry (its family, axis rule, arguments)."""
        qualname = self.name if "." in self.name else f"ragged.{self.name}"
        return ragged._registry.get(qualname)


def randn(
    shape: Sequence[int], generator: torch.Generator, dtype: torch.dtype, layout: str = "contiguous"
) -> torch.Tensor:
    """Random values of ``shape``; "strided"/"transposed" layouts are non-contiguous views."""
    shape = tuple(shape)
    if layout == "strided" and shape:
        full = _draw((2 * shape[0], *shape[1:]), generator, dtype)
        return full[::2]
    if layout == "transposed" and len(shape) > 1:
        return _draw(tuple(reversed(shape)), generator, dtype).permute(*reversed(range(len(shape))))
    return _draw(shape, generator, dtype)


def _draw(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    return torch.randint(-4, 5, shape, generator=generator, dtype=dtype)


def ragged_randn(
    lengths: list[int],
    inner: Sequence[int],
    generator: torch.Generator,
    dtype: torch.dtype,
    layout: str = "contiguous",
) -> ragged.RaggedArray:
    """A RaggedArray with the given lengths and random values."""
    values = randn((sum(lengths), *inner), generator, dtype, layout)
    return ragged.from_lengths(values, lengths)


def pair_randn(
    lengths: list[int],
    inner: Sequence[int],
    generator: torch.Generator,
    dtype: torch.dtype,
    layout: str = "contiguous",
    columns: list[int] | None = None,
) -> ragged.RaggedArray:
    """A pair map ``(B, N*, M*, *inner)`` with random values (square unless ``columns``)."""
    rows = ragged.from_lengths(torch.zeros(sum(lengths)), lengths).partition.levels[0]
    cols = rows
    if columns is not None:
        cols = ragged.from_lengths(torch.zeros(sum(columns)), columns).partition.levels[0]
    partition = ragged.Partition.outer(rows, cols)
    values = randn((partition.num_values, *inner), generator, dtype, layout)
    return ragged.RaggedArray(values, partition)


def is_pair_map(x: Any) -> bool:
    """A RaggedArray with a product partition ``(B, N*, M*, ...)``."""
    return (
        isinstance(x, ragged.RaggedArray)
        and x.ragged_ndim == 2
        and x.partition.levels[1].columns is not None
    )


def pair_blocks(z: ragged.RaggedArray) -> list[torch.Tensor]:
    """The dense ``(N_b, M_b, *inner)`` block of every segment of a pair map."""
    rows = z.partition.levels[0].lengths.tolist()
    cols = z.partition.levels[1].columns.lengths.tolist()  # type: ignore[union-attr]
    parts = torch.split(z.values, [n * m for n, m in zip(rows, cols, strict=True)])
    return [p.reshape(n, m, *z.values.shape[1:]) for p, n, m in zip(parts, rows, cols, strict=True)]


def or_empty(
    fn: Callable[..., torch.Tensor], fill: Any, dtype: torch.dtype | None = None
) -> Callable[..., torch.Tensor]:
    """Reference wrapper: ``fn(segment)``, or ``fill`` of the reduced shape for an empty one."""

    def reference(segment: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if segment.shape[0]:
            return fn(segment, *args, **kwargs)
        probe = fn(torch.zeros((1, *segment.shape[1:]), dtype=segment.dtype), *args, **kwargs)
        return torch.full(probe.shape, fill, dtype=dtype or probe.dtype)

    return reference


def segment_args(sample: Sample, b: int) -> list[Any]:
    """The reference's arguments for segment ``b`` of a one-level sample."""
    out = []
    for a in sample.args:
        if is_pair_map(a):  # segment b of a pair map is its dense block
            out.append(pair_blocks(a)[b])
        elif isinstance(a, ragged.RaggedArray):
            out.append(a.unbind()[b])
        elif isinstance(a, PerSegment):
            out.append(a.tensor[b])
        else:
            out.append(a)
    return out


def num_segments(sample: Sample) -> int:
    return next(a.num_segments for a in sample.args if isinstance(a, ragged.RaggedArray))


def compare_to_reference(info: OpInfo, sample: Sample, out: Any) -> None:
    """``out`` (the op's result on ``sample``) against the reference run on every segment."""
    outs = out if isinstance(out, tuple) else (out,)
    per_segment = []
    for b in range(num_segments(sample)):
        ref = info.reference(*segment_args(sample, b), **sample.kwargs)
        per_segment.append(ref if isinstance(ref, tuple) else (ref,))
    for k, got in enumerate(outs):
        expected = [refs[k] for refs in per_segment]
        if isinstance(got, ragged.RaggedArray):
            assert got.num_segments == len(expected)
            assert got.lengths.tolist() == [e.shape[0] for e in expected], sample.name
            segments = pair_blocks(got) if is_pair_map(got) else got.unbind()
            for seg, e in zip(segments, expected, strict=True):
                torch.testing.assert_close(
                    seg, e, atol=info.atol, rtol=info.rtol, equal_nan=True, check_dtype=True
                )
        else:
            assert got.shape[0] == len(expected), sample.name
            for row, e in zip(got, expected, strict=True):
                torch.testing.assert_close(row, e, atol=info.atol, rtol=info.rtol, equal_nan=True)


def _differentiable(sample: Sample) -> list[int]:
    return [
        i
        for i, a in enumerate(sample.args)
        if isinstance(a, ragged.RaggedArray) and a.values.is_floating_point()
    ]


def as_function(info: OpInfo, sample: Sample) -> tuple[Any, tuple[torch.Tensor, ...]]:
    """The op on ``sample`` as a function of its floating-point ragged inputs' values (the
    form ``gradcheck`` takes), and those values, detached, as leaves."""
    positions = _differentiable(sample)

    def fn(*values: torch.Tensor) -> Any:
        args = list(sample.call_args())
        for i, v in zip(positions, values, strict=True):
            args[i] = args[i].with_values(v)
        out = info.op(*args, **sample.kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        tensors = [o.values if isinstance(o, ragged.RaggedArray) else o for o in outs]
        # Non-finite entries (e.g. the NaN mean of an empty segment) are constants that finite
        # differences cannot handle: zero them.
        return tuple(
            torch.where(torch.isfinite(t.detach()), t, 0.0)
            for t in tensors
            if t.is_floating_point()
        )

    inputs = tuple(sample.args[i].values.detach().clone().requires_grad_() for i in positions)
    return fn, inputs


def check_gradients(info: OpInfo, sample: Sample, *, fast: bool = False) -> None:
    """``gradcheck`` (and ``gradgradcheck`` where the op claims it) on ``sample``; ``fast``:
    in fast mode (see ``OpInfo.fast_gradcheck``)."""
    fn, inputs = as_function(info, sample)
    if not inputs or not sum(v.numel() for v in inputs):
        return
    # torch's fast mode fails on an empty input among non-empty ones (a size mismatch in
    # _get_numerical_vJu): those samples are small, check them in full.
    fast = fast and all(v.numel() for v in inputs)
    assert torch.autograd.gradcheck(
        fn,
        inputs,
        check_forward_ad=info.forward_ad,
        check_batched_grad=info.vmap,
        fast_mode=fast,
    ), sample.name
    if info.gradgrad:
        assert torch.autograd.gradgradcheck(fn, inputs, fast_mode=fast), sample.name


def check_vmap_over_values(info: OpInfo, sample: Sample) -> None:
    """``torch.func.vmap`` over a batch of two values tensors for the first ragged argument of
    ``sample`` equals a loop over them."""
    pos = next(i for i, a in enumerate(sample.args) if isinstance(a, ragged.RaggedArray))
    x = sample.args[pos]
    gen = torch.Generator().manual_seed(3)
    ensemble = torch.stack(
        [
            x.values,
            torch.randn(x.values.shape, generator=gen).to(x.dtype)
            if x.values.is_floating_point()
            else x.values.flip(0),
        ]
    )
    args = list(sample.call_args())

    def fn(v: torch.Tensor) -> Any:
        call = list(args)
        call[pos] = x.with_values(v)
        out = info.op(*call, **sample.kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(o.values if isinstance(o, ragged.RaggedArray) else o for o in outs)

    batched = torch.func.vmap(fn)(ensemble)
    looped = [fn(v) for v in ensemble]
    for k, got in enumerate(batched):
        torch.testing.assert_close(got, torch.stack([out[k] for out in looped]), equal_nan=True)


def check_one_graph(
    fn: Callable[..., Any], batches: Sequence[Any], *, backend: str, **options: Any
) -> None:
    """``fn`` compiles to one graph over ``batches`` (shapes dynamic, ``fullgraph``) and matches
    eager mode on each (NaN equal to NaN, tolerance ``1e-4``)."""
    with ragged.dynamic_shapes():
        report = ragged.testing.check_compile(
            fn,
            batches,
            backend=backend,
            max_graphs=1,
            equal_nan=True,
            atol=1e-4,
            rtol=1e-4,
            **options,
        )
    assert report.graphs == 1


BATCH_AXIS = "`axis` cannot be the batch axis (segments differ in length), got 0."


def axis_errors(
    op: Callable[..., Any], name: str, *, batch: str = BATCH_AXIS, out_of_range: int = 2
) -> list[ErrorCase]:
    """The errors every op with ``axis=`` shares: the batch axis, an axis out of range, and a
    dense ``x`` (on ``[[1.0, 2.0], [3.0]]``, ``(B, L*)``)."""
    x = ragged.array([[1.0, 2.0], [3.0]])
    func = f"ragged.{name}"
    return [
        ErrorCase(lambda: op(x, axis=0), ValueError, f"{func}: {batch}"),
        ErrorCase(
            lambda: op(x, axis=out_of_range),
            ValueError,
            f"{func}: `axis` must be in [-2, 2), got {out_of_range}.",
        ),
        ErrorCase(
            lambda: op(x.values, axis=1),
            TypeError,
            f"{func}: `x` must be a RaggedArray, got Tensor.",
        ),
    ]


# One table module per op family; each defines OPS.
MODULES = [
    "attention",
    "combine",
    "elementwise",
    "indexing",
    "linalg",
    "reductions",
    "normalize",
    "pairs",
    "sample",
    "scan",
    "sort",
    "structure",
]


def all_ops() -> list[OpInfo]:
    """Every entry, from every table module."""
    import importlib

    return [op for name in MODULES for op in importlib.import_module(f"{__name__}.{name}").OPS]
