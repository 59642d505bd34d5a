"""Uniform error construction: every message names the function and the parameter.

Messages read ``"<function>: `<param>` <expected>, got <got>."`` so that users see at once which
call and which argument failed, what was expected and what arrived. ``<function>`` is the public
name of the op or function that failed: callers pass the function object itself (``sum``,
``RaggedArray.with_values``) and ``name_of`` reads the name it was declared under in
``ragged._registry``, so no message carries a hand-typed name.
"""

from __future__ import annotations

from typing import Any

Func = Any  # a public function or method (or, for internal helpers, its name as a string)


def name_of(func: Func) -> str:
    """The name to show for ``func`` in error messages.

    >>> import ragged
    >>> name_of(ragged.sum), name_of(ragged.RaggedArray.with_values), name_of("ragged.f")
    ('ragged.sum', 'RaggedArray.with_values', 'ragged.f')
    """
    if isinstance(func, str):
        return func
    return str(getattr(func, "__ragged_name__", None) or getattr(func, "__qualname__", repr(func)))


def _message(func: Func, param: str, expected: str, got: Any) -> str:
    return f"{name_of(func)}: `{param}` {expected}, got {got}."


def type_error(func: Func, param: str, expected: str, got: Any) -> TypeError:
    """Build (not raise) a `TypeError` with the house message format.

    >>> type_error("ragged.f", "x", "must be a Tensor", "int")
    TypeError('ragged.f: `x` must be a Tensor, got int.')
    """
    return TypeError(_message(func, param, expected, got))


def value_error(func: Func, param: str, expected: str, got: Any) -> ValueError:
    """Build (not raise) a `ValueError` with the house message format.

    >>> value_error("ragged.f", "axis", "must be in [0, 3)", 5)
    ValueError('ragged.f: `axis` must be in [0, 3), got 5.')
    """
    return ValueError(_message(func, param, expected, got))


def typename(obj: Any) -> str:
    """A short description of what arrived, for error messages.

    >>> import torch
    >>> typename(torch.zeros(2, 3, dtype=torch.int32))
    'Tensor(shape=(2, 3), dtype=torch.int32)'
    >>> typename([1, 2])
    'list'
    """
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.is_nested:  # a strided nested tensor has no shape to show
            return f"nested Tensor(layout={obj.layout}, dtype={obj.dtype})"
        return f"Tensor(shape={tuple(obj.shape)}, dtype={obj.dtype})"
    return type(obj).__name__
