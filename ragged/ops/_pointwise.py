"""Pointwise torch functions on RaggedArrays: computed on the values, the partition kept.

A pointwise function (``torch.exp``, ``F.gelu``, ``torch.clamp``, ``F.dropout``, a dtype cast)
means the same on a RaggedArray as on each of its segments, and on the segments together as on
the flat ``values``: so it runs once on the values, with torch's own arguments, and the result
keeps the input's partition object and names. torch's dtype promotion follows from calling
torch. Dense and RaggedArray operands of a binary function line up as for ``ragged.add``
(``ragged._broadcast``).

This module is the one declared table of them (no ragged op of their own: ``ragged.apply`` is the
general form); ``ragged.ops._torch`` puts each in the dispatch table of
``RaggedArray.__torch_function__`` and installs its Tensor-style methods (``x.exp()``).
``inplace=True`` is accepted and computed out of place: RaggedArrays are immutable (modules such
as ``nn.ReLU(inplace=True)`` use the returned value, so they work unchanged).

>>> import ragged, torch
>>> import torch.nn.functional as F
>>> x = ragged.array([[0.0, 1.0], [2.0]])
>>> F.gelu(torch.exp(x)).partition is x.partition
True
>>> x.sigmoid().to_list()  # doctest: +ELLIPSIS
[[0.5, 0.731...], [0.880...]]
>>> torch.clamp(x, max=1.5).to_list(), torch.atan2(x, x).shape
([[0.0, 1.0], [1.5]], RaggedShape(2, [2, 1]))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .. import _layout as layout
from .._array import RaggedArray
from .._broadcast import line_up
from .._registry import refuse, torch_function
from .._torch_args import refuse_out
from .._versions import check_unchanged, is_edited
from ._elementwise import binary, scalars_as_tensors

__all__ = ["elementwise", "rows"]

# Unary math functions: ``torch.<name>`` and, where Tensor has it, ``x.<name>()``.
UNARY = [
    "acos",
    "arccos",
    "acosh",
    "arccosh",
    "asin",
    "arcsin",
    "asinh",
    "arcsinh",
    "atan",
    "arctan",
    "atanh",
    "arctanh",
    "cos",
    "cosh",
    "sin",
    "sinh",
    "tan",
    "tanh",
    "sinc",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "sqrt",
    "rsqrt",
    "square",
    "reciprocal",
    "sigmoid",
    "logit",
    "erf",
    "erfc",
    "erfinv",
    "lgamma",
    "digamma",
    "i0",
    "deg2rad",
    "rad2deg",
    "relu",
    "positive",
    "sgn",
    "nan_to_num",
    "frac",
    "hardshrink",
    "angle",
    "conj_physical",
    "mvlgamma",
]
# The same, with a zero or no derivative (piecewise constant, or a boolean result).
UNARY_CONSTANT = [
    "ceil",
    "floor",
    "round",
    "trunc",
    "fix",
    "sign",
    "signbit",
    "isnan",
    "isinf",
    "isfinite",
    "isposinf",
    "isneginf",
    "isreal",
]
# Activations and dropout of ``torch.nn.functional`` (and ``torch.<name>`` where it exists).
ACTIVATIONS = [
    "gelu",
    "silu",
    "relu6",
    "elu",
    "selu",
    "celu",
    "leaky_relu",
    "hardtanh",
    "hardsigmoid",
    "hardswish",
    "mish",
    "softplus",
    "softsign",
    "softshrink",
    "tanhshrink",
    "logsigmoid",
    "threshold",
]
RANDOM = ["dropout", "alpha_dropout", "rrelu"]
# torch.compile (2.13) dispatches only the functions torch lists as overridable: not these two,
# whose modules (nn.Hardsigmoid, nn.Hardswish) therefore run eagerly only.
NOT_COMPILED = {"hardsigmoid", "hardswish"}
# Binary functions: the first two arguments are operands that line up (``ragged._broadcast``).
BINARY = [
    "atan2",
    "arctan2",
    "hypot",
    "fmod",
    "copysign",
    "logaddexp",
    "logaddexp2",
    "nextafter",
    "xlogy",
    "fmax",
    "fmin",
    "float_power",
    "heaviside",
    "ldexp",
    "isclose",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "rsub",
    "gcd",
    "lcm",
    "igamma",
    "igammac",
]
# Functions of three operands (``torch.lerp(x, end, weight)``) and of an operand and a mask.
TERNARY = ["lerp", "addcmul", "addcdiv"]
_NO_GRAD = {
    "heaviside",
    "isclose",
    "fmod",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "gcd",
    "lcm",
    "igamma",
    "igammac",
}


_INPUT = ("input", "")
# A result of one row per input row keeps the input's (valid) partition: no checks needed.
_trusted = RaggedArray._trusted
_new = object.__new__
Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling


def _result(out: torch.Tensor, like: RaggedArray) -> RaggedArray:
    """The RaggedArray of a pointwise result: ``like``'s partition object and names."""
    return RaggedArray(out, like.partition, like.axes)


