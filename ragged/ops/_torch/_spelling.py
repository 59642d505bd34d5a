"""torch's spelling of an op's call: arguments translated to the op's, errors renamed back.

``spelled`` makes the handler of an op's ``torch=`` functions and ``methods=`` (``dim`` ->
``axis``, ``keepdim`` -> ``keepdims``, torch's defaults, a direct call when the arguments
already line up); ``display_name`` is how users spell a torch callable; ``_custom`` declares a
hand-written handler whose errors get torch's name (``_RENAMING``, applied by ``_table``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import _registry
from ..._array import RaggedArray
from ..._registry import torch_function
from ..._torch_args import CAST, IGNORED, REQUIRED, TorchArgs, TorchParam, refuse_out

_ERRORS = (TypeError, ValueError, IndexError, NotImplementedError)


_NAMESPACES = (
    ("torch", torch),
    ("torch.nn.functional", F),
    ("torch.Tensor", torch.Tensor),
    ("torch.linalg", torch.linalg),
)


def display_name(fn: Any) -> str:
    """How users spell a torch callable: ``torch.sum``, ``torch.nn.functional.gelu``.

    >>> display_name(torch.mm), display_name(torch.linalg.vector_norm)
    ('torch.mm', 'torch.linalg.vector_norm')
    """
    if isinstance(fn, str):
        return fn
    name = getattr(fn, "__name__", "")
    for prefix, namespace in _NAMESPACES:
        for candidate in (name.lstrip("_"), name):  # F.threshold is F._threshold
            if candidate and getattr(namespace, candidate, None) is fn:
                return f"{prefix}.{candidate}"
    return torch.overrides.resolve_name(fn) or getattr(fn, "__qualname__", repr(fn))


def _renamed(
    error: Exception, prefixes: Sequence[str], name: str, renames: Sequence[tuple[str, str]]
) -> Exception | None:
    """``error`` with the registry's prefix replaced by torch's name, and the op's argument
    names by torch's; ``None`` when its message does not start with one of ``prefixes``."""
    text = str(error.args[0]) if error.args else ""
    prefix = next((p for p in prefixes if text.startswith(p + ": ")), None)
    if prefix is None:
        return None
    text = name + text[len(prefix) :]
    for ours, theirs in renames:
        text = text.replace(f"`{ours}`", f"`{theirs}`")
    try:
        new = type(error)(text)
    except Exception:  # an exception type that wants other arguments: keep the original
        return None
    return new.with_traceback(error.__traceback__)


def _same(value: Any, default: Any) -> bool:
    """``value`` is torch's ``default`` (bools and tensors by identity: ``True`` is not ``1``)."""
    if value is default:
        return True
    special = (Tensor, RaggedArray, bool)
    if isinstance(value, special) or isinstance(default, special):
        return False
    try:
        return bool(value == default)
    except Exception:
        return False


def _direct(args: TorchArgs, signature: inspect.Signature) -> frozenset[int]:
    """The numbers of positional arguments (and no keywords) for which calling the op with
    torch's arguments unchanged is exactly right: they line up with the op's leading
    parameters, and every omitted torch default equals the op's."""
    ours = list(signature.parameters.values())
    params = args.params
    if any(p.variadic for p in params):
        return frozenset()
    lead = [p for p in params if p.positional]
    counts = set()
    for n in range(1, len(lead) + 1):
        if n > len(ours) or lead[n - 1].target != ours[n - 1].name:
            break
        if ours[n - 1].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            break
        given = {p.target for p in lead[:n]}
        omitted = [p for p in params if p not in lead[:n]]
        if all(_omittable(p, signature, given, params) for p in omitted):
            counts.add(n)
    return frozenset(counts)


def _omittable(param: Any, signature: inspect.Signature, given: set[Any], params: Any) -> bool:
    """Leaving ``param`` out of a direct call gives torch's default for it."""
    if param.target in (CAST, IGNORED, None):
        return param.default is not REQUIRED
    if param.target in given:
        return True
    if param.default is REQUIRED:
        return False
    if next(p for p in params if p.target == param.target) is not param:
        return True  # a second spelling of one parameter (unbiased/correction): the first counts
    ours = signature.parameters[param.target].default
    return ours is not inspect.Parameter.empty and _same(ours, param.default)


