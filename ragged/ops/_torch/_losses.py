"""torch's elementwise losses (``F.mse_loss``, ``F.l1_loss``, ...) on RaggedArrays: over every
entry, input and target lined up as for ``ragged.add``; ``reduction='none'`` keeps the array."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F

from ..._array import RaggedArray
from ..._broadcast import align
from ..._registry import torch_function

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
