"""Linear algebra on the values: ``matmul``, ``linear`` and ``einsum``.

Axis rules: ``matmul`` and ``linear`` act on the inner axes only and **keep all** (the result
has the input's partition object). ``einsum`` keeps the partition when its output keeps the
ragged subscript; when the output drops it, the op **consumes** the ragged axis (a contraction
over each segment: a dense ``(B, ...)`` result), and when it drops the batch subscript too, the
contraction runs over all rows (a dense result).

The reference semantics is the same torch op on every segment: ``matmul(x, w)`` is
``torch.matmul(segment, w)`` for each segment of shape ``(L, *inner)``, which on the flat values
is one ``torch.matmul(x.values, w)``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import CONTRACT, remove
from ..._errors import Func, name_of, type_error, typename, value_error
from ..._format import shape_text
from ..._registry import op, refuse
from ..._versions import check_unchanged
from .._pair_layouts import ragged_product, rows_times
from .._pairs import RaggedTranspose, pair_dot

RAGGED_RIGHT = (
    "both operands are RaggedArrays, in layouts that are not a pair-map product: the "
    "per-segment pair map is (B, ..., N*, D) @ (B, ..., D, M*) (q @ k.transpose(-2, -1), "
    "x @ y.mT: ragged.pair_dot) and a pair map applies as (B, ..., N*, M*) @ (B, ..., M*, D) "
    "(att @ v: ragged.pair_matmul); for a contraction over each segment write "
    "ragged.einsum('bld,ble->bde', x, y)."
)


# --- matmul -----------------------------------------------------------------------------------


@op(
    "linalg",
    rule=CONTRACT,
    args="a: operand, b: operand",
    torch=(torch.matmul, torch.Tensor.matmul),
    methods=("matmul",),
    torch_args="input, other",
    checks=True,
)
def matmul(a: Any, b: Any) -> RaggedArray:
    """Matrix product on the inner axes, ``torch.matmul(segment, b)`` for every segment.

    One operand is a RaggedArray ``x`` of shape ``(B, L*, *inner)``, the other a dense tensor
    ``w``. ``x @ w`` (``matmul(x, w)``) is ``torch.matmul(x.values, w)``:

    * ``w`` of shape ``(D, E)``: ``(B, L*, ..., D) -> (B, L*, ..., E)``, each row times ``w``.
    * ``w`` of shape ``(D,)``: contracts the last inner axis, ``(B, L*, ..., D) -> (B, L*, ...)``.
    * ``w`` of shape ``(*batch, D, E)``: its batch axes broadcast against the inner axes of
      ``x`` before the last two, as in ``torch.matmul``; they may not reach the ragged axis.

    ``w @ x`` (``matmul(w, x)``) is ``torch.matmul(w, segment)``, which treats the last two
    inner axes of each row as a matrix, so ``x`` needs at least two inner axes (with one, the
    product would contract the ragged axis; write ``x @ w.mT`` for a row-wise product).

    A weight per segment (``w`` of shape ``(B, D, E)``) is not a ``matmul``: its leading axis
    would line up with an inner axis. Use ``ragged.einsum("bld,bde->ble", x, w)``.

    ``x @ y.mT`` for two RaggedArrays is the per-segment pair map ``x_b @ y_b^T``
    ([`ragged.pair_dot`][ragged.pair_dot]): ``(B, N*, D)`` and ``(B, M*, D)`` give ``(B, N*, M*)``.
    In any layout, ``(B, ..., N*, D) @ (B, ..., D, M*)`` (``q @ k.transpose(-2, -1)`` of
    ``(B, H, L*, Dh)`` arrays) is that pair map, shown as ``(B, ..., N*, M*)``, and a pair map
    applies as ``(B, ..., N*, M*) @ (B, ..., M*, D)`` ([`ragged.pair_matmul`][ragged.pair_matmul]):
    attention written by hand, without padding.

    Axis names: kept (the last inner axis keeps its name); an axis contracted by a 1-D ``w``
    loses its name. Differentiable in both operands.

    Args:
        a: RaggedArray or dense tensor.
        b: dense tensor or RaggedArray (exactly one of ``a``, ``b`` is a RaggedArray).

    Returns:
        A RaggedArray with the partition object of the ragged operand.

    >>> import ragged, torch
    >>> x = ragged.array([[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]])
    >>> (x @ torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])).to_list()
    [[[1.0, 2.0, 3.0]], [[3.0, 4.0, 7.0], [5.0, 6.0, 11.0]]]
    >>> ragged.matmul(x, torch.tensor([1.0, -1.0])).to_list()
    [[-1.0], [-1.0, -1.0]]
    >>> q = x.view(*x.shape[:2], 1, 2).transpose(1, 2)  # (B, H, L*, Dh), one head
    >>> att = q @ q.transpose(-2, -1)  # (B, H, L*, L*): sum_b L_b^2 values per head
    >>> att.shape, att.values.shape
    (RaggedShape(2, 1, [1, 2], [[1], [2, 2]]), torch.Size([5, 1]))
    >>> (att @ q).shape  # (B, H, L*, Dh), the layout of q
    RaggedShape(2, 1, [1, 2], 2)
    """
    func = matmul
    if isinstance(b, RaggedTranspose) and isinstance(a, RaggedArray):
        return pair_dot(a, b.array)
    a_ragged, b_ragged = isinstance(a, RaggedArray), isinstance(b, RaggedArray)
    if a_ragged and b_ragged:
        check_unchanged(func, a, b, ("a", "b"), any_layout=True)
        product = ragged_product(a, b)
        if product is None:
            raise NotImplementedError(f"{name_of(func)}: {RAGGED_RIGHT}")
        return product
    if a_ragged:
        check_unchanged(func, a, None, ("a", "b"), any_layout=True)
        _check_dense(func, "b", b, a)
        if a.order is not None:  # e.g. (B, H, L*, Dh) @ (Dh, E): the rows, in any layout
            return rows_times(func, a, b, _matmul_right)
        return _matmul_right(func, a, b)
    if b_ragged:
        check_unchanged(func, b, None, ("b", "a"))
        _check_dense(func, "a", a, b)
        return _matmul_left(func, a, b)
    raise TypeError(
        f"{name_of(func)}: one operand must be a RaggedArray, got {type(a).__name__} and {type(b).__name__}."
    )


def _check_dense(func: Func, param: str, w: Any, x: RaggedArray) -> None:
    if not isinstance(w, Tensor):
        raise type_error(func, param, "must be a Tensor (the other operand is ragged)", typename(w))
    if w.dim() == 0:
        raise value_error(func, param, "must have at least one axis", "a 0-d tensor")
    if w.dtype != x.dtype:
        raise type_error(
            func, param, f"must have the dtype of the RaggedArray ({x.dtype})", w.dtype
        )


def _check_batch(func: Func, param: str, w: Tensor, x: RaggedArray) -> None:
    """``w``'s batch axes (all but its last two) must fit in ``x``'s inner batch axes."""
    room = max(x.values.dim() - 3, 0)  # inner axes before the two matrix axes
    extra = w.dim() - 2
    if extra <= room:
        return
    raise value_error(
        func,
        param,
        f"must have at most {room} batch axes (they broadcast against the inner axes of "
        f"{shape_text(x)} before its last two and may not reach the ragged axis); for one "
        f"weight per segment use ragged.einsum('bld,bde->ble', x, w)",
        f"shape {tuple(w.shape)}",
    )


def _matmul_right(func: Func, x: RaggedArray, w: Tensor) -> RaggedArray:
    if x.values.dim() < 2:
        raise value_error(func, "a", "must have at least one inner axis to contract", shape_text(x))
    size = x.values.shape[-1]
    axis = 0 if w.dim() == 1 else w.dim() - 2
    if w.shape[axis] != size:
        raise value_error(
            func,
            "b",
            f"must have size {size} on axis {axis} to contract the last inner axis of "
            f"{shape_text(x)}",
            f"shape {tuple(w.shape)}",
        )
    if w.dim() > 2:
        _check_batch(func, "b", w, x)
    out = torch.matmul(x.values, w)
    names = remove(x.axes, [x.ndim - 1]) if w.dim() == 1 else x.axes
    return RaggedArray(out, x.partition, names if _fits(names, x, out) else None)


def _matmul_left(func: Func, w: Tensor, x: RaggedArray) -> RaggedArray:
    if x.values.dim() < 3:
        raise value_error(
            func,
            "b",
            "must have at least two inner axes when `a` is dense (a @ segment contracts the "
            "segment's second-to-last axis, which would be the ragged axis); for a row-wise "
            "product write ragged.matmul(b, a.mT)",
            shape_text(x),
        )
    size = x.values.shape[-2]
    if w.shape[-1] != size:
        raise value_error(
            func,
            "a",
            f"must have size {size} on its last axis to contract the second-to-last inner axis "
            f"of {shape_text(x)}",
            f"shape {tuple(w.shape)}",
        )
    if w.dim() > 2:
        _check_batch(func, "a", w, x)
    out = torch.matmul(w, x.values)
    names = remove(x.axes, [x.ndim - 2]) if w.dim() == 1 else x.axes
    return RaggedArray(out, x.partition, names if _fits(names, x, out) else None)


def _fits(names: tuple[str, ...] | None, x: RaggedArray, out: Tensor) -> bool:
    return names is not None and len(names) == x.ragged_ndim + out.dim()


# --- linear -----------------------------------------------------------------------------------


@op(
    "linalg",
    rule=CONTRACT,
    args="x: ragged, weight: tensor, bias: tensor?",
    torch=(torch.nn.functional.linear,),
    torch_args="input, weight, bias=None",
)
def linear(x: RaggedArray, weight: Tensor, bias: Tensor | None = None) -> RaggedArray:
    """``torch.nn.functional.linear`` on the rows: ``x @ weight.T + bias`` on the last axis.

    Args:
        x: ``(B, L*, ..., in_features)``.
        weight: ``(out_features, in_features)``, or ``(in_features,)`` to contract the last
            axis (its name is dropped).
        bias: ``(out_features,)`` (or a 0-d tensor for a 1-D ``weight``), or ``None``.

    Returns:
        ``(B, L*, ..., out_features)`` with the partition object of ``x``; names kept.

    >>> import ragged, torch
    >>> x = ragged.array([[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]])
    >>> ragged.linear(x, torch.tensor([[1.0, 1.0]]), torch.tensor([0.5])).to_list()
    [[[3.5]], [[7.5], [11.5]]]
    """
    func = linear
    if not isinstance(x, RaggedArray):
        raise type_error(func, "x", "must be a RaggedArray", typename(x))
    if not isinstance(weight, Tensor) or weight.dim() not in (1, 2):
        raise type_error(
            func,
            "weight",
            "must be a 1-D or 2-D Tensor (out_features, in_features)",
            typename(weight),
        )
    if bias is not None and not isinstance(bias, Tensor):
        raise type_error(func, "bias", "must be a Tensor or None", typename(bias))
    if x.values.dim() < 2:
        raise value_error(
            func, "x", "must have at least one inner axis (in_features)", shape_text(x)
        )
    if weight.shape[-1] != x.values.shape[-1]:
        raise value_error(
            func,
            "weight",
            f"must have in_features = {x.values.shape[-1]} (the last axis of {shape_text(x)})",
            f"shape {tuple(weight.shape)}",
        )
    for param, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            expected = (
                f"must have the dtype of `x` ({x.dtype}); cast one of them: x.to({t.dtype}) or "
                f"module.to({x.dtype})"
            )
            raise type_error(func, param, expected, t.dtype)
    out = F.linear(x.values, weight, bias)
    names = remove(x.axes, [x.ndim - 1]) if weight.dim() == 1 else x.axes
    return RaggedArray(out, x.partition, names if _fits(names, x, out) else None)


refuse(
    torch.mm,
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
