"""``x[index]`` on a permuted layout (``ragged._layout``) when the index reads only the axes after
the last ragged axis, as rotary embeddings do on ``(B, H, L*, Dh)``: ``x[..., : Dh // 2]``.

Those axes are the last inner axes of the storage, in the same order (inner axes are stored in
their logical order), so the index is the same on the storage order: the result keeps the
partition and the order of the axes before. Any other index on a permuted array is refused as
before (an entry on an inner axis before the ragged one would need the axes mapped one by one).

>>> import ragged, torch
>>> x = ragged.from_lengths(torch.arange(24.0).reshape(6, 2, 2), [2, 4])  # (B, L*, H, D)
>>> q = x.transpose(1, 2)  # (B, H, L*, D)
>>> q[..., :1].shape
RaggedShape(2, 2, [2, 4], 1)
>>> q[..., 1].order
(2, 1)
"""

from __future__ import annotations

from typing import Any

from torch import SymInt

from ..._array import RaggedArray
from ..._layout import build, logical_order
from .._ragged_index import RaggedIndex, index_rows
from ._getitem import getitem


def _is_full(item: Any) -> bool:
    return isinstance(item, slice) and item == slice(None)


def _full(items: tuple[Any, ...], ndim: int, used: int) -> tuple[Any, ...] | None:
    """``items`` with its ``...`` (at most one), or the axes after its last entry, as full
    slices: ``used`` of the ``ndim`` axes are indexed. None for two ``...`` or too many."""
    ellipses = [k for k, item in enumerate(items) if item is Ellipsis]
    if len(ellipses) > 1 or used > ndim:
        return None
    if not ellipses:
        return items + (slice(None),) * (ndim - used)
    k = ellipses[0]
    return items[:k] + (slice(None),) * (ndim - used) + items[k + 1 :]


def _trailing(x: RaggedArray, index: Any) -> tuple[int, tuple[Any, ...]] | None:
    """The logical position ``p`` of the last ragged axis and the entries after it, when
    ``index`` (ints and slices, at most one ``...``) reads only those axes; None otherwise."""
    items = index if isinstance(index, tuple) else (index,)
    if any(
        not (item is Ellipsis or isinstance(item, (slice, int, SymInt))) or isinstance(item, bool)
        for item in items
    ):
        return None
    full = _full(items, x.ndim, sum(1 for item in items if item is not Ellipsis))
    if full is None:
        return None
    order = logical_order(x)
    p = max(d for d in range(1, x.ndim) if order[d - 1] <= x.ragged_ndim)
    if not all(_is_full(item) for item in full[: p + 1]):
        return None
    return p, full[p + 1 :]


def _new_axes(x: RaggedArray, index: Any) -> list[int] | None:
    """The result positions of the ``None`` entries when ``index`` is ``None``, ``:`` and at
    most one ``...`` only (HF's ``repeat_kv``: ``k[:, :, None, :, :]``); None otherwise."""
    items = index if isinstance(index, tuple) else (index,)
    if not any(item is None for item in items) or not all(
        item is None or item is Ellipsis or _is_full(item) for item in items
    ):
        return None
    full = _full(items, x.ndim, sum(1 for item in items if _is_full(item)))
    return None if full is None else [k for k, item in enumerate(full) if item is None]


def getitem_any_layout(x: RaggedArray, index: Any) -> Any:
    """``x[index]``: [`RaggedArray.__getitem__`][ragged.RaggedArray.__getitem__], and on a
    permuted array an index of the axes after the last ragged axis (the module docstring) or
    new size-1 axes (``None`` and ``:`` only: one ``unsqueeze`` each); ``x[b, i]`` with a
    [`RaggedIndex`][ragged.RaggedIndex] ``i`` reads ``x`` at its positions."""
    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(item, RaggedIndex) for item in items):
        return index_rows(x, items)
    new = _new_axes(x, index) if x.order is not None and x.order[0] != 0 else None
    if new is not None and 0 not in new:  # x[None] and sequence-first views: getitem refuses
        for position in new:
            x = x.unsqueeze(position)
        return x
    found = _trailing(x, index) if x.order is not None else None
    if found is None:
        return getitem(x, index)  # the storage order's rules (a permuted array is refused)
    p, tail = found
    storage = type(x)._trusted(x.values, x.partition, None)
    values = getitem(storage, (Ellipsis, *tail)).values
    kept = [k for k, item in enumerate(tail) if isinstance(item, slice)]
    order = (*logical_order(x)[:p], *range(p + 1, p + 1 + len(kept)))
    names = None if x.axes is None else (*x.axes[: p + 1], *(x.axes[p + 1 + k] for k in kept))
    return build(x, values, names, order)
