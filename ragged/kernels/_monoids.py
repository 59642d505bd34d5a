"""The monoids of the segmented scans (sum, product, max, min, logsumexp) and the scan along an
inner (dense) axis. The segmented kernels are in ``ragged.kernels._scan``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._dtypes import highest, lowest

# --- monoids ----------------------------------------------------------------------------------


def _accumulating(dtype: torch.dtype) -> torch.dtype:
    """Integer and bool sums and products accumulate in int64, as ``torch.cumsum`` does."""
    return dtype if dtype.is_floating_point or dtype.is_complex else torch.int64


@dataclasses.dataclass(frozen=True)
class Monoid:
    """The pieces of one scan.

    Attributes:
        scan: the inclusive torch scan along a dim (inner axes, the padded grid of totals).
        combine: ``combine(earlier, later, out=None)``, associative and elementwise.
        identity: the value of an empty prefix, for a result dtype.
        filler: a finite value for unused slots.
        dtype: the result dtype for an input dtype.
        torch_blocks: the composite path scans blocks with ``scan`` (block-major buffer);
            otherwise with ``K - 1`` combines of contiguous rows (position-major buffer):
            ``torch.cummax``/``torch.logcumsumexp`` over many short lines are 10-60x slower on
            CPU than that, and ``torch.logaddexp`` on strided rows 15x slower than on
            contiguous ones (measured, blocks of 16 rows of [16] float32).
        safe: ``combine(identity, y)`` is ``y`` with finite derivatives of every order. False for
            logaddexp: at ``-inf`` its second derivatives are NaN, so "no prefix" is a selection.
        grid_ok: ``scan`` is safe on the padded grid of block totals in eager mode. False for
            ``torch.logcumsumexp``, whose double backward is NaN wherever an incoming gradient
            is exactly 0 (torch 2.13), as it is for the grid's unused cells.
        name: the op's name for the native kernels.
        in_place: the torch fallback of the eager fast path scans in place
            (:func:`scan_in_place`); otherwise it runs the composite scan.
    """

    scan: Callable[[Tensor, int], Tensor]
    combine: Callable[..., Tensor]
    identity: Callable[[torch.dtype], Any]
    filler: float
    dtype: Callable[[torch.dtype], torch.dtype] = lambda d: d
    torch_blocks: bool = False
    safe: bool = True
    grid_ok: bool = True
    name: str = ""
    in_place: bool = True


SUM = Monoid(torch.cumsum, torch.add, lambda d: 0, 0, _accumulating, torch_blocks=True, name="sum")
PROD = Monoid(
    torch.cumprod,
    torch.mul,
    lambda d: 1,
    1,
    _accumulating,
    torch_blocks=True,
    name="prod",
    in_place=False,
)
MAX = Monoid(lambda v, d: torch.cummax(v, d).values, torch.maximum, lowest, 0, name="max")
MIN = Monoid(lambda v, d: torch.cummin(v, d).values, torch.minimum, highest, 0, name="min")
LOGSUMEXP = Monoid(
    torch.logcumsumexp,
    torch.logaddexp,
    lambda d: -math.inf,
    0,
    safe=False,
    grid_ok=False,
    name="logsumexp",
    in_place=False,
)
MONOIDS = {m.name: m for m in (SUM, PROD, MAX, MIN, LOGSUMEXP)}


# --- scans along an inner axis ----------------------------------------------------------------


def dense_scan(m: Monoid, values: Tensor, dim: int, reverse: bool, exclusive: bool) -> Tensor:
    """Scan ``values`` along the dense axis ``dim`` with monoid ``m``."""
    if reverse:
        values = values.flip(dim)
    out = m.scan(values, dim)
    if exclusive:
        first = out.new_full((*out.shape[:dim], 1, *out.shape[dim + 1 :]), m.identity(out.dtype))
        out = torch.cat([first, out.narrow(dim, 0, out.shape[dim] - 1)], dim)
    return out.flip(dim) if reverse else out
