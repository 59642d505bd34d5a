"""Elementwise ops: Python operators, ``where`` and ``apply`` for any torch pointwise function.

Axis rule: **keep all**. The result has the partition (the same object) of its ragged
operand(s) and their axis names; operands line up as described in docs/semantics.md ("Broadcasting").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._axes import KEEP, UNIFY
from .._broadcast import align, line_up
from .._errors import Func, name_of
from .._registry import op
from .._versions import check_unchanged

_SCALARS = (int, float, bool, complex)
# An elementwise result keeps its operand's rows: valid by construction, no checks needed.
_result = RaggedArray._trusted
Y_PARAM = ("y", "")
ANY_ARRAY_PARAM = ("a RaggedArray argument", "")


def binary(func: Func, fn: Callable[[Any, Any], Tensor], x: Any, y: Any) -> RaggedArray:
    """Apply a torch binary function to two operands, at least one of them a RaggedArray.

    Checks its operands' version counters itself (declared ``checks=True``): here the check
    runs after the fast-path dispatch, where it costs least.
    """
    if type(x) is RaggedArray:
        if type(y) is RaggedArray:
            # One partition: equal row counts, so equal shapes means equal inner shapes.
            if y.partition is x.partition and y.axes == x.axes and y.values.shape == x.values.shape:
                check_unchanged(func, x, y)
                return _result(fn(x.values, y.values), x.partition, x.axes)
        elif isinstance(y, _SCALARS):
            check_unchanged(func, x)
            return _result(fn(x.values, y), x.partition, x.axes)
    elif type(y) is RaggedArray and isinstance(x, _SCALARS):
        check_unchanged(func, y, names=Y_PARAM)
        # torch ops take a number second only; a 0-d tensor promotes like a number.
        left = torch.as_tensor(x, device=y.values.device)
        return _result(fn(left, y.values), y.partition, y.axes)
    if not isinstance(x, RaggedArray) and not isinstance(y, RaggedArray):
        raise TypeError(
            f"{name_of(func)}: one operand must be a RaggedArray, got {type(x).__name__} and "
            f"{type(y).__name__}."
        )
    if isinstance(x, RaggedArray):
        check_unchanged(func, x, y if isinstance(y, RaggedArray) else None)
    else:
        check_unchanged(func, y, names=Y_PARAM)
    a, b, partition, axes = align(func, x, y)
    return RaggedArray(fn(a, b), partition, axes)


def _unary(func: Func, fn: Callable[[Tensor], Tensor], x: Any) -> RaggedArray:
    if not isinstance(x, RaggedArray):
        raise TypeError(f"{name_of(func)}: `x` must be a RaggedArray, got {type(x).__name__}.")
    check_unchanged(func, x)
    return _result(fn(x.values), x.partition, x.axes)


def _binary_op(
    name: str,
    fn: Callable[[Any, Any], Tensor],
    symbol: str,
    example: tuple[str, str, str],
    torch_fns: tuple[Any, ...],
    methods: tuple[str, ...],
    torch_args: str = "input, other",
) -> Callable[[Any, Any], RaggedArray]:
    def binary_op(x: Any, y: Any) -> RaggedArray:
        return binary(binary_op, fn, x, y)

    data, other, result = example
    binary_op.__name__ = binary_op.__qualname__ = name
    binary_op.__doc__ = f"""Elementwise ``{symbol}`` (``torch.{fn.__name__}``) with ragged broadcasting.

    At least one operand is a RaggedArray; the other may be a RaggedArray with the same
    partition, a dense tensor that broadcasts (see ``ragged._broadcast``) or a number.

    >>> import ragged, torch
    >>> ragged.{name}(ragged.array({data}), {other}).to_list()
    {result}
    """
    declare = op(
        "elementwise",
        rule=UNIFY,
        args="x: operand, y: operand",
        torch=torch_fns,
        methods=methods,
        torch_args=torch_args,
        checks=True,
    )
    return declare(binary_op)


def scalars_as_tensors(op: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Any, Any], Tensor]:
    """For torch ops that take tensors only: numbers become 0-d tensors on the other's device."""

    def wrapped(a: Any, b: Any) -> Tensor:
        like = a if isinstance(a, Tensor) else b
        if not isinstance(a, Tensor):
            a = torch.as_tensor(a, device=like.device)
        if not isinstance(b, Tensor):
            b = torch.as_tensor(b, device=like.device)
        return op(a, b)

    wrapped.__name__ = op.__name__
    return wrapped


FLOAT_ROWS = "[[1.0, 2.0], [3.0]]"
INT_ROWS = "[[6, 7], [-5]]"
BOOL_ROWS = "[[True, False], [True]]"
TENSOR_METHODS = torch.Tensor


def _spellings(*names: str) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """``torch.<name>`` and ``torch.Tensor.<name>`` for each name; the names as methods."""
    fns = tuple(getattr(m, n) for n in names for m in (torch, TENSOR_METHODS) if hasattr(m, n))
    return fns, names


