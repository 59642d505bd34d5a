"""``ragged.export``: ``torch.export`` a model that takes and returns RaggedArrays.

``torch.export`` flattens inputs with the pytree registry, where a RaggedArray's offsets live in
the (identity-compared) context: exporting it directly would bake one batch's offsets into the
program as constants. ``ragged.export`` instead exports a wrapper whose graph inputs are each
RaggedArray's ``values`` and ``offsets`` (both with dynamic sizes), rebuilds the RaggedArrays
inside the graph, and returns outputs the same way. The result runs on batches of any size and
can be saved and loaded with ``torch.export.save``/``load`` (the ragged calling convention is
stored next to the program).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from .._array import RaggedArray
from .._errors import type_error
from .._partition import Partition, RowPartition
from .._pytree import is_ragged_leaf
from .._registry import public
from ._compile import dynamic_shapes

_SPEC_FILE = "ragged_calling_convention.json"


def _rebuild(values: Tensor, offsets: list[Tensor], axes: list[str] | None) -> RaggedArray:
    """A RaggedArray from its values and the offsets of every level (outermost first)."""
    totals = [o.shape[0] - 1 for o in offsets[1:]] + [values.shape[0]]
    levels = tuple(RowPartition.from_offsets(o, t) for o, t in zip(offsets, totals, strict=True))
    return RaggedArray(values, Partition(levels), tuple(axes) if axes else None)


def _to_tensors(tree: Any) -> tuple[list[Tensor | Any], list[Any]]:
    """Flatten a pytree with RaggedArrays as their values and the offsets of every level;
    record names and numbers of levels per leaf."""
    leaves, _ = pytree.tree_flatten(tree, is_leaf=is_ragged_leaf)
    flat: list[Any] = []
    kinds: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, RaggedArray):
            flat += [leaf.values, *(level.offsets for level in leaf.partition.levels)]
            kinds.append(
                {
                    "ragged": True,
                    "axes": list(leaf.axes) if leaf.axes else None,
                    "levels": leaf.ragged_ndim,
                }
            )
        else:
            flat.append(leaf)
            kinds.append({"ragged": False})
    return flat, kinds


def _from_tensors(flat: list[Any], kinds: list[Any]) -> list[Any]:
    it = iter(flat)
    out = []
    for kind in kinds:
        if kind["ragged"]:
            values = next(it)
            offsets = [next(it) for _ in range(kind.get("levels", 1))]
            out.append(_rebuild(values, offsets, kind["axes"]))
        else:
            out.append(next(it))
    return out


class _Flat(torch.nn.Module):
    """The module torch.export sees: plain tensors in and out."""

    def __init__(self, model: Callable[..., Any], in_spec: Any, in_kinds: list[Any]) -> None:
        super().__init__()
        self.model = model
        self.in_spec, self.in_kinds = in_spec, in_kinds

    def forward(self, *flat: Any) -> Any:
        args = pytree.tree_unflatten(_from_tensors(list(flat), self.in_kinds), self.in_spec)
        leaves = pytree.tree_leaves(self.model(*args), is_leaf=is_ragged_leaf)
        return tuple(_to_tensors(leaves)[0])


@public("transforms")
@dataclasses.dataclass
class RaggedExportedProgram:
    """An exported program with the ragged calling convention around it.

    Attributes:
        program: the ``torch.export.ExportedProgram`` over plain tensors.
    """

    program: torch.export.ExportedProgram
    in_spec: Any
    in_kinds: list[Any]
    out_spec: Any
    out_kinds: list[Any]

    def __call__(self, *args: Any) -> Any:
        """Run on RaggedArrays (and other arguments) of any batch size."""
        leaves, spec = pytree.tree_flatten(args, is_leaf=is_ragged_leaf)
        flat, kinds = _to_tensors(leaves)
        same_kinds = [(k["ragged"], k.get("levels")) for k in kinds] == [
            (k["ragged"], k.get("levels")) for k in self.in_kinds
        ]
        if spec != self.in_spec or not same_kinds:
            raise TypeError("RaggedExportedProgram: arguments differ from the exported ones.")
        outputs = self.program.module()(*flat)
        return pytree.tree_unflatten(_from_tensors(list(outputs), self.out_kinds), self.out_spec)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save with ``torch.export.save``; load with [`ragged.load_exported`][ragged.load_exported]."""
        convention = {
            "in_spec": pytree.treespec_dumps(self.in_spec),
            "in_kinds": self.in_kinds,
            "out_spec": pytree.treespec_dumps(self.out_spec),
            "out_kinds": self.out_kinds,
        }
        torch.export.save(self.program, path, extra_files={_SPEC_FILE: json.dumps(convention)})


