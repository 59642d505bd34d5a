"""torch-ragged: JAX-style functional ragged arrays on PyTorch.

A [`RaggedArray`][ragged.RaggedArray] is flat ``values`` plus an immutable
[`Partition`][ragged.Partition] of offsets, with optional axis names. It is a pytree
(``torch.func`` and ``torch.compile`` accept it), and every op is a pure function whose
reference semantics is the same op applied to each segment.

>>> import ragged, torch
>>> x = ragged.from_lengths(torch.arange(6.0), [3, 0, 3])
>>> x.to_padded()
tensor([[0., 1., 2.],
        [0., 0., 0.],
        [3., 4., 5.]])
"""

from . import _pytree, _serialization, func, ops
from . import data as data  # ragged.data: collate, batch samplers, micro-batch planner
from . import distributed as distributed  # ragged.distributed: collectives and sharding
from . import nn as nn  # ragged.nn: LayerNorm, multi-head attention, Transformer encoder
from ._array import RaggedArray as RaggedArray
from ._convert import to_list as to_list
from ._convert import to_mask as to_mask
from ._convert import to_nested as to_nested
from ._convert import to_padded as to_padded
from ._convert import unbind as unbind
from ._factories import from_lengths as from_lengths
from ._factories import from_nested_lengths as from_nested_lengths
from ._factories import from_offsets as from_offsets
from ._factories import from_segment_ids as from_segment_ids
from ._factories_dense import array as array
from ._factories_dense import from_nested as from_nested
from ._factories_dense import from_padded as from_padded
from ._flat import FlatArray as FlatArray
from ._partition import Partition as Partition
from ._partition import RowPartition as RowPartition
from ._shape import RaggedShape as RaggedShape
from ._shape import RaggedSize as RaggedSize
from .func import *  # noqa: F403  (transforms, listed in ragged.func.__all__)
from .interop import from_danling as from_danling
from .interop import from_hf as from_hf
from .interop import from_hf_packed as from_hf_packed
from .interop import from_packed_sequence as from_packed_sequence
from .interop import from_pyg as from_pyg
from .interop import to_danling as to_danling
from .interop import to_hf as to_hf
from .interop import to_hf_packed as to_hf_packed
from .interop import to_packed_sequence as to_packed_sequence
from .interop import to_pyg as to_pyg
from .interop._awkward import from_awkward as from_awkward
from .interop._awkward import to_awkward as to_awkward
from .ops import *  # noqa: F403  (every op: ragged.ops.__all__, generated from the registry)
from .ops._methods import install as _install_methods
from .ops._ragged_index import RaggedIndex as RaggedIndex

_pytree.register()
_serialization.register()
_install_methods()

__version__ = "0.1.0"

__all__ = [
    "FlatArray",
    "Partition",
    "RaggedArray",
    "RaggedIndex",
    "RaggedShape",
    "RaggedSize",
    "RowPartition",
    "array",
    "from_awkward",
    "from_danling",
    "from_hf",
    "from_hf_packed",
    "from_lengths",
    "from_nested",
    "from_nested_lengths",
    "from_offsets",
    "from_packed_sequence",
    "from_padded",
    "from_pyg",
    "from_segment_ids",
    "to_awkward",
    "to_danling",
    "to_hf",
    "to_hf_packed",
    "to_list",
    "to_mask",
    "to_nested",
    "to_packed_sequence",
    "to_padded",
    "to_pyg",
    "unbind",
]
__all__ += ops.__all__
__all__ += func.__all__
