"""Parsing ``ragged.einsum`` equations into cached recipes (the einops way: parse once, bind many).

A recipe depends only on the equation and on which operands are RaggedArrays; everything that
depends on shapes, partitions and names is checked when the recipe is bound to its operands.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from ..._errors import Func, type_error, value_error

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
ELLIPSIS = "..."


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A parsed equation.

    Attributes:
        equation: as given (for error messages).
        terms: the subscript term of each operand.
        tokens: each term split into letters and at most one ``...``.
        out_tokens: the output's tokens.
        ragged_pos: the positions of the RaggedArray operands.
        bat, rag: the batch and ragged subscripts of the RaggedArray operands.
        mode: ``"keep"`` (the output keeps the ragged subscript: a RaggedArray), ``"segment"``
            (only the batch one: a contraction over each segment) or ``"all"`` (neither).
        rest: the output's tokens after the kept batch/ragged subscripts.
        row, slot: two free letters: rows of values, and the rows within a tile.
    """

    equation: str
    terms: tuple[str, ...]
    tokens: tuple[tuple[str, ...], ...]
    out_tokens: tuple[str, ...]
    ragged_pos: tuple[int, ...]
    bat: str
    rag: str
    mode: str
    rest: tuple[str, ...]
    row: str
    slot: str


def tokens_of(func: Func, term: str, what: str, equation: str) -> tuple[str, ...]:
    """Split a subscript term into letters and at most one ``...``.

    >>> tokens_of("f", "b...d", "operand 0", "b...d->b")
    ('b', '...', 'd')
    """
    out: list[str] = []
    i = 0
    while i < len(term):
        if term.startswith(ELLIPSIS, i):
            out.append(ELLIPSIS)
            i += 3
        elif term[i] in LETTERS:
            out.append(term[i])
            i += 1
        else:
            raise value_error(
                func,
                "equation",
                f"{what} has the subscript {term[i]!r}; subscripts are letters and at most one "
                f"'...'",
                repr(equation),
            )
    if out.count(ELLIPSIS) > 1:
        raise value_error(func, "equation", f"{what} has more than one '...'", repr(equation))
    return tuple(out)


def axis_of(tokens: tuple[str, ...], pos: int, ndim: int) -> int:
    """The axis of an operand that its subscript at ``pos`` names (``...`` may come before).

    >>> axis_of(("b", "...", "d"), 2, 5)
    4
    """
    if ELLIPSIS in tokens and pos > tokens.index(ELLIPSIS):
        return ndim - (len(tokens) - pos)
    return pos


def parse(func: Func, equation: str, ragged: tuple[bool, ...]) -> Recipe:
    """The recipe of ``equation`` for operands that are RaggedArrays where ``ragged`` says so.

    Cached in eager mode; under ``torch.compile`` the parse is traced once per graph (Dynamo
    does not trace through ``functools.lru_cache``).

    >>> r = parse("ragged.einsum", "bld,de->ble", (True, False))
    >>> r.mode, r.bat, r.rag, r.rest
    ('keep', 'b', 'l', ('e',))
    """
    if torch.compiler.is_compiling():
        return _parse(func, equation, ragged)
    return _cached_parse(func, equation, ragged)


def split_equation(func: Func, equation: str, count: int) -> tuple[tuple[str, ...], str]:
    """The operands' subscript terms and the output's of ``equation`` (spaces dropped), which
    must have an explicit output and ``count`` operand terms."""
    eq = equation.replace(" ", "")
    if eq.count("->") != 1:
        raise value_error(
            func, "equation", "must give the output explicitly after one '->'", repr(equation)
        )
    lhs, rhs = eq.split("->")
    terms = tuple(lhs.split(","))
    if len(terms) != count:
        raise value_error(
            func,
            "equation",
            f"must have one subscript term per operand ({count} operands)",
            repr(equation),
        )
    return terms, rhs


