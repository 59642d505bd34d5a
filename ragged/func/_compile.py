"""``ragged.dynamic_shapes``: compile settings for one graph across all batch shapes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.fx.experimental._config as fx_config

from .._registry import public


@public("transforms")
@contextlib.contextmanager
def dynamic_shapes() -> Iterator[None]:
    """Compile without 0/1 specialisation or duck-sized shape equalities.

    ``torch.compile(fn, dynamic=True)`` over RaggedArrays gives one graph across batch sizes and
    lengths, except that by default Dynamo (a) specialises sizes 0 and 1 (a batch of one
    segment, a one-row array or an empty one compiles a new graph) and (b) assumes that sizes
    equal in the first batch stay equal ("duck sizing", e.g. ``B`` and the feature size). Inside
    this context both are off (``backed_size_oblivious=True``, ``use_duck_shape=False``), so one
    graph serves every batch. Wrap the *calls* of the compiled function: Dynamo compiles (and
    recompiles) at call time.

    Inductor's on-disk FX-graph and autograd caches are also off inside the context: in torch
    2.13 their keys ignore these settings, and a training graph cached by one process for feature
    size 16 was reused by another for size 64 (an ``assert_size_stride`` failure). Compiling
    without the cache costs compile time only.

    >>> import ragged, torch
    >>> f = torch.compile(lambda x: ragged.sum(x, 1), dynamic=True, backend="eager")
    >>> with ragged.dynamic_shapes():
    ...     outs = [f(ragged.from_lengths(torch.ones(n, 4), [n])) for n in (3, 1, 0)]
    >>> [o.tolist() for o in outs]
    [[[3.0, 3.0, 3.0, 3.0]], [[1.0, 1.0, 1.0, 1.0]], [[0.0, 0.0, 0.0, 0.0]]]
    """
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with (
        fx_config.patch(backed_size_oblivious=True, use_duck_shape=False),  # type: ignore[attr-defined]
        inductor_config.patch(fx_graph_cache=False),
        functorch_config.patch(enable_autograd_cache=False),
    ):
        yield
