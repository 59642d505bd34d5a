"""The variants of ``ragged.attention``: checks of the arguments and what the kernels get.

``parse`` turns the user's arguments (``window``, ``alibi``, ``relative_bias``,
``document_ids``, ``prefix``, ``score_mod``, ``mask_mod``) into the kernels' static
``Variant`` and their tensors (``Extras``); ``tabulate`` evaluates a callable relative bias on
every distance a call can see, once the longest segment (or a static bound on it) is known.
The semantics are in ``ragged/kernels/_attention_mods.py`` and ``docs/semantics.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._array import RaggedArray
from .._errors import Func, type_error, typename, value_error
from .._format import shape_text
from ..kernels._attention_mods import Extras, Variant

SELF_ONLY = (
    "needs self-attention: q and k with equal partitions (positions i and j of one sequence)"
)


@dataclasses.dataclass(frozen=True)
class Parsed:
    """The checked variants of one call.

    Attributes:
        variant: the static facts for the kernels.
        extras: the tensors (a callable relative bias is not tabulated yet: ``relative``).
        relative: a callable relative bias, or ``None``.
        unfused: the variants the fused CUDA kernels do not take, in words (``""``: none).
    """

    variant: Variant
    extras: Extras
    relative: Callable[[Tensor], Tensor] | None
    unfused: str


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _window(func: Func, window: Any) -> tuple[int | None, int | None]:
    expected = "must be a pair (left, right) of non-negative ints or None"
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise type_error(func, "window", expected, typename(window))
    for side in window:
        if side is not None and not _is_int(side):
            raise type_error(func, "window", expected, tuple(window))
        if side is not None and side < 0:
            raise value_error(func, "window", expected, tuple(window))
        if side is not None and side >= 2**63:  # None: unbounded
            big = "must be a pair of ints below 2**63 (None for no bound on a side)"
            raise value_error(func, "window", big, tuple(window))
    return window[0], window[1]


def _head_tensor(func: Func, name: str, x: Any, q: RaggedArray, rows: bool) -> Tensor:
    """A floating tensor ``[H]`` (``rows=False``) or ``[R, H]``, cast to ``q``'s dtype."""
    heads = q.values.shape[1]
    shape = f"[2R + 1, H] with H = {heads}" if rows else f"[H] with H = {heads}"
    if not isinstance(x, Tensor):
        kind = "a tensor " + shape + (" or a callable" if rows else "")
        raise type_error(func, name, f"must be {kind}", typename(x))
    if not x.dtype.is_floating_point:
        raise type_error(func, name, "must have a floating-point dtype", x.dtype)
    if x.device != q.device:
        raise value_error(func, name, f"must be on the device of `q` ({q.device})", x.device)
    if rows:
        good = x.dim() == 2 and x.shape[1] == heads and x.shape[0] % 2 == 1
    else:
        good = x.dim() == 1 and x.shape[0] == heads
    if not good:
        raise value_error(func, name, f"must have shape {shape}", tuple(x.shape))
    return x.to(q.dtype)


def check_partition(
    func: Func, name: str, x: RaggedArray, ref_name: str, ref: RaggedArray, why: str
) -> None:
    """``x`` must have the partition of ``ref`` (identity, else one value comparison)."""
    if x.partition is not ref.partition and not x.partition.equals(ref.partition):
        raise value_error(
            func,
            name,
            f"must have the partition of `{ref_name}` ({why})",
            f"{ref_name} {shape_text(ref)} and {name} {shape_text(x)}",
        )


def _documents(func: Func, ids: Any, q: RaggedArray) -> Tensor:
    if not isinstance(ids, RaggedArray):
        raise type_error(func, "document_ids", "must be a RaggedArray (B, L*)", typename(ids))
    if ids.values.dim() != 1 or ids.ragged_ndim != 1:
        raise value_error(func, "document_ids", "must have shape (B, L*)", shape_text(ids))
    if ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise type_error(func, "document_ids", "must have an integer dtype", ids.dtype)
    check_partition(func, "document_ids", ids, "q", q, "one id per query row")
    return ids.values.to(torch.int64)


