"""``collate``: a ``DataLoader`` ``collate_fn`` that batches variable-length samples without padding.

The rule (see ``docs/semantics.md`` (data loading)): a sample is a tensor or a pytree (dicts, tuples,
namedtuples, lists) of tensors and Python scalars. A bare-tensor sample always becomes a
RaggedArray. Inside a pytree, a tensor field becomes a RaggedArray when ``ragged_keys`` names it
or, with ``ragged_keys=None``, when its leading sizes differ within the batch; other tensor fields
are stacked densely. A field that is a list of numbers in every sample (what tokenizers and
``datasets`` return) is a 1-D tensor field: int64 if every number is an int, bool if every one
is a bool, else the default float dtype (int64 when every list is empty). Python numbers become
a tensor, anything else a list.

Lengths come from the samples' shapes, so every RaggedArray built here knows its maximum
length on the host and later ``to_padded``/``to_mask`` calls read nothing from the device. Fields
with equal lengths share one partition object, so binary ops between them take the fast path.
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, overload

import torch
from torch import Tensor

from .._array import RaggedArray
from .._errors import type_error, value_error
from .._partition import Partition, RowPartition
from .._registry import public

__all__ = ["collate"]

Path = tuple[Hashable, ...]


K = TypeVar("K")


@overload
def collate(samples: Sequence[Tensor], *, ragged_keys: None = None) -> RaggedArray: ...
@overload
def collate(
    samples: Sequence[Mapping[K, Any]], *, ragged_keys: Iterable[Any] | None = None
) -> dict[K, Any]: ...
@overload
def collate(samples: Sequence[Any], *, ragged_keys: Iterable[Any] | None = None) -> Any: ...


@public("data", namespace="ragged.data")
def collate(samples: Sequence[Any], *, ragged_keys: Iterable[Any] | None = None) -> Any:
    """Batch variable-length samples into RaggedArrays (no padding) and dense tensors.

    Use it as ``DataLoader(dataset, collate_fn=ragged.data.collate)``, or with
    ``functools.partial(ragged.data.collate, ragged_keys=[...])`` (picklable, so it works with
    worker processes).

    Args:
        samples: tensors of shape ``(L_i, *inner)``, or pytrees (dicts, tuples, namedtuples,
            lists) of one structure whose leaves are tensors, numpy arrays, lists of numbers
            (1-D fields, e.g. a tokenizer's ``input_ids``) or Python scalars.
        ragged_keys: the fields that become RaggedArrays; every other tensor field is stacked
            (and must have one shape across the batch). A field is a top-level dict key or tuple
            index (a field name for a namedtuple), or a tuple path into nested containers
            (``("inputs", "ids")``). ``None``
            infers the rule per batch: a field is ragged iff its leading sizes differ. Inference
            is convenient but its output type can change between batches (a batch whose
            samples happen to have equal lengths is stacked), so pass ``ragged_keys`` for
            training loops.

    Returns:
        A RaggedArray for bare tensors, else the samples' structure with batched leaves.

    Raises:
        TypeError: the samples' structures or dtypes differ, or ``samples`` is not a sequence.
        ValueError: no samples, a ragged field with differing inner shapes, a dense field with
            differing shapes, or a ``ragged_keys`` entry that names no tensor field.

    >>> import ragged, torch
    >>> batch = ragged.data.collate([
    ...     {"tokens": torch.tensor([1, 2, 3]), "label": 0},
    ...     {"tokens": torch.tensor([4]), "label": 1},
    ... ])
    >>> batch["tokens"].to_list(), batch["label"]
    ([[1, 2, 3], [4]], tensor([0, 1]))
    >>> batch["tokens"].partition.levels[0].max_length  # known on the host: no sync later
    3
    >>> ragged.data.collate([torch.ones(2, 4), torch.ones(2, 4)]).shape  # bare tensors: ragged
    RaggedShape(2, [2, 2], 4)
    >>> rows = [{"input_ids": [101, 7592, 102], "label": 1}, {"input_ids": [101, 102], "label": 0}]
    >>> ragged.data.collate(rows)["input_ids"].to_list()  # lists of numbers, as from a tokenizer
    [[101, 7592, 102], [101, 102]]
    """
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence):
        raise type_error(
            collate, "samples", "must be a sequence of samples", type(samples).__name__
        )
    if not samples:
        raise value_error(collate, "samples", "must hold at least one sample", "an empty batch")
    first = samples[0]
    if isinstance(first, Tensor) or _is_array(first):
        return _Collator(None).ragged((), [_as_tensor(s, ()) for s in samples])
    keys = None
    if ragged_keys is not None:
        if isinstance(ragged_keys, (str, bytes)):
            ragged_keys = [ragged_keys]
        keys = {k if isinstance(k, tuple) else (k,) for k in ragged_keys}
    collator = _Collator(keys)
    out = collator.walk((), list(samples))
    if keys is not None:
        unused = keys - collator.used
        if unused:
            names = sorted(map(_path_text, unused))
            raise value_error(
                collate, "ragged_keys", "must name tensor fields of the samples", names
            )
    return out


def _is_array(obj: Any) -> bool:
    return type(obj).__module__ == "numpy" and type(obj).__name__ == "ndarray"


def _as_tensor(obj: Any, path: Path) -> Tensor:
    if isinstance(obj, Tensor):
        return obj
    if _is_array(obj):
        return torch.as_tensor(obj)
    raise type_error(
        collate, "samples", f"must hold tensors at {_path_text(path)}", type(obj).__name__
    )


def _path_text(path: Path) -> str:
    return "the sample" if not path else "".join(f"[{key!r}]" for key in path)


class _Collator:
    """One collate call: walks the samples' common structure and batches each leaf."""

    def __init__(self, keys: set[Path] | None) -> None:
        self.keys = keys
        self.used: set[Path] = set()
        self.partitions: dict[tuple[int, ...], Partition] = {}

    def walk(self, path: Path, items: list[Any]) -> Any:
        first = items[0]
        for b, item in enumerate(items):
            if type(item) is not type(first) and not (_is_leaf(item) and _is_leaf(first)):
                got = f"{type(first).__name__} in sample 0, {type(item).__name__} in sample {b}"
                raise type_error(
                    collate, "samples", f"must share one structure at {_path_text(path)}", got
                )
        if isinstance(first, Mapping):
            fields = list(first.keys())
            for b, item in enumerate(items):
                if set(item.keys()) != set(fields):
                    got = f"keys {sorted(map(str, fields))} in sample 0, {sorted(map(str, item.keys()))} in sample {b}"
                    raise type_error(
                        collate, "samples", f"must share one structure at {_path_text(path)}", got
                    )
            batched = {k: self.walk((*path, k), [item[k] for item in items]) for k in fields}
            try:  # keep the mapping type when it can be built from a dict (OrderedDict, ...)
                return batched if type(first) is dict else type(first)(batched)  # type: ignore[call-arg]
            except TypeError:
                return batched
        if isinstance(first, list) and _number_lists(items):
            return self.leaf(path, _number_tensors(items))
        if isinstance(first, (tuple, list)):
            for b, item in enumerate(items):
                if len(item) != len(first):
                    got = f"length {len(first)} in sample 0, {len(item)} in sample {b}"
                    expected = (
                        f"must share one structure at {_path_text(path)} (tuples and lists of "
                        "non-numbers are containers: give a variable-length field as a tensor "
                        "or a list of numbers)"
                    )
                    raise type_error(collate, "samples", expected, got)
            names = getattr(first, "_fields", None)  # a namedtuple's fields go by name
            keys = names if isinstance(first, tuple) and names else range(len(first))
            fields = [
                self.walk((*path, key), [item[i] for item in items]) for i, key in enumerate(keys)
            ]
            return type(first)(*fields) if keys is names else type(first)(fields)
        return self.leaf(path, items)

    def leaf(self, path: Path, items: list[Any]) -> Any:
        first = items[0]
        if isinstance(first, Tensor) or _is_array(first):
            tensors = [_as_tensor(item, path) for item in items]
            if self.keys is not None:
                ragged = path in self.keys
                if ragged:
                    self.used.add(path)
            else:
                ragged = (
                    all(t.dim() > 0 for t in tensors) and len({t.shape[0] for t in tensors}) > 1
                )
            return self.ragged(path, tensors) if ragged else self.dense(path, tensors)
        if all(isinstance(item, numbers.Number) for item in items):
            return torch.tensor(items)
        return list(items)

    def dense(self, path: Path, tensors: list[Tensor]) -> Tensor:
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) > 1:
            names = ", ".join(sorted(map(_path_text, self.keys or ())))
            held = "" if self.keys is None else f", which holds {names},"
            raise value_error(
                collate,
                "samples",
                f"must have one shape at {_path_text(path)} to stack it (name it in "
                f"`ragged_keys`{held} to batch it as a RaggedArray)",
                f"shapes {sorted(shapes)}",
            )
        _check_dtypes(path, tensors)
        return torch.stack(tensors, out=_shared_out(tensors, (len(tensors), *tensors[0].shape)))

    def ragged(self, path: Path, tensors: list[Tensor]) -> RaggedArray:
        for b, t in enumerate(tensors):
            if t.dim() == 0:
                raise value_error(
                    collate,
                    "samples",
                    f"must have a leading (ragged) axis at {_path_text(path)}",
                    f"a 0-dim tensor in sample {b}",
                )
        inner = {tuple(t.shape[1:]) for t in tensors}
        if len(inner) > 1:
            raise value_error(
                collate,
                "samples",
                f"must have one inner shape at {_path_text(path)} (only the leading axis is ragged)",
                f"inner shapes {sorted(inner)}",
            )
        _check_dtypes(path, tensors)
        lengths = tuple(t.shape[0] for t in tensors)
        total = sum(lengths)
        values = torch.cat(tensors, out=_shared_out(tensors, (total, *tensors[0].shape[1:])))
        partition = self.partitions.get(lengths)
        if partition is None:
            lengths_t = torch.tensor(lengths, dtype=torch.int64, device=values.device)
            squares = sum(n * n for n in lengths)  # pair maps over it need no device read
            level = RowPartition.from_lengths(
                lengths_t, total, max(lengths), squares, nonempty=min(lengths) > 0
            )
            partition = self.partitions[lengths] = Partition((level,))
        return RaggedArray(values, partition)


