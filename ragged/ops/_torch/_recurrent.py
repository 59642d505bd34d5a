"""``nn.RNN``, ``nn.GRU`` and ``nn.LSTM`` on ``(B, L*, C)`` RaggedArrays, through packed sequences.

The modules call ``torch.rnn_tanh`` / ``torch.rnn_relu`` / ``torch.gru`` / ``torch.lstm``
(``torch._VF``) with the RaggedArray as ``input``; the handlers below pack it (as
``ragged.to_packed_sequence`` does), call the packed overload, and return the output as a
RaggedArray with the input's partition and the last states in the input's segment order, as
torch returns them for a batch of tensors. An initial state ``hx`` is in the input's order too.
An empty segment takes no step: no output row, and its initial state as its last state.

Packing reads the lengths once (``PackedSequence`` keeps its ``batch_sizes`` on the host): under
``torch.compile`` (with ``torch._dynamo.config.allow_rnn``) the recurrence is the opaque op
``ragged::packed_recurrence``, so the model stays one graph.
Only ``batch_first=True`` runs: torch's sequence-first layout ``(L*, B, C)`` puts the ragged
axis first, and the module sizes its state with ``input.size(1)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
from ..._factories import from_lengths
from .._packing import packing_plan
from ._spelling import torch_handler


def packed_rows(x: RaggedArray) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(rows, batch_sizes, sorted_indices, unsorted_indices)`` for packing ``x``: the packed
    data of ``x`` is ``x.values.index_select(0, rows)``, and packed data ``d`` goes back to the
    rows of ``x`` as ``torch.index_copy(new, 0, rows, d)``. Reads the lengths once."""
    plan = packing_plan("ragged.to_packed_sequence", x)
    rows = torch.empty_like(plan.dest).index_copy_(
        0, plan.dest, torch.arange(x.values.shape[0], device=x.device)
    )
    device = x.device
    return rows, plan.batch_sizes, plan.sorted_indices.to(device), plan.rank.to(device)


_FUNCTIONS: dict[str, Callable[..., tuple[Tensor, ...]]] = {
    "gru": torch.gru,
    "lstm": torch.lstm,
    "rnn_tanh": torch.rnn_tanh,
    "rnn_relu": torch.rnn_relu,
}


def _run_packed(
    mode: str, values: Tensor, lengths: Tensor, hx: list[Tensor], params: list[Tensor], *flags: Any
) -> list[Tensor]:
    """The recurrence ``mode`` on the rows ``values`` of segments of ``lengths``: ``[out, *last]``
    (the output rows in ``values``' order, the last states in the segments' order). Eager: packs
    (reads the lengths once) and calls the packed overload of ``torch.gru``, ...."""
    bidirectional = flags[-1]
    host = lengths.cpu()  # PackedSequence keeps its batch_sizes on the host anyway
    x = from_lengths(values, host)
    if bool(host.all()):
        kept, packed = None, x
    else:  # no step for an empty segment: no output row, its initial state as the last one
        kept = torch.nonzero(host).squeeze(1).to(values.device)
        packed = x[kept]  # the same rows in the same order
        if kept.shape[0] == 0:
            width = hx[0].shape[-1] * (2 if bidirectional else 1)
            return [values.new_zeros(0, width), *(h.clone() for h in hx)]
    rows, batch_sizes, sorted_indices, unsorted_indices = packed_rows(packed)
    order = sorted_indices if kept is None else kept.index_select(0, sorted_indices)
    states = [h.index_select(1, order) for h in hx]
    state: Any = states if mode == "lstm" else states[0]
    result = _FUNCTIONS[mode](values.index_select(0, rows), batch_sizes, state, params, *flags)
    out = result[0]
    last = [h.index_select(1, unsorted_indices) for h in result[1:]]
    if kept is not None:
        last = [torch.index_copy(h0, 1, kept, h) for h0, h in zip(hx, last, strict=True)]
    return [torch.index_copy(out.new_zeros(out.shape), 0, rows, out), *last]


# Under torch.compile the recurrence is one opaque op (the pattern of ragged::bucketed_attention):
# Dynamo sees static output shapes and no host read, so a model with a GRU stays one graph. Its
# gradient recomputes the forward with autograd inside the backward op (torch has no standalone
# backward op for the CPU recurrences): one more forward's time per training step, under
# compile only; eager calls run the packed overload directly.
@torch.library.custom_op("ragged::packed_recurrence", mutates_args=())
def packed_recurrence(
    mode: str,
    values: Tensor,
    lengths: Tensor,
    hx: list[Tensor],
    params: list[Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
) -> list[Tensor]:
    flags = (has_biases, num_layers, dropout, train, bidirectional)
    return [
        t.clone() if t is values else t
        for t in _run_packed(mode, values, lengths, hx, params, *flags)
    ]


@packed_recurrence.register_fake
def _(mode: str, values: Tensor, lengths: Tensor, hx: list[Tensor], *rest: Any) -> list[Tensor]:
    width = hx[0].shape[-1] * (2 if rest[-1] else 1)
    return [values.new_empty(values.shape[0], width), *(torch.empty_like(h) for h in hx)]


def _with_autograd() -> Any:
    """A guard under which autograd records again inside a custom op's kernel (the dispatcher
    excludes the autograd keys there). torch has no public spelling of this: it is the guard
    torch's own functorch layers use (``torch._C._ForceDispatchKeyGuard``)."""
    excluded = torch._C._dispatch_tls_local_exclude_set()
    excluded = excluded.remove(torch._C.DispatchKey.AutogradFunctionality)
    excluded = excluded.remove(torch._C.DispatchKey.ADInplaceOrView)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded)


