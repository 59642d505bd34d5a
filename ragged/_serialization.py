"""``torch.save``/``torch.load`` support, including the default ``weights_only=True`` load.

RaggedArray, Partition and RowPartition are plain frozen dataclasses of tensors and ints, so
pickle, ``copy.deepcopy`` and ``torch.save`` work as they are; registering them as safe globals
lets ``torch.load`` rebuild them under ``weights_only=True``. Arrays saved together that share
a partition object share it again after loading.
"""

from __future__ import annotations

import torch

from ._array import RaggedArray
from ._partition import Partition, RowPartition


def register() -> None:
    """Allow RaggedArrays in ``torch.load(..., weights_only=True)``."""
    torch.serialization.add_safe_globals([RaggedArray, Partition, RowPartition])