def _prefix(func: Func, prefix: Any, q: RaggedArray) -> Tensor:
    """The prefix lengths as int64 ``[B]``, clipped to the segments' lengths: a prefix past a
    segment's end means the whole segment, and the padded buckets must not see the padding
    rows beyond it as prefix keys."""
    expected = "must be a non-negative int or an integer tensor [B]"
    lengths = q.partition.levels[0].lengths
    if _is_int(prefix):
        if prefix < 0:
            raise value_error(func, "prefix", expected, prefix)
        full = torch.full((q.num_segments,), prefix, dtype=torch.int64, device=q.device)
        return torch.minimum(full, lengths.to(torch.int64))
    if not isinstance(prefix, Tensor) or prefix.dtype.is_floating_point or prefix.dtype.is_complex:
        got = typename(prefix) if not isinstance(prefix, Tensor) else prefix.dtype
        raise type_error(func, "prefix", expected, got)
    if prefix.dim() != 1 or prefix.shape[0] != q.num_segments:
        raise value_error(
            func, "prefix", f"must have one entry per segment ({q.num_segments})", prefix.shape
        )
    if prefix.device.type == "cpu" and not torch.compiler.is_compiling():
        # A host tensor reads without a device sync; on an accelerator (no read) or under
        # torch.compile a negative entry counts as 0 (clamped below).
        negative = prefix < 0
        if bool(negative.any()):
            b = int(torch.argmax(negative.to(torch.int8)))
            raise value_error(func, "prefix", expected, f"prefix[{b}] = {int(prefix[b])}")
    prefix = prefix.to(device=q.device, dtype=torch.int64).clamp_min(0)
    return torch.minimum(prefix, lengths.to(torch.int64))


MODS = {
    "score_mod": ("score, b, h, q_idx, kv_idx", 5),
    "mask_mod": ("b, h, q_idx, kv_idx", 4),
}


def _arity(func: Func, name: str, fn: Callable[..., Any]) -> None:
    """``fn`` takes the arguments ``name`` is called with (when Python can tell)."""
    spelled, count = MODS[name]
    if torch.compiler.is_compiling():  # Dynamo cannot bind a signature: read the code object
        bad = _code_arity(fn, count)
        if bad is not None:
            expected = f"must take {count} arguments ({spelled})"
            raise type_error(func, name, expected, f"signature {bad}")
        return
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or an extension: cannot tell, call it
        return
    try:
        signature.bind(*range(count))
    except TypeError:
        raise type_error(
            func, name, f"must take {count} arguments ({spelled})", f"signature {signature}"
        ) from None


def _code_arity(fn: Callable[..., Any], count: int) -> str | None:
    """The signature of a plain Python function ``fn`` that cannot take ``count`` positional
    arguments (read from its code object, which Dynamo traces), else ``None`` (also when
    ``fn`` is no plain function: a builtin, a method, a ``functools.partial``)."""
    code = getattr(fn, "__code__", None)
    if code is None or not isinstance(fn, types.FunctionType):
        return None
    positional = code.co_argcount
    required = positional - len(fn.__defaults__ or ())
    varargs = bool(code.co_flags & inspect.CO_VARARGS)
    keywords = code.co_kwonlyargcount  # Dynamo reads __kwdefaults__ only eagerly (rare)
    if keywords:
        keywords -= len(fn.__kwdefaults__ or {})
    if required <= count and (varargs or count <= positional) and keywords == 0:
        return None
    names = list(code.co_varnames[:positional])
    kwonly = list(code.co_varnames[positional : positional + code.co_kwonlyargcount])
    if varargs:
        names.append("*" + code.co_varnames[positional + code.co_kwonlyargcount])
    elif kwonly:
        names.append("*")
    return "(" + ", ".join(names + kwonly) + ")"


