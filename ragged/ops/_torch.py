"""torch functions and Tensor-style methods on RaggedArrays: the dispatch table, from the registry.

``RaggedArray.__torch_function__`` looks the called function up in one dict and calls its
handler with torch's arguments. The dict is generated here from the registry:

* every op's ``torch=`` functions, and its ``methods=`` as RaggedArray methods, call the op with
  the arguments translated from torch's spelling (``TorchArgs``: ``dim`` -> ``axis``,
  ``keepdim`` -> ``keepdims``, torch's defaults); a call whose arguments already line up with
  the op's (``torch.sum(x, 1)``) goes straight to the op;
* the pointwise functions (``ragged/ops/_pointwise.py``) run on the values;
* the handlers declared below with ``torch_function`` (``torch.max`` with indices,
  ``torch.allclose``, ``F.normalize``, ``torch.stack``, ``F.scaled_dot_product_attention``,
  ``x.size()``, ...) and the refusals, whose TypeError says what to use instead;
* any other function raises a TypeError naming it and the nearest ragged functions.

``dim`` is the logical axis (0 batch, 1 ragged, then the inner axes; negative from the end).
An error of the op is re-raised with torch's name and argument names (``torch.softmax: `dim`
...``); this costs nothing unless an error is raised. The table is ``docs/torch.md``.

>>> import ragged, torch
>>> x = ragged.array([[1.0, 2.0], [], [3.0]])
>>> torch.sum(x, dim=1), x.sum(1, keepdim=True).shape
(tensor([3., 0., 3.]), torch.Size([3, 1]))
>>> torch.softmax(x, dim=0)
Traceback (most recent call last):
ValueError: torch.softmax: `dim` cannot be the batch axis (segments differ in length), got 0.
"""

from __future__ import annotations

import difflib
import inspect
import types
from collections.abc import Callable, Sequence
from typing import Any, overload

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _array, _registry
from .._array import RaggedArray
from .._axes import normalize_axis
from .._broadcast import align
from .._partition import Partition, RowPartition
from .._registry import CAST, IGNORED, REQUIRED, TorchArgs, TorchParam, refuse, torch_function
from .._shape import RaggedShape
from . import _elementwise as ew
from . import _pointwise as _pointwise
from ._attention import attention
from ._combining import concat
from ._combining import stack as ragged_stack
from ._pairs import transpose as pair_transpose
from ._reductions._logical import argmax, argmin
from ._reductions._reduce import amax, amin
from ._reductions._statistics import norm
from ._sorting import argsort, sort, topk