@torch.library.custom_op("ragged::packed_recurrence_backward", mutates_args=())
def packed_recurrence_backward(
    grads: list[Tensor],
    mode: str,
    values: Tensor,
    lengths: Tensor,
    hx: list[Tensor],
    params: list[Tensor],
    has_biases: bool,
    num_layers: int,
    bidirectional: bool,
) -> list[Tensor]:
    inputs = [t.detach().requires_grad_() for t in (values, *hx, *params)]
    flags = (has_biases, num_layers, 0.0, True, bidirectional)
    with _with_autograd(), torch.enable_grad():
        n = 1 + len(hx)
        outs = _run_packed(mode, inputs[0], lengths, inputs[1:n], inputs[n:], *flags)
        found = torch.autograd.grad(outs, inputs, grads, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(found, inputs, strict=True)]


@packed_recurrence_backward.register_fake
def _(
    grads: list[Tensor],
    mode: str,
    values: Tensor,
    lengths: Tensor,
    hx: list[Tensor],
    params: list[Tensor],
    *rest: Any,
) -> list[Tensor]:
    return [torch.empty_like(t) for t in (values, *hx, *params)]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    mode, values, lengths, hx, params, has_biases, num_layers, _, _, bidirectional = inputs
    ctx.save_for_backward(values, lengths, *hx, *params)
    ctx.static = (mode, len(hx), has_biases, num_layers, bidirectional)


def _backward(ctx: Any, grads: list[Tensor | None]) -> tuple[Any, ...]:
    mode, states, has_biases, num_layers, bidirectional = ctx.static
    values, lengths, *rest = ctx.saved_tensors
    hx, params = rest[:states], rest[states:]
    width = hx[0].shape[-1] * (2 if bidirectional else 1)
    out_grad = values.new_zeros(values.shape[0], width) if grads[0] is None else grads[0]
    state_grads = [
        torch.zeros_like(h) if g is None else g for g, h in zip(grads[1:], hx, strict=True)
    ]
    grads = [out_grad, *state_grads]
    found = packed_recurrence_backward(
        grads, mode, values, lengths, hx, params, has_biases, num_layers, bidirectional
    )
    n = 1 + states
    return (None, found[0], None, found[1:n], found[n:], None, None, None, None, None)


packed_recurrence.register_autograd(_backward, setup_context=_setup_context)


def _recurrent(
    fn: Any,
    input: Any,
    hx: Any,
    params: Any,
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[Any, ...]:
    """Run ``fn`` (``torch.gru``, ...) on the packed rows of ``input``; a tuple of the output
    RaggedArray and the states (one tensor, or two for ``torch.lstm``)."""
    if not isinstance(input, RaggedArray) or input.ndim != 3 or input.ragged_ndim != 1:
        got = f"{input.ndim} axes" if isinstance(input, RaggedArray) else type(input).__name__
        raise TypeError(f"`input` must be a RaggedArray (B, L*, C); got {got}.")
    if not batch_first:
        raise ValueError(
            "`batch_first` must be True for a RaggedArray (B, L*, C): the sequence-first "
            "layout puts the ragged axis before the batch; got False."
        )
    initial = list(hx) if isinstance(hx, (tuple, list)) else [hx]
    flags = (has_biases, num_layers, dropout, train, bidirectional)
    mode = fn.__name__
    # Dropout between layers draws random masks that the recomputing backward would not redraw:
    # that case runs eagerly (a graph break under compile).
    opaque = torch.compiler.is_compiling() and not (dropout > 0 and train)
    run = packed_recurrence if opaque else _eager_packed
    values, *last = run(mode, input.values, input.lengths, initial, list(params), *flags)
    return (input.with_values(values, axes=None), *last)


# Packing reads the lengths: under torch.compile a graph break where the opaque op cannot run
# (dropout between layers). torch._disable_dynamo is torch._dynamo.disable that imports Dynamo on
# the first call, not at `import ragged`.
_eager_packed = torch._disable_dynamo(_run_packed)


_MEANING = (
    "`{}` of `nn.{}` on `(B, L*, C)`: through a packed sequence (reads the "
    "lengths once); a RaggedArray output and the last states in the input's order"
)


def _handler(fn: Any) -> Any:
    """The handler of ``fn`` (``torch.gru``, ...) called as the modules call it (unpacked)."""

    def handler(
        input: Any,
        hx: Any,
        params: Any,
        has_biases: bool,
        num_layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
    ) -> tuple[Any, ...]:
        flags = (has_biases, num_layers, dropout, train, bidirectional, batch_first)
        return _recurrent(fn, input, hx, params, *flags)

    return handler


for _fn, _module in (
    (torch.gru, "GRU(batch_first=True)"),
    (torch.lstm, "LSTM(batch_first=True)"),
    (torch.rnn_tanh, "RNN(batch_first=True)"),
    (torch.rnn_relu, "RNN(nonlinearity='relu', batch_first=True)"),
):
    torch_handler(
        _fn,
        family="linalg",
        meaning=_MEANING.format(f"torch.{_fn.__name__}", _module),
        see=("ragged.to_packed_sequence",),
    )(_handler(_fn))
