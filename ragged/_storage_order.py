"""Ops on permuted arrays (``ragged._layout``): run on the storage order, the layout put back.

``pointwise`` lifts an elementwise op: when its RaggedArray operands share one order, it runs on
their storage order and the result gets that order back. ``lift_axes`` lifts an op with axis
arguments. The registry applies them to the ops it declares (the elementwise family, and every
op with one RaggedArray argument and ``axis`` / ``axes`` arguments); the torch door applies
``pointwise`` to its elementwise handlers.

An op of the registry is written for the storage order ``(B, L*, *inner)`` and refuses a
permuted array (``ragged._layout``) with ``PermutedLayoutError`` before it reads anything. For
an op that takes one RaggedArray and ``axis`` / ``axes`` arguments, ``lift_axes`` answers that
refusal instead: it translates each axis (a logical int; names travel with their axes and need
nothing) to the storage axis, runs the op on the array in its storage order, and puts the
layout back on the result, which has the input's axes (``keep``), or the input's axes less the
one reduced axis. Any other result, or a second RaggedArray operand, keeps the refusal. The
plain path costs nothing more: the lifting starts from the op's own refusal.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._versions import PermutedLayoutError

__all__ = ["lift_axes", "pointwise"]

_AXIS_KINDS = ("axis", "axes")


def lift_axes(fn: Callable[..., Any], declared: Sequence[Any]) -> Callable[..., Any]:
    """``fn`` (an op with declared arguments ``declared``) that also takes a permuted array as
    its one RaggedArray argument, when it has ``axis`` / ``axes`` arguments."""
    kinds = [arg.kind for arg in declared]
    if kinds.count("ragged") != 1 or not any(k in _AXIS_KINDS for k in kinds):
        return fn
    params = _plain_parameters(fn)
    if params is None:
        return fn
    # Only constants in the closure, and no inspect on the lifting path: Dynamo wraps the
    # closure of a function it reaches without a source (through the torch door's tables) and
    # traces the lifting path itself under torch.compile.
    array_name = declared[kinds.index("ragged")].name
    axis_names = tuple(arg.name for arg in declared if arg.kind in _AXIS_KINDS)

    @functools.wraps(fn)
    def lifted(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (TypeError, ValueError) as error:  # PermutedLayoutError, or an axis check first
            refusal = error
        arguments = _bind(params, args, kwargs)
        if arguments is None:
            raise refusal
        order = getattr(arguments.get(array_name), "order", None)
        if order is None or order[0] == 0:  # the sequence-first view keeps its refusal
            raise refusal
        return _axes_on_storage(fn, refusal, arguments, array_name, axis_names)

    return lifted


_CONSTANT = (type(None), bool, int, float, str)


def _plain_parameters(fn: Any) -> tuple[tuple[str, bool, bool, Any], ...] | None:
    """``fn``'s parameters as ``(name, keyword_only, required, default)`` constants, or
    ``None`` where they are not that plain (``*args``, positional-only, an object default)."""
    out = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            return None
        required = param.default is inspect.Parameter.empty
        if not required and not isinstance(param.default, _CONSTANT):
            return None
        default = None if required else param.default
        out.append((param.name, param.kind is param.KEYWORD_ONLY, required, default))
    return tuple(out)


def _bind(params: Any, args: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The call's arguments by name, defaults filled in (``None`` where it does not bind)."""
    arguments: dict[str, Any] = {}
    position = 0
    for name, keyword_only, required, default in params:
        if not keyword_only and position < len(args):
            arguments[name] = args[position]
            position += 1
        elif name in kwargs:
            arguments[name] = kwargs[name]
        elif required:
            return None
        else:
            arguments[name] = default
    if position < len(args) or any(k not in arguments for k in kwargs):
        return None
    return arguments