def _pointwise_general(
    fn: Callable[..., Any],
    name: str,
    operands: int,
    keywords: tuple[str, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    keep_names: bool,
) -> RaggedArray:
    """Any call: check the RaggedArray operands, line up the dense ones, call ``fn`` on the
    values."""
    if kwargs.get("out") is not None:
        refuse_out(name, kwargs["out"])
    lead, rest = args[:operands], args[operands:]
    keyed = {k: kwargs[k] for k in keywords if k in kwargs}
    arrays = [a for a in (*lead, *keyed.values()) if isinstance(a, RaggedArray)]
    if not arrays:
        where = ", ".join(f"`{k}`" for k in ("input", *keywords)) if operands == 1 else "operands"
        raise TypeError(
            f"{name}: a RaggedArray is supported as its {where} only, not as another argument."
        )
    for k, a in enumerate(arrays):
        check_unchanged(name, a, names=("input" if a is lead[0] else f"operand {k}", ""))
    first = arrays[0]
    values = [line_up(name, first, a) for a in lead]
    call = {**kwargs, **{k: line_up(name, first, v) for k, v in keyed.items()}}
    call.pop("inplace", None)  # RaggedArrays are immutable: always computed out of place
    call.pop("out", None)
    out = fn(*values, *rest, **call)
    if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.shape[0] != first.values.shape[0]:
        raise TypeError(f"{name}: a RaggedArray needs a function that keeps the rows.")
    names = first.axes if keep_names or out.dim() == first.values.dim() else None
    return RaggedArray(out, first.partition, names)


def elementwise(
    fn: Callable[..., Any], name: str, operands: int = 1, keywords: tuple[str, ...] = ()
) -> Callable[..., Any]:
    """The handler of an elementwise torch function of ``operands`` leading operands (and the
    operands named ``keywords``); its other arguments go to ``fn`` unchanged."""
    if operands == 1:

        def general(*args: Any, **kwargs: Any) -> RaggedArray:
            return _pointwise_general(fn, name, 1, keywords, args, kwargs, True)

        other = layout.pointwise(general)  # permuted arrays run on their storage order

        def unary(x: Any, *args: Any, **kwargs: Any) -> RaggedArray:
            # The hot path (torch.exp(x) on tiny inputs): check_unchanged and _trusted fused.
            if type(x) is RaggedArray and x.order is None and not kwargs and not keywords:
                values = x.values
                if _is_compiling():
                    return _trusted(fn(values, *args), x.partition, x.axes)
                if is_edited(x):
                    check_unchanged(name, x, names=_INPUT)  # raises the error naming the edit
                out = fn(values, *args)
                result = _new(RaggedArray)
                state = result.__dict__
                state["values"] = out
                state["partition"] = x.partition
                state["axes"] = x.axes
                state["order"] = None
                try:
                    state["_values_version"] = out._version if type(out) is Tensor else None
                except RuntimeError:  # an inference tensor
                    state["_values_version"] = None
                return result
            return other(x, *args, **kwargs)

        unary.lifts_layouts = True  # type: ignore[attr-defined]  # ragged.ops._torch: no wrapper
        return unary
    pair = scalars_as_tensors(fn)

    def handler(x: Any, *args: Any, **kwargs: Any) -> RaggedArray:
        if len(args) == 1 and not kwargs:
            return binary(name, pair, x, args[0])
        return _pointwise_general(fn, name, operands, keywords, (x, *args), kwargs, True)

    return handler


def rows(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """The handler of a row-wise function of the values whose result may change the inner
    shape (``F.embedding``, ``F.one_hot``): names are kept only if the number of axes is."""

    def handler(x: Any, *args: Any, **kwargs: Any) -> RaggedArray:
        return _pointwise_general(fn, name, 1, (), (x, *args), kwargs, False)

    return checked_embedding(handler, name) if fn is F.embedding else handler


def checked_embedding(handler: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``F.embedding`` on RaggedArray indices: integer indices, in the rows of ``weight`` (torch
    checks the range; its ``IndexError`` becomes a message naming the function)."""

    def embedding(input: Any, weight: Any, *args: Any, **kwargs: Any) -> RaggedArray:
        indices = input.values if isinstance(input, RaggedArray) else input
        dtype = getattr(indices, "dtype", None)
        if dtype is not None and (
            dtype.is_floating_point or dtype.is_complex or dtype == torch.bool
        ):
            expected = "must hold integer indices (int64 or int32); cast with x.long()"
            raise TypeError(f"{name}: `input` {expected}, got dtype {dtype}.")
        try:
            return handler(input, weight, *args, **kwargs)
        except IndexError as error:
            rows = weight.shape[0] if isinstance(weight, torch.Tensor) else "?"
            expected = f"must hold indices in [0, {rows}) (the rows of `weight`)"
            raise ValueError(
                f"{name}: `input` {expected}, got an index outside ({error})."
            ) from None

    return embedding


def _cast(dtype: torch.dtype) -> Callable[..., Any]:
    def cast(x: RaggedArray, memory_format: Any = torch.preserve_format) -> RaggedArray:
        return _result(x.values.to(dtype, memory_format=memory_format), x)

    return cast


def _declare(
    name: str,
    fn: Any,
    handler: Callable[..., Any],
    meaning: str,
    *,
    grad: bool = True,
    dense_self: bool = False,
) -> None:
    """Declare ``fn``, ``F.<name>`` where it exists, and the method ``x.<name>()`` where Tensor
    has it (``torch.Tensor.<name>`` itself too when a dense ``self`` may meet a RaggedArray
    operand: ``t.atan2(x)``)."""
    method = getattr(torch.Tensor, name, None)
    functional = getattr(F, name, None) if name not in ("sigmoid", "tanh") else None
    fns = (fn,) if functional in (None, fn) else (fn, functional)
    fns = (*fns, method) if method is not None and dense_self else fns
    methods = () if method is None else (name,)
    see = ("ragged.apply",)
    torch_function(
        *fns,
        family="elementwise",
        meaning=meaning,
        methods=methods,
        see=see,
        grad=grad,
        checks=True,  # elementwise() checks versions, out= and the operands' alignment
    )(handler)


ELEMENTWISE = "elementwise on the values"
CONSTANT = "elementwise on the values (piecewise constant or boolean: no gradient)"
OPERANDS = "elementwise; dense and RaggedArray operands line up as for `ragged.add`"
OPERANDS_CONSTANT = OPERANDS + " (no gradient)"
CLAMP = "elementwise; `min` and `max` may be numbers, dense tensors or RaggedArrays"
ROWS = "row-wise on the values: `(B, L*)` indices give `(B, L*, *rest)`"
DTYPES = {
    "float": torch.float32,
    "double": torch.float64,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "int": torch.int32,
    "long": torch.int64,
    "short": torch.int16,
    "bool": torch.bool,
}


def _declare_all() -> None:
    for name in UNARY + UNARY_CONSTANT:
        fn = getattr(torch, name)
        grad = name in UNARY
        meaning = ELEMENTWISE if grad else CONSTANT
        _declare(name, fn, elementwise(fn, f"torch.{name}"), meaning, grad=grad)
    for name in ("clamp", "clip"):
        fn = getattr(torch, name)
        _declare(name, fn, elementwise(fn, f"torch.{name}", keywords=("min", "max")), CLAMP)
    for name in ("clamp_min", "clamp_max"):
        fn = getattr(torch, name)
        _declare(name, fn, elementwise(fn, f"torch.{name}", 2), CLAMP)
    for name in ACTIVATIONS + RANDOM:
        meaning = ELEMENTWISE
        if name in RANDOM:
            meaning += " (random: an independent draw per entry)"
        # F.<name>, and torch.<name> where it exists (with arguments of its own: torch.dropout's
        # ``train`` is F.dropout's ``training``).
        for fn in (getattr(F, name), getattr(torch, name, None)):
            if fn is not None:
                label = "torch.nn.functional" if fn is getattr(F, name) else "torch"
                compiled = name not in NOT_COMPILED
                text = meaning + ("" if compiled else " (eager only: not traced by torch.compile)")
                torch_function(
                    fn,
                    family="elementwise",
                    meaning=text,
                    see=("ragged.apply",),
                    compile=compiled,
                    checks=True,
                )(elementwise(fn, f"{label}.{name}"))
    for name in BINARY:
        fn = getattr(torch, name)
        handler = elementwise(fn, f"torch.{name}", 2)
        grad = name not in _NO_GRAD
        meaning = OPERANDS if grad else OPERANDS_CONSTANT
        _declare(name, fn, handler, meaning, grad=grad, dense_self=True)
    for name in TERNARY:
        fn = getattr(torch, name)
        _declare(name, fn, elementwise(fn, f"torch.{name}", 3), OPERANDS, dense_self=True)
    masked = "`mask` (a RaggedArray, or a dense tensor that lines up) selects the entries to fill"
    handler = elementwise(torch.masked_fill, "torch.masked_fill", 2)
    _declare("masked_fill", torch.masked_fill, handler, masked, dense_self=True)
    for fn, grad in ((F.embedding, True), (F.one_hot, False)):
        torch_function(
            fn, family="indexing", meaning=ROWS, see=("ragged.map",), grad=grad, checks=True
        )(rows(fn, f"torch.nn.functional.{fn.__name__}"))
    for name, dtype in DTYPES.items():
        torch_function(
            family="tensor",
            meaning=f"the values cast to {dtype} (the partition object is kept)",
            methods=(name,),
            see=("RaggedArray.to",),
            grad=dtype.is_floating_point,
        )(_cast(dtype))
    torch_function(
        torch.clone,
        family="elementwise",
        meaning="a copy of the values (the partition object is kept)",
        see=("ragged.apply",),
        checks=True,
    )(elementwise(torch.clone, "torch.clone"))


_declare_all()
# Pointwise in torch (``torch.Tag.pointwise``) but not a function of one RaggedArray's values.
refuse(
    torch.frexp,
    torch.polygamma,
    family="elementwise",
    hint="its result is not one tensor of the input's rows (frexp: two tensors; polygamma: the "
    "order comes first): apply it to the values, e.g. ragged.apply(lambda v: torch.polygamma(1, "
    "v), x)",
    see=("ragged.apply",),
)
