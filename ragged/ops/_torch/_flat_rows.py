"""What a [`FlatArray`][ragged.FlatArray] (``x.view(-1, C)``, the rows of a RaggedArray) takes.

A FlatArray is an ``(N, *inner)`` array whose rows belong to segments. It answers what a
row-wise layer does to such a tensor and nothing that mixes rows: ``view`` / ``reshape`` back
to a RaggedArray with the array's own sizes (or of the inner axes), ``torch.addmm(bias, flat,
w)``, ``flat @ w`` / ``torch.matmul`` / ``torch.mm`` with a dense right operand, ``F.linear``,
``F.layer_norm`` and ``softmax`` / ``log_softmax`` over an inner axis, the pointwise functions
of the RaggedArray door (the elementwise family: ``torch.tanh``, ``F.gelu``, ``F.dropout``,
``torch.add``, ...) and the operators. Any other torch function raises a TypeError naming it.

Every handler runs the torch function on ``values``: with the rows first, torch's broadcasting
against an ``(N, *inner)`` tensor is the FlatArray's, so a dense operand lines up exactly as it
would against the tensor of the rows.
"""

from __future__ import annotations

import operator
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ... import _flat, _layout, _registry
from ..._array import RaggedArray
from ..._flat import FlatArray
from ..._shape import RaggedSize
from ._spelling import display_name

__all__ = ["install"]

TAKES = (
    "a FlatArray (x.view(-1, C): the rows of a RaggedArray) takes addmm, matmul / mm / @ with a "
    "dense right operand, F.linear, F.layer_norm, softmax over an inner axis, the pointwise "
    "functions and operators, and view / reshape (back to the array with its own sizes, "
    "x.size()[:-1] + (n,)); use flat.values, the [N, ...] tensor, for anything that mixes rows"
)


def _unsupported(func: Any, args: Any, kwargs: Any) -> Any:
    name = display_name(func)
    if name.startswith("torch.Tensor.__"):
        return NotImplemented  # a Python operator: let Python try the reflected one
    raise TypeError(f"{name} is not supported on a FlatArray: {TAKES}.")


def _rows(func: Any, flats: list[FlatArray]) -> FlatArray:
    """The first of ``flats``, after checking that all have its rows (the same partition)."""
    first = flats[0]
    for other in flats[1:]:
        if other.partition is not first.partition and not (
            other.partition.levels[-1] is first.partition.levels[-1]
            or other.partition.equals(first.partition)
        ):
            raise ValueError(
                f"{display_name(func)}: the FlatArray operands have rows of different arrays "
                f"({tuple(first.shape)} and {tuple(other.shape)}); they must come from arrays "
                "with one partition."
            )
    return first


def _wrap(func: Any, out: Any, like: FlatArray) -> Any:
    """``out`` (a tensor or a tuple of them) as FlatArrays of ``like``'s rows."""
    if isinstance(out, tuple):
        return tuple(_wrap(func, o, like) for o in out)
    if not isinstance(out, torch.Tensor):
        return out  # torch.allclose, torch.equal: a bool
    if out.dim() != like.values.dim():
        raise ValueError(
            f"{display_name(func)}: a dense operand with more axes than the FlatArray "
            f"{tuple(like.shape)} would move its rows off the first axis (result shape "
            f"{tuple(out.shape)}); {TAKES}."
        )
    return FlatArray._trusted(out, like.partition)


def _plain(value: Any) -> Any:
    return value.values if type(value) is FlatArray else value


def pointwise(func: Any) -> Callable[..., Any]:
    """``func`` (elementwise) on the values of its FlatArray operands, which share rows."""

    def handler(*args: Any, **kwargs: Any) -> Any:
        flats = [a for a in (*args, *kwargs.values()) if type(a) is FlatArray]
        like = _rows(func, flats)
        plain = func(*map(_plain, args), **{k: _plain(v) for k, v in kwargs.items()})
        return NotImplemented if plain is NotImplemented else _wrap(func, plain, like)

    return handler


