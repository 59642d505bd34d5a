"""Uniform error construction: every message names the function and the parameter.

Messages read ``"<function>: `<param>` <expected>, got <got>."`` so that users see at once which
call and which argument failed, what was expected and what arrived.
"""

from __future__ import annotations

from typing import Any


def _message(func: str, param: str, expected: str, got: Any) -> str:
    return f"{func}: `{param}` {expected}, got {got}."


def type_error(func: str, param: str, expected: str, got: Any) -> TypeError:
    """Build (not raise) a `TypeError` with the house message format.

    >>> type_error("ragged.f", "x", "must be a Tensor", "int")
    TypeError('ragged.f: `x` must be a Tensor, got int.')
    """
    return TypeError(_message(func, param, expected, got))


def value_error(func: str, param: str, expected: str, got: Any) -> ValueError:
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
