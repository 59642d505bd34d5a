"""Data loading for variable-length samples: collate without padding, length-aware batch
samplers, and a dynamic micro-batch planner.

>>> import ragged, torch
>>> from torch.utils.data import DataLoader
>>> data = [torch.ones(n, 2) for n in [3, 1, 4, 1, 5]]
>>> loader = DataLoader(
...     data,
...     batch_sampler=ragged.data.TokenBudgetBatchSampler([3, 1, 4, 1, 5], 6, shuffle=False),
...     collate_fn=ragged.data.collate,
... )
>>> [batch.lengths.tolist() for batch in loader]
[[3, 1], [4, 1], [5]]
"""

from ._collate import collate as collate
from ._planner import MicrobatchCost as MicrobatchCost
from ._planner import plan_cost as plan_cost
from ._planner import plan_microbatches as plan_microbatches
from ._samplers import BucketBatchSampler as BucketBatchSampler
from ._samplers import TokenBudgetBatchSampler as TokenBudgetBatchSampler

__all__ = [
    "BucketBatchSampler",
    "MicrobatchCost",
    "TokenBudgetBatchSampler",
    "collate",
    "plan_cost",
    "plan_microbatches",
]