def _dense_right(label: str, input: Any, other: Any) -> FlatArray:
    if type(input) is not FlatArray or input.values.dim() < 2:
        raise TypeError(
            f"{label}: the FlatArray must be the left operand, with an inner axis "
            "to contract (`flat @ w`); a product over its rows mixes segments: use flat.values."
        )
    if not isinstance(other, torch.Tensor) or type(other) is FlatArray or other.dim() > 2:
        raise TypeError(
            f"{label}: the right operand of a FlatArray product must be a dense "
            f"1-D or 2-D tensor, got {type(other).__name__}"
            + (f" of shape {tuple(other.shape)}." if isinstance(other, torch.Tensor) else ".")
        )
    return input


def _matmul(func: Any) -> Callable[..., Any]:
    label = display_name(func)

    def matmul(input: Any, other: Any, **kwargs: Any) -> Any:
        flat = _dense_right(label, input, other)
        return FlatArray._trusted(func(flat.values, other, **kwargs), flat.partition)

    return matmul


def _addmm(input: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1) -> FlatArray:
    flat = _dense_right("torch.addmm", mat1, mat2)
    if type(input) is FlatArray:
        _rows(torch.addmm, [flat, input])
    out = torch.addmm(_plain(input), flat.values, mat2, beta=beta, alpha=alpha)
    return FlatArray._trusted(out, flat.partition)


def _linear(input: Any, weight: Any, bias: Any = None) -> FlatArray:
    if type(input) is not FlatArray or type(weight) is FlatArray or type(bias) is FlatArray:
        raise TypeError(f"torch.nn.functional.linear: only `input` may be a FlatArray; {TAKES}.")
    return FlatArray._trusted(F.linear(input.values, weight, bias), input.partition)


def _inner_dim(func: Any, input: FlatArray, dim: Any) -> None:
    if isinstance(dim, int) and dim % max(input.values.dim(), 1) == 0:
        raise TypeError(
            f"{display_name(func)}: `dim` {dim} is the rows of the FlatArray (they belong to "
            "different segments); an inner axis is needed (or ragged.softmax on the array)."
        )


def _along(func: Any) -> Callable[..., Any]:
    """``softmax`` / ``log_softmax`` along an inner axis."""

    def handler(input: Any, *args: Any, **kwargs: Any) -> Any:
        if type(input) is not FlatArray:
            raise TypeError(f"{display_name(func)}: {TAKES}.")
        _inner_dim(func, input, kwargs["dim"] if "dim" in kwargs else args[0] if args else None)
        out = func(input.values, *args, **kwargs)
        return FlatArray._trusted(out, input.partition)

    return handler


def _layer_norm(input: Any, normalized_shape: Any, *args: Any, **kwargs: Any) -> FlatArray:
    if type(input) is not FlatArray or any(type(a) is FlatArray for a in args):
        raise TypeError(
            f"torch.nn.functional.layer_norm: only `input` may be a FlatArray; {TAKES}."
        )
    size = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(size) >= input.values.dim():
        raise TypeError(
            "torch.nn.functional.layer_norm: `normalized_shape` must leave the rows of the "
            f"FlatArray {tuple(input.shape)}, got {size}."
        )
    out = F.layer_norm(input.values, normalized_shape, *args, **kwargs)
    return FlatArray._trusted(out, input.partition)


def _reshape(name: str, view: bool) -> Callable[..., Any]:
    def reshape(self: FlatArray, *shape: Any) -> Any:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        if view and len(shape) == 1 and isinstance(shape[0], torch.dtype):
            return FlatArray._trusted(self.values.view(shape[0]), self.partition)
        array = RaggedArray._trusted(self.values, self.partition, None)
        if any(isinstance(s, RaggedSize) for s in shape):
            return _layout.reshape(f"FlatArray.{name}", array, shape, view=view)  # back
        if not shape or not _first_is_rows(self, shape[0]):
            raise ValueError(
                f"FlatArray.{name}: `shape` {shape} must start with -1 or the number of rows "
                f"({self.values.shape[0]}) (a reshape of the inner axes), or be the shape of "
                "the array it came from (its RaggedSize entries, x.size()[:-1] + (n,))."
            )
        return _layout.merge_rows(f"FlatArray.{name}", array, shape, view=view)

    reshape.__name__ = reshape.__qualname__ = name
    return reshape


def _first_is_rows(flat: FlatArray, first: Any) -> bool:
    if isinstance(first, int) and first == -1:
        return True
    return torch.compiler.is_compiling() or first == flat.values.shape[0]


