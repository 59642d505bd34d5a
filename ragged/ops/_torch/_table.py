"""The dispatch table of ``RaggedArray.__torch_function__`` and the Tensor-style methods.

Built from the registry: the ops' ``torch=`` functions and ``methods=`` (``spelled``), the
pointwise functions, the handlers declared in ``_handlers`` and ``_tensor``, and the refusals
(declared next to their family's ops), whose TypeError says what to use instead; any other
function raises a TypeError naming the nearest ragged functions. The registry holds each torch
spelling once (``_registry.claim``: a second declaration raises at import), so no entry here
replaces another.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Callable
from typing import Any

import torch

from ... import _array, _layout, _registry
from ..._array import RaggedArray
from ..._torch_args import refuse_out
from ..._versions import check_unchanged
from .. import _pointwise as _pointwise
from . import _dynamo_tuples as dynamo_tuples
from . import _handlers as _handlers
from . import _immutable as _immutable
from . import _losses as _losses
from . import _mha as _mha
from . import _model_calls as _model_calls
from . import _pair_calls as _pair_calls
from . import _recurrent as _recurrent
from . import _tensor as _tensor
from ._spelling import ERRORS, RENAMING, TORCH_RENAMES, display_name, rename_error, spelled
from ._trailing import TRAILING_AXIS_FUNCTIONS, on_trailing_axes


def _unsupported(func: Any, args: Any, kwargs: Any) -> Any:
    """The error for a torch function without a handler, naming the nearest ragged ones."""
    name = display_name(func)
    if name.startswith("torch.Tensor.__"):
        return NotImplemented  # a Python operator: let Python try the reflected one
    short = name.rsplit(".", 1)[-1]
    candidates = {
        spec.name: spec.qualname for spec in _registry.ops() if spec.namespace == "ragged"
    }
    near = [candidates[n] for n in difflib.get_close_matches(short, list(candidates), n=3)]
    suggestion = f"the nearest ragged functions: {', '.join(near)}; " if near else ""
    raise TypeError(
        f"{name} is not supported on RaggedArrays; {suggestion}ragged.map(fn, x) applies a "
        "function to the rows, ragged.vmap(fn)(x) to each segment, and x.with_values(...) "
        "rebuilds an array from its values (docs/torch.md lists the supported functions)."
    )


def _refused(fn: Any, hint: str) -> Callable[..., Any]:
    def handler(*args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{display_name(fn)} is not supported on RaggedArrays: {hint}.")

    return handler


def _renaming(handler: Callable[..., Any], fn: Any) -> Callable[..., Any]:
    """``handler`` whose errors name ``fn`` (torch's spelling) instead of a ragged op."""
    prefixes = tuple(s.qualname for s in _registry.ops())

    def renaming(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        except ERRORS as error:
            text = str(error.args[0]) if error.args else ""
            label = display_name(fn)
            new = rename_error(error, prefixes, label, TORCH_RENAMES)
            if new is None and text.startswith("`"):  # a handler's own message
                new = type(error)(f"{label}: {text}").with_traceback(error.__traceback__)
            if new is None:
                raise
            raise new from None

    return renaming


# Ops over the last axes of their first operand, which take the sequence-first view too.
ROWWISE = frozenset({torch.nn.functional.linear, torch.nn.functional.layer_norm})


def _operand_name(position: int) -> str:
    return ("input", "other")[position] if position < 2 else f"args[{position}]"


def guarded(handler: Callable[..., Any], fn: Any) -> Callable[..., Any]:
    """``handler`` behind the checks of the torch door: ``out=`` is refused, and every
    RaggedArray argument (also in a list or tuple) must be unchanged since it was built
    (``ragged._versions``; eager only) and in the storage order unless the handler takes any
    layout. Handlers declared ``checks=True`` do this themselves."""

    layouts = getattr(handler, "takes_layouts", False)  # ragged._layout: any order
    first = getattr(handler, "takes_sequence_first", False)  # and the (L*, B, ...) view
    label = display_name(fn)  # once, here: torch.compile does not trace the string work

    def checked(*args: Any, **kwargs: Any) -> Any:
        if kwargs and kwargs.get("out") is not None:
            refuse_out(display_name(fn), kwargs["out"])
        # Also while torch.compile traces: check_unchanged then checks the (static) layout only.
        for k, value in enumerate(args):
            check_arguments(label, _operand_name(k), value, layouts, first)
        for key, value in kwargs.items():
            check_arguments(label, key, value, layouts, first)
        return handler(*args, **kwargs)

    return checked


def check_arguments(
    label: str, name: str, value: Any, any_layout: bool = False, sequence_first: bool = False
) -> None:
    """Raise if ``value`` (a RaggedArray, or a list or tuple of them) was edited in place (or
    is in a permuted layout, unless ``any_layout``; sequence-first, unless ``sequence_first``);
    ``label``: torch's name of the call."""
    items = [(name, value)] if type(value) is RaggedArray else []
    if type(value) in (list, tuple):
        items = [(f"{name}[{k}]", a) for k, a in enumerate(value) if type(a) is RaggedArray]
    for item_name, item in items:
        check_unchanged(
            label,
            item,
            names=(item_name, ""),
            any_layout=any_layout,
            sequence_first=sequence_first,
        )


def dispatch_table() -> dict[Any, Callable[..., Any]]:
    """torch function -> handler, for ``RaggedArray.__torch_function__``."""
    table: dict[Any, Callable[..., Any]] = {None: _unsupported}
    for spec in _registry.ops():
        for fn in spec.torch:
            table[fn] = _lifted(spec, spelled(spec.obj, spec.torch_signature(fn), fn))
            if fn in ROWWISE:  # the sequence-first view (L*, B, E) too: ragged._layout
                table[fn] = _layout.rowwise(table[fn])
    for entry in _registry.torch_functions():
        for fn in entry.fns:
            if entry.handler is None:
                table[fn] = _refused(fn, entry.hint)
            else:
                handler = entry.handler if entry.checks else guarded(entry.handler, fn)
                handler = _renaming(handler, fn) if entry.handler in RENAMING else handler
                table[fn] = _lifted(entry, handler)
    return table


def _lifted(entry: Any, handler: Callable[..., Any]) -> Callable[..., Any]:
    """The elementwise handlers take permuted arrays too (``ragged._layout.pointwise``)."""
    if getattr(handler, "lifts_layouts", False):  # lifts them itself (the unary fast path)
        return handler
    casts = set(entry.methods) & set(_pointwise.DTYPES)
    if entry.family == "elementwise" or casts:
        return _layout.pointwise(handler)
    axis = TRAILING_AXIS_FUNCTIONS.get(getattr(entry, "qualname", ""))  # torch.cat(..., -1)
    return handler if axis is None else on_trailing_axes(handler, axis)


def method_table() -> dict[str, Callable[..., Any]]:
    """Tensor-style method name -> function, installed on RaggedArray."""
    table: dict[str, Callable[..., Any]] = {}
    for spec in _registry.ops():
        for name in spec.methods:
            method = spelled(spec.obj, spec.torch_signature(None), f"RaggedArray.{name}")
            table[name] = _lifted(spec, method)
    for entry in _registry.torch_functions():
        for name in entry.methods:
            handler = entry.handler
            assert handler is not None
            label = f"RaggedArray.{name}"
            if not entry.checks:
                handler = guarded(handler, label)
            if entry.handler in RENAMING:
                handler = _renaming(handler, label)
            table[name] = _lifted(entry, handler)
    return table


def install(extra: dict[Any, Callable[..., Any]]) -> None:
    """Fill ``RaggedArray.__torch_function__``'s table with ``dispatch_table()`` and ``extra``
    (the operators of a dense ``self``; idempotent)."""
    table = dispatch_table()
    both = [display_name(f) for f in extra if f in table]
    if both:
        raise ValueError(f"declared both as operators and in the registry: {both}")
    table.update(extra)
    _array.TORCH_FUNCTIONS.clear()
    _array.TORCH_FUNCTIONS.update(table)
    python = [(f, h) for f, h in table.items() if isinstance(f, types.FunctionType)]
    _array.TORCH_PYTHON_FUNCTIONS[:] = python
    dynamo_tuples.install()  # torch.cat((x, y)) under torch.compile: Dynamo opens tuples too
