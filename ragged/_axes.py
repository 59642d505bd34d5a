"""Axis names, axis arguments and the axis-name rules of the ops.

A RaggedArray of logical shape ``(B, L*, *inner)`` is either fully named (one unique string per
axis) or unnamed (``axes is None``). Every op that takes ``axis=`` accepts an int (negative ints
count from the end) or a name. Every op declares (in the registry) one rule of the closed set
at the end of this module, which says how the names of its result follow from its inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ._errors import Func, name_of, type_error, value_error

if TYPE_CHECKING:
    from ._array import RaggedArray

AxisNames = tuple[str, ...]


def check_names(func: Func, axes: object, ndim: int, param: str = "axes") -> AxisNames | None:
    """Validate axis names for an array with ``ndim`` axes; return them as a tuple.

    >>> check_names("ragged.array", ["batch", "seq", "feat"], 3)
    ('batch', 'seq', 'feat')
    >>> check_names("ragged.array", None, 3) is None
    True
    >>> check_names("ragged.array", ["a", "a", "b"], 3)
    Traceback (most recent call last):
    ValueError: ragged.array: `axes` must be unique names, got ['a', 'a', 'b'].
    """
    if axes is None:
        return None
    if isinstance(axes, str) or not isinstance(axes, Sequence):
        raise type_error(func, param, f"must be a sequence of {ndim} str or None", repr(axes))
    names = tuple(axes)
    if not all(isinstance(name, str) for name in names):
        raise type_error(func, param, "must contain only str", repr(list(names)))
    if len(names) != ndim:
        raise value_error(
            func, param, f"must name all {ndim} axes", f"{len(names)} names {list(names)}"
        )
    if len(set(names)) != len(names):
        raise value_error(func, param, "must be unique names", repr(list(names)))
    return names


def normalize_axis(func: Func, x: RaggedArray, axis: int | str, param: str = "axis") -> int:
    """Turn an int or a name into a non-negative axis index of ``x``.

    >>> import ragged
    >>> x = ragged.array([[[1.0, 2.0]], []], axes=("batch", "seq", "feat"))
    >>> normalize_axis("ragged.sum", x, "seq"), normalize_axis("ragged.sum", x, -1)
    (1, 2)
    >>> normalize_axis("ragged.sum", x, "time")
    Traceback (most recent call last):
    ValueError: ragged.sum: `axis` must be one of ('batch', 'seq', 'feat'), got 'time'.
    """
    ndim = x.ndim
    if isinstance(axis, str):
        if x.axes is None:
            raise value_error(func, param, "can be a name only for a named array", repr(axis))
        if axis not in x.axes:
            raise value_error(func, param, f"must be one of {x.axes}", repr(axis))
        return x.axes.index(axis)
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise type_error(func, param, "must be an int or an axis name", type(axis).__name__)
    if not -ndim <= axis < ndim:
        raise value_error(func, param, f"must be in [{-ndim}, {ndim})", axis)
    return axis % ndim


def transformed(
    func: Func, names: AxisNames | None, ndim: int, out_ndim: int, axes: Any = "keep"
) -> AxisNames | None:
    """The names of a RaggedArray that a user function returned (``ragged.map``, ``ragged.vmap``).

    ``axes="keep"`` (the default) keeps the input's names when the number of axes is unchanged;
    a named input whose number of axes changed is an error that asks for ``axes=`` (names are
    never dropped silently). Otherwise ``axes`` names the result (``None``: unnamed).

    >>> transformed("ragged.map", ("b", "l", "d"), 3, 3)
    ('b', 'l', 'd')
    >>> transformed("ragged.map", ("b", "l", "d"), 3, 2, axes=("b", "l"))
    ('b', 'l')
    >>> transformed("ragged.map", ("b", "l", "d"), 3, 2)
    Traceback (most recent call last):
    ValueError: ragged.map: `f` changed the number of axes of the named array ('b', 'l', 'd') (3 -> 2); pass `axes=` with the 2 names of the result, or axes=None to drop the names.
    """
    if not (isinstance(axes, str) and axes == "keep"):
        return check_names(func, axes, out_ndim)
    if out_ndim == ndim or names is None:
        return names if out_ndim == ndim else None
    raise ValueError(
        f"{name_of(func)}: `f` changed the number of axes of the named array {names} "
        f"({ndim} -> {out_ndim}); pass `axes=` with the {out_ndim} names of the result, or "
        "axes=None to drop the names."
    )


# --- axis-name rules --------------------------------------------------------------------------
#
# How an op names the axes of its result: a closed set of small functions, each used by the ops
# that follow it and checked by the op table (``tests/test_optable.py`` evaluates every op's
# declared rule on named inputs and compares the names of the result). ``None`` names stay
# ``None``: names are all or nothing, and an op never invents names for an unnamed input.


def keep(names: AxisNames | None) -> AxisNames | None:
    """**Keep all**: the result has its input's axes (elementwise, softmax, scans, sort, ...).

    >>> keep(("batch", "seq", "feat"))
    ('batch', 'seq', 'feat')
    """
    return names


def remove(names: AxisNames | None, axes: Iterable[int], *, keepdims: bool = False) -> Any:
    """**Remove the reduced axes** (reductions): the names of the axes not in ``axes``.

    With ``keepdims`` every axis stays (as size 1) and keeps its name.

    >>> remove(("batch", "seq", "feat"), [2])
    ('batch', 'seq')
    >>> remove(("batch", "seq", "feat"), [2], keepdims=True)
    ('batch', 'seq', 'feat')
    >>> remove(None, [1]) is None
    True
    """
    if names is None or keepdims:
        return names
    dropped = set(axes)
    return tuple(n for i, n in enumerate(names) if i not in dropped)


def insert(names: AxisNames | None, position: int, name: str | None) -> AxisNames | None:
    """**Add one** axis named ``name`` at ``position`` (``stack``, a pair map's new ragged axis).

    A named input needs a name for the new axis; an unnamed input stays unnamed.

    >>> insert(("batch", "seq"), 2, "feat")
    ('batch', 'seq', 'feat')
    >>> insert(("batch", "i", "feat"), 2, "j")
    ('batch', 'i', 'j', 'feat')
    >>> insert(None, 1, "x") is None
    True
    """
    if names is None:
        return None
    if name is None:
        raise ValueError(f"a named array {names} needs a name for its new axis {position}")
    return (*names[:position], name, *names[position:])


def swap(names: AxisNames | None, a: int, b: int) -> AxisNames | None:
    """**Swap** two axes (``transpose`` of a pair map's ragged axes).

    >>> swap(("batch", "i", "j", "feat"), 1, 2)
    ('batch', 'j', 'i', 'feat')
    """
    if names is None:
        return None
    out = list(names)
    out[a], out[b] = out[b], out[a]
    return tuple(out)


def unify(a: AxisNames | None, b: AxisNames | None, ragged_ndim: tuple[int, int]) -> Any:
    """**Unify** the names of two operands that line up by name (elementwise, concat).

    Group by group (the batch axis, the ragged axes, the inner axes), the result lists the first
    operand's names, then the second operand's new ones: a new ragged name makes a pair map
    ``(B, i*, j*, ...)``. An unnamed operand takes the other's names (positional alignment).

    >>> unify(("b", "seq", "feat"), ("b", "seq", "head"), (1, 1))
    ('b', 'seq', 'feat', 'head')
    >>> unify(("b", "i", "feat"), ("b", "j", "feat"), (1, 1))
    ('b', 'i', 'j', 'feat')
    >>> unify(None, ("b", "seq"), (1, 1))
    ('b', 'seq')
    """
    if a is None or b is None or a == b:  # equal names: a keepdims result, say
        return a if a is not None else b
    na, nb = ragged_ndim
    ragged = a[1 : 1 + na] + tuple(n for n in b[1 : 1 + nb] if n not in a[1 : 1 + na])
    inner = a[1 + na :] + tuple(n for n in b[1 + nb :] if n not in a[1 + na :])
    return (a[0], *ragged, *inner)


def subscripts(operands: Sequence[tuple[str, AxisNames | None]], output: str) -> Any:
    """**By subscript** (einsum): each output letter takes the name its axis has in an input.

    ``None`` when the output has ``...``, a letter no named input names, or a repeated name.

    >>> subscripts([("bld", ("batch", "seq", "feat")), ("de", None)], "ble")
    >>> subscripts([("bld", ("batch", "seq", "feat")), ("de", None)], "bl")
    ('batch', 'seq')
    """
    if "..." in output:
        return None
    by_letter: dict[str, str] = {}
    for letters, names in operands:
        if names is None:
            continue
        head, _, tail = letters.partition("...")
        for pos, c in enumerate(head):
            by_letter.setdefault(c, names[pos])
        for pos, c in enumerate(tail):
            by_letter.setdefault(c, names[len(names) - len(tail) + pos])
    out = tuple(by_letter.get(c, "") for c in output)
    if "" in out or len(set(out)) != len(out):
        return None
    return out


class Dense:
    """The result is a dense tensor: every ragged axis was consumed (dense results are unnamed)."""

    def __repr__(self) -> str:
        return "DENSE"


DENSE = Dense()


@dataclasses.dataclass(frozen=True)
class AxisRule:
    """An op's axis rule, as declared in the registry: one of the closed set below.

    ``expected`` computes the names of an op's result from its arguments with the primitives
    above (the op-table test checks every op's result against it); ``summary`` is the text of
    the support matrix.

    Attributes:
        kind: which of the rules below.
        summary: one line for the docs.
    """

    kind: str
    summary: str

    def expected(self, arrays: Sequence[Any], call: dict[str, Any]) -> Any:
        """The names of the result of a call, or ``DENSE`` for a dense result.

        Args:
            arrays: the call's RaggedArray arguments, in order.
            call: the call's arguments by parameter name (defaults included).

        >>> import ragged
        >>> x = ragged.array([[[1.0]], [[2.0], [3.0]]], axes=("batch", "seq", "feat"))
        >>> REDUCE.expected([x], {"x": x, "axis": "feat", "keepdims": False})
        ('batch', 'seq')
        >>> REDUCE.expected([x], {"x": x, "axis": 1, "keepdims": False})
        DENSE
        """
        kind = self.kind
        first = arrays[0]
        if kind == "dense":
            if first.ragged_ndim > 1 and "axis" in call:  # one ragged axis of several goes
                return remove(first.axes, [normalize_axis("AxisRule", first, call["axis"])])
            return DENSE
        names = first.axes
        if kind in ("keep", "new"):
            return keep(names)
        if kind == "unify":
            for other in arrays[1:]:
                names = unify(names, other.axes, (first.ragged_ndim, other.ragged_ndim))
            return names
        if kind == "remove":
            axis, keepdims = call.get("axis"), bool(call.get("keepdims"))
            items = range(first.ndim) if axis is None else _axis_list(first, axis)
            ragged = {a for a in items if 1 <= a <= first.ragged_ndim}
            if len(ragged) == first.ragged_ndim or (ragged and keepdims and first.ragged_ndim == 1):
                return DENSE
            return remove(names, items, keepdims=keepdims)
        if kind == "take":
            axis = normalize_axis("take", first, call.get("axis", 1))
            index = call["indices"]
            if axis <= first.ragged_ndim:
                if index is arrays[-1] and index is not first:
                    return names
                if first.ragged_ndim == 1:
                    return DENSE
                return remove(names, [axis]) if index.dim() == 1 else names
            return remove(names, [axis]) if index.dim() == 0 else names
        if kind == "rows":
            axis = call.get("axis")
            last = first.ragged_ndim if axis is None else normalize_axis("rows", first, axis)
            return None if names is None else names[: 1 + last]
        if kind == "merge":
            axis = normalize_axis("flatten", first, call.get("axis", 1))
            return DENSE if axis == 0 and first.ragged_ndim == 1 else remove(names, [axis])
        if kind == "index":
            return _indexed(first, call["index"])
        if kind == "insert":
            axis = call["axis"]
            position = first.axes.index(axis) if isinstance(axis, str) else axis % (first.ndim + 1)
            return insert(names, position, call.get("name"))
        nr = first.ragged_ndim  # pair ops work on the innermost ragged axes
        if kind == "swap":
            return swap(names, nr - 1, nr)
        other = arrays[1] if len(arrays) > 1 else None
        if kind in ("outer", "pair_dot"):
            assert other is not None
            if names is None or other.axes is None or names[nr] == other.axes[nr]:
                return None
            if kind == "pair_dot":
                if first.values.dim() != other.values.dim():
                    return None
                names = names[:-1]
            return insert(names, nr + 1, other.axes[nr])
        if kind == "pair_matmul":
            assert other is not None
            if names is None or other.axes is None:
                return None
            out = (*names[:nr], *other.axes[1 + other.ragged_ndim :])
            return out if len(set(out)) == len(out) else None
        if kind == "contract":
            dense = next(v for k, v in call.items() if k in ("a", "b", "weight") and v is not first)
            if getattr(dense, "dim", lambda: 2)() == 1:
                names = (
                    None
                    if names is None
                    else remove(names, [first.ndim - (2 if dense is call.get("a") else 1)])
                )
            return names
        if kind == "subscripts":
            letters, _, output = call["equation"].replace(" ", "").partition("->")
            inputs = [
                (term, getattr(operand, "axes", None))
                for term, operand in zip(letters.split(","), call["operands"], strict=False)
            ]
            return subscripts(inputs, output)
        raise ValueError(f"no expectation for the rule {kind!r}")


def _indexed(x: Any, index: Any) -> Any:
    """The names of ``x[index]``: an int removes its axis (on the batch or a ragged axis: a dense
    result for one ragged axis), a slice or a 1-D index keeps it, ``...`` stands for full slices.
    """
    items = list(index) if isinstance(index, tuple) else [index]
    if len(items) == 1 and getattr(items[0], "partition", None) is not None:
        items = [slice(None)] * max(items[0].ragged_ndim, 1) + items  # x[ragged]: its own axis
    if any(item is Ellipsis for item in items):
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (x.ndim - len(items) + 1)
    items += [slice(None)] * (x.ndim - len(items))
    lead = items[: 1 + x.ragged_ndim]
    if x.ragged_ndim > 1 and _is_scalar_index(lead[0]):  # x[b, ...]: segment b, then the rest
        names = None if x.axes is None else x.axes[1:]
        segment = _Shape(names, x.ragged_ndim - 1, x.ndim - 1)
        return _indexed(segment, tuple(items[1:])) if len(items) > 1 else names
    if x.ragged_ndim > 1:
        dropped = [d for d, item in enumerate(items) if _is_scalar_index(item)]
        if len([d for d in dropped if 1 <= d <= x.ragged_ndim]) == x.ragged_ndim:
            return DENSE
        return remove(x.axes, dropped)
    if any(_is_scalar_index(item) for item in lead) or any(
        getattr(item, "partition", None) is None and getattr(item, "dim", lambda: 1)() > 1
        for item in lead[1:]
    ):
        return DENSE
    if any(getattr(item, "partition", None) is None and hasattr(item, "dim") for item in lead[1:]):
        return DENSE  # a dense index on the ragged axis: the same positions in every segment
    dropped = [d for d, item in enumerate(items) if _is_scalar_index(item)]
    return remove(x.axes, dropped)


@dataclasses.dataclass
class _Shape:
    """What ``_indexed`` reads of an array: its names and numbers of axes."""

    axes: AxisNames | None
    ragged_ndim: int
    ndim: int


def _is_scalar_index(item: Any) -> bool:
    return isinstance(item, int) or (hasattr(item, "dim") and item.dim() == 0)


def _axis_list(x: Any, axis: Any) -> list[int]:
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    return [normalize_axis("AxisRule.expected", x, a) for a in items]


# The closed set of rules (the registry's ``rule=``).
KEEP = AxisRule("keep", "keep all")
NEW = AxisRule("new", "keep all names (a new partition: other lengths)")
UNIFY = AxisRule("unify", "unify (operands line up by name or position)")
REDUCE = AxisRule("remove", "remove the reduced axes (all ragged axes: a dense result)")
DENSE_RESULT = AxisRule("dense", "remove the ragged axis (a dense result for one ragged axis)")
TAKE = AxisRule(
    "take",
    "new partition (the indices'); dense indices give a dense result (one ragged axis) or "
    "remove the axis (0-D per row)",
)
STACK = AxisRule("insert", "add one (a new inner axis, named by `name`)")
OUTER = AxisRule("outer", "add one (the second operand's ragged axis: a pair map)")
PAIR_DOT = AxisRule("pair_dot", "add one (a pair map), remove the contracted inner axis")
PAIR_MATMUL = AxisRule("pair_matmul", "remove one (the pair map's second ragged axis)")
TRANSPOSE = AxisRule("swap", "swap the two ragged axes")
CONTRACT = AxisRule("contract", "keep all (a 1-D operand removes the axis it contracts)")
SUBSCRIPTS = AxisRule("subscripts", "by subscript (the output's letters name its axes)")
ROWS = AxisRule("rows", "keep the axes down to `axis` (one entry per row of that axis)")
FLATTEN = AxisRule("merge", "merge `axis` into the next axis (the merged axis keeps its name)")
INDEX = AxisRule("index", "an integer index removes its axis; slices and 1-D indices keep it")
