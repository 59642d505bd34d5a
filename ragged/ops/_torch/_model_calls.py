"""torch calls that model code makes on RaggedArrays: ``torch.diff`` and ``torch.addmm``.

``torch.diff`` along the ragged axis differences the rows within each segment (HF models
compute packed-sequence boundaries so from ``position_ids``); ``torch.addmm`` with RaggedArray
rows as ``mat1`` is GPT-2's ``Conv1D`` (``bias + rows @ weight``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import normalize_axis
from ..._torch_args import refuse_out
from .._combining import concat
from ._spelling import torch_handler


def _shifted(x: RaggedArray, axis: int, start: int | None, stop: int | None) -> RaggedArray:
    """``x`` sliced ``start:stop`` along ``axis`` (within each segment for a ragged axis)."""
    index = (slice(None),) * axis + (slice(start, stop),)
    return x[index]


@torch_handler(
    torch.diff,
    methods=("diff",),
    family="scans",
    meaning="`n`-th forward difference along `dim` (default -1): within each segment for the "
    "ragged axis (a segment of length `L` gives `max(L - n, 0)` rows); `prepend`/`append` "
    "are RaggedArrays joined along `dim` first; along the ragged axis the result's size "
    "depends on the lengths (a host read, no single compiled graph)",
    see=("ragged.concat",),
    compile=False,
)
def _diff(
    input: Any, n: int = 1, dim: Any = -1, prepend: Any = None, append: Any = None
) -> RaggedArray:
    if not isinstance(input, RaggedArray):
        raise TypeError(f"`input` must be a RaggedArray, got {type(input).__name__}.")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"`n` must be a non-negative int, got {n!r}.")
    axis = normalize_axis("torch.diff", input, dim, "dim")
    if axis == 0:
        raise ValueError("`dim` cannot be the batch axis (segments differ in length), got 0.")
    if n == 0:
        return input  # as torch: `prepend` and `append` are not joined
    parts = [p for p in (prepend, input, append) if p is not None]
    for name, part in (("prepend", prepend), ("append", append)):
        if part is not None and not isinstance(part, RaggedArray):
            raise TypeError(
                f"`{name}` must be a RaggedArray with the batch of `input` (joined along "
                f"`dim` within each segment), got {type(part).__name__}."
            )
    x = concat(parts, axis) if len(parts) > 1 else input
    for _ in range(n):
        # Both slices have the same lengths and their rows in the same order: subtract the
        # values (an operator would compare the two partitions by value, a host read).
        later = _shifted(x, axis, 1, None)
        x = later.with_values(later.values - _shifted(x, axis, None, -1).values)
    return x


@torch_handler(
    torch.addmm,
    family="linalg",
    meaning="`beta * input + alpha * (mat1 @ mat2)` with RaggedArray rows `mat1` (one inner "
    "axis) and dense `input` and `mat2` (GPT-2's `Conv1D`); the partition of `mat1`",
    see=("ragged.matmul", "ragged.linear"),
)
def _addmm(
    input: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1, out: Any = None
) -> RaggedArray:
    refuse_out(None, out)
    if not isinstance(mat1, RaggedArray) or mat1.values.ndim != 2:
        got = f"{mat1.ndim} axes" if isinstance(mat1, RaggedArray) else type(mat1).__name__
        raise TypeError(
            f"`mat1` must be RaggedArray rows with one inner axis (B, L*, K), got {got}."
        )
    for name, operand in (("input", input), ("mat2", mat2)):
        if not isinstance(operand, Tensor) or isinstance(operand, RaggedArray):
            raise TypeError(
                f"`{name}` must be a dense Tensor with RaggedArray rows `mat1`, got "
                f"{type(operand).__name__}; for two RaggedArrays use ragged.pair_dot."
            )
    values = torch.addmm(input, mat1.values, mat2, beta=beta, alpha=alpha)
    return mat1.with_values(values, axes=None)
