"""RaggedArrays are immutable: what an in-place spelling says instead, and gradients of arrays.

Every in-place method of ``torch.Tensor`` (the names that end in ``_``: ``x.add_``, ``x.zero_``,
``x.uniform_``, ...), item assignment (``x[0] = ...``) and the ``torch.nn.init`` functions raise
a ``TypeError`` that says the array is immutable and names the functional spelling; ``x.tolist()``
and ``x.item()`` name what to use. ``torch.autograd.grad`` takes RaggedArray inputs and outputs
(the gradient of an array is an array of its partition), and ``x.grad`` (``RaggedArray.grad``)
is the gradient of the values as an array.

>>> import ragged, torch
>>> x = ragged.array([[1.0, 2.0], [3.0]])
>>> x.add_(1)
Traceback (most recent call last):
TypeError: RaggedArray.add_: RaggedArrays are immutable (no in-place edits); use the functional spelling x.add(...), which returns a new array: e.g. x + 1 for x.add_(1), ragged.where(mask, new, x) for a masked write, or x.with_values(new_values) for new values (torch.nn.init functions edit in place too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.init as init

from ..._array import RaggedArray
from ..._registry import refuse, torch_function

__all__ = ["IN_PLACE", "refusals"]

# Tensor methods that end in ``_`` but edit nothing of the data, or that RaggedArray defines.
_NOT_EDITS = frozenset({"requires_grad_"})

# Every in-place method of torch.Tensor, from torch's own names (``add_``, ``zero_``, ...).
IN_PLACE: tuple[str, ...] = tuple(
    sorted(
        name
        for name in dir(torch.Tensor)
        if name.endswith("_") and not name.startswith("_") and name not in _NOT_EDITS
    )
)

FUNCTIONAL = (
    "e.g. x + 1 for x.add_(1), ragged.where(mask, new, x) for a masked write, or "
    "x.with_values(new_values) for new values (torch.nn.init functions edit in place too)"
)


def immutable(label: str, spelling: str) -> TypeError:
    """The error of an in-place edit of a RaggedArray, naming ``spelling`` (its functional form).

    >>> immutable("RaggedArray.exp_", "x.exp()")
    TypeError('RaggedArray.exp_: RaggedArrays are immutable (no in-place edits); use the functional spelling x.exp(), which returns a new array: e.g. x + 1 for x.add_(1), ragged.where(mask, new, x) for a masked write, or x.with_values(new_values) for new values (torch.nn.init functions edit in place too).')
    """
    return TypeError(
        f"{label}: RaggedArrays are immutable (no in-place edits); use the functional spelling "
        f"{spelling}, which returns a new array: {FUNCTIONAL}."
    )


# The functional spelling of in-place methods whose name without ``_`` is no RaggedArray method.
_SPELLINGS = {
    "zero_": "x.with_values(torch.zeros_like(x.values))",
    "fill_": "x.with_values(torch.full_like(x.values, value))",
    "copy_": "x.with_values(src.values) (or src itself)",
    "masked_fill_": "x.masked_fill(mask, value) or ragged.where(mask, value, x)",
    "masked_scatter_": "ragged.where(mask, new, x)",
    "index_put_": "ragged.where(mask, new, x)",
    "set_": "x.with_values(new_values)",
    "resize_": "ragged.map(lambda v: ..., x)",
}


def _spelling(name: str) -> str:
    if name in _SPELLINGS:
        return _SPELLINGS[name]
    base = name[:-1]
    if hasattr(RaggedArray, base):
        return f"x.{base}(...)"
    if hasattr(torch.Tensor, base):
        return f"x.with_values(x.values.{base}(...))"
    return "x.with_values(new_values)"


def _method(name: str) -> Callable[..., Any]:
    label, spelling = f"RaggedArray.{name}", _spelling(name)

    def refused(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise immutable(label, spelling)

    refused.__name__ = refused.__qualname__ = name
    return refused


def _setitem(self: Any, index: Any, value: Any) -> None:
    raise immutable("RaggedArray.__setitem__", "ragged.where(mask, value, x)")


def _tolist(self: Any) -> Any:
    raise TypeError(
        "RaggedArray.tolist: a RaggedArray is no dense tensor; use x.to_list() (nested lists, "
        "one per segment) or x.values.tolist() (the rows back to back)."
    )


def _item(self: Any) -> Any:
    raise TypeError(
        "RaggedArray.item: a RaggedArray has no single value; reduce it first (e.g. "
        "ragged.sum(x, axis=None)) or read x.values.item() of a one-entry array."
    )


def refusals() -> dict[str, Callable[..., Any]]:
    """Attribute name -> method refusing it, installed on RaggedArray with the other methods."""
    table = {name: _method(name) for name in IN_PLACE}
    table.update(__setitem__=_setitem, tolist=_tolist, item=_item)
    return table


# --- torch functions -----------------------------------------------------------------------

refuse(
    init.constant_,
    init.normal_,
    init.uniform_,
    init.kaiming_uniform_,
    family="tensor",
    hint="RaggedArrays are immutable and torch.nn.init functions write in place; initialise "
    "new values and rebuild the array: x.with_values(torch.nn.init.normal_(torch.empty_like("
    "x.values)))",
    see=("RaggedArray.with_values",),
)


def _unwrap(obj: Any) -> Any:
    if isinstance(obj, RaggedArray):
        return obj.values
    if isinstance(obj, (tuple, list)):
        return type(obj)(_unwrap(o) for o in obj)
    return obj


@torch_function(
    torch.autograd.grad,
    family="tensor",
    meaning="gradients of outputs with respect to inputs; RaggedArray inputs get RaggedArray "
    "gradients of their partition (`None` where unused)",
    see=("RaggedArray.grad",),
    compile=False,
)
def _autograd_grad(
    outputs: Any, inputs: Any, grad_outputs: Any = None, *args: Any, **kwargs: Any
) -> Any:
    single = not isinstance(inputs, (tuple, list))
    sources = (inputs,) if single else tuple(inputs)
    grads = torch.autograd.grad(
        _unwrap(outputs), _unwrap(sources), _unwrap(grad_outputs), *args, **kwargs
    )
    out = tuple(
        RaggedArray(g, x.partition, x.axes) if isinstance(x, RaggedArray) and g is not None else g
        for g, x in zip(grads, sources, strict=True)
    )
    return out
