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
    **kwargs: Any,
) -> RaggedArray:
    """``attention`` within every row of the innermost ragged axis (see the module)."""
    arrays = [("q", q, 1), ("k", k, 1), ("v", v, 1)]
    if bias is None:
        return on_rows(attention, arrays, lambda *views: attention(*views, **kwargs))
    arrays.append(("bias", bias, 2))
    return on_rows(
        attention, arrays, lambda qv, kv, vv, bv: attention(qv, kv, vv, bias=bv, **kwargs)
    )
