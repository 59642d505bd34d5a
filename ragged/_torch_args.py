"""torch's signature of an op: the parameters of a torch function mapped onto the op's.

``TorchArgs.parse`` reads a declaration such as ``torch_args="input, dim=None, *, dtype=None"``
(``ragged._registry.op``) against the op's own signature; ``ragged.ops._torch`` builds the
handlers of the op's ``torch=`` functions and ``methods=`` from it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

__all__ = [
    "CAST",
    "IGNORED",
    "REQUIRED",
    "TORCH_NAMES",
    "TorchArgs",
    "TorchParam",
    "refuse_out",
]

REQUIRED: Any = inspect.Parameter.empty  # a torch parameter without a default
CAST = "<cast>"  # ``dtype=``: the input is cast to it first, as torch does
IGNORED = "<ignored>"  # accepted and ignored (``_stacklevel``)
# torch's names for the op's parameters, where they differ ("input" and "other" are the op's
# first and second parameters).
TORCH_NAMES = {"dim": "axis", "keepdim": "keepdims", "tensors": "arrays"}


@dataclasses.dataclass(frozen=True)
class TorchParam:
    """One parameter of a torch function, and where it goes in the op's call.

    Attributes:
        name: torch's name (``dim``).
        target: the op's parameter it maps onto (``axis``); ``CAST`` for ``dtype=`` (the input
            is cast first); ``IGNORED``; ``None``: no counterpart, so only its default is
            accepted (another value is a TypeError that says so).
        default: torch's default (``REQUIRED`` if none). A mapped parameter that the caller
            omits is passed with torch's default, so torch's defaults hold (``torch.sort``
            sorts along ``dim=-1``).
        positional: it may be passed by position (it comes before the ``*``).
        variadic: it collects the remaining positional arguments (``*operands``).
    """

    name: str
    target: str | None
    default: Any = REQUIRED
    positional: bool = True
    variadic: bool = False


@dataclasses.dataclass(frozen=True)
class TorchArgs:
    """torch's signature of an op, as declared in ``torch_args="input, dim=None, *, dtype=None"``.

    Items are torch's parameter names in torch's order, with torch's defaults (Python literals)
    and ``*`` before the keyword-only ones; ``name->target`` maps a parameter onto the op's
    parameter ``target`` explicitly. Otherwise: a name the op has maps onto itself; ``input``
    (or ``self``) and ``other`` onto the op's first and second parameters; ``dim``, ``keepdim``
    and ``tensors`` onto ``axis``, ``keepdims`` and ``arrays``; ``dtype`` casts the input;
    ``_stacklevel`` is ignored; any other name has no counterpart (its default only).

    >>> import ragged
    >>> args = TorchArgs.parse(ragged.sum, "input, dim=None, keepdim=False, *, dtype=None")
    >>> [(p.name, p.target, p.default) for p in args.params]
    [('input', 'x', <class 'inspect._empty'>), ('dim', 'axis', None), ('keepdim', 'keepdims', False), ('dtype', '<cast>', None)]
    """

    params: tuple[TorchParam, ...]

    @staticmethod
    def parse(fn: Callable[..., Any], text: str) -> TorchArgs:
        """Parse ``text`` against the signature of the op ``fn``."""
        names = list(inspect.signature(fn).parameters)
        params = []
        keyword_only = False
        for item in filter(None, (s.strip() for s in text.split(","))):
            if item == "*":
                keyword_only = True
                continue
            variadic = item.startswith("*")
            head, eq, default_text = item.lstrip("*").partition("=")
            name, arrow, explicit = (s.strip() for s in head.partition("->"))
            default = ast.literal_eval(default_text.strip()) if eq else REQUIRED
            target = explicit or None if arrow else _torch_target(name, names)
            if arrow and explicit and explicit not in names:
                raise ValueError(f"{fn}: torch argument {name!r} maps onto unknown {explicit!r}")
            params.append(TorchParam(name, target, default, not keyword_only, variadic))
            keyword_only = keyword_only or variadic
        return TorchArgs(tuple(params))


def _torch_target(name: str, names: list[str]) -> str | None:
    if name in names:
        return name
    if name in ("input", "self"):
        return names[0]
    if name == "other":
        return names[1]
    if name == "dtype":
        return CAST
    if name == "_stacklevel":
        return IGNORED
    target = TORCH_NAMES.get(name)
    return target if target in names else None


def refuse_out(label: Any, out: Any) -> None:
    """``out=`` must be None (a handler's message gets its name from ``_renaming``)."""
    if out is not None:
        prefix = f"{label}: " if label else ""
        raise TypeError(
            f"{prefix}`out=` is not supported: RaggedArrays are immutable (use the result)."
        )