_ALPHA = "input, other, *, alpha=1"
# name, torch function, symbol, doctest (array, other, result), torch spellings and methods
add = _binary_op(
    "add",
    torch.add,
    "x + y",
    (FLOAT_ROWS, "1.0", "[[2.0, 3.0], [4.0]]"),
    *_spellings("add"),
    _ALPHA,
)
subtract = _binary_op(
    "subtract",
    torch.sub,
    "x - y",
    (FLOAT_ROWS, "1.0", "[[0.0, 1.0], [2.0]]"),
    *_spellings("sub", "subtract"),
    _ALPHA,
)
multiply = _binary_op(
    "multiply",
    torch.mul,
    "x * y",
    (FLOAT_ROWS, "2.0", "[[2.0, 4.0], [6.0]]"),
    *_spellings("mul", "multiply"),
)
divide = _binary_op(
    "divide",
    torch.true_divide,
    "x / y",
    (FLOAT_ROWS, "2.0", "[[0.5, 1.0], [1.5]]"),
    *_spellings("div", "divide", "true_divide"),
    "input, other, *, rounding_mode=None",
)
floor_divide = _binary_op(
    "floor_divide",
    torch.floor_divide,
    "x // y",
    (INT_ROWS, "4", "[[1, 1], [-2]]"),
    *_spellings("floor_divide"),
)
remainder = _binary_op(
    "remainder",
    torch.remainder,
    "x % y",
    (INT_ROWS, "4", "[[2, 3], [3]]"),
    *_spellings("remainder"),
)
power = _binary_op(
    "power",
    torch.pow,
    "x ** y",
    (FLOAT_ROWS, "2.0", "[[1.0, 4.0], [9.0]]"),
    *_spellings("pow"),
    "input, exponent->y",
)
maximum = _binary_op(
    "maximum",
    scalars_as_tensors(torch.maximum),
    "max(x, y)",
    (FLOAT_ROWS, "2.0", "[[2.0, 2.0], [3.0]]"),
    *_spellings("maximum"),
)
minimum = _binary_op(
    "minimum",
    scalars_as_tensors(torch.minimum),
    "min(x, y)",
    (FLOAT_ROWS, "2.0", "[[1.0, 2.0], [2.0]]"),
    *_spellings("minimum"),
)
eq = _binary_op(
    "eq", torch.eq, "x == y", (FLOAT_ROWS, "2.0", "[[False, True], [False]]"), *_spellings("eq")
)
ne = _binary_op(
    "ne",
    torch.ne,
    "x != y",
    (FLOAT_ROWS, "2.0", "[[True, False], [True]]"),
    *_spellings("ne", "not_equal"),
)
lt = _binary_op(
    "lt",
    torch.lt,
    "x < y",
    (FLOAT_ROWS, "2.0", "[[True, False], [False]]"),
    *_spellings("lt", "less"),
)
le = _binary_op(
    "le",
    torch.le,
    "x <= y",
    (FLOAT_ROWS, "2.0", "[[True, True], [False]]"),
    *_spellings("le", "less_equal"),
)
gt = _binary_op(
    "gt",
    torch.gt,
    "x > y",
    (FLOAT_ROWS, "2.0", "[[False, False], [True]]"),
    *_spellings("gt", "greater"),
)
ge = _binary_op(
    "ge",
    torch.ge,
    "x >= y",
    (FLOAT_ROWS, "2.0", "[[False, True], [True]]"),
    *_spellings("ge", "greater_equal"),
)
logical_and = _binary_op(
    "logical_and",
    scalars_as_tensors(torch.logical_and),
    "x and y",
    (BOOL_ROWS, "False", "[[False, False], [False]]"),
    *_spellings("logical_and"),
)
logical_or = _binary_op(
    "logical_or",
    scalars_as_tensors(torch.logical_or),
    "x or y",
    (BOOL_ROWS, "False", "[[True, False], [True]]"),
    *_spellings("logical_or"),
)
logical_xor = _binary_op(
    "logical_xor",
    scalars_as_tensors(torch.logical_xor),
    "x xor y",
    (BOOL_ROWS, "True", "[[False, True], [False]]"),
    *_spellings("logical_xor"),
)
bitwise_and = _binary_op(
    "bitwise_and",
    torch.bitwise_and,
    "x & y",
    (INT_ROWS, "3", "[[2, 3], [3]]"),
    *_spellings("bitwise_and"),
)
bitwise_or = _binary_op(
    "bitwise_or",
    torch.bitwise_or,
    "x | y",
    (INT_ROWS, "1", "[[7, 7], [-5]]"),
    *_spellings("bitwise_or"),
)
bitwise_xor = _binary_op(
    "bitwise_xor",
    torch.bitwise_xor,
    "x ^ y",
    (INT_ROWS, "1", "[[7, 6], [-6]]"),
    *_spellings("bitwise_xor"),
)


