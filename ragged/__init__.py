"""torch-ragged: JAX-style functional ragged arrays on PyTorch.

A :class:`RaggedArray` is flat ``values`` plus an immutable :class:`Partition` of offsets, with
optional axis names. It is a pytree (``torch.func`` and ``torch.compile`` accept it), and every
op is a pure function whose reference semantics is the same op applied to each segment.

>>> import ragged, torch
>>> x = ragged.from_lengths(torch.arange(6.0), [3, 0, 3])
>>> x.to_padded()
tensor([[0., 1., 2.],
        [0., 0., 0.],
        [3., 4., 5.]])
"""

from . import _pytree, _serialization, func
from . import data as data  # ragged.data: collate, batch samplers, micro-batch planner
from . import distributed as distributed  # ragged.distributed: collectives and sharding
from . import nn as nn  # ragged.nn: LayerNorm, multi-head attention, Transformer encoder
from ._array import RaggedArray as RaggedArray
from ._convert import to_list as to_list
from ._convert import to_mask as to_mask
from ._convert import to_nested as to_nested
from ._convert import to_padded as to_padded
from ._convert import unbind as unbind
from ._factories import array as array
from ._factories import from_lengths as from_lengths
from ._factories import from_nested as from_nested
from ._factories import from_nested_lengths as from_nested_lengths
from ._factories import from_offsets as from_offsets
from ._factories import from_padded as from_padded
from ._factories import from_segment_ids as from_segment_ids
from ._partition import Partition as Partition
from ._partition import RowPartition as RowPartition
from ._shape import RaggedShape as RaggedShape
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
from .ops import _attention as _ops_attention
from .ops import _combine as _ops_combine
from .ops import _einsum as _ops_einsum
from .ops import _elementwise as _ops_elementwise
from .ops import _index as _ops_index
from .ops import _linalg as _ops_linalg
from .ops import _logical as _ops_logical
from .ops import _normalize as _ops_normalize
from .ops import _pairs as _ops_pairs
from .ops import _reduce as _ops_reduce
from .ops import _sample as _ops_sample
from .ops import _scan as _ops_scan
from .ops import _sort as _ops_sort
from .ops import _statistics as _ops_statistics
from .ops._attention import *  # noqa: F403
from .ops._combine import *  # noqa: F403
from .ops._einsum import *  # noqa: F403
from .ops._elementwise import *  # noqa: F403
from .ops._index import *  # noqa: F403
from .ops._linalg import *  # noqa: F403
from .ops._logical import *  # noqa: F403
from .ops._normalize import *  # noqa: F403
from .ops._pairs import *  # noqa: F403
from .ops._reduce import *  # noqa: F403
from .ops._sample import *  # noqa: F403
from .ops._scan import *  # noqa: F403
from .ops._sort import *  # noqa: F403
from .ops._statistics import *  # noqa: F403

_pytree.register()
_serialization.register()

__version__ = "0.1.0"

__all__ = [
    "Partition",
    "RaggedArray",
    "RaggedShape",
    "RowPartition",
    "array",
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
__all__ += _ops_attention.__all__
__all__ += _ops_combine.__all__
__all__ += _ops_einsum.__all__
__all__ += _ops_elementwise.__all__
__all__ += _ops_index.__all__
__all__ += _ops_linalg.__all__
__all__ += _ops_logical.__all__
__all__ += _ops_normalize.__all__
__all__ += _ops_pairs.__all__
__all__ += _ops_reduce.__all__
__all__ += _ops_sample.__all__
__all__ += _ops_scan.__all__
__all__ += _ops_sort.__all__
__all__ += _ops_statistics.__all__
__all__ += func.__all__