def _same(transform: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., FlatArray]:
    def method(self: FlatArray, *args: Any, **kwargs: Any) -> FlatArray:
        return FlatArray._trusted(transform(self.values, *args, **kwargs), self.partition)

    return method


def _to_ragged(self: FlatArray) -> RaggedArray:
    """The RaggedArray of these rows in the storage order ``(B, L*, ..., *inner)``.

    >>> import ragged
    >>> x = ragged.array([[1.0, 2.0], [3.0]])
    >>> x.view(-1).to_ragged().to_list()
    [[1.0, 2.0], [3.0]]
    """
    return RaggedArray._trusted(self.values, self.partition, None)


BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")


def methods() -> dict[str, Any]:
    """The Tensor-style methods and operators of FlatArray, by name."""
    table: dict[str, Any] = {
        "view": _reshape("view", view=True),
        "reshape": _reshape("reshape", view=False),
        "to_ragged": _to_ragged,
        "contiguous": _same(torch.Tensor.contiguous),
        "clone": _same(torch.Tensor.clone),
        "detach": _same(torch.Tensor.detach),
        "to": _same(torch.Tensor.to),
        "float": _same(torch.Tensor.float),
        "double": _same(torch.Tensor.double),
        "__matmul__": _matmul(operator.matmul),
        "__rmatmul__": lambda self, other: _matmul(operator.matmul)(other, self),  # refused
        "__neg__": pointwise(operator.neg),
        "__abs__": pointwise(operator.abs),
        "__pos__": pointwise(operator.pos),
    }
    names = [m for spec in _registry.ops() if spec.family == "elementwise" for m in spec.methods]
    for entry in _registry.torch_functions():
        if entry.family == "elementwise" and entry.handler is not None:
            names.extend(entry.methods)
    for name in names:  # x.exp(), x.clamp(0), ...: the pointwise Tensor methods
        table[name] = pointwise(getattr(torch.Tensor, name))
    for name in BINARY:
        fn = getattr(operator, name)
        table[f"__{name}__"] = pointwise(fn)
        table[f"__r{name}__"] = pointwise(lambda a, b, fn=fn: fn(b, a))
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        table[f"__{name}__"] = pointwise(getattr(operator, name))
    return table


def dispatch_table() -> dict[Any, Callable[..., Any]]:
    """torch function -> handler, for ``FlatArray.__torch_function__``."""
    table: dict[Any, Callable[..., Any]] = {None: _unsupported}
    for spec in _registry.ops():
        if spec.family == "elementwise":
            for fn in spec.torch:
                table[fn] = pointwise(fn)
    for entry in _registry.torch_functions():
        if entry.family == "elementwise" and entry.handler is not None:
            for fn in entry.fns:
                table[fn] = pointwise(fn)
    for name in (*BINARY, "div", "eq", "ne", "lt", "le", "gt", "ge", "neg", "abs"):
        for dunder in (f"__{name}__", f"__r{name}__"):
            fn = getattr(torch.Tensor, dunder, None)
            if fn is not None:
                table[fn] = pointwise(fn)
    for fn in (torch.matmul, torch.mm, torch.Tensor.__matmul__, torch.Tensor.matmul):
        table[fn] = _matmul(fn)
    product = _matmul(torch.matmul)
    table[torch.Tensor.__rmatmul__] = lambda w, flat: product(flat, w)  # w.__rmatmul__(flat)
    table[torch.addmm] = _addmm
    table[F.linear] = _linear
    table[F.layer_norm] = _layer_norm
    for fn in (torch.softmax, F.softmax, torch.log_softmax, F.log_softmax):
        table[fn] = _along(fn)
    return table


def install() -> None:
    """Fill ``FlatArray.__torch_function__``'s table and add its methods (idempotent)."""
    for name, value in methods().items():
        setattr(FlatArray, name, value)
    table = dispatch_table()
    _flat.FLAT_FUNCTIONS.clear()
    _flat.FLAT_FUNCTIONS.update(table)
    python = [(f, h) for f, h in table.items() if isinstance(f, types.FunctionType)]
    _flat.FLAT_PYTHON_FUNCTIONS[:] = python
