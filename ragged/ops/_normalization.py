"""Normalisations: softmax, log-softmax, layer norm, RMS norm, per-segment standardisation.

Axis rule: **keep all**. The result has the input's partition (the same object) and axis names.

Over the ragged axis the statistics are per segment (``softmax`` sums over a segment's rows,
``normalize`` standardises each segment by its own mean and variance); over inner axes these
are the torch functions on ``values``. Empty segments stay empty and never affect the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._array import RaggedArray
from .._axes import KEEP, normalize_axis
from .._errors import Func, type_error, value_error
from .._registry import op
from .._versions import check_unchanged
from ..kernels._segment import gather, segment_sum
from ..kernels._segment_softmax import segment_softmax
from ._grouping import group
from ._pair_layouts import axis_on_storage


def _check_float(func: Func, x: Any) -> None:
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", type(x).__name__)
    check_unchanged(func, x)  # declared checks=True
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise type_error(func, "x", "must have a floating-point dtype", x.dtype)


def _axis(func: Func, x: RaggedArray, axis: Any) -> int:
    """The axis as a non-negative int; the batch axis is an error."""
    dim = normalize_axis(func, x, axis)
    if dim == 0:
        raise value_error(
            func, "axis", "cannot be the batch axis (segments differ in length)", repr(axis)
        )
    return dim


# --- softmax ----------------------------------------------------------------------------------


def _softmax(func: Func, x: RaggedArray, axis: int | str, log: bool) -> RaggedArray:
    if isinstance(x, RaggedArray) and x.order is not None:  # e.g. (B, H, L*, L*) scores
        return axis_on_storage(func, x, axis, lambda s, a: _softmax(func, s, a, log))
    _check_float(func, x)
    dim = _axis(func, x, axis)
    if dim > x.ragged_ndim:
        fn = torch.log_softmax if log else torch.softmax
        values = fn(x.values, dim - x.ragged_ndim)
    else:
        values = segment_softmax(x.values, group(x, (dim,), exact=False).segments, log=log)
    return RaggedArray(values, x.partition, x.axes)


@op(
    "normalization",
    rule=KEEP,
    args="x: ragged, axis: axis",
    torch=(torch.softmax, torch.nn.functional.softmax),
    methods=("softmax",),
    torch_args="input, dim, dtype=None, *, _stacklevel=3",
    checks=True,
)
def softmax(x: RaggedArray, axis: int | str) -> RaggedArray:
    """Softmax along ``axis``: over each segment's rows for the ragged axis.

    Elementwise over the other inner axes. Gradients over the ragged axis are exact (unlike
    ``torch.nested``'s in torch 2.13).

    Args:
        x: a floating-point array.
        axis: the ragged axis or an inner axis (int or name); required, as in ``jax.nn``.

    >>> import ragged
    >>> x = ragged.array([[0.0, 0.0], [], [1.0]])
    >>> ragged.softmax(x, axis=1).to_list()
    [[0.5, 0.5], [], [1.0]]
    """
    return _softmax(softmax, x, axis, log=False)


@op(
    "normalization",
    rule=KEEP,
    args="x: ragged, axis: axis",
    torch=(torch.log_softmax, torch.nn.functional.log_softmax),
    methods=("log_softmax",),
    torch_args="input, dim, dtype=None, *, _stacklevel=3",
    checks=True,
)
def log_softmax(x: RaggedArray, axis: int | str) -> RaggedArray:
    """Log-softmax along ``axis``; see [`softmax`][ragged.softmax].

    >>> import ragged
    >>> ragged.log_softmax(ragged.array([[0.0, 0.0], [5.0]]), axis=1).to_list()  # doctest: +ELLIPSIS
    [[-0.693..., -0.693...], [0.0]]
    """
    return _softmax(log_softmax, x, axis, log=True)


# --- layer norm, RMS norm ---------------------------------------------------------------------


def _normalized_shape(func: Func, x: RaggedArray, shape: Any) -> tuple[int, ...]:
    items = (shape,) if isinstance(shape, int) else shape
    if (
        isinstance(shape, bool)
        or not isinstance(items, (Sequence, torch.Size))
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in items)
    ):
        raise type_error(
            func, "normalized_shape", "must be an int or a sequence of ints", repr(shape)
        )
    dims = tuple(items)
    inner = tuple(x.values.shape[1:])
    if not dims or len(dims) > len(inner) or inner[len(inner) - len(dims) :] != dims:
        expected = f"must be a non-empty suffix of the inner shape {inner}"
        raise value_error(func, "normalized_shape", expected, dims)
    return dims


def _check_affine(func: Func, name: str, t: Any, dims: tuple[int, ...]) -> None:
    if t is None:
        return
    if not isinstance(t, Tensor):
        raise type_error(func, name, "must be a Tensor or None", type(t).__name__)
    if tuple(t.shape) != dims:
        raise value_error(func, name, f"must have shape {dims} (normalized_shape)", tuple(t.shape))


@op(
    "normalization",
    rule=KEEP,
    args="x: ragged, normalized_shape: sizes, weight: tensor?, bias: tensor?, eps: number?",
    torch=(torch.nn.functional.layer_norm,),
    torch_args="input, normalized_shape, weight=None, bias=None, eps=1e-05",
    checks=True,
)
def layer_norm(
    x: RaggedArray,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float | None = None,
) -> RaggedArray:
    """Layer normalisation over the trailing inner axes (``F.layer_norm`` on the values).

    Every row is normalised on its own, so segments never mix.

    Args:
        x: a floating-point array ``(B, L*, *inner)``.
        normalized_shape: the trailing inner axes to normalise over (a suffix of ``inner``).
        weight: optional scale of shape ``normalized_shape``.
        bias: optional shift of shape ``normalized_shape``.
        eps: added to the variance (default ``1e-5``, as torch).

    >>> import ragged, torch
    >>> x = ragged.from_lengths(torch.tensor([[1.0, 3.0], [2.0, 2.0], [0.0, 4.0]]), [1, 2])
    >>> ragged.layer_norm(x, 2).to_list()  # doctest: +ELLIPSIS
    [[[-0.99..., 0.99...]], [[0.0, 0.0], [-0.99..., 0.99...]]]
    """
    func = layer_norm
    _check_float(func, x)
    dims = _normalized_shape(func, x, normalized_shape)
    _check_affine(func, "weight", weight, dims)
    _check_affine(func, "bias", bias, dims)
    # The float default lives in the body: torch.compile lifts a float default of the signature
    # as a graph input and reads it back with .item().
    return x.with_values(F.layer_norm(x.values, dims, weight, bias, 1e-5 if eps is None else eps))


@op(
    "normalization",
    rule=KEEP,
    args="x: ragged, normalized_shape: sizes, weight: tensor?, eps: number?",
    torch=(torch.nn.functional.rms_norm,),
    torch_args="input, normalized_shape, weight=None, eps=None",
    checks=True,
)
def rms_norm(
    x: RaggedArray,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> RaggedArray:
    """RMS normalisation over the trailing inner axes (``F.rms_norm`` on the values).

    Args:
        x: a floating-point array ``(B, L*, *inner)``.
        normalized_shape: the trailing inner axes to normalise over (a suffix of ``inner``).
        weight: optional scale of shape ``normalized_shape``.
        eps: added to the mean square; ``None``: the dtype's machine epsilon (as torch).

    >>> import ragged, torch
    >>> x = ragged.from_lengths(torch.tensor([[3.0, 4.0], [1.0, 1.0]]), [2, 0])
    >>> ragged.rms_norm(x, (2,)).to_list()  # doctest: +ELLIPSIS
    [[[0.848..., 1.131...], [1.0, 1.0]], []]
    """
    func = rms_norm
    _check_float(func, x)
    dims = _normalized_shape(func, x, normalized_shape)
    _check_affine(func, "weight", weight, dims)
    return x.with_values(F.rms_norm(x.values, dims, weight, eps))


# --- per-segment standardisation --------------------------------------------------------------


@op(
    "normalization",
    rule=KEEP,
    args="x: ragged, axis: axis?, correction: number?, eps: number?",
    checks=True,
)
def normalize(
    x: RaggedArray,
    axis: int | str = 1,
    *,
    correction: int | float = 0,
    eps: float | None = None,
) -> RaggedArray:
    """Standardise along ``axis``: ``(x - mean) / sqrt(var + eps)``, per segment by default.

    Over the ragged axis every segment is centred and scaled by its own mean and variance
    (two passes, so large offsets do not cost precision). A one-row segment gives 0 with the
    default ``correction=0`` (its variance is 0), and NaN when ``correction >= 1`` (no degrees
    of freedom, as ``torch.var``); empty segments stay empty.

    Args:
        x: a floating-point array.
        axis: the ragged axis (default) or an inner axis (int or name).
        correction: subtracted from the count in the variance's denominator (0: population
            variance, as layer norm; 1: sample variance).
        eps: added to the variance (default ``1e-5``; kept out of the signature for
            torch.compile, see ``layer_norm``).

    >>> import ragged
    >>> x = ragged.array([[1.0, 3.0], [], [5.0]])
    >>> ragged.normalize(x).to_list()  # doctest: +ELLIPSIS
    [[-0.99..., 0.99...], [], [0.0]]
    """
    func = normalize
    eps = 1e-5 if eps is None else eps
    _check_float(func, x)
    if isinstance(correction, bool) or not isinstance(correction, (int, float)):
        raise type_error(func, "correction", "must be a number", type(correction).__name__)
    dim = _axis(func, x, axis)
    values = x.values
    if dim > x.ragged_ndim:
        d = dim - x.ragged_ndim
        centred = values - values.mean(d, keepdim=True)
        if values.shape[d] - correction <= 0:
            return x.with_values(centred * torch.nan)
        var = centred.square().sum(d, keepdim=True) / (values.shape[d] - correction)
        return x.with_values(centred * torch.rsqrt(var + eps))
    segments = group(x, (dim,), exact=False).segments
    count = segments.counts.view(-1, *[1] * (values.dim() - 1)).to(values.dtype)
    mean = segment_sum(values, segments) / count.clamp_min(1)
    centred = values - gather(mean, segments)
    dof = count - correction
    squares = segment_sum(centred.square(), segments)
    # Segments without degrees of freedom get a finite stand-in here and NaN rows below: a NaN
    # scale would make the gradient NaN too (0 * NaN), while a selection keeps it 0.
    var = torch.where(dof > 0, squares / dof.clamp_min(1e-30), 1.0)
    out = centred * gather(torch.rsqrt(var + eps), segments)
    if correction > 0:  # else only empty segments lack degrees of freedom, and they have no rows
        out = torch.where(gather(dof > 0, segments), out, torch.nan)
    return x.with_values(out)