@public("transforms")
def export(model: Callable[..., Any], args: tuple[Any, ...]) -> RaggedExportedProgram:
    """Export ``model`` for RaggedArray inputs of any batch size, total and maximum length.

    Every RaggedArray argument becomes graph inputs with dynamic sizes: its values and the
    offsets of each ragged level (two for ``(B, L*, ...)``, three for ``(B, S*, T*, ...)``); the
    model is traced under [`ragged.dynamic_shapes`][ragged.dynamic_shapes] (no 0/1
    specialisation). RaggedArrays in the output come back rebuilt from their values and
    offsets. Ops in the model must not need a host-side maximum length unless the model passes
    one explicitly (partitions rebuilt in the graph do not know it).

    Args:
        model: an ``nn.Module`` or function of RaggedArrays and tensors.
        args: example arguments (a tuple).

    Returns:
        A [`RaggedExportedProgram`][ragged.RaggedExportedProgram], callable on RaggedArrays, savable.

    >>> import ragged, torch
    >>> model = torch.nn.Linear(4, 2)
    >>> program = ragged.export(lambda x: ragged.sum(ragged.map(model, x), axis=1),
    ...                         (ragged.from_lengths(torch.randn(7, 4), [3, 4]),))
    >>> x = ragged.from_lengths(torch.randn(9, 4), [1, 0, 8])
    >>> torch.allclose(program(x), ragged.sum(ragged.map(model, x), axis=1), atol=1e-6)
    True
    """
    if not isinstance(args, tuple):
        raise type_error(
            export, "args", "must be a tuple of example arguments", type(args).__name__
        )
    leaves, in_spec = pytree.tree_flatten(args, is_leaf=is_ragged_leaf)
    flat, in_kinds = _to_tensors(leaves)
    wrapper = _Flat(model, in_spec, in_kinds)
    # The output convention comes from one eager call (tracing must not mutate the wrapper).
    out_leaves, out_spec = pytree.tree_flatten(model(*args), is_leaf=is_ragged_leaf)
    out_kinds = _to_tensors(out_leaves)[1]
    dims: list[Any] = []
    for kind in in_kinds:
        if kind["ragged"]:
            dims += [{0: torch.export.Dim.AUTO}] * (1 + kind["levels"])
        else:
            dims.append(None)
    with dynamic_shapes():
        program = torch.export.export(wrapper, tuple(flat), dynamic_shapes={"flat": tuple(dims)})
    return RaggedExportedProgram(program, in_spec, in_kinds, out_spec, out_kinds)


@public("transforms")
def load_exported(path: str | os.PathLike[str]) -> RaggedExportedProgram:
    """Load a program saved with [`RaggedExportedProgram.save`][ragged.RaggedExportedProgram.save].

    >>> import io, ragged, torch
    >>> program = ragged.export(lambda x: x * 2, (ragged.from_lengths(torch.ones(3), [1, 2]),))
    >>> buffer = io.BytesIO(); program.save(buffer); _ = buffer.seek(0)
    >>> ragged.load_exported(buffer)(ragged.from_lengths(torch.ones(4), [4])).to_list()
    [[2.0, 2.0, 2.0, 2.0]]
    """
    extra = {_SPEC_FILE: ""}
    program = torch.export.load(path, extra_files=extra)
    convention = json.loads(extra[_SPEC_FILE])
    return RaggedExportedProgram(
        program,
        pytree.treespec_loads(convention["in_spec"]),
        convention["in_kinds"],
        pytree.treespec_loads(convention["out_spec"]),
        convention["out_kinds"],
    )