__all__ = ["dispatch_table", "display_name", "method_table", "spelled"]

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
    required = [p for p in params if p.default is REQUIRED and not p.variadic]
    direct = _direct(args, signature)
    spec = _registry.lookup(op)
    prefixes = (spec.qualname,) if spec is not None else ()
    # torch spells some numbers as bools (``unbiased=True`` for ``correction=1``).
    numbers = {a.name for a in spec.args if a.kind == "number"} if spec is not None else set()

    def translate(call_args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if len(call_args) > len(lead) and variadic is None:
            raise TypeError(
                f"{display_name(name)}: takes at most {len(lead)} positional arguments, got {len(call_args)}."
            )
        given = {p.name: (p, v) for p, v in zip(lead, call_args, strict=False)}
        for key, value in kwargs.items():
            param = by_name.get(key)
            if param is None:
                if key == "out":
                    _no_out(display_name(name), value)
                    continue
                known = ", ".join(dict.fromkeys(f"`{p.name}`" for p in by_name.values()))
                raise TypeError(
                    f"{display_name(name)}: unexpected argument `{key}` (it takes {known})."
                )
            if param.name in given:
                raise TypeError(f"{display_name(name)}: got two values for `{param.name}`.")
            given[param.name] = (param, value)
        call: dict[str, Any] = {}
        dtype = None
        for param, value in given.values():
            if param.target is None:
                if not _same(value, param.default):
                    raise TypeError(
                        f"{display_name(name)}: `{param.name}` is supported on RaggedArrays at its default "
                        f"{param.default!r} only, got {value!r}."
                    )
            elif param.target == CAST:
                dtype = value
            elif param.target != IGNORED:
                if param.target in call:
                    raise TypeError(f"{display_name(name)}: got two values for `{param.name}`.")
                if param.target in numbers and isinstance(value, bool):
                    value = int(value)
                call[param.target] = value
        for param in required:
            if param.name not in given and param.target not in call:
                raise TypeError(f"{display_name(name)}: missing the argument `{param.name}`.")
        for target, default in defaults.items():
            call.setdefault(target, default)
        if dtype is not None and isinstance(call.get(ours[0]), RaggedArray):
            call[ours[0]] = call[ours[0]].to(dtype)
        if variadic is not None:
            rest = call_args[len(lead) :]
            if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
                rest = tuple(rest[0])  # torch.einsum("...", [a, b])
            return op(*[call.pop(p.target) for p in lead if p.target], *rest, **call)
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


# --- handlers of functions without an op of their own -------------------------------------------

# Handlers whose errors come from ragged ops: their messages get torch's name too.
_RENAMING: set[Any] = set()
_TORCH_RENAMES = [("x", "input"), ("axis", "dim"), ("keepdims", "keepdim"), ("arrays", "tensors")]


def _custom(*fns: Any, **declaration: Any) -> Callable[[Any], Any]:
    def declare(handler: Any) -> Any:
        _RENAMING.add(handler)
        return torch_function(*fns, **declaration)(handler)

    return declare


def _no_out(label: Any, out: Any) -> None:
    """``out=`` must be None (a handler's message gets its name from ``_renaming``)."""
    if out is not None:
        prefix = f"{label}: " if label else ""
        raise TypeError(
            f"{prefix}`out=` is not supported: RaggedArrays are immutable (use the result)."
        )


def _with_indices(values_op: Any, index_op: Any, kind: Any, x: Any, dim: Any, keepdim: bool) -> Any:
    values = values_op(x, dim, keepdims=keepdim)
    return kind((values, index_op(x, dim, keepdims=keepdim)))


@_custom(
    torch.max,
    torch.Tensor.max,
    methods=("max",),
    family="reductions",
    meaning="`max(x)`: the maximum; `max(x, dim)`: (values, indices) along `dim` (empty "
    "segments: -inf and -1); `max(x, other)`: elementwise maximum",
    see=("ragged.amax", "ragged.argmax", "ragged.maximum"),
)
def _max(input: Any, dim: Any = None, keepdim: bool = False, *, other: Any = None) -> Any:
    if isinstance(dim, (Tensor, RaggedArray)) or other is not None:
        return ew.maximum(input, dim if other is None else other)
    if dim is None:
        return amax(input)
    return _with_indices(amax, argmax, torch.return_types.max, input, dim, keepdim)


@_custom(
    torch.min,
    torch.Tensor.min,
    methods=("min",),
    family="reductions",
    meaning="`min(x)`, `min(x, dim)` (values, indices), `min(x, other)`: as `max`",
    see=("ragged.amin", "ragged.argmin", "ragged.minimum"),
)
def _min(input: Any, dim: Any = None, keepdim: bool = False, *, other: Any = None) -> Any:
    if isinstance(dim, (Tensor, RaggedArray)) or other is not None:
        return ew.minimum(input, dim if other is None else other)
    if dim is None:
        return amin(input)
    return _with_indices(amin, argmin, torch.return_types.min, input, dim, keepdim)


@_custom(
    torch.sort,
    methods=("sort",),
    family="sorting",
    meaning="(values, indices) sorted along `dim` (default -1), within each segment for the "
    "ragged axis; always stable",
    see=("ragged.sort", "ragged.argsort"),
)
def _sort(
    input: Any, dim: Any = -1, descending: bool = False, stable: bool = False, *, out: Any = None
) -> Any:
    _no_out(None, out)
    values = sort(input, dim, descending=descending)
    indices = argsort(input, dim, descending=descending)
    return torch.return_types.sort((values, indices))  # type: ignore[arg-type]


@_custom(
    torch.topk,
    methods=("topk",),
    family="sorting",
    meaning="(values, indices) of the `k` largest along `dim` (default -1); a segment shorter "
    "than `k` keeps all its rows",
    see=("ragged.topk",),
)
def _topk(
    input: Any,
    k: int,
    dim: Any = -1,
    largest: bool = True,
    sorted: bool = True,
    *,
    out: Any = None,
) -> Any:
    _no_out(None, out)
    out = topk(input, k, dim, largest=largest, sorted=sorted)
    return torch.return_types.topk(out)


@_custom(
    torch.norm,
    methods=("norm",),
    family="reductions",
    meaning="vector `p`-norm over `dim` (`'fro'`: 2)",
    see=("ragged.norm",),
)
def _norm(
    input: Any,
    p: Any = "fro",
    dim: Any = None,
    keepdim: bool = False,
    out: Any = None,
    dtype: Any = None,
) -> Any:
    _no_out(None, out)
    if p == "nuc":
        raise ValueError("`p='nuc'` (the nuclear norm) is not supported on RaggedArrays.")
    x = input if dtype is None else input.to(dtype)
    return norm(x, 2 if p == "fro" or p is None else p, dim, keepdims=keepdim)


@_custom(
    torch.allclose,
    torch.Tensor.allclose,
    methods=("allclose",),
    family="elementwise",
    meaning="every entry close (`torch.isclose`); partitions compared by value (different "
    "ones raise, as shapes that do not broadcast)",
    see=("ragged.testing.assert_close",),
    grad=False,
    compile=False,
)
def _allclose(
    input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
) -> bool:
    close = torch.isclose(input, other, rtol=rtol, atol=atol, equal_nan=equal_nan)
    return bool(close.values.all()) if isinstance(close, RaggedArray) else bool(close.all())


@_custom(
    torch.equal,
    torch.Tensor.equal,
    methods=("equal",),
    family="elementwise",
    meaning="same partition (by value), inner shape and values",
    see=("ragged.testing.assert_close",),
    grad=False,
    compile=False,
)
def _equal(input: Any, other: Any) -> bool:
    if not (isinstance(input, RaggedArray) and isinstance(other, RaggedArray)):
        return False
    if input.inner_shape != other.inner_shape or input.ragged_ndim != other.ragged_ndim:
        return False
    if input.partition is not other.partition and not input.partition.equals(other.partition):
        return False
    return torch.equal(input.values, other.values)


@_custom(
    F.normalize,
    family="normalization",
    meaning="`x / max(norm_p(x, dim), eps)`; `dim=1` (the default) normalises each segment "
    "along its rows, an inner `dim` each row",
    see=("ragged.norm",),
)
def _normalize(
    input: Any, p: float | None = None, dim: Any = 1, eps: float | None = None, out: Any = None
) -> Any:
    # Float defaults live in the body: torch.compile lifts a float default of the signature as
    # a graph input and reads it back with .item() (a host sync). torch's are 2.0 and 1e-12.
    p = 2.0 if p is None else p
    eps = 1e-12 if eps is None else eps
    _no_out(None, out)
    if not isinstance(input, RaggedArray):
        raise TypeError(f"`input` must be a RaggedArray, got {type(input).__name__}.")
    axis = normalize_axis("F.normalize", input, dim, "dim")
    if axis > input.ragged_ndim:
        values = F.normalize(input.values, p, axis - input.ragged_ndim, eps)
        return input.with_values(values)
    return input / norm(input, p, axis, keepdims=True).clamp_min(eps)


@_custom(
    torch.stack,
    family="combining",
    meaning="a new axis: an inner `dim` stacks equal partitions (`ragged.stack`); `dim=0` "
    "nests the arrays as the segments of a new batch axis; `dim=1` puts, in each segment, the "
    "arrays' rows for it under a new axis (two ragged axes)",
    see=("ragged.stack", "ragged.concat"),
)
def _stack(tensors: Sequence[Any], dim: int = 0, *, out: Any = None) -> RaggedArray:
    _no_out(None, out)
    arrays = list(tensors)
    if not arrays or not all(isinstance(a, RaggedArray) for a in arrays):
        raise TypeError("`tensors` must be a non-empty sequence of RaggedArrays.")
    first = arrays[0]
    if not isinstance(dim, int) or not -first.ndim - 1 <= dim <= first.ndim:
        raise ValueError(f"`dim` must be in [{-first.ndim - 1}, {first.ndim}], got {dim}.")
    position = dim % (first.ndim + 1)
    if position > first.ragged_ndim:
        return ragged_stack(arrays, position)
    if any(a.axes is not None for a in arrays):
        raise ValueError(
            "named arrays need a name for the new axis: stack them with `rename(None)` first."
        )
    if position == 0:
        joined = concat(arrays, 0)
        counts = torch.tensor([a.num_segments for a in arrays], device=first.device)
        outer = RowPartition.from_lengths(
            counts, joined.num_segments, max(a.num_segments for a in arrays)
        )
        return RaggedArray(joined.values, Partition((outer, *joined.partition.levels)))
    if first.ragged_ndim > 1:
        raise NotImplementedError("`dim=1` needs arrays with one ragged axis.")
    return _stack_rows(arrays)


def _stack_rows(arrays: list[RaggedArray]) -> RaggedArray:
    """``torch.stack(arrays, 1)``: segment ``b`` holds ``arrays[k][b]`` for every ``k``."""
    b = arrays[0].num_segments
    if any(a.num_segments != b for a in arrays):
        counts = [a.num_segments for a in arrays]
        raise ValueError(f"`tensors` must have equal numbers of segments, got {counts}.")
    k = len(arrays)
    device = arrays[0].device
    lengths = torch.stack([a.lengths for a in arrays], 1).reshape(-1)  # (b, k) row-major
    total = sum(a.values.shape[0] for a in arrays)
    known = [a.partition.levels[0].max_length for a in arrays]
    longest = None if None in known else max([0, *[m for m in known if m is not None]])
    inner = RowPartition.from_lengths(lengths, total, longest)
    outer = RowPartition.from_lengths(torch.full((b,), k, device=device), b * k, k if b else 0)
    values = torch.cat([a.values for a in arrays])
    bases = [0]
    for a in arrays[:-1]:
        bases.append(bases[-1] + a.values.shape[0])
    starts = torch.stack([a.offsets[:-1] + base for a, base in zip(arrays, bases, strict=True)], 1)
    starts = starts.reshape(-1)
    row = torch.arange(total, device=device)
    source = (
        starts.index_select(0, inner.row_ids) + row - inner.offsets.index_select(0, inner.row_ids)
    )
    return RaggedArray(values.index_select(0, source), Partition((outer, inner)))


SDPA_LAYOUT = (
    "`query`, `key` and `value` must be RaggedArrays of torch's layout (B, L*, E), one head; "
    "for heads use ragged.attention(q, k, v) with the layout (B, L*, H, Dh) (torch's (B, H, L*, "
    "Dh) puts the heads before the ragged axis, which a RaggedArray does not represent)"
)


@_custom(
    F.scaled_dot_product_attention,
    family="attention",
    meaning="torch's layout `(B, L*, E)` (one head): attention within each segment; "
    "`is_causal`, `scale`, `dropout_p` as torch; heads: `ragged.attention` `(B, L*, H, Dh)`",
    see=("ragged.attention",),
)
def _sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> RaggedArray:
    arrays = (query, key, value)
    if not all(isinstance(a, RaggedArray) and a.ndim == 3 for a in arrays):
        got = ", ".join(
            f"{a.ndim} axes" if isinstance(a, RaggedArray) else type(a).__name__ for a in arrays
        )
        raise TypeError(f"{SDPA_LAYOUT}; got {got}.")
    if attn_mask is not None:
        raise TypeError(
            "`attn_mask` is not supported on RaggedArrays: segments never attend to each other; "
            "for a pair bias or mask use ragged.attention(q, k, v, bias=...)."
        )
    if enable_gqa:
        raise TypeError("`enable_gqa` needs heads: use ragged.attention.")
    q, k, v = (RaggedArray(a.values[:, None], a.partition) for a in arrays)
    out = attention(q, k, v, causal=is_causal, scale=scale, dropout_p=dropout_p or None)
    return RaggedArray(out.values[:, 0], query.partition, query.axes)


# --- inner axes: transpose, unsqueeze, squeeze, flatten --------------------------------------

MOVES_RAGGED = (
    "moves the batch or a ragged axis, which RaggedArrays keep in front; torch modules that "
    "transpose batch and sequence (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.LSTM) "
    "do not take RaggedArrays: use ragged.nn (RaggedMultiheadAttention, "
    "RaggedTransformerEncoderLayer) or ragged.attention; ragged.transpose swaps the two ragged "
    "axes of a pair map"
)


RESHAPES_RAGGED = (
    "is the batch or a ragged axis, which has per-segment sizes; reshape the rows with "
    "ragged.map(lambda v: ..., x)"
)


def _inner(x: RaggedArray, dim: Any, ndim: int | None = None, why: str = RESHAPES_RAGGED) -> int:
    """``dim`` of ``x`` (of a result with ``ndim`` axes) as a dim of the values, which must be
    an inner axis (else a TypeError that says ``why``)."""
    n = x.ndim if ndim is None else ndim
    if not isinstance(dim, int) or isinstance(dim, bool) or not -n <= dim < n:
        raise ValueError(f"`dim` must be an int in [{-n}, {n}), got {dim!r}.")
    position = dim % n
    if position <= x.ragged_ndim:
        raise TypeError(f"`dim` {dim} {why}.")
    return position - x.ragged_ndim


@_custom(
    torch.transpose,
    torch.swapaxes,
    methods=("transpose", "swapaxes"),
    family="indexing",
    meaning="swaps two inner axes (the ragged axes of a pair map: `ragged.transpose`); the "
    "batch and ragged axes stay in front",
    see=("ragged.transpose",),
)
def _transpose(input: RaggedArray, dim0: int, dim1: int) -> RaggedArray:
    if {dim0 % input.ndim, dim1 % input.ndim} == {1, 2} and input.ragged_ndim == 2:
        return pair_transpose(input)
    a, b = _inner(input, dim0, why=MOVES_RAGGED), _inner(input, dim1, why=MOVES_RAGGED)
    return input.with_values(input.values.transpose(a, b), axes=_swapped(input.axes, a, b, input))


def _swapped(names: Any, a: int, b: int, x: RaggedArray) -> Any:
    if names is None:
        return None
    out = list(names)
    i, j = a + x.ragged_ndim, b + x.ragged_ndim
    out[i], out[j] = out[j], out[i]
    return tuple(out)


@_custom(
    torch.unsqueeze,
    methods=("unsqueeze",),
    family="indexing",
    meaning="a size-1 inner axis at `dim` (of the result)",
    see=("RaggedArray.__getitem__",),
)
def _unsqueeze(input: RaggedArray, dim: int) -> RaggedArray:
    if input.axes is not None:
        raise ValueError("a named array needs a name for its new axis: use x[..., None] unnamed.")
    return input.with_values(input.values.unsqueeze(_inner(input, dim, input.ndim + 1)))


@_custom(
    torch.squeeze,
    methods=("squeeze",),
    family="indexing",
    meaning="removes size-1 inner axes (all of them, or `dim`)",
)
def _squeeze(input: RaggedArray, dim: Any = None) -> RaggedArray:
    nr = input.ragged_ndim
    dims = range(nr + 1, input.ndim) if dim is None else dim if isinstance(dim, tuple) else (dim,)
    inner = sorted({_inner(input, d) for d in dims})
    drop = [d for d in inner if input.values.shape[d] == 1]
    values = input.values.squeeze(tuple(drop)) if drop else input.values
    names = input.axes
    if names is not None:
        names = tuple(n for i, n in enumerate(names) if i - nr not in drop)
    return RaggedArray(values, input.partition, names)


@_custom(
    torch.flatten,
    methods=("flatten",),
    family="indexing",
    meaning="flattens inner axes `start_dim..end_dim`; all axes (the default): every entry in "
    "order, a dense 1-D tensor (`x.values.reshape(-1)`)",
)
def _flatten(input: RaggedArray, start_dim: int = 0, end_dim: int = -1) -> Any:
    n = input.ndim
    every = isinstance(start_dim, int) and isinstance(end_dim, int)
    if every and start_dim % n == 0 and end_dim % n == n - 1:
        return input.values.reshape(-1)
    a, b = _inner(input, start_dim), _inner(input, end_dim)
    names = None if input.axes is not None and a != b else input.axes
    return RaggedArray(input.values.flatten(a, b), input.partition, names)


# --- Tensor-style properties and conversions ----------------------------------------------------


@overload
def _size(self: RaggedArray, dim: None = None) -> RaggedShape: ...
@overload
def _size(self: RaggedArray, dim: int) -> int | Tensor: ...
@torch_function(
    family="tensor",
    meaning="`x.size()`: the RaggedShape; `x.size(d)`: an int, or the lengths of a ragged axis",
    methods=("size",),
    see=("RaggedArray.shape",),
    grad=False,
)
def _size(self: RaggedArray, dim: int | None = None) -> Any:
    return self.shape if dim is None else self.shape[dim]


@torch_function(
    family="tensor",
    meaning="the number of axes, `x.ndim`",
    methods=("dim", "ndimension"),
    see=("RaggedArray.ndim",),
    grad=False,
)
def _dim(self: RaggedArray) -> int:
    return self.ndim


@torch_function(
    torch.numel,
    family="tensor",
    meaning="the number of entries (of the values)",
    methods=("numel", "nelement"),
    grad=False,
)
def _numel(input: RaggedArray) -> int:
    return input.values.numel()


@torch_function(
    torch.is_floating_point,
    family="tensor",
    meaning="whether the values are floating point",
    methods=("is_floating_point",),
    grad=False,
)
def _is_floating_point(input: RaggedArray) -> bool:
    return input.values.is_floating_point()


@torch_function(
    family="tensor",
    meaning="sets `requires_grad` of the values (a leaf) in place and returns the array, as "
    "torch: the data and the partition do not change",
    methods=("requires_grad_",),
    grad=False,
    compile=False,
)
def _requires_grad_(self: RaggedArray, requires_grad: bool = True) -> RaggedArray:
    self.values.requires_grad_(requires_grad)
    return self


@torch_function(
    family="tensor",
    meaning="values and offsets on the CPU",
    methods=("cpu",),
    see=("RaggedArray.to",),
)
def _cpu(self: RaggedArray, memory_format: Any = torch.preserve_format) -> RaggedArray:
    return self.to("cpu", memory_format=memory_format)


@torch_function(
    family="tensor",
    meaning="values and offsets on a CUDA device",
    methods=("cuda",),
    see=("RaggedArray.to",),
    compile=False,
)
def _cuda(
    self: RaggedArray,
    device: Any = None,
    non_blocking: bool = False,
    memory_format: Any = torch.preserve_format,
) -> RaggedArray:
    target = torch.device("cuda", device) if isinstance(device, int) else device or "cuda"
    return self.to(target, non_blocking=non_blocking, memory_format=memory_format)


@torch_function(
    family="tensor",
    meaning="the dtype and device of `other` (a tensor or a RaggedArray)",
    methods=("type_as",),
    see=("RaggedArray.to",),
)
def _type_as(self: RaggedArray, other: Any) -> RaggedArray:
    return self.to(device=other.device, dtype=other.dtype)


@torch_function(
    torch.unbind,
    family="indexing",
    meaning="`dim=0`: the segments, as `x.unbind()`",
    see=("ragged.unbind",),
    grad=True,
    compile=False,
)
def _unbind(input: RaggedArray, dim: int = 0) -> tuple[Any, ...]:
    if dim != 0:
        raise ValueError(f"`dim` must be 0 (the batch axis) on a RaggedArray, got {dim}.")
    return input.unbind()


# --- losses: elementwise over all entries -------------------------------------------------------

_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
_LOSSES_BCE = ("binary_cross_entropy", "binary_cross_entropy_with_logits")


def _loss(fn: Callable[..., Any]) -> Callable[..., Any]:
    label = f"torch.nn.functional.{fn.__name__}"

    def handler(input: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
        reduction = kwargs.get("reduction", "mean")
        a, b, partition, names = align(label, input, target)
        out = fn(a, b, *args, **kwargs)
        return RaggedArray(out, partition, names) if reduction == "none" else out

    return handler


# --- the table --------------------------------------------------------------------------------


def _declare_losses() -> None:
    for name in _LOSSES + _LOSSES_BCE:
        fn = getattr(F, name)
        torch_function(
            fn,
            family="reductions",
            meaning="over every entry (`reduction='none'`: a RaggedArray of losses); input and "
            "target line up as for `ragged.add`",
            see=("ragged.mean",),
        )(_loss(fn))


_declare_losses()

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
