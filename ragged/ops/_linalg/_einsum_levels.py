"""``ragged.einsum`` on multi-level operands: one letter per ragged axis.

A RaggedArray operand with ``n`` ragged axes starts its subscripts with ``1 + n`` letters (its
batch and ragged axes), the same for every RaggedArray operand (which need equal partitions).
The contraction over the other letters is dense: it runs on the rows of ``values`` (a per-row
einsum; dense operands that use the batch letter are gathered to every row). Ragged letters the
output drops are then summed over, any combination of them, with the reduction driver's groups
(``ragged.sum``): the output keeps a prefix-ordered subset of the lead letters, first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._axes import subscripts
from ..._broadcast import same_partition
from ..._errors import Func, value_error
from .._reductions._reduce import sum as ragged_sum
from ._einsum_parse import ELLIPSIS, LETTERS, split_equation, tokens_of


def einsum_levels(func: Func, equation: str, operands: Sequence[Any]) -> Any:
    """``einsum`` where some RaggedArray operand has several ragged axes (see the module)."""
    terms, rhs = split_equation(func, equation, len(operands))
    tokens = [tokens_of(func, t, f"operand {i}", equation) for i, t in enumerate(terms)]
    out = tokens_of(func, rhs, "the output", equation)
    ragged_pos = [i for i, o in enumerate(operands) if isinstance(o, RaggedArray)]
    x: RaggedArray = operands[ragged_pos[0]]
    nr = x.ragged_ndim
    lead = tokens[ragged_pos[0]][: 1 + nr]
    for i in ragged_pos:
        operand = operands[i]
        if operand.ragged_ndim != nr or tuple(tokens[i][: 1 + nr]) != tuple(lead):
            raise value_error(
                func,
                "equation",
                f"operand {i} is a RaggedArray: every RaggedArray operand must have {nr} ragged "
                f"axes and start with the same {1 + nr} subscripts {''.join(lead)!r}",
                repr(equation),
            )
        if ELLIPSIS in lead or len(set(lead)) != len(lead):
            raise value_error(
                func,
                "equation",
                f"operand {i} must name its batch and ragged axes with {1 + nr} distinct letters",
                repr(equation),
            )
        if i != ragged_pos[0]:
            same_partition(func, x, operand)
    bat, rag = lead[0], set(lead[1:])
    for i, toks in enumerate(tokens):
        if i not in ragged_pos and rag & set(toks):
            raise value_error(
                func,
                "equation",
                f"operand {i} is a dense tensor and uses a ragged subscript (a dense operand "
                "cannot span a ragged axis)",
                repr(equation),
            )
    kept = [c for c in lead if c in out]
    if list(out[: len(kept)]) != kept and not kept == [bat]:
        raise value_error(
            func,
            "equation",
            f"output must start with the batch and ragged subscripts it keeps, in order "
            f"({''.join(kept)!r})",
            repr(equation),
        )
    if kept and bat not in kept:
        raise value_error(
            func,
            "equation",
            f"output keeps a ragged subscript but not the batch subscript {bat!r} (summing over "
            "the batch axis needs every ragged axis summed too)",
            repr(equation),
        )
    used = {c for toks in tokens for c in toks}
    row = next(c for c in LETTERS if c not in used)
    rest = [c for c in out if c not in lead]
    args = []
    segments = x.partition.segment_ids()
    for i, operand in enumerate(operands):
        toks = tokens[i]
        if i in ragged_pos:
            args.append((operand.values, [row, *toks[1 + nr :]]))
        elif bat in toks:
            axis = toks.index(bat)
            args.append(
                (operand.index_select(axis, segments), [row if c == bat else c for c in toks])
            )
        else:
            args.append((operand, list(toks)))
    rows_eq = ",".join("".join(t) for _, t in args) + "->" + row + "".join(rest)
    values = torch.einsum(rows_eq, *[a for a, _ in args])
    names = subscripts([(terms[i], operands[i].axes) for i in ragged_pos], "".join([*lead, *rest]))
    result = RaggedArray(values, x.partition, names)
    dropped = [k for k, c in enumerate(lead) if c not in out]
    if not dropped:
        return result
    if bat not in out:
        dropped = list(range(1 + nr))
    reduced = ragged_sum(result, axis=tuple(dropped))
    if kept == [bat] and out.index(bat) != 0:  # only the batch axis is left: a dense result
        assert isinstance(reduced, Tensor)
        return reduced.movedim(0, out.index(bat))
    return reduced
