"""Static types of the reductions: the axis decides between a Tensor and a RaggedArray.

Reducing everything (``axis=None``) gives a dense Tensor, and so does reducing the ragged axis
of an array with one ragged axis (``axis=1``, the common case; for an array with two ragged
axes it leaves a RaggedArray, which these types do not see). Reducing an inner axis keeps the
RaggedArray, and an axis given as another int, a name or a tuple may give either. The
decorators below only tell type checkers so (``typing.cast``): at runtime they return the
function itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, cast, overload

from torch import Tensor

from ..._array import RaggedArray

__all__ = [
    "ArgReduction",
    "Moment",
    "Norm",
    "Reduction",
    "arg_reduction",
    "moment",
    "norm",
    "reduction",
]

AnyAxis = int | str | Sequence[int | str]


class Reduction(Protocol):
    """``sum``, ``mean``, ``amax``, ``logsumexp``, ``any``, ...: ``(x, axis=None, *, keepdims,
    fill_value)``."""

    @overload
    def __call__(
        self, x: RaggedArray, axis: None = None, *, keepdims: bool = ..., fill_value: Any = ...
    ) -> Tensor: ...
    @overload
    def __call__(
        self, x: RaggedArray, axis: Literal[1], *, keepdims: bool = ..., fill_value: Any = ...
    ) -> Tensor: ...
    @overload
    def __call__(
        self, x: RaggedArray, axis: AnyAxis, *, keepdims: bool = ..., fill_value: Any = ...
    ) -> Tensor | RaggedArray: ...


class Moment(Protocol):
    """``var`` and ``std``: a reduction with ``correction``."""

    @overload
    def __call__(
        self,
        x: RaggedArray,
        axis: None = None,
        *,
        correction: int | float = ...,
        keepdims: bool = ...,
        fill_value: Any = ...,
    ) -> Tensor: ...
    @overload
    def __call__(
        self,
        x: RaggedArray,
        axis: Literal[1],
        *,
        correction: int | float = ...,
        keepdims: bool = ...,
        fill_value: Any = ...,
    ) -> Tensor: ...
    @overload
    def __call__(
        self,
        x: RaggedArray,
        axis: AnyAxis,
        *,
        correction: int | float = ...,
        keepdims: bool = ...,
        fill_value: Any = ...,
    ) -> Tensor | RaggedArray: ...


class Norm(Protocol):
    """``norm``: ``(x, ord=2, axis=None, *, keepdims, fill_value)``."""

    @overload
    def __call__(
        self,
        x: RaggedArray,
        ord: float = ...,
        axis: None = None,
        *,
        keepdims: bool = ...,
        fill_value: Any = ...,
    ) -> Tensor: ...
    @overload
    def __call__(
        self,
        x: RaggedArray,
        ord: float = ...,
        *,
        axis: Literal[1],
        keepdims: bool = ...,
        fill_value: Any = ...,
    ) -> Tensor: ...
    @overload
    def __call__(
        self,
        x: RaggedArray,
        ord: float,
        axis: Literal[1],
        *,
        keepdims: bool = ...,
        fill_value: Any = ...,
    ) -> Tensor: ...
    @overload
    def __call__(
        self,
        x: RaggedArray,
        ord: float = ...,
        axis: AnyAxis | None = ...,
        *,
        keepdims: bool = ...,
        fill_value: Any = ...,
    ) -> Tensor | RaggedArray: ...


class ArgReduction(Protocol):
    """``argmax`` and ``argmin``: one axis; ``None`` gives a flat index (a Tensor)."""

    @overload
    def __call__(
        self, x: RaggedArray, axis: None = None, *, keepdims: bool = ..., fill_value: Any = ...
    ) -> Tensor: ...
    @overload
    def __call__(
        self, x: RaggedArray, axis: Literal[1], *, keepdims: bool = ..., fill_value: Any = ...
    ) -> Tensor: ...
    @overload
    def __call__(
        self, x: RaggedArray, axis: int | str, *, keepdims: bool = ..., fill_value: Any = ...
    ) -> Tensor | RaggedArray: ...


def reduction(fn: Callable[..., Any]) -> Reduction:
    """Type ``fn`` as a ``Reduction`` (it returns ``fn`` itself)."""
    return cast(Reduction, fn)


def moment(fn: Callable[..., Any]) -> Moment:
    """Type ``fn`` as a ``Moment`` (it returns ``fn`` itself)."""
    return cast(Moment, fn)


def norm(fn: Callable[..., Any]) -> Norm:
    """Type ``fn`` as a ``Norm`` (it returns ``fn`` itself)."""
    return cast(Norm, fn)


def arg_reduction(fn: Callable[..., Any]) -> ArgReduction:
    """Type ``fn`` as an ``ArgReduction`` (it returns ``fn`` itself)."""
    return cast(ArgReduction, fn)
