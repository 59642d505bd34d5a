"""torch functions along an axis after the last ragged axis, on a permuted layout.

Rotary embeddings on ``(B, H, L*, Dh)`` (``x.transpose(1, 2)`` of ``(B, L*, H, Dh)``, a permuted
layout, ``ragged._layout``) join the two halves of the last axis:
``torch.cat((-x2, x1), dim=-1)``. The axes after the last ragged axis are the last inner axes of
the storage, in the same order and at the same dims (the axes before them are the ragged axes
and the other inner axes, in some order), so such a call is the same call on the storage order:
the operands are read in storage order and the result gets their order back. Operands in other
orders, or an axis at or before the last ragged axis, keep the op's refusal.

>>> import ragged, torch
>>> q = ragged.from_lengths(torch.arange(16.0).reshape(4, 2, 2), [1, 3]).transpose(1, 2)
>>> torch.cat((q, -q), dim=-1).shape  # (B, H, L*, 2 * Dh)
RaggedShape(2, 2, [1, 3], 4)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._array import RaggedArray
from ..._layout import logical_order

__all__ = ["TRAILING_AXIS_FUNCTIONS", "on_trailing_axes"]

# The ops lifted so (by public name): the one argument that names an axis, as torch spells it
# (name and position).
TRAILING_AXIS_FUNCTIONS = {"ragged.concat": ("dim", 1)}


def _arrays(value: Any) -> list[RaggedArray]:
    if isinstance(value, RaggedArray):
        return [value]
    if isinstance(value, (list, tuple)):
        return [a for item in value for a in _arrays(item)]
    return []


def _last_ragged(x: RaggedArray) -> int:
    """The logical position of ``x``'s last ragged axis."""
    order = logical_order(x)
    return max(d for d in range(1, x.ndim) if order[d - 1] <= x.ragged_ndim)


def _strip(value: Any) -> Any:
    if isinstance(value, RaggedArray):
        return type(value)._trusted(value.values, value.partition, None)
    if isinstance(value, (list, tuple)):
        return type(value)(_strip(item) for item in value)
    return value


def on_trailing_axes(handler: Callable[..., Any], dim: tuple[str, int]) -> Callable[..., Any]:
    """``handler`` (a torch spelling whose axis is the argument ``dim``) that also takes permuted
    arrays sharing one order, along an axis after their last ragged axis."""
    name, position = dim

    def lifted(*args: Any, **kwargs: Any) -> Any:
        arrays = _arrays((args, kwargs))
        first = arrays[0] if arrays else None
        # Decided from the (static) orders, not from the handler's refusal: the op's checks
        # do not run while torch.compile traces.
        if first is None or all(a.order is None for a in arrays):
            return handler(*args, **kwargs)
        axis = kwargs[name] if name in kwargs else args[position] if len(args) > position else 0
        same = all(a.order == first.order and a.axes == first.axes for a in arrays)
        n = first.ndim
        if not same or isinstance(axis, bool) or not isinstance(axis, int) or not -n <= axis < n:
            return handler(*args, **kwargs)  # the op's refusal (or its own error)
        if axis % n <= _last_ragged(first):
            return handler(*args, **kwargs)
        out = handler(*_strip(args), **{k: _strip(v) for k, v in kwargs.items()})
        return type(out)._trusted(out.values, out.partition, first.axes, first.order)

    lifted.__wrapped__ = handler  # type: ignore[attr-defined]
    return lifted
