"""The torch table: how the tests call every row of ``docs/torch.md``.

Rows come from the registry (``ragged._registry``): an op's ``torch=`` functions and ``methods=``
(called here with the op table's samples, translated to torch's spelling, and checked against
the op table's per-segment reference), the pointwise functions (checked against the same
function on every segment), and the other ``torch_function`` handlers and refusals (checked by
the explicit cases of ``tests/test_torch.py``).
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable
from typing import Any

import torch

import ragged
from ragged import _registry
from ragged.ops import _pointwise, _torch
from tests.optable import all_ops, ragged_randn

# torch's C++ argument parser, refusing a call before any dispatch (a Python number where it
# wants a Tensor: torch.maximum(x, 2.0) fails for dense tensors too).
PARSER = re.compile(r"^\w+\(\): argument|received an invalid combination|positional arguments but")


class Inexpressible(Exception):
    """A sample whose arguments torch's spelling cannot express (a ragged-only argument)."""


def is_descriptor(fn: Any) -> bool:
    """``torch.Tensor.<name>``: reachable only with a dense ``self`` (``t.add(x)``)."""
    return getattr(fn, "__objclass__", None) is torch._C.TensorBase


def spellings(spec: _registry.OpSpec) -> list[tuple[str, Any]]:
    """``(label, fn or method name)`` for every spelling of ``spec`` a RaggedArray can call."""
    out: list[tuple[str, Any]] = []
    for fn in spec.torch:
        if not is_descriptor(fn):
            out.append((torch.overrides.resolve_name(fn) or fn.__name__, fn))
    out += [(f"x.{name}", name) for name in spec.methods]
    return out


def torch_caller(spec: _registry.OpSpec, spelling: Any) -> Callable[..., Any]:
    """A function with the op's signature that calls ``spelling`` (a torch function, or a
    method name) with the arguments translated to torch's spelling."""
    method = spelling if isinstance(spelling, str) else None
    args = spec.torch_signature(None if method else spelling)
    signature = inspect.signature(spec.obj)
    names: dict[str, str] = {}
    for param in args.params:
        if param.target in signature.parameters and not param.variadic:
            names.setdefault(param.target, param.name)
    order = [p.name for p in args.params if p.positional and not p.variadic]
    builtin = isinstance(spelling, types.BuiltinFunctionType)
    sequences = {a.name for a in spec.args if a.kind == "arrays"}

    def call(*call_args: Any, **call_kwargs: Any) -> Any:
        bound = signature.bind(*call_args, **call_kwargs)
        bound.apply_defaults()
        spelled: dict[str, Any] = {}
        rest: tuple[Any, ...] = ()
        for name, value in bound.arguments.items():
            param = signature.parameters[name]
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                rest = tuple(value)
            elif param.kind is inspect.Parameter.VAR_KEYWORD:
                spelled.update(value)
            elif name in names:
                if isinstance(value, tuple) and name in sequences:
                    value = list(value)  # Dynamo (torch 2.13) looks into lists, not tuples
                spelled[names[name]] = value
            elif value is not param.default:
                if method is None:
                    raise Inexpressible(name)
                spelled[name] = value  # the methods take the op's own extras by name
        # The first argument by position, the others by name (torch's parser picks some
        # overloads by their keyword-only arguments: torch.argsort(x, dim=1, stable=True)).
        positional = [spelled.pop(order[0])] if order and order[0] in spelled else []
        given = dict(zip(order, positional, strict=False)) | spelled
        if builtin and _refused_by_the_parser(spec, names, given, positional):
            raise Inexpressible("torch's argument parser")
        if method is not None:
            self = positional[0]
            if not isinstance(self, ragged.RaggedArray):
                raise Inexpressible("self")
            return getattr(self, method)(*positional[1:], *rest, **spelled)
        try:
            return spelling(*positional, *rest, **spelled)
        except TypeError as error:
            if builtin and PARSER.search(str(error)):  # torch rejects it for tensors too
                raise Inexpressible(str(error)) from None
            raise

    return call


def _refused_by_the_parser(
    spec: _registry.OpSpec, names: dict[str, str], given: dict[str, Any], positional: list[Any]
) -> bool:
    """torch's C++ argument parser rejects the call before it dispatches to RaggedArray: an
    axis name (str) for ``dim``, or a Python number where torch wants a Tensor first."""
    dims = [names.get(a.name) for a in spec.args if a.kind in ("axis", "axes")]
    if any(_has_str(given.get(d)) for d in dims if d):
        return True
    return bool(positional) and isinstance(positional[0], (int, float, bool, complex))


