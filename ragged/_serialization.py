"""Pickling, ``torch.save``/``torch.load`` (also with the default ``weights_only=True``).

A file is untrusted input: a corrupted or crafted partition must not load (it would give wrong
numbers, and wrong offsets can make kernels read or write out of bounds). So every RaggedArray,
Partition and RowPartition read from a pickle is checked completely before it exists (see
``ragged._validate``): for every level, offsets start at 0, never decrease and end at the
number of children; lengths are the offsets' differences; each row id names the row whose
offsets hold that child; the recorded maximum length, sum of squared lengths, columns and unit
and nonempty flags are right; index tensors are 1-D int64 on the values' device; and ``values`` has one row
per child of the last level. A failed check raises a ``ValueError`` naming the inconsistency.
The checks are a few vectorised passes and one read from the device per level.

Format: each object pickles as ``import_ragged_before_torch_load(kind, fields)``, a call that
checks ``fields`` and builds the object. ``torch.load(weights_only=True)`` calls only
allow-listed functions, so ``register`` adds this one to its safe globals at
``import ragged``, and only this one: the classes themselves are not allow-listed, since a
file could otherwise call their (trusting) constructors directly. Without ``import ragged``,
torch's error names the first unknown global, and that is this function: its name is the hint
(torch runs no code of ours before that error). Pickles of earlier versions (the classes
pickled by value) load with ``weights_only=False`` through ``__setstate__``, which checks them
the same way.

Copies in memory are trusted: ``copy.deepcopy`` rebuilds through the constructors, and pickles
sent between processes by ``multiprocessing`` (``DataLoader`` workers, ``torch.multiprocessing``
queues) rebuild without the data checks: they come from this program, not from a file.
"""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from . import _validate
from ._array import RaggedArray
from ._errors import name_of
from ._partition import Partition, Pickled, RowPartition

__all__ = ["import_ragged_before_torch_load", "reduce", "register", "setstate"]

_KINDS: dict[str, type] = {
    "RaggedArray": RaggedArray,
    "Partition": Partition,
    "RowPartition": RowPartition,
}
_FIELDS: dict[type, tuple[str, ...]] = {
    RaggedArray: ("values", "partition", "axes"),
    Partition: ("levels",),
    RowPartition: ("offsets", "lengths", "row_ids", "max_length", "sum_squares", "columns", "unit"),
}


def _checked(kind: object, fields: object) -> tuple[type, dict[str, Any]]:
    """The class named ``kind`` and ``fields``, after every check (``ragged._validate``)."""
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"ragged: a file names an unknown ragged type {kind!r}.")
    func = f"{name_of(cls)} (loaded from a file or pickle)"
    names = _FIELDS[cls]
    if cls is RaggedArray and isinstance(fields, dict) and "order" in fields:
        names = (*names, "order")  # a permuted layout (saved only when there is one)
    if cls is RowPartition and isinstance(fields, dict) and "nonempty" in fields:
        names = (*names, "nonempty")  # saved only when set
    if not isinstance(fields, dict) or set(fields) != set(names):
        got = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
        raise ValueError(
            f"{name_of(func)}: the file must give the fields {list(names)}, got {got}."
        )
    if cls is RowPartition:
        _validate.check_level(func, fields)
    elif cls is Partition:
        _validate.check_levels(func, fields["levels"])
    else:
        _validate.check_array(func, fields)
        if fields.get("order") is not None:
            _check_order(func, fields)
    return cls, fields


def _check_order(func: str, fields: dict[str, Any]) -> None:
    """A saved layout (``ragged._layout``) must fit the array: a permutation of its non-batch
    axes, the ragged axes and the inner axes each in their stored order."""
    order, ragged = fields["order"], len(fields["partition"].levels)
    ndim = ragged + fields["values"].dim()
    good = isinstance(order, tuple) and all(type(k) is int for k in order)
    if good and sorted(order) == list(range(1, ndim)):
        outer = [k for k in order if k <= ragged]
        inner = [k for k in order if k > ragged]
        good = outer == sorted(outer) and inner == sorted(inner)
    else:
        good = False
    if not good:
        raise ValueError(
            f"{name_of(func)}: `order` must be a layout of the array's {ndim - 1} non-batch axes "
            f"(ragged._layout), got {order!r}."
        )


def import_ragged_before_torch_load(kind: str, fields: dict[str, Any]) -> Any:
    """Check ``fields`` completely, then build the RaggedArray, Partition or RowPartition.

    Every ragged object in a pickle is a call of this function; its name is what
    ``torch.load`` prints when ``ragged`` was not imported.
    """
    cls, fields = _checked(kind, fields)
    return cls(**fields)


def _fields(obj: Any) -> dict[str, Any]:
    fields = {name: getattr(obj, name) for name in _FIELDS[type(obj)]}
    if getattr(obj, "order", None) is not None:  # a RaggedArray in a permuted layout
        fields["order"] = obj.order
    if getattr(obj, "nonempty", False):  # a RowPartition known to have no empty row
        fields["nonempty"] = True
    return fields


def reduce(obj: Any) -> tuple[Any, ...]:
    """The pickle recipe of a RaggedArray, Partition or RowPartition (checked when loaded)."""
    return (import_ragged_before_torch_load, (type(obj).__name__, _fields(obj)))


def setstate(obj: Any, state: Any) -> None:
    """Check and apply the state of an object pickled by an earlier version (by value)."""
    if obj.__dict__:
        raise ValueError(f"{name_of(type(obj))}: the state is set twice.")
    cls, fields = _checked(type(obj).__name__, state)
    obj.__dict__.update(cls(**fields).__dict__)  # the constructors' checks and version stamps


def _trusted(kind: str, fields: dict[str, Any]) -> Any:
    """Rebuild from a pickle this program sent to itself (``multiprocessing``): no data read."""
    return _KINDS[kind](**fields)


def _reduce_trusted(obj: Any) -> tuple[Any, ...]:
    return (_trusted, (type(obj).__name__, _fields(obj)))


def register() -> None:
    """Install the pickling hooks of the ragged classes; allow ragged objects in
    ``torch.load(..., weights_only=True)``; trusted IPC pickles."""
    Pickled._reduce = reduce
    Pickled._setstate = setstate
    torch.serialization.add_safe_globals([import_ragged_before_torch_load])
    for cls in _KINDS.values():
        ForkingPickler.register(cls, _reduce_trusted)
