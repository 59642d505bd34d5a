"""In-place edits: arrays remember the version counters of their tensors, and ops check them.

A RaggedArray is immutable, but its tensors are ordinary torch tensors that cannot be frozen:
``x.values.add_(1)`` or ``x.offsets[1] = 1`` would succeed and leave ``x`` changed (or, for the
offsets, inconsistent with its shape, its cached maximum length and its attention plans). Every
tensor has a version counter (``Tensor._version``) that each in-place op bumps, so an array
records the counters it was built with and eager ops compare them (``check_unchanged``):
an edit raises a ``ValueError`` that names the way to build a changed array instead.

The stamp is the *sum* of the counters: counters only grow, so the sum changes exactly when one
of them does. Views share the counter of their base, so an in-place write anywhere in the base
of ``values`` (also outside the rows the array uses) counts as an edit. No stamp is kept (and
nothing is checked) where counters cannot be read or mean nothing: inference tensors (no
counter), tensors seen while ``torch.compile`` or ``torch.export`` traces, and non-tensor leaves
that ``torch.func`` puts into rebuilt nodes. See ``docs/semantics.md`` (Immutability).

Cost (eager, tiny inputs): recording one counter when an array is built and reading
``1 + 3 * levels`` counters per checked array, a few hundred nanoseconds; measured in
``docs/benchmarks.md``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

import torch
from torch import Tensor

from ._errors import Func, name_of

if TYPE_CHECKING:
    from ._array import RaggedArray
    from ._partition import Partition

__all__ = ["PermutedLayoutError", "check_unchanged", "is_edited", "refuse_permuted", "stamp"]

_is_compiling = torch.compiler.is_compiling
Parameter = torch.nn.Parameter  # a plain tensor for the version checks (other subclasses: tracing)
_version = operator.attrgetter("_version")

EDITED = (
    "was modified in place after it was built ({what}); RaggedArrays are immutable: build a new "
    "array instead, e.g. {param}.with_values(new_values) for new values or ragged.from_lengths / "
    "ragged.from_offsets for a new partition"
)


def stamp(tensors: Sequence[Tensor]) -> int | None:
    """The sum of the version counters of ``tensors``, or ``None`` where one is unreadable."""
    if _is_compiling():
        return None
    total = 0
    for t in tensors:
        if type(t) is not Tensor or t.is_inference():
            return None
        total += t._version
    return total


def _moved(partition: Partition) -> bool:
    """Whether an index tensor of ``partition`` was edited since it was built."""
    recorded = partition._stamp
    return recorded is not None and sum(map(_version, partition._watch)) != recorded


class PermutedLayoutError(TypeError):
    """An op that works on the storage order only was given a permuted array
    (``ragged._layout``); the pointwise ops catch it and run on the storage order."""


def refuse_permuted(func: Func, name: str, sequence_first: bool = False) -> TypeError:
    """The error of an op that works on the storage order only, given a permuted array
    (``ragged._layout``); ``sequence_first``: the ``(L*, B, ...)`` view."""
    prefix = "" if func is None else f"{name_of(func)}: "
    if sequence_first:
        return PermutedLayoutError(
            f"{prefix}`{name}` is a sequence-first view (L*, B, ...) (from x.transpose(0, 1)), "
            "which this op does not take; transpose it back to (B, L*, ...) first (the "
            "sequence-first view takes sizes, the pointwise ops, F.linear, F.layer_norm and "
            "F.multi_head_attention_forward; docs/semantics.md, The logical order)."
        )
    return PermutedLayoutError(
        f"{prefix}`{name}` has its ragged axis moved (a permuted layout, e.g. from "
        "x.transpose(1, 2)), which this op does not take; move the axes back first (for "
        "example x.transpose(1, 2) again), or use the Tensor-style reshapes and pointwise ops, "
        "which take any layout (docs/semantics.md, Layouts and shapes)."
    )


def check_unchanged(
    func: Func,
    x: RaggedArray,
    y: RaggedArray | None = None,
    names: tuple[str, str] = ("x", "y"),
    *,
    any_layout: bool = False,
    sequence_first: bool = False,
) -> None:
    """Raise if ``x`` (or ``y``) was edited in place since it was built.

    Eager ops call it first on their RaggedArray arguments (``names``: their parameter names);
    a partition shared by ``x`` and ``y`` is read once. It does nothing while
    ``torch.compile``/``torch.export`` traces (counters are not static there).

    >>> import ragged, torch
    >>> x = ragged.from_lengths(torch.zeros(3), [2, 1])
    >>> check_unchanged("ragged.f", x)
    >>> x.offsets[1] = 1
    >>> check_unchanged("ragged.f", x)
    Traceback (most recent call last):
    ValueError: ragged.f: `x` was modified in place after it was built (its partition's offsets, lengths or row ids were written); RaggedArrays are immutable: build a new array instead, e.g. x.with_values(new_values) for new values or ragged.from_lengths / ragged.from_offsets for a new partition.
    """
    if not sequence_first and (x.order is not None or (y is not None and y.order is not None)):
        # A permuted layout (ragged._layout): static metadata, so refused under compile too;
        # ``any_layout`` takes the orders that keep the batch axis first.
        for name, array in zip(names, (x, y), strict=True):
            order = None if array is None else array.order
            if order is not None and (not any_layout or order[0] == 0):
                raise refuse_permuted(func, name, order[0] == 0)
    if _is_compiling():
        return
    # Inlined for x (and y): this runs first in every eager op, on tiny inputs too.
    recorded = x._values_version
    if recorded is not None and x.values._version != recorded:
        _edited(func, names[0], x, values=True)
    partition = x.partition
    recorded = partition._stamp
    if recorded is not None:
        watch = partition._watch
        if len(watch) == 3:  # one level: the common case, unrolled
            a, b, c = watch
            moved = a._version + b._version + c._version != recorded
        else:
            moved = sum(map(_version, watch)) != recorded
        if moved:
            _edited(func, names[0], x, values=False)
    if y is not None:
        recorded = y._values_version
        if recorded is not None and y.values._version != recorded:
            _edited(func, names[1], y, values=True)
        if y.partition is not partition and _moved(y.partition):
            _edited(func, names[1], y, values=False)


def is_edited(x: RaggedArray) -> bool:
    """Whether the values or an index tensor of ``x`` were edited in place since it was built:
    the test of ``check_unchanged`` alone (no layout check, eager only), for the hottest paths,
    which then call ``check_unchanged`` for the error."""
    recorded = x._values_version
    if recorded is not None and x.values._version != recorded:
        return True
    partition = x.partition
    recorded = partition._stamp
    if recorded is None:
        return False
    watch = partition._watch
    if len(watch) == 3:  # one level: the common case, unrolled
        a, b, c = watch
        return bool(a._version + b._version + c._version != recorded)
    return sum(map(_version, watch)) != recorded


def _edited(func: Func, param: str, x: RaggedArray, values: bool) -> NoReturn:
    if values:
        what = f"its values' version counter moved from {x._values_version} to {x.values._version}"
    else:
        what = "its partition's offsets, lengths or row ids were written"
    raise ValueError(f"{name_of(func)}: `{param}` {EDITED.format(what=what, param=param)}.")