def _axes_on_storage(
    fn: Any, refusal: Exception, arguments: dict[str, Any], array_name: str, axis_names: Any
) -> Any:
    x = arguments[array_name]
    if any(k != array_name and hasattr(v, "order") for k, v in arguments.items()):
        raise refusal
    n = x.ndim
    storage = (0, *x.order)  # logical axis -> storage axis
    removed: list[int] = []

    def to_storage(axis: Any) -> Any:
        if isinstance(axis, bool) or not isinstance(axis, int) or not -n <= axis < n:
            return axis  # a name, or an error the op reports itself
        return storage[axis % n]

    for name in axis_names:
        value = arguments[name]
        if isinstance(value, (tuple, list)):
            arguments[name] = type(value)(map(to_storage, value))
        elif value is not None:
            arguments[name] = to_storage(value)
            if isinstance(value, str) and x.axes is not None and value in x.axes:
                removed.append(storage[x.axes.index(value)])
            elif isinstance(arguments[name], int):
                removed.append(arguments[name])
    names = None if x.axes is None else _storage_names(x.axes, storage)
    arguments[array_name] = type(x)._trusted(x.values, x.partition, names)
    out = fn(**arguments)

    def restore(value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(map(restore, value))
        if hasattr(value, "order"):
            return _with_layout(refusal, value, x, removed)
        if isinstance(value, torch.Tensor) and value.dim() == n and value.dim() > 1:
            return value.permute(storage)  # a dense result with every axis kept (keepdims)
        return value

    return restore(out)


def _storage_names(logical: tuple[str, ...], storage: tuple[int, ...]) -> tuple[str, ...]:
    names = [""] * len(logical)
    for k, s in enumerate(storage):
        names[s] = logical[k]
    return tuple(names)


def _with_layout(refusal: Exception, out: Any, x: Any, removed: list[int]) -> Any:
    """``out`` (in storage order) in ``x``'s layout: every axis kept, or the one ``removed``."""
    order = x.order
    if out.ndim == x.ndim and out.ragged_ndim == x.ragged_ndim:
        kept = list(order)
    elif out.ndim == x.ndim - 1 and len(removed) == 1 and out.ragged_ndim == x.ragged_ndim:
        gone = removed[0]
        kept = [k - (k > gone) for k in order if k != gone]
    else:
        raise refusal
    storage_order = (0, *kept)
    names = None
    if out.axes is not None:
        names = tuple(out.axes[s] for s in storage_order)
    same = all(k == i + 1 for i, k in enumerate(kept))
    return type(out)._trusted(out.values, out.partition, names, None if same else tuple(kept))


def pointwise(handler: Callable[..., Any], defer: type | None = None) -> Callable[..., Any]:
    """``handler`` (an elementwise op) that also takes permuted arrays: when its RaggedArray
    operands share one order, it runs on their storage order and its result gets that order
    back. The plain path costs nothing more: the lifting starts from the op's own refusal.

    ``defer``: for an operator method (``__and__``), the type of a right operand that the op
    refuses (a TypeError) and whose reflected operator takes over (``NotImplemented``)."""

    @functools.wraps(handler)
    def lifted(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        except PermutedLayoutError as error:
            refusal = error
        except TypeError:
            if defer is not None and isinstance(args[-1], defer):
                return NotImplemented
            raise
        return _pointwise_on_storage(handler, refusal, args, kwargs)

    return lifted


def _pointwise_on_storage(
    handler: Any, refusal: Exception, args: Any, kwargs: dict[str, Any]
) -> Any:
    arrays = [a for a in (*args, *kwargs.values()) if hasattr(a, "order")]
    order, names = arrays[0].order, arrays[0].axes
    if order is None:
        order, names = next((a.order, a.axes) for a in arrays if a.order is not None)
    # A dense operand lines up with the inner axes alike in the storage order only when the
    # ragged axis is not among them: the sequence-first view (L*, B, *inner), inner axes last.
    inner = len(order) - 1 if order[0] == 0 else 0
    for value in (*args, *kwargs.values()):
        dense = isinstance(value, torch.Tensor) and value.dim() > inner
        if dense or (hasattr(value, "order") and value.order != order):
            raise refusal  # operands in other layouts, or dense ones to line up: refused

    def strip(value: Any) -> Any:
        if hasattr(value, "order"):
            return type(value)._trusted(value.values, value.partition, None)
        return value

    out = handler(*map(strip, args), **{k: strip(v) for k, v in kwargs.items()})

    def restore(value: Any) -> Any:
        if hasattr(value, "order") and value.ndim == len(order) + 1:
            return type(value)._trusted(value.values, value.partition, names, order)
        return value

    return tuple(map(restore, out)) if isinstance(out, tuple) else restore(out)
