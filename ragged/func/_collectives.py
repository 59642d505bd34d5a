"""Collectives across the segments mapped by a named ``ragged.vmap``: psum, pmean, pmax, pmin.

Inside ``ragged.vmap(f, axis_name="seg")``, ``ragged.psum(v, "seg")`` returns the sum of ``v``
over all segments (the same value in every segment), like ``jax.lax.psum`` under
``jax.vmap(axis_name=...)``.

How it works without private functorch APIs: ``ragged.vmap`` runs ``f`` over its length
buckets in passes. In pass ``j`` the first ``j`` collectives already know their results (from
earlier passes) and the rest return a placeholder; every collective's argument is returned from
``f`` as an extra (batched) output, so after the pass the arguments of collective ``j`` are
known for every segment and reduced across all buckets. ``k`` collectives need ``k + 1`` passes.
The results are ordinary differentiable tensors, so autograd, ``torch.func`` transforms and
``torch.compile`` see a plain computation. ``f`` must be deterministic and call the collectives
in the same order in every pass.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

import torch
from torch import Tensor

from .._errors import Func, value_error
from .._registry import public


@dataclasses.dataclass
class CollectivePass:
    """The collectives' state during one pass of a named ``ragged.vmap``."""

    axis_name: str
    known: list[Tensor]  # results of the collectives resolved in earlier passes
    recorded: list[Tensor] = dataclasses.field(default_factory=list)  # arguments seen this pass
    kinds: list[str] = dataclasses.field(default_factory=list)


_ACTIVE: contextvars.ContextVar[tuple[CollectivePass, ...]] = contextvars.ContextVar(
    "ragged_collectives", default=()
)


@contextlib.contextmanager
def collective_pass(state: CollectivePass) -> Iterator[CollectivePass]:
    """Make ``state`` the innermost active pass while ``f`` runs."""
    token = _ACTIVE.set((*_ACTIVE.get(), state))
    try:
        yield state
    finally:
        _ACTIVE.reset(token)


def _collective(func: Func, kind: str, x: Tensor, axis_name: str) -> Tensor:
    for state in reversed(_ACTIVE.get()):
        if state.axis_name == axis_name:
            break
    else:
        raise value_error(
            func,
            "axis_name",
            "must name an enclosing ragged.vmap(..., axis_name=...)",
            repr(axis_name),
        )
    index = len(state.recorded)
    state.recorded.append(x)
    state.kinds.append(kind)
    if index < len(state.known):
        return state.known[index]
    return torch.ones_like(x)  # placeholder: this pass's outputs are discarded


def combine(kind: str, stacked: Tensor, num_segments: int) -> Tensor:
    """Reduce a collective's per-segment arguments ``[B, ...]`` to its result."""
    if kind == "sum":
        return stacked.sum(0)
    if kind == "mean":
        return stacked.sum(0) / max(num_segments, 1)
    if kind == "max":
        return stacked.amax(0)
    return stacked.amin(0)


@public("transforms")
def psum(x: Tensor, axis_name: str) -> Tensor:
    """Sum of ``x`` over all segments of the enclosing ``ragged.vmap(..., axis_name=axis_name)``.

    >>> import ragged, torch
    >>> x = ragged.array([[1.0, 2.0], [3.0], [4.0, 5.0]])
    >>> share = ragged.vmap(lambda s: s.sum() / ragged.psum(s.sum(), "seg"), axis_name="seg")
    >>> share(x)
    tensor([0.2000, 0.2000, 0.6000])
    """
    return _collective(psum, "sum", x, axis_name)


@public("transforms")
def pmean(x: Tensor, axis_name: str) -> Tensor:
    """Mean of ``x`` over all segments of the enclosing named ``ragged.vmap``.

    >>> import ragged, torch
    >>> x = ragged.array([[1.0, 2.0], [3.0], [4.0, 5.0]])
    >>> ragged.vmap(lambda s: s.sum() - ragged.pmean(s.sum(), "seg"), axis_name="seg")(x)
    tensor([-2., -2.,  4.])
    """
    return _collective(pmean, "mean", x, axis_name)


@public("transforms")
def pmax(x: Tensor, axis_name: str) -> Tensor:
    """Elementwise maximum of ``x`` over all segments of the enclosing named ``ragged.vmap``.

    >>> import ragged, torch
    >>> x = ragged.array([[1.0, 2.0], [3.0], [4.0, 5.0]])
    >>> ragged.vmap(lambda s: ragged.pmax(s.max(), "seg") - s.max(), axis_name="seg")(x)
    tensor([3., 2., 0.])
    """
    return _collective(pmax, "max", x, axis_name)


@public("transforms")
def pmin(x: Tensor, axis_name: str) -> Tensor:
    """Elementwise minimum of ``x`` over all segments of the enclosing named ``ragged.vmap``.

    >>> import ragged, torch
    >>> x = ragged.array([[1.0, 2.0], [3.0], [4.0, 5.0]])
    >>> ragged.vmap(lambda s: s.min() - ragged.pmin(s.min(), "seg"), axis_name="seg")(x)
    tensor([0., 2., 3.])
    """
    return _collective(pmin, "min", x, axis_name)