def spelled(op: Callable[..., Any], args: TorchArgs, name: Any) -> Callable[..., Any]:
    """A handler that calls ``op`` with arguments in torch's spelling ``args``.

    ``name`` (a torch callable or a string such as ``"RaggedArray.sum"``) replaces the op's name
    in its error messages.

    >>> import ragged
    >>> sum_ = spelled(ragged.sum, TorchArgs.parse(ragged.sum, "input, dim=None, keepdim=False"), "f")
    >>> sum_(ragged.array([[1, 2], [3]]), keepdim=True, dim=1)
    tensor([[3],
            [3]])
    """
    # The closures hold ``name`` itself (a torch function or a string: both are constants to
    # torch.compile); its display name is computed when an error needs it.
    signature = inspect.signature(op)
    ours = list(signature.parameters)
    params = args.params
    lead = [p for p in params if p.positional and not p.variadic]
    variadic = next((p for p in params if p.variadic), None)
    by_name = {p.name: p for p in params}
    renames: list[tuple[str, str]] = []
    defaults: dict[str, Any] = {}
    for p in params:
        if p.target in ours:
            by_name.setdefault(p.target, p)  # the op's own names are accepted too
            if p.name != p.target and all(p.target != r[0] for r in renames):
                renames.append((p.target, p.name))
            if p.default is not REQUIRED and not p.variadic:
                defaults.setdefault(p.target, p.default)
    for extra in ours:  # the op's own extras (``fill_value``), by name
        if extra not in by_name and all(p.target != extra for p in params):
            by_name[extra] = TorchParam(extra, extra, REQUIRED, positional=False)
    required = [(p.name, p.target) for p in params if p.default is REQUIRED and not p.variadic]
    direct = _direct(args, signature)
    spec = _registry.lookup(op)
    prefixes = (spec.qualname,) if spec is not None else ()
    # torch spells some numbers as bools (``unbiased=True`` for ``correction=1``).
    numbers = {a.name for a in spec.args if a.kind == "number"} if spec is not None else set()
    # What ``translate`` reads, as plain tuples (name, target, default): torch.compile traces
    # it, and cannot hold a TorchParam (a dataclass instance) as a constant.
    plain = {p.name: (p.name, p.target, p.default) for p in by_name.values()}
    keyed = {key: plain[p.name] for key, p in by_name.items()}
    leading = [plain[p.name] for p in lead]
    variadic_targets = [p.target for p in lead if p.target] if variadic is not None else None
    accepted = ", ".join(dict.fromkeys(f"`{p.name}`" for p in by_name.values()))

    def translate(call_args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if len(call_args) > len(leading) and variadic_targets is None:
            raise TypeError(
                f"{display_name(name)}: takes at most {len(leading)} positional arguments, got "
                f"{len(call_args)}."
            )
        given = {p[0]: (p, v) for p, v in zip(leading, call_args, strict=False)}
        for key, value in kwargs.items():
            param = keyed.get(key)
            if param is None:
                if key == "out":
                    refuse_out(display_name(name), value)
                    continue
                raise TypeError(
                    f"{display_name(name)}: unexpected argument `{key}` (it takes {accepted})."
                )
            if param[0] in given:
                raise TypeError(f"{display_name(name)}: got two values for `{param[0]}`.")
            given[param[0]] = (param, value)
        call: dict[str, Any] = {}
        dtype = None
        for (label, target, default), value in given.values():
            if target is None:
                if not _same(value, default):
                    raise TypeError(
                        f"{display_name(name)}: `{label}` is supported on RaggedArrays at its "
                        f"default {default!r} only, got {value!r}."
                    )
            elif target == CAST:
                dtype = value
            elif target != IGNORED:
                if target in call:
                    raise TypeError(f"{display_name(name)}: got two values for `{label}`.")
                if target in numbers and isinstance(value, bool):
                    value = int(value)
                call[target] = value
        for label, target in required:
            if label not in given and target not in call:
                raise TypeError(f"{display_name(name)}: missing the argument `{label}`.")
        for target, default in defaults.items():
            call.setdefault(target, default)
        if dtype is not None and isinstance(call.get(ours[0]), RaggedArray):
            call[ours[0]] = call[ours[0]].to(dtype)
        if variadic_targets is not None:
            rest = call_args[len(leading) :]
            if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
                rest = tuple(rest[0])  # torch.einsum("...", [a, b])
            return op(*[call.pop(t) for t in variadic_targets], *rest, **call)
        return op(**call)

    def handler(*call_args: Any, **kwargs: Any) -> Any:
        try:
            if not kwargs and len(call_args) in direct:
                return op(*call_args)
            return translate(call_args, kwargs)
        except _ERRORS as error:
            new = _renamed(error, prefixes, display_name(name), renames)
            if new is None:
                raise
            raise new from None

    return handler


# Handlers whose errors come from ragged ops: their messages get torch's name too.
_RENAMING: set[Any] = set()
_TORCH_RENAMES = [("x", "input"), ("axis", "dim"), ("keepdims", "keepdim"), ("arrays", "tensors")]


def _custom(*fns: Any, **declaration: Any) -> Callable[[Any], Any]:
    def declare(handler: Any) -> Any:
        _RENAMING.add(handler)
        return torch_function(*fns, **declaration)(handler)

    return declare