@op(
    "elementwise",
    rule=KEEP,
    args="x: ragged",
    torch=(torch.neg, torch.negative),
    methods=("neg", "negative"),
    torch_args="input",
    checks=True,
)
def negative(x: RaggedArray) -> RaggedArray:
    """Elementwise ``-x``.

    >>> import ragged
    >>> ragged.negative(ragged.array([[1, -2], [3]])).to_list()
    [[-1, 2], [-3]]
    """
    return _unary(negative, torch.neg, x)


@op(
    "elementwise",
    rule=KEEP,
    args="x: ragged",
    torch=(torch.abs, torch.absolute),
    methods=("abs", "absolute"),
    torch_args="input",
    checks=True,
)
def abs(x: RaggedArray) -> RaggedArray:
    """Elementwise absolute value.

    >>> import ragged
    >>> ragged.abs(ragged.array([[1, -2], [-3]])).to_list()
    [[1, 2], [3]]
    """
    return _unary(abs, torch.abs, x)


@op(
    "elementwise",
    rule=KEEP,
    args="x: ragged",
    torch=(torch.bitwise_not,),
    methods=("bitwise_not",),
    torch_args="input",
    checks=True,
)
def bitwise_not(x: RaggedArray) -> RaggedArray:
    """Elementwise ``~x`` (logical not for bool).

    >>> import ragged
    >>> ragged.bitwise_not(ragged.array([[True, False], []])).to_list()
    [[False, True], []]
    """
    return _unary(bitwise_not, torch.bitwise_not, x)


@op(
    "elementwise",
    rule=KEEP,
    args="x: ragged",
    torch=(torch.logical_not,),
    methods=("logical_not",),
    torch_args="input",
    checks=True,
)
def logical_not(x: RaggedArray) -> RaggedArray:
    """Elementwise logical not (any dtype; zero is false).

    >>> import ragged
    >>> ragged.logical_not(ragged.array([[0, 2], [1]])).to_list()
    [[True, False], [False]]
    """
    return _unary(logical_not, torch.logical_not, x)


@op(
    "elementwise",
    rule=UNIFY,
    args="condition: operand, x: operand, y: operand",
    torch=((torch.where, "condition, input->x, other->y"), torch.Tensor.where),
    methods=("where",),
    torch_args="input->x, condition, other->y",
    checks=True,
)
def where(condition: Any, x: Any, y: Any) -> RaggedArray:
    """Elementwise ``x if condition else y``; any argument may be dense or a number.

    Operands line up pairwise as for binary ops; the result takes the partition of the ragged
    operands.

    >>> import ragged, torch
    >>> x = ragged.array([[1.0, -2.0], [3.0]])
    >>> ragged.where(x > 0, x, 0.0).to_list()
    [[1.0, 0.0], [3.0]]
    """
    func = where
    ragged_args = [a for a in (condition, x, y) if isinstance(a, RaggedArray)]
    if not ragged_args:
        raise TypeError(f"{name_of(func)}: one of `condition`, `x`, `y` must be a RaggedArray.")
    first = ragged_args[0]
    for other in ragged_args:
        check_unchanged(func, other, names=ANY_ARRAY_PARAM)
    parts = [line_up(func, first, a) for a in (condition, x, y)]
    return RaggedArray(torch.where(*parts), first.partition, first.axes)


@op("elementwise", rule=KEEP, args="fn: callable, *args: any, **kwargs: any", checks=True)
def apply(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> RaggedArray:
    """Apply a pointwise torch function to the values of RaggedArrays.

    ``fn`` is called with every RaggedArray argument replaced by its values (dense tensors
    line up by the broadcasting rules against the first RaggedArray); it must return a tensor
    with one row per value row. For row-wise functions (``nn.Module``s, feature maps) see
    [`ragged.map`][ragged.map].

    >>> import ragged, torch
    >>> x = ragged.array([[0.0, 1.0], [2.0]])
    >>> ragged.apply(torch.square, x).to_list()
    [[0.0, 1.0], [4.0]]
    >>> ragged.apply(torch.clamp, x, min=0.5).to_list()
    [[0.5, 1.0], [2.0]]
    """
    func = apply
    ragged_args = [a for a in args if isinstance(a, RaggedArray)]
    if not ragged_args:
        raise TypeError(f"{name_of(func)}: at least one positional argument must be a RaggedArray.")
    first = ragged_args[0]
    for other in ragged_args:
        check_unchanged(func, other, names=ANY_ARRAY_PARAM)
    values = [line_up(func, first, a) for a in args]
    out = fn(*values, **kwargs)
    if not isinstance(out, Tensor) or out.dim() == 0 or out.shape[0] != first.values.shape[0]:
        got = f"shape {tuple(out.shape)}" if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(
            f"{name_of(func)}: `fn` must return one row per value row "
            f"({first.values.shape[0]}), got {got}."
        )
    names = first.axes if out.dim() == first.values.dim() else None
    return RaggedArray(out, first.partition, names)
