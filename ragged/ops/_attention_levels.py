"""Attention within the innermost ragged axis of multi-level arrays.

For ``q``, ``k``, ``v`` of shape ``(B, S*, T*, H, Dh)`` (documents -> sentences -> tokens) every
sentence attends within itself: the innermost level alone is a one-level batch whose segments
are the sentences (``ragged.ops._levels.on_rows``), so the one-level kernels run unchanged and
the outer levels go back on top of the result. ``q`` and ``k`` must share the levels above the
innermost (cross-attention pairs the same sentences); a pair bias has one more level than
``q``: ``(B, S*, Tq*, Tk*, H)``, the pair map of every sentence (``ragged.outer`` of the two
arrays builds it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._array import RaggedArray
from ._levels import on_rows


def attention_levels(
    attention: Callable[..., RaggedArray],
    q: Any,
    k: Any,
    v: Any,
    bias: Any,
    document_ids: Any,
    **kwargs: Any,
) -> RaggedArray:
    """``attention`` within every row of the innermost ragged axis (see the module)."""
    arrays = [("q", q, 1), ("k", k, 1), ("v", v, 1)]
    extra = [("bias", bias, 2), ("document_ids", document_ids, 1)]
    present = [(name, x, depth) for name, x, depth in extra if x is not None]

    def call(qv: RaggedArray, kv: RaggedArray, vv: RaggedArray, *rest: RaggedArray) -> Any:
        named = {name: view for (name, _, _), view in zip(present, rest, strict=True)}
        return attention(qv, kv, vv, **named, **kwargs)

    return on_rows(attention, arrays + present, call)
