"""Hypothesis strategies for random partitions and RaggedArrays.

Drawn arrays cover the edge cases every op must handle: zero segments, one segment, empty
segments, one long segment among short ones, and non-contiguous values.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch

import ragged


@st.composite
def lengths(draw, *, min_segments=0, max_segments=6, max_length=5, allow_empty=True):
    """Per-segment lengths, sometimes with one segment much longer than the rest."""
    low = 0 if allow_empty else 1
    out = draw(st.lists(st.integers(low, max_length), min_size=min_segments, max_size=max_segments))
    if out and draw(st.booleans()) and draw(st.booleans()):
        out[draw(st.integers(0, len(out) - 1))] = 3 * max_length + 1  # one long segment
    return out


@st.composite
def ragged_arrays(
    draw,
    *,
    inner=(3,),
    dtype=torch.float64,
    min_segments=0,
    max_segments=6,
    max_length=5,
    allow_empty=True,
    requires_grad=False,
):
    """A RaggedArray with random lengths; values random and possibly non-contiguous."""
    lens = draw(
        lengths(
            min_segments=min_segments,
            max_segments=max_segments,
            max_length=max_length,
            allow_empty=allow_empty,
        )
    )
    total = sum(lens)
    seed = draw(st.integers(0, 2**31 - 1))
    layout = draw(st.sampled_from(["contiguous", "strided", "transposed"]))
    values = random_tensor((total, *inner), dtype, seed, layout)
    if requires_grad:
        values = values.detach().requires_grad_(True)
    return ragged.from_lengths(values, lens)


def random_tensor(shape, dtype, seed, layout="contiguous"):
    """Random values of ``shape``; ``layout`` "strided" or "transposed" gives a non-contiguous
    tensor holding the same kind of data."""
    generator = torch.Generator().manual_seed(seed)
    rows, *inner = shape
    if layout == "strided":
        full_shape = (2 * rows, *inner)
    elif layout == "transposed":
        full_shape = (*reversed(shape),)
    else:
        full_shape = tuple(shape)
    if dtype.is_floating_point:
        full = torch.randn(full_shape, generator=generator, dtype=dtype)
    elif dtype == torch.bool:
        full = torch.rand(full_shape, generator=generator) > 0.5
    else:
        full = torch.randint(-5, 6, full_shape, generator=generator, dtype=dtype)
    if layout == "strided":
        return full[::2]
    if layout == "transposed":
        return full.permute(*reversed(range(len(shape))))
    return full


@st.composite
def nested_lengths(draw, *, depth=None, max_segments=4, max_length=3):
    """Nested per-level lengths of a multi-level partition: ``[l0, l1, ...]`` with ``len(l0)``
    segments and ``len(l[k + 1]) == sum(l[k])``; ``depth`` levels (2 or 3 when ``None``). Empty
    segments and empty rows at every level occur, and sometimes zero segments."""
    depth = draw(st.sampled_from([2, 3])) if depth is None else depth
    levels = [draw(st.lists(st.integers(0, max_length), max_size=max_segments))]
    for _ in range(depth - 1):
        levels.append(
            draw(
                st.lists(
                    st.integers(0, max_length), min_size=sum(levels[-1]), max_size=sum(levels[-1])
                )
            )
        )
    return levels


@st.composite
def multi_level_arrays(draw, *, inner=(2,), dtype=torch.float64, depth=None):
    """A multi-level RaggedArray ``(B, L1*, ..., *inner)`` with random values (any layout)."""
    levels = draw(nested_lengths(depth=depth))
    seed = draw(st.integers(0, 2**31 - 1))
    layout = draw(st.sampled_from(["contiguous", "strided", "transposed"]))
    values = random_tensor((sum(levels[-1]), *inner), dtype, seed, layout)
    return ragged.from_nested_lengths(values, levels)
