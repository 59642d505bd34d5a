"""Random sampling of rows within each segment, without host syncs.

After the PyTorch blog post "Overcoming the hidden performance traps of variable-shaped
tensors": the per-sample ``nonzero`` + ``randperm`` sampler reads a data-dependent size back to
the host for every sample. Here every segment's choice comes from one static-shape pass over
all rows: each row gets a distinct random key (a random permutation), one sort by
``(segment, key)`` gives each row a uniformly random rank within its segment, and a row is
chosen when its rank is below the segment's quota. Nothing reads device memory, so the masks
compile to one graph across batches.

Axis rules: [`sample_mask`][ragged.sample_mask] and [`sample_balanced`][ragged.sample_balanced] **keep all** (a boolean mask with
the input's partition object); [`sample`][ragged.sample] builds a **new partition** (its output size
depends on the data: the one documented host sync).

Randomness: ``generator=`` takes a ``torch.Generator`` on the values' device; the same seed
gives the same choice. ``torch.compile`` cannot trace a generator argument: under compilation
pass ``generator=None`` (the global generator, seeded with ``torch.manual_seed``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._axes import NEW, ROWS
from .._errors import Func, type_error, typename, value_error
from .._partition import Partition, RowPartition
from .._registry import op
from ._indexing._axis import checked_array, filter_plan, ragged_axis, whole_rows


def _check_k(func: Func, k: Any, x: RaggedArray, dim: int = 1) -> int | Tensor:
    """``k`` is a non-negative int or an integer tensor with one entry per row of axis
    ``dim - 1`` (``(B,)`` for axis 1), or 0-d."""
    if isinstance(k, Tensor):
        num = x.partition.levels[dim - 1].num_rows
        if k.dtype.is_floating_point or k.dtype.is_complex or k.dtype == torch.bool:
            raise type_error(func, "k", "must have an integer dtype", k.dtype)
        if k.dim() > 1 or (k.dim() == 1 and k.shape[0] != num):
            raise value_error(func, "k", f"must be an int or have shape ({num},)", tuple(k.shape))
        return k.to(device=x.device, dtype=torch.int64).clamp_min(0)
    if isinstance(k, bool) or not isinstance(k, int):
        raise type_error(
            func, "k", "must be an int or an integer Tensor of shape (B,)", typename(k)
        )
    if k < 0:
        raise value_error(func, "k", "must be non-negative", k)
    return k


def _per_row(k: int | Tensor, row_ids: Tensor) -> int | Tensor:
    if isinstance(k, int) or k.dim() == 0:
        return k
    return k.index_select(0, row_ids)


def _rng(generator: torch.Generator | None) -> dict[str, Any]:
    """``generator=`` only when one is given: under torch.compile an explicit
    ``generator=None`` makes ``randperm`` specialise its size and ``rand`` fail on a
    data-dependent one."""
    return {} if generator is None else {"generator": generator}


def _random_ranks(groups: Tensor, starts: Tensor, generator: torch.Generator | None) -> Tensor:
    """A uniformly random rank of each row within its group, ``0 .. count - 1`` (sync-free).

    ``groups`` holds each row's group id in ``[0, len(starts))`` and ``starts[g]`` is the number
    of rows in groups before ``g``. A random permutation gives every row a distinct key, so the
    order within each group after sorting by ``(group, key)`` is a uniform random permutation.
    """
    n = groups.shape[0]
    keys = torch.randperm(n, device=groups.device, **_rng(generator))
    order = torch.argsort(groups * n + keys)
    position = torch.empty_like(order).scatter(0, order, torch.arange(n, device=groups.device))
    return position - starts.index_select(0, groups)


def _chosen(x: RaggedArray, dim: int, k: int | Tensor, generator: torch.Generator | None) -> Tensor:
    """The mask of a uniform subset of ``min(k, L)`` entries per row along ragged axis ``dim``."""
    level = x.partition.levels[dim - 1]
    rank = _random_ranks(level.row_ids, level.offsets[:-1], generator)
    return rank < _per_row(k, level.row_ids)


@op("sampling", rule=ROWS, args="x: ragged, k: sizes, axis: axis?, generator: generator?")
def sample_mask(
    x: RaggedArray,
    k: int | Tensor,
    *,
    axis: int | str = 1,
    generator: torch.Generator | None = None,
) -> RaggedArray:
    """A boolean mask choosing a uniformly random subset of ``min(k, L_b)`` rows per segment.

    Every subset of that size is equally likely, independently across segments. Sync-free with
    static shapes (one ``randperm`` and one sort over all rows): it compiles to one graph
    across batches. Along another ragged ``axis`` of a multi-level array the subsets are drawn
    within every row of the axis above: on ``(B, S*, T*)``, ``axis=1`` chooses sentences
    (a ``(B, S*)`` mask) and ``axis=2`` tokens within each sentence (``(B, S*, T*)``).

    Args:
        x: the array whose rows are sampled (only its partition is used).
        k: rows per segment, an int or an integer tensor with one entry per row of the axis
            above (``(B,)`` for axis 1); negative means 0.
        axis: the ragged axis to sample along (default 1).
        generator: source of randomness (``None``: the global generator).

    Returns:
        A boolean RaggedArray with one flag per entry of ``axis``: the partition object of
        ``x`` for its innermost ragged axis, else its levels down to ``axis``.

    >>> import ragged, torch
    >>> x = ragged.from_lengths(torch.arange(7.0), [4, 0, 1, 2])
    >>> mask = ragged.sample_mask(x, 2, generator=torch.Generator().manual_seed(0))
    >>> ragged.sum(mask, axis=1)
    tensor([2, 0, 1, 2])
    """
    func = sample_mask
    x = checked_array(func, x)
    dim = ragged_axis(func, x, axis)
    k = _check_k(func, k, x, dim)
    chosen = _chosen(x, dim, k, generator)
    partition = x.partition if dim == x.ragged_ndim else Partition(x.partition.levels[:dim])
    return RaggedArray(chosen, partition, x.axes[: dim + 1] if x.axes is not None else None)


@op(
    "sampling",
    rule=NEW,
    args="x: ragged, k: sizes, axis: axis?, replace: bool?, generator: generator?",
)
def sample(
    x: RaggedArray,
    k: int | Tensor,
    *,
    axis: int | str = 1,
    replace: bool = False,
    generator: torch.Generator | None = None,
) -> RaggedArray:
    """The chosen rows of each segment: ``min(k, L_b)`` without replacement, or ``k`` with it.

    Without replacement the rows are those of [`sample_mask`][ragged.sample_mask], in their original order
    within the segment. With replacement each non-empty segment gets ``k`` rows drawn
    independently and uniformly (in draw order); empty segments stay empty. Along an outer
    ragged ``axis`` of a multi-level array the chosen entries are whole rows (sentences with
    their tokens), drawn within every row of the axis above.

    The choice is sync-free; compacting the chosen rows needs the output's total size, which
    depends on the data: this reads it once (one host sync; along an outer axis with the
    sizes below, and with replacement once more for them). The exception: without
    replacement, an int ``k`` and a known ``max_length <= k`` mean every row is chosen, and
    ``x`` itself is returned without touching the device.

    Differentiable with respect to the values of the chosen rows.

    Args:
        x: the array to sample from.
        k: rows per segment, an int or an integer tensor with one entry per row of the axis
            above (``(B,)`` for axis 1); negative means 0.
        axis: the ragged axis to sample along (default 1).
        replace: draw with replacement.
        generator: source of randomness (``None``: the global generator).

    Returns:
        A RaggedArray with a new partition and the axis names of ``x``.

    >>> import ragged, torch
    >>> x = ragged.from_lengths(torch.arange(7.0), [4, 0, 1, 2])
    >>> y = ragged.sample(x, 2, generator=torch.Generator().manual_seed(0))
    >>> y.lengths
    tensor([2, 0, 1, 2])
    >>> ragged.sample(x, 3, replace=True).lengths
    tensor([3, 0, 3, 3])
    """
    func = sample
    x = checked_array(func, x)
    dim = ragged_axis(func, x, axis)
    k = _check_k(func, k, x, dim)
    if not isinstance(replace, bool):
        raise type_error(func, "replace", "must be a bool", typename(replace))
    levels = x.partition.levels
    level = levels[dim - 1]
    if replace:
        return _sample_with_replacement(x, dim, k, generator)
    known = level.max_length
    if isinstance(k, int) and known is not None and known <= k:
        return x
    chosen = _chosen(x, dim, k, generator)
    if dim < x.ragged_ndim:
        plan = filter_plan(x, dim, chosen)
        if plan is None:
            return x
        partition, rows = plan
        return RaggedArray(x.values.index_select(0, rows), partition, x.axes)
    lengths = (
        torch.minimum(level.lengths, k) if isinstance(k, Tensor) else level.lengths.clamp_max(k)
    )
    total = int(lengths.sum())  # the one host sync: the output size depends on the data
    # Compact without nonzero: chosen row i goes to slot cumsum(chosen)[i] - 1; the others to a
    # spare slot at the end, which is dropped.
    slot = torch.where(chosen, torch.cumsum(chosen, 0) - 1, total)
    rows = torch.arange(chosen.shape[0], device=x.device)
    index = rows.new_zeros(total + 1).scatter(0, slot, rows)[:total]
    max_length = min(k, known) if isinstance(k, int) and known is not None else None
    new = RowPartition.from_lengths(lengths, total, max_length)
    return RaggedArray(x.values.index_select(0, index), Partition((*levels[:-1], new)), x.axes)


def _sample_with_replacement(
    x: RaggedArray, dim: int, k: int | Tensor, generator: torch.Generator | None
) -> RaggedArray:
    levels = x.partition.levels
    level = levels[dim - 1]
    lengths = torch.where(level.lengths > 0, k, 0)
    total = int(lengths.sum())  # the one host sync: the output size depends on the data
    # total = k * (non-empty segments), so min(k, total) is k, or 0 for no draws (sym_min: no
    # guard on the data-dependent total under torch.compile).
    max_length = torch.sym_min(k, total) if isinstance(k, int) else None
    out_level = RowPartition.from_lengths(lengths, total, max_length)
    segment = out_level.row_ids
    size = level.lengths.index_select(0, segment)
    draw = torch.rand(total, dtype=torch.float64, device=x.device, **_rng(generator))
    # floor(u * L) is uniform on 0 .. L - 1; the clamp guards the rounding of u * L up to L.
    offset = torch.minimum((draw * size).to(torch.int64), size - 1)
    index = level.offsets.index_select(0, segment) + offset
    if dim < x.ragged_ndim:  # whole rows: their sizes below are read once more
        partition, rows = whole_rows(x, dim, levels[: dim - 1], out_level, index, None)
        return RaggedArray(x.values.index_select(0, rows), partition, x.axes)
    partition = Partition((*levels[:-1], out_level))
    return RaggedArray(x.values.index_select(0, index), partition, x.axes)


@op(
    "sampling",
    rule=NEW,
    args="labels: ragged, k: sizes, positive_fraction: number?, generator: generator?",
)
def sample_balanced(
    labels: RaggedArray,
    k: int | Tensor,
    *,
    positive_fraction: float | None = None,
    generator: torch.Generator | None = None,
) -> RaggedArray:
    """A mask of up to ``k`` rows per segment, balancing positives and negatives.

    The sync-free version of the positive/negative sampler of detection models (torchvision's
    ``BalancedPositiveNegativeSampler``, the example of the blog post). Per segment it chooses,
    uniformly at random, ``min(P_b, round(k * positive_fraction))`` positives and then
    ``min(N_b, k - chosen positives)`` negatives, so negatives fill the quota when positives are
    scarce (but not the other way round). ``round`` rounds half to even (Python's ``round``,
    ``torch.round``); torchvision truncates instead.

    Args:
        labels: ``(B, L*)`` integers (``>= 1`` positive, ``0`` negative, ``< 0`` ignored) or
            booleans (True positive, False negative). With more ragged axes (``(B, S*, T*)``)
            the rows of the innermost one are balanced within every row of the axis above
            (tokens within each sentence): a label belongs to an entry of that axis only.
        k: rows per segment, an int or an integer tensor of shape ``(B,)`` (one entry per row
            of the axis above the innermost).
        positive_fraction: the share of ``k`` reserved for positives, in ``[0, 1]`` (default 0.5).
        generator: source of randomness (``None``: the global generator).

    Returns:
        A boolean RaggedArray with the partition object of ``labels``.

    >>> import ragged, torch
    >>> labels = ragged.array([[1, 0, 0, 0, -1, 1, 1], [0, 0], []])
    >>> mask = ragged.sample_balanced(labels, 4, generator=torch.Generator().manual_seed(0))
    >>> ragged.sum(ragged.where(mask, labels, 0) > 0, axis=1), ragged.sum(mask, axis=1)
    (tensor([2, 0, 0]), tensor([4, 2, 0]))
    """
    func = sample_balanced
    labels = checked_array(func, labels, "labels")
    values = labels.values
    if values.dtype.is_floating_point or values.dtype.is_complex:
        raise type_error(func, "labels", "must have an integer or bool dtype", values.dtype)
    if values.dim() != 1:
        raise value_error(
            func,
            "labels",
            "must have shape (B, L*) (one label per row)",
            f"inner shape {tuple(values.shape[1:])}",
        )
    k = _check_k(func, k, labels, labels.ragged_ndim)
    if positive_fraction is None:
        # The default lives here, not in the signature: torch.compile lifts a float default as
        # a graph input and reads it back with .item().
        positive_fraction = 0.5
    if isinstance(positive_fraction, bool) or not isinstance(positive_fraction, (int, float)):
        raise type_error(func, "positive_fraction", "must be a float", typename(positive_fraction))
    if not 0.0 <= positive_fraction <= 1.0:
        raise value_error(func, "positive_fraction", "must be in [0, 1]", positive_fraction)
    if values.dtype == torch.bool:
        positive, negative = values, ~values
    else:
        positive, negative = values >= 1, values == 0
    # Class 0 positive, 1 negative, 2 ignored; rank rows within (segment, class) groups.
    level = labels.partition.levels[-1]  # along the innermost ragged axis
    row_ids = level.row_ids
    cls = torch.where(positive, 0, torch.where(negative, 1, 2))
    groups = row_ids * 3 + cls
    counts = torch.zeros(3 * level.num_rows, dtype=torch.int64, device=values.device)
    counts = counts.index_add(0, groups, torch.ones_like(groups))
    rank = _random_ranks(groups, torch.cumsum(counts, 0) - counts, generator)
    per_segment = counts.view(-1, 3)
    # A tensor quota (round half to even, as Python's round): under torch.compile a Python int
    # k is symbolic, and round() of a symbolic float would read it back.
    quota = torch.round(torch.as_tensor(k * positive_fraction, dtype=torch.float64))
    quota = quota.to(torch.int64)
    num_pos = torch.clamp_max(per_segment[:, 0], quota)
    num_neg = torch.minimum(per_segment[:, 1], k - num_pos)
    limit = torch.where(
        cls == 0, num_pos.index_select(0, row_ids), num_neg.index_select(0, row_ids)
    )
    chosen = (cls < 2) & (rank < limit)
    return RaggedArray(chosen, labels.partition, labels.axes)