def _number_lists(items: list[Any]) -> bool:
    """Whether every item is a list of real numbers (bools included; no nested containers)."""
    return all(
        isinstance(item, list) and all(isinstance(e, numbers.Real) for e in item) for item in items
    )


def _number_tensors(items: list[list[Any]]) -> list[Tensor]:
    """The lists as 1-D tensors of one dtype for the whole batch."""
    elements = [e for item in items for e in item]
    if not elements or all(isinstance(e, numbers.Integral) for e in elements):
        is_bool = bool(elements) and all(isinstance(e, bool) for e in elements)
        dtype = torch.bool if is_bool else torch.int64
    else:
        dtype = torch.get_default_dtype()
    return [torch.tensor(item, dtype=dtype) for item in items]


def _check_dtypes(path: Path, tensors: list[Tensor]) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise type_error(
            collate,
            "samples",
            f"must have one dtype at {_path_text(path)}",
            sorted(map(str, dtypes)),
        )
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise value_error(
            collate,
            "samples",
            f"must be on one device at {_path_text(path)}",
            sorted(map(str, devices)),
        )


def _shared_out(tensors: list[Tensor], shape: tuple[int, ...]) -> Tensor | None:
    """In a DataLoader worker, an output in shared memory saves one copy when it is sent to the
    main process (what ``default_collate`` does)."""
    if torch.utils.data.get_worker_info() is None or tensors[0].device.type != "cpu":
        return None
    numel = 1
    for size in shape:
        numel *= size
    storage = tensors[0]._typed_storage()._new_shared(numel, device="cpu")
    return tensors[0].new(storage).resize_(shape)


def _is_leaf(obj: Any) -> bool:
    return not isinstance(obj, (Mapping, tuple, list))