def make_checked_mod(func: Func, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a ``score_mod`` or ``mask_mod``) whose output is checked: a tensor of the
    score's shape and a floating dtype (``score_mod``), or a boolean or integer tensor that
    broadcasts to the shape of its index arguments (``mask_mod``); never 0-d. Dynamo traces
    the checks (a new wrapper per traced call); eager calls use ``checked_mod``."""

    def checked(*args: Tensor) -> Tensor:
        out = fn(*args)
        if name == "score_mod":
            target = tuple(args[0].shape)
            good = isinstance(out, Tensor) and tuple(out.shape) == target
            good = good and out.dtype.is_floating_point
            expected = f"must return a floating tensor of the score's shape {target}"
        else:
            target = tuple(torch.broadcast_shapes(*(a.shape for a in args)))
            good = isinstance(out, Tensor) and out.dim() > 0 and not out.is_floating_point()
            good = good and not out.is_complex() and _broadcasts(tuple(out.shape), target)
            expected = (
                f"must return a boolean tensor that broadcasts to its arguments' shape {target}"
            )
        if not good:
            got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, Tensor) else typename(out)
            raise value_error(func, name, expected, got)
        return out

    return checked


# One wrapper per function in eager mode, so that kernels see the same object on every call.
checked_mod = functools.lru_cache(maxsize=64)(make_checked_mod)


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(target), strict=False))


def parse(
    func: Func,
    q: RaggedArray,
    same: bool,
    causal: bool,
    window: Any,
    alibi: Any,
    relative_bias: Any,
    document_ids: Any,
    prefix: Any,
    score_mod: Any,
    mask_mod: Any,
) -> Parsed:
    """Check the variants of a call (``same``: self-attention) and build what kernels take."""
    positional = {
        "window": window,
        "alibi": alibi,
        "relative_bias": relative_bias,
        "document_ids": document_ids,
        "prefix": prefix,
    }
    for name, value in positional.items():
        if value is not None and not same:
            raise value_error(func, name, SELF_ONLY, "two partitions")
    left = right = None
    if window is not None:
        left, right = _window(func, window)
    slopes = None if alibi is None else _head_tensor(func, "alibi", alibi, q, rows=False)
    table = relative = None
    radius = 0
    if callable(relative_bias) and not isinstance(relative_bias, Tensor):
        relative = relative_bias
    elif relative_bias is not None:
        table = _head_tensor(func, "relative_bias", relative_bias, q, rows=True)
        radius = (table.shape[0] - 1) // 2
    documents = None if document_ids is None else _documents(func, document_ids, q)
    prefix_t = None
    if prefix is not None:
        if not causal:
            raise value_error(
                func,
                "prefix",
                "needs causal=True (prefix-LM: bidirectional in the prefix, causal after)",
                "causal=False",
            )
        prefix_t = _prefix(func, prefix, q)
    for name, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if fn is not None and not callable(fn):
            raise type_error(func, name, "must be a callable or None", typename(fn))
        if fn is not None:
            _arity(func, name, fn)
    # Dynamo cannot trace the lru_cache: a new wrapper per traced call, whose checks it traces.
    wrap = make_checked_mod if torch.compiler.is_compiling() else checked_mod
    score_mod = None if score_mod is None else wrap(func, "score_mod", score_mod)
    mask_mod = None if mask_mod is None else wrap(func, "mask_mod", mask_mod)
    unfused = [
        name
        for name, value in (
            ("ALiBi slopes", alibi),
            ("a relative-position bias", relative_bias),
            ("document ids", document_ids),
            ("a prefix", prefix),
            ("a score_mod", score_mod),
            ("a mask_mod", mask_mod),
        )
        if value is not None
    ]
    variant = Variant(
        causal=causal,
        left=left,
        right=right,
        radius=radius,
        heads=int(q.values.shape[1]),
        mask_mod=mask_mod,
        score_mod=score_mod,
    )
    extras = Extras(table, slopes, documents, prefix_t)
    return Parsed(variant, extras, relative, ", ".join(unfused))


def tabulate(func: Func, parsed: Parsed, q: RaggedArray, longest: Any) -> tuple[Variant, Extras]:
    """The variant and tensors with a callable relative bias evaluated on every distance
    ``-(longest - 1) .. longest - 1`` (``longest``: the longest segment, or a bound on it)."""
    if parsed.relative is None:
        return parsed.variant, parsed.extras
    radius = torch.sym_max(longest - 1, 0)
    distances = torch.arange(-radius, radius + 1, device=q.device)
    table = parsed.relative(distances)
    heads = q.values.shape[1]
    if (
        not isinstance(table, Tensor)
        or table.dim() != 2
        or table.shape[1] != heads
        or not table.dtype.is_floating_point
    ):
        got = tuple(table.shape) if isinstance(table, Tensor) else typename(table)
        raise value_error(
            func,
            "relative_bias",
            f"must return a floating tensor [len(distances), H] with H = {heads}",
            got,
        )
    variant = dataclasses.replace(parsed.variant, radius=radius)
    return variant, parsed.extras._replace(table=table.to(q.dtype))
