"""``nn.RNN``, ``nn.GRU`` and ``nn.LSTM`` on ``(B, L*, C)`` RaggedArrays, through packed sequences.

The modules call ``torch.rnn_tanh`` / ``torch.rnn_relu`` / ``torch.gru`` / ``torch.lstm``
(``torch._VF``) with the RaggedArray as ``input``; the handlers below pack it (as
``ragged.to_packed_sequence`` does), call the packed overload, and return the output as a
RaggedArray with the input's partition and the last states in the input's segment order, as
torch returns them for a batch of tensors. An initial state ``hx`` is in the input's order too.
An empty segment takes no step: no output row, and its initial state as its last state.

Packing reads the lengths once (``PackedSequence`` keeps its ``batch_sizes`` on the host), so
these rows do not trace into one graph under ``torch.compile``: Dynamo breaks the graph there.
Only ``batch_first=True`` runs: torch's sequence-first layout ``(L*, B, C)`` puts the ragged
axis first, and the module sizes its state with ``input.size(1)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._array import RaggedArray
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


# Packing reads the lengths: one clean graph break, run eagerly. torch._disable_dynamo is
# torch._dynamo.disable that imports Dynamo on the first call, not at `import ragged`.
@torch._disable_dynamo
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
    lengths = input.lengths.cpu()  # PackedSequence keeps its batch_sizes on the host anyway
    if bool(lengths.all()):
        kept, packed = None, input
    else:  # no step for an empty segment: no output row, its initial state as the last one
        kept = torch.nonzero(lengths).squeeze(1).to(input.device)
        packed = input[kept]  # the same rows in the same order
        if kept.shape[0] == 0:
            width = initial[0].shape[-1] * (2 if bidirectional else 1)
            empty = input.values.new_zeros(0, width)
            return (input.with_values(empty, axes=None), *initial)
    rows, batch_sizes, sorted_indices, unsorted_indices = packed_rows(packed)
    order = sorted_indices if kept is None else kept.index_select(0, sorted_indices)
    states = [h.index_select(1, order) for h in initial]
    state: Any = states if isinstance(hx, (tuple, list)) else states[0]
    data = input.values.index_select(0, rows)
    result = fn(
        data, batch_sizes, state, params, has_biases, num_layers, dropout, train, bidirectional
    )
    out = result[0]
    values = torch.index_copy(out.new_zeros(out.shape), 0, rows, out)
    last = [h.index_select(1, unsorted_indices) for h in result[1:]]
    if kept is not None:
        last = [torch.index_copy(h0, 1, kept, h) for h0, h in zip(initial, last, strict=True)]
    return (input.with_values(values, axes=None), *last)


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
        compile=False,
    )(_handler(_fn))
