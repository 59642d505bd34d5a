"""The dispatch table of ``RaggedArray.__torch_function__`` and the Tensor-style methods.

Built from the registry: the ops' ``torch=`` functions and ``methods=`` (``spelled``), the
pointwise functions, the handlers declared in ``_handlers`` and ``_tensor``, and the refusals
declared here, whose TypeError says what to use instead; any other function raises a TypeError
naming the nearest ragged functions.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ... import _array, _registry
from ..._registry import refuse
from .. import _pointwise as _pointwise
from . import _handlers as _handlers
from . import _immutable as _immutable
from . import _tensor as _tensor
from ._spelling import _ERRORS, _RENAMING, _TORCH_RENAMES, _renamed, display_name, spelled

refuse(
    F.multi_head_attention_forward,
    family="attention",
    hint="nn.MultiheadAttention and nn.TransformerEncoderLayer do not take RaggedArrays: use "
    "ragged.nn.RaggedMultiheadAttention and ragged.nn.RaggedTransformerEncoderLayer (the same "
    "parameters and state dict) or ragged.attention",
    see=("ragged.nn.RaggedMultiheadAttention", "ragged.attention"),
)
refuse(
    F.cross_entropy,
    F.nll_loss,
    family="reductions",
    hint="torch puts the classes on dim 1, the ragged axis of a RaggedArray; call it on the "
    "rows: F.cross_entropy(logits.values, target.values)",
)
refuse(
    torch.cummax,
    torch.cummin,
    family="scans",
    hint="torch's returns the indices too; ragged.cummax(x, axis) and ragged.cummin give the "
    "running values",
    see=("ragged.cummax", "ragged.cummin"),
)
refuse(
    torch.reshape,
    torch.permute,
    torch.movedim,
    family="indexing",
    hint="the ragged axis has per-segment sizes; reshape the rows with ragged.map(lambda v: "
    "v.reshape(...), x)",
    see=("ragged.map",),
)
refuse(
    torch.nonzero,
    torch.masked_select,
    family="indexing",
    hint="ragged.filter(x, mask) keeps the rows where a RaggedArray mask is True",
    see=("ragged.filter",),
)
refuse(
    torch.gather,
    torch.index_select,
    torch.take,
    torch.take_along_dim,
    family="indexing",
    hint="ragged.take(x, indices, axis) takes rows within each segment",
    see=("ragged.take",),
)
refuse(F.pad, family="indexing", hint="ragged.pad pads every segment", see=("ragged.pad",))
refuse(
    torch.unique_consecutive,
    family="sorting",
    hint="ragged.unique_consecutive(x, axis) collapses runs within each segment",
    see=("ragged.unique_consecutive",),
)
refuse(
    torch.median,
    torch.nanmedian,
    torch.quantile,
    torch.mode,
    torch.nansum,
    torch.nanmean,
    family="reductions",
    hint="no ragged op: per segment, e.g. ragged.vmap(lambda s: torch.median(s, 0).values)(x)",
    see=("ragged.vmap",),
)
refuse(
    torch.mm,
    torch.bmm,
    family="linalg",
    hint="ragged.matmul(x, w) or F.linear(x, weight) multiply the rows by a dense matrix",
    see=("ragged.matmul", "ragged.linear"),
)
refuse(
    F.conv1d,
    torch.flip,
    torch.roll,
    family="linalg",
    hint="torch's layout would mix segments; per segment: ragged.vmap(fn)(x)",
    see=("ragged.vmap",),
)


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
        except _ERRORS as error:
            text = str(error.args[0]) if error.args else ""
            label = display_name(fn)
            new = _renamed(error, prefixes, label, _TORCH_RENAMES)
            if new is None and text.startswith("`"):  # a handler's own message
                new = type(error)(f"{label}: {text}").with_traceback(error.__traceback__)
            if new is None:
                raise
            raise new from None

    return renaming


def dispatch_table() -> dict[Any, Callable[..., Any]]:
    """torch function -> handler, for ``RaggedArray.__torch_function__``."""
    table: dict[Any, Callable[..., Any]] = {None: _unsupported}
    for spec in _registry.ops():
        for fn in spec.torch:
            table[fn] = spelled(spec.obj, spec.torch_signature(fn), fn)
    for entry in _registry.torch_functions():
        for fn in entry.fns:
            if entry.handler is None:
                table[fn] = _refused(fn, entry.hint)
            elif entry.handler in _RENAMING:
                table[fn] = _renaming(entry.handler, fn)
            else:
                table[fn] = entry.handler
    return table


def method_table() -> dict[str, Callable[..., Any]]:
    """Tensor-style method name -> function, installed on RaggedArray."""
    table: dict[str, Callable[..., Any]] = {}
    for spec in _registry.ops():
        for name in spec.methods:
            table[name] = spelled(spec.obj, spec.torch_signature(None), f"RaggedArray.{name}")
    for entry in _registry.torch_functions():
        for name in entry.methods:
            handler = entry.handler
            assert handler is not None
            if handler in _RENAMING:
                handler = _renaming(handler, f"RaggedArray.{name}")
            table[name] = handler
    return table


def install(extra: dict[Any, Callable[..., Any]]) -> None:
    """Fill ``RaggedArray.__torch_function__``'s table with ``dispatch_table()`` and ``extra``
    (the operators of a dense ``self``; idempotent)."""
    table = {**dispatch_table(), **extra}
    _array.TORCH_FUNCTIONS.clear()
    _array.TORCH_FUNCTIONS.update(table)
    python = [(f, h) for f, h in table.items() if isinstance(f, types.FunctionType)]
    _array.TORCH_PYTHON_FUNCTIONS[:] = python