def _has_str(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return any(isinstance(v, str) for v in value)
    return isinstance(value, str)


def spelled_op(info: Any, spelling: Any) -> Callable[..., Any]:
    """``info.op`` with its op called through ``spelling``. An entry whose ``op`` wraps the
    public op (``lambda x, **kw: ragged.norm(x, 1, **kw)``) runs with ``ragged.<name>``
    pointing at the torch spelling meanwhile."""
    caller = torch_caller(info.spec, spelling)
    if info.op is info.spec.obj:
        return caller
    name = info.spec.name

    def op(*args: Any, **kwargs: Any) -> Any:
        original = getattr(ragged, name)
        setattr(ragged, name, caller)
        try:
            return info.op(*args, **kwargs)
        finally:
            setattr(ragged, name, original)

    return op


def op_infos() -> dict[str, Any]:
    """The first op-table entry of every op (``docs/torch.md`` reads its flags)."""
    infos: dict[str, Any] = {}
    for info in all_ops():
        infos.setdefault(info.spec.qualname, info)
    return infos


def compiles(info: Any) -> bool:
    """The row of ``info``'s op claims one graph without host syncs under torch.compile."""
    return info.compile and not info.data_dependent


def op_rows() -> list[tuple[Any, str, Any]]:
    """``(OpInfo, label, spelling)`` for every op-table entry whose op has torch spellings."""
    rows = []
    for info in all_ops():
        for label, spelling in spellings(info.spec):
            rows.append((info, label, spelling))
    return rows


# --- the pointwise table --------------------------------------------------------------------

POSITIVE = {"log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "lgamma", "digamma"}
UNIT = {"acos", "arccos", "asin", "arcsin", "atanh", "arctanh", "erfinv"}
ABOVE_ONE = {"acosh", "arccosh", "mvlgamma"}
PROBABILITY = {"logit"}
# Extra arguments the call needs (torch requires them), and which must stay deterministic.
EXTRA: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "threshold": ((0.1, 2.0), {}),
    "mvlgamma": ((2,), {}),
    "dropout": ((0.5, False), {}),
    "alpha_dropout": ((0.5, False), {}),
}
# Binary operands: (first, second) kinds among "float", "positive", "int", "small_int".
BINARY_KINDS = {
    "fmod": ("float", "positive"),
    "xlogy": ("float", "positive"),
    "float_power": ("positive", "float"),
    "ldexp": ("float", "small_int"),
    "bitwise_left_shift": ("int", "small_int"),
    "bitwise_right_shift": ("int", "small_int"),
    "gcd": ("int", "int"),
    "lcm": ("int", "small_int"),
    "igamma": ("positive", "positive"),
    "igammac": ("positive", "positive"),
}


def pointwise_entries() -> list[_registry.TorchSpec]:
    """The declarations of ``ragged/ops/_pointwise.py`` (elementwise, on the values)."""
    entries = _registry.torch_functions()
    return [e for e in entries if e.see == ("ragged.apply",) and e.handler is not None]


def name_of(entry: _registry.TorchSpec) -> str:
    return entry.methods[0] if entry.methods else _torch.display_name(entry.fns[0]).split(".")[-1]


def domain(name: str, values: torch.Tensor) -> torch.Tensor:
    """Values moved into ``name``'s domain."""
    if name in POSITIVE:
        return values.abs() + 0.5
    if name in UNIT:
        return torch.tanh(values) * 0.9
    if name in ABOVE_ONE:
        return values.abs() + 1.5
    if name in PROBABILITY:
        return torch.sigmoid(values) * 0.8 + 0.1
    return values


def operand(kind: str, lengths: list[int], gen: torch.Generator, dtype: torch.dtype) -> Any:
    if kind in ("int", "small_int"):
        high = 4 if kind == "small_int" else 100
        values = torch.randint(0, high, (sum(lengths), 3), generator=gen)
        return ragged.from_lengths(values, lengths)
    x = ragged_randn(lengths, (3,), gen, dtype)
    return x.with_values(x.values.abs() + 0.5) if kind == "positive" else x


LOSSES = (
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
)
UNARY_NAMES = set(_pointwise.UNARY + _pointwise.UNARY_CONSTANT + _pointwise.ACTIVATIONS)
UNARY_NAMES |= set(_pointwise.RANDOM) | {"clamp", "clip"}
BINARY_NAMES = set(_pointwise.BINARY) | {"clamp_min", "clamp_max", "masked_fill"}
