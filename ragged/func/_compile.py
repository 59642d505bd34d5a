"""``ragged.dynamic_shapes`` and ``ragged.jit``: one compiled graph across all batch shapes."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx.experimental._config as fx_config

from .._errors import type_error, typename
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


@public("transforms")
def jit(f: Callable[..., Any] | None = None, /, **compile_kwargs: Any) -> Any:
    """Compile ``f`` for every batch shape: JAX's ``jax.jit`` for RaggedArrays.

    ``ragged.jit(f)`` is ``torch.compile(f, dynamic=True)`` whose calls run under
    [`ragged.dynamic_shapes`][ragged.dynamic_shapes]: one graph serves every batch size and
    length, including batches of one segment, one row or none, with no context manager at the
    call site. ``f`` takes and returns pytrees of RaggedArrays and tensors, and may use
    ``torch.func`` transforms inside. It works as a decorator with or without arguments;
    keyword arguments go to ``torch.compile`` (``backend``, ``fullgraph``, ``mode``, ``options``;
    ``dynamic`` defaults to ``True``).

    Each call of ``ragged.jit`` compiles ``f`` itself: ``f``'s own code object carries the
    compiled graphs and Dynamo's recompile limit, so jitting many functions never exhausts a
    limit shared by a library wrapper. Called while another function is being compiled, the
    jitted function is traced inline (its graphs join the caller's).

    Args:
        f: the function (or ``nn.Module``) to compile; omit it to get a decorator.
        **compile_kwargs: options for ``torch.compile``.

    Returns:
        The compiled function (the original is ``__wrapped__``; ``torch.compile``'s result is
        ``compiled``).

    >>> import ragged, torch
    >>> @ragged.jit(backend="eager", fullgraph=True)
    ... def total(x):
    ...     return ragged.sum(x * 2, axis=1)
    >>> [total(ragged.from_lengths(torch.ones(sum(n), 2), n)).shape for n in ([3, 1], [1], [])]
    [torch.Size([2, 2]), torch.Size([1, 2]), torch.Size([0, 2])]
    """
    if f is None:
        return functools.partial(jit, **compile_kwargs)
    if not callable(f):
        raise type_error(jit, "f", "must be a callable or None", typename(f))
    compile_kwargs.setdefault("dynamic", True)
    compiled = torch.compile(f, **compile_kwargs)

    def call(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # inside another compiled function: inline f
            return f(*args, **kwargs)
        with dynamic_shapes():
            return compiled(*args, **kwargs)

    functools.update_wrapper(call, f, updated=())  # a module's __dict__ stays its own
    call.compiled = compiled  # type: ignore[attr-defined]
    return call
