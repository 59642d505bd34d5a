"""torch calls that model code makes on RaggedArrays: ``diff``, ``addmm`` and ``gather``.

``torch.diff`` along the ragged axis differences the rows within each segment (HF models
compute packed-sequence boundaries so from ``position_ids``); ``torch.addmm`` with RaggedArray
rows as ``mat1`` is GPT-2's ``Conv1D`` (``bias + rows @ weight``); ``torch.gather`` of a dense
buffer with RaggedArray positions is BERT's ``token_type_ids`` lookup.
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
    "depends on the lengths (a host read), except for `n=1` when no segment is empty "
    "(`RowPartition.nonempty`), with no `prepend` or one row of each segment "
    "(`prepend=x[:, :1] - 1`, HF's packed-sequence check): then one compiled graph",
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


@torch_handler(
    torch.gather,
    family="indexing",
    meaning="a dense `input` `(B, N, ...)` gathered along `dim` 1 with a RaggedArray `index` "
    "`(B, L*, ...)`: `out[b][i] = input[b, index[b][i]]`, the partition of `index` (HF BERT "
    "gathers its `token_type_ids` buffer so with ragged `position_ids`); negative indices count "
    "from the end; a RaggedArray `input`: `ragged.take`",
    see=("ragged.take",),
)
def _gather(input: Any, dim: Any, index: Any, *, sparse_grad: bool = False, out: Any = None) -> Any:
    refuse_out(None, out)
    if isinstance(input, RaggedArray) or not isinstance(input, Tensor):
        raise TypeError(
            "`input` must be a dense Tensor (B, N, ...) gathered with a RaggedArray `index`, got "
            f"{type(input).__name__}; to take rows within each segment use ragged.take(x, "
            "indices, axis)."
        )
    if not isinstance(index, RaggedArray) or index.ragged_ndim != 1 or index.order is not None:
        raise TypeError(
            "`index` must be a one-level RaggedArray (B, L*, ...) in storage order, got "
            f"{type(index).__name__ if not isinstance(index, RaggedArray) else index.shape}."
        )
    if index.dtype != torch.int64:
        raise TypeError(f"`index` must hold int64 positions, got {index.dtype}.")
    n = input.dim()
    if index.ndim != n or n < 2:
        raise ValueError(
            f"`index` must have as many axes as `input` (at least 2), got {index.ndim} and {n}."
        )
    if isinstance(dim, bool) or not isinstance(dim, int) or dim % n != 1 or not -n <= dim < n:
        raise ValueError(
            f"`dim` must be 1, the ragged axis of `index` (within each segment of `index`, "
            f"positions along `input`'s axis 1), got {dim!r}."
        )
    if sparse_grad:
        raise ValueError("`sparse_grad` must be False (a dense gradient), got True.")
    inner = index.values.shape[1:]
    if not torch.compiler.is_compiling() and (
        input.shape[0] != index.num_segments
        or any(k > r for k, r in zip(inner, input.shape[2:], strict=True))
    ):
        raise ValueError(
            f"`index` {tuple(index.shape)} must fit `input` {tuple(input.shape)}: the same batch "
            "size and, after the gathered axis, no axis longer than `input`'s."
        )
    # out[r, k...] = input[segment of r, index[r, k...], k...]: advanced indexing, so positions
    # past a segment's row raise as in torch (no flat index into another row).
    m = len(inner)
    rows = index.segment_ids.view(-1, *[1] * m)
    trailing = [
        torch.arange(k, device=input.device).view(k, *[1] * (m - 1 - j))
        for j, k in enumerate(inner)
    ]
    key = (rows, index.values, *trailing)
    values = input[key]
    return index.with_values(values, axes=None)