def _parse(func: Func, equation: str, ragged: tuple[bool, ...]) -> Recipe:
    terms, rhs = split_equation(func, equation, len(ragged))
    ragged_pos = tuple(i for i, is_ragged in enumerate(ragged) if is_ragged)
    if not ragged_pos:
        raise type_error(
            func,
            "operands",
            "must include a RaggedArray (use torch.einsum otherwise)",
            "only Tensors",
        )
    tokens = tuple(tokens_of(func, t, f"operand {i}", equation) for i, t in enumerate(terms))
    out_tokens = tokens_of(func, rhs, "the output", equation)
    bat, rag = _batch_and_ragged(func, equation, terms, tokens, ragged_pos)
    for i, toks in enumerate(tokens):
        if not ragged[i] and rag in toks:
            raise value_error(
                func,
                "equation",
                f"operand {i} is a dense tensor and uses the ragged subscript {rag!r} (a dense "
                f"operand cannot span a ragged axis; make it a RaggedArray with the same partition)",
                repr(equation),
            )
        if not ragged[i] and toks.count(bat) > 1:
            raise value_error(
                func,
                "equation",
                f"operand {i} uses the batch subscript {bat!r} twice",
                repr(equation),
            )
    used = {c for toks in tokens for c in toks}
    for c in out_tokens:
        if c != ELLIPSIS and c not in used:
            raise value_error(
                func, "equation", f"output subscript {c!r} appears in no operand", repr(equation)
            )
    if len(set(out_tokens)) != len(out_tokens):
        raise value_error(func, "equation", "output repeats a subscript", repr(equation))
    if ELLIPSIS in out_tokens and all(ELLIPSIS not in t for t in tokens):
        raise value_error(func, "equation", "output has '...' but no operand has", repr(equation))
    free = [c for c in LETTERS if c not in used]
    if len(free) < 2:
        raise value_error(
            func, "equation", "uses too many letters (two are needed for rows)", repr(equation)
        )
    if rag in out_tokens:
        if out_tokens[:2] != (bat, rag):
            raise value_error(
                func,
                "equation",
                f"output keeps the ragged subscript {rag!r}, so it must start with the batch and "
                f"ragged subscripts {bat + rag!r}",
                repr(equation),
            )
        mode, rest = "keep", out_tokens[2:]
    elif bat in out_tokens:
        mode, rest = "segment", tuple(t for t in out_tokens if t != bat)
    else:
        mode, rest = "all", out_tokens
    return Recipe(
        equation, terms, tokens, out_tokens, ragged_pos, bat, rag, mode, rest, free[0], free[1]
    )


_cached_parse = functools.lru_cache(maxsize=512)(_parse)


def _batch_and_ragged(
    func: Func,
    equation: str,
    terms: tuple[str, ...],
    tokens: tuple[tuple[str, ...], ...],
    ragged_pos: tuple[int, ...],
) -> tuple[str, str]:
    """The batch and ragged subscripts that every RaggedArray operand starts with."""
    first = ragged_pos[0]
    head = tokens[first][:2]
    if len(head) < 2 or ELLIPSIS in head:
        raise value_error(
            func,
            "equation",
            f"operand {first} is a RaggedArray: its first two subscripts must be letters for its "
            f"batch and ragged axes, got {terms[first]!r} in",
            repr(equation),
        )
    bat, rag = head
    if bat == rag:
        raise value_error(
            func,
            "equation",
            f"operand {first} uses {bat!r} for both its batch and ragged axes",
            repr(equation),
        )
    for i in ragged_pos:
        if tokens[i][:2] != (bat, rag):
            raise value_error(
                func,
                "equation",
                f"operand {i} is a RaggedArray: its first two subscripts must be the batch and "
                f"ragged subscripts {bat + rag!r} of operand {first}, got {terms[i]!r} in",
                repr(equation),
            )
        for c, role in ((bat, "batch"), (rag, "ragged")):
            if c in tokens[i][2:]:
                raise value_error(
                    func,
                    "equation",
                    f"operand {i} uses its {role} subscript {c!r} again on an inner axis",
                    repr(equation),
                )
    return bat, rag
