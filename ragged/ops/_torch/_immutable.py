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

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
import torch.nn.init as init

from ..._array import RaggedArray
from ..._registry import refuse, torch_function

__all__ = ["IN_PLACE", "refusals", "refuse_nn_init"]

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


# --- torch.nn.init ---------------------------------------------------------------------------
# Most ``torch.nn.init`` functions never dispatch to ``__torch_function__``: they read the shape
# (``tensor.dim()``, ``tensor.ndimension()``, ``tensor.is_meta``) and then write in place. The
# array's answers to those reads, and its in-place methods, look for a torch.nn.init function
# on the call stack (a few frames up) and raise the immutability error in its name.

_INIT_GLOBALS = vars(init)
_STACK_DEPTH = 8  # dim -> handler wrappers -> _calculate_fan_in_and_fan_out -> xavier_uniform_


def _nn_init_caller() -> str | None:
    """The public ``torch.nn.init`` function on the call stack (the outermost), or ``None``."""
    frame: FrameType | None = sys._getframe(2)
    name = None
    for _ in range(_STACK_DEPTH):
        if frame is None:
            break
        if frame.f_globals is _INIT_GLOBALS:
            code = frame.f_code.co_name
            if not code.startswith("_") and code in _INIT_GLOBALS:
                name = code
        elif name is not None:
            break
        frame = frame.f_back
    return name


def _init_error(name: str) -> TypeError:
    return immutable(
        f"torch.nn.init.{name}", f"x.with_values(torch.nn.init.{name}(torch.empty_like(x.values)))"
    )


def refuse_nn_init() -> None:
    """Raise the immutability ``TypeError`` when a ``torch.nn.init`` function (a few frames up
    the stack) is reading a RaggedArray's shape before writing to it; no-op otherwise (and
    while compiling: Dynamo cannot trace stack frames).

    >>> import ragged, torch
    >>> torch.nn.init.xavier_uniform_(ragged.array([[[1.0, 2.0]], [[3.0, 4.0]]]))
    Traceback (most recent call last):
    TypeError: torch.nn.init.xavier_uniform_: RaggedArrays are immutable (no in-place edits); use the functional spelling x.with_values(torch.nn.init.xavier_uniform_(torch.empty_like(x.values))), which returns a new array: e.g. x + 1 for x.add_(1), ragged.where(mask, new, x) for a masked write, or x.with_values(new_values) for new values (torch.nn.init functions edit in place too).
    """
    if not torch.compiler.is_compiling():
        name = _nn_init_caller()
        if name is not None:
            raise _init_error(name)


def _is_meta(self: Any) -> bool:
    refuse_nn_init()  # trunc_normal_, orthogonal_, dirac_ and sparse_ ask before writing
    return bool(self.values.is_meta)


def _method(name: str) -> Callable[..., Any]:
    label, spelling = f"RaggedArray.{name}", _spelling(name)

    def refused(self: Any, *args: Any, **kwargs: Any) -> Any:
        caller = _nn_init_caller()  # ones_, zeros_: torch.nn.init writes without reading
        raise immutable(label, spelling) if caller is None else _init_error(caller)

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


def refusals() -> dict[str, Any]:
    """Attribute name -> method refusing it (and the `is_meta` property), installed on
    RaggedArray with the other methods."""
    table: dict[str, Any] = {name: _method(name) for name in IN_PLACE}
    table.update(__setitem__=_setitem, tolist=_tolist, item=_item, is_meta=property(_is_meta))
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
