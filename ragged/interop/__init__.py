"""Conversions to and from other libraries' variable-length formats.

* ``torch.nn.utils.rnn.PackedSequence`` (RNNs): ``to_packed_sequence``,
  ``from_packed_sequence``.
* HuggingFace-style padded batches with an ``attention_mask``: ``to_hf``, ``from_hf``.
* HuggingFace padding-free batches (``input_ids`` of shape ``[1, T]``, ``position_ids``
  restarting per sequence, flash-attention's ``cu_seq_lens_q/k``), as transformers'
  ``DataCollatorWithFlattening`` makes them: ``to_hf_packed``, ``from_hf_packed``.
* PyTorch Geometric's ``(x, batch)`` segment-id vector or a ``Batch``: ``to_pyg``,
  ``from_pyg``.
* DanLing's ``NestedTensor`` (PyPI ``danling``, optional): ``to_danling``,
  ``from_danling``.
* ``torch.nested`` jagged tensors: ``ragged.from_nested`` and ``RaggedArray.to_nested``.
* awkward arrays (PyPI ``awkward``, optional): ``from_awkward``, ``to_awkward`` (``ragged.array``
  takes awkward arrays too).

Every conversion is differentiable with respect to the values. Host reads are stated per
function; they happen only where the other format keeps sizes on the host (``PackedSequence``'s
``batch_sizes``, DanLing's offsets) or where an output size depends on the data.

Each format has its own module here (``_packed_sequence``, ``_hf``, ``_pyg``, ``_danling``, ``_awkward``);
optional peers are imported on first use only.
"""

from ._awkward import from_awkward as from_awkward
from ._awkward import to_awkward as to_awkward
from ._danling import from_danling as from_danling
from ._danling import to_danling as to_danling
from ._hf import from_hf as from_hf
from ._hf import from_hf_packed as from_hf_packed
from ._hf import to_hf as to_hf
from ._hf import to_hf_packed as to_hf_packed
from ._packed_sequence import from_packed_sequence as from_packed_sequence
from ._packed_sequence import to_packed_sequence as to_packed_sequence
from ._pyg import from_pyg as from_pyg
from ._pyg import to_pyg as to_pyg

__all__ = [
    "from_awkward",
    "from_danling",
    "from_hf",
    "from_hf_packed",
    "from_packed_sequence",
    "from_pyg",
    "to_awkward",
    "to_danling",
    "to_hf",
    "to_hf_packed",
    "to_packed_sequence",
    "to_pyg",
]
