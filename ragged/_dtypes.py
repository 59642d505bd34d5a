"""Dtype facts shared by the kernels and the ops."""

from __future__ import annotations

import math

import torch


def lowest(dtype: torch.dtype) -> float | int | bool:
    """The smallest value of ``dtype`` (the identity of max): ``-inf``, the integer minimum, False.

    >>> lowest(torch.float32), lowest(torch.int8), lowest(torch.bool)
    (-inf, -128, False)
    """
    if dtype == torch.bool:
        return False
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


def highest(dtype: torch.dtype) -> float | int | bool:
    """The largest value of ``dtype`` (the identity of min): ``inf``, the integer maximum, True.

    >>> highest(torch.float64), highest(torch.uint8), highest(torch.bool)
    (inf, 255, True)
    """
    if dtype == torch.bool:
        return True
    return math.inf if dtype.is_floating_point else torch.iinfo(dtype).max
