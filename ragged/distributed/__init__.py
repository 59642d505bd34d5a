"""Collectives and sharding for RaggedArrays on ``torch.distributed``.

Ranks hold RaggedArrays with different numbers of segments and values. Each collective first
exchanges the small host metadata (numbers of segments and values, dtype, inner shape, known
maximum length) with ``torch.distributed``'s object collectives, then moves lengths and values
with tensor collectives (``all_gather``, ``broadcast``, ``scatter``) on the values' device:
buffers are padded to the largest rank where the collective needs equal sizes. Results record
their maximum length, so later ``to_padded``/``to_mask`` calls read nothing from the device.

Errors: a rank whose arguments are wrong must not leave the others waiting in a collective
(until the process group's timeout, 30 minutes by default). So each collective first runs its
local checks on every rank and exchanges the outcome in its first metadata exchange (one
``all_gather_object``); if any rank failed, every rank raises there, the failing rank its own
error and the others a ``ValueError`` (``TypeError``) naming that rank and its error.

Ordering: [`all_gather`][ragged.distributed.all_gather] concatenates the ranks' segments in rank order (rank 0's first);
[`scatter`][ragged.distributed.scatter] and [`shard`][ragged.distributed.shard] give rank ``r`` the ``r``-th contiguous chunk. The global mean
of a per-token loss is [`global_mean`][ragged.distributed.global_mean] (sums and counts all-reduced); see
``docs/semantics.md`` (data loading).

Context parallelism splits the sequences of one batch over ranks:
``plan_context_parallel`` lays rows out on the host (a ``ContextParallelPlan``) and
``context_parallel_attention`` computes exact attention over that layout (``docs/scaling.md``).
"""

from ._collectives import all_gather as all_gather
from ._collectives import broadcast as broadcast
from ._collectives import global_mean as global_mean
from ._collectives import scatter as scatter
from ._collectives import shard as shard
from ._collectives import shard_bounds as shard_bounds
from ._context_attention import context_parallel_attention as context_parallel_attention
from ._context_plan import ContextParallelPlan as ContextParallelPlan
from ._context_plan import plan_context_parallel as plan_context_parallel

__all__ = [
    "ContextParallelPlan",
    "all_gather",
    "broadcast",
    "context_parallel_attention",
    "global_mean",
    "plan_context_parallel",
    "scatter",
    "shard",
    "shard_bounds",
]
