"""Variable-length attention in eager mode: planning the length buckets (``_attention_buckets``
runs them).

Segments of equal length form a *bucket*; buckets may also merge near-equal lengths, padded to
the longest (padded keys masked with ``-inf``, padded query rows dropped: still exact), by a
cost model: merging a segment saves one kernel call (``CALL_COST``, in units of "pairs x head
width") and costs its padded pairs. On CPU the measured cost of a call is below that of masking,
so by default buckets hold equal lengths only; the padded buckets are kept (and tested) for
devices where calls cost more.

Planning needs the lengths on the host: they are read once per partition *level* (partitions
are immutable; the plan is cached per level object, weakly), so a model with many attention
layers over one batch reads them once. The plan is built in plain Python and its index tensors
are made with ``torch.frombuffer``: a tensor made by a torch op inside a ``torch.func``
transform belongs to that transform (functorch wraps it), so a plan first built under
``hessian`` would otherwise leak wrapped tensors into later calls; ``frombuffer`` tensors are
plain. Index tensors that scale with the number of pairs (for a bias) are computed per call.
"""

from __future__ import annotations

import array
import dataclasses
import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

from .._partition import RowPartition

# Fixed cost of one bucket (gathers, mask, kernel call, Python), in pairs x head width: a
# segment joins a bucket when the padded pairs it adds, times H * D, stay below this. Measured
# here (CPU, one thread), padding never paid: the flash kernel with a key padding mask is slower
# than more calls without one, so buckets hold equal lengths only. The padded buckets stay
# (tested) for devices where a call costs more.
CALL_COST = 0
COMPOSITE_BLOCK = 32  # block size of the composite path in eager mode (dropout)

_HOST: weakref.WeakKeyDictionary[RowPartition, list[int]] = weakref.WeakKeyDictionary()
_PerKey = weakref.WeakKeyDictionary[RowPartition, dict[int, "Plan"]]
_PLANS: weakref.WeakKeyDictionary[RowPartition, _PerKey] = weakref.WeakKeyDictionary()
_T = TypeVar("_T")
Rows = Tensor | tuple[int, int]  # an index tensor, or a (start, stop) range of rows


def host_lengths(level: RowPartition) -> list[int]:
    """The lengths of ``level`` as a host list: read from the device once per level object."""
    found = _HOST.get(level)
    if found is None:
        found = _HOST[level] = level.lengths.tolist()
    return found


def _ints(values: array.array) -> Tensor:
    """A plain int64 CPU tensor over ``values`` (an ``array('q')``; never empty here)."""
    return torch.frombuffer(values, dtype=torch.int64)


def _flags(values: array.array) -> Tensor:
    """A plain bool CPU tensor over ``values`` (an ``array('b')`` of 0/1)."""
    return torch.frombuffer(values, dtype=torch.bool)


def _outside_transforms(build: Callable[[], _T]) -> _T:
    """Run ``build`` in a helper thread, where no ``torch.func`` transform is active (the
    transform stack is thread-local), so the tensors it makes are plain. Used to move a plan to
    a non-CPU device."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append((True, build()))
        except BaseException as error:  # re-raised in the caller's thread
            result.append((False, error))

    thread = threading.Thread(target=run, name="ragged-attention-plan")
    thread.start()
    thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value


# --- the plan ---------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class Bucket:
    """``n`` segments padded to ``q_len`` query rows and ``k_len`` keys.

    Attributes:
        q_read, k_read: the rows to read, ``[n * len]`` (clamped into the segment where
            padded), or a range when the segments lie back to back unpadded.
        q_dest, k_dest: the row of every slot, ``[n * len]``, with padded slots sent to a dump
            row (the total number of rows); or the same range as the read when unpadded and
            back to back.
        q_keep: bool ``[n * q_len]``, the real query slots (``None``: all are real).
        q_real, q_real_dest: for a padded bucket, the positions of the real query slots in
            ``[n * q_len]`` and their rows (the forward writes only real rows).
        key_keep: bool ``[n * k_len]``, the real key slots (``None``: all are real).
        pair_range: the bucket's pairs in a pair bias as one range (unpadded, back to back).
        pair_start, q_counts, k_counts: int64 ``[n]``, each segment's first pair and lengths
            (to index the bias otherwise).
        segments: int64 ``[n]``, the segments' indices in the batch (for per-segment variants).

    Every tensor is flat and made by ``torch.frombuffer`` (see the module doc); shapes are
    applied with views at each use.
    """

    n: int
    q_len: int
    k_len: int
    q_read: Rows
    k_read: Rows
    q_dest: Rows
    k_dest: Rows
    q_keep: Tensor | None
    q_real: Tensor | None
    q_real_dest: Tensor | None
    key_keep: Tensor | None
    pair_range: tuple[int, int] | None
    pair_start: Tensor
    q_counts: Tensor
    k_counts: Tensor
    segments: Tensor


@dataclasses.dataclass(eq=False)
class Plan:
    """The buckets of one (query level, key level) pair and the host facts they came from."""

    buckets: list[Bucket]
    host_q: list[int]
    host_k: list[int]
    pairs: int  # sum_b Lq_b * Lk_b
    idle_q: bool  # some query rows have no keys (their output and gradient are 0)
    idle_k: bool  # some key rows have no queries (their gradients are 0)
    padded: bool  # some bucket pads its segments


def plan(q_level: RowPartition, k_level: RowPartition, head_numel: int) -> Plan:
    """The bucket plan for attention of ``q_level``'s segments over ``k_level``'s (cached)."""
    per_q = _PLANS.get(q_level)
    if per_q is None:
        per_q = _PLANS[q_level] = weakref.WeakKeyDictionary()
    per_k: dict[int, Plan] | None = per_q.get(k_level)
    if per_k is None:
        per_k = per_q[k_level] = {}
    found = per_k.get(head_numel)
    if found is None:
        lq = host_lengths(q_level)
        lk = lq if k_level is q_level else host_lengths(k_level)
        built = build_plan(lq, lk, head_numel)
        device = q_level.lengths.device
        if device.type != "cpu":
            built = _outside_transforms(lambda: _to_device(built, device))
        found = per_k[head_numel] = built
    return found


def _groups(lq: list[int], lk: list[int], head_numel: int) -> list[list[int]]:
    """Greedy buckets in order of decreasing pairs: a segment joins the current bucket while
    the padded pairs per merged segment stay below the cost of a call."""
    budget = CALL_COST / max(1, head_numel)
    order = sorted((b for b in range(len(lq)) if lq[b] and lk[b]), key=lambda b: -lq[b] * lk[b])
    groups: list[list[int]] = []
    current: list[int] = []
    top_q = top_k = area = 0
    for b in order:
        new_q, new_k = max(top_q, lq[b]), max(top_k, lk[b])
        count = len(current) + 1
        if current and count * new_q * new_k - area - lq[b] * lk[b] > budget * (count - 1):
            groups.append(sorted(current))
            current, new_q, new_k, area = [], lq[b], lk[b], 0
        current.append(b)
        top_q, top_k, area = new_q, new_k, area + lq[b] * lk[b]
    if current:
        groups.append(sorted(current))
    return groups


def _offsets(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def build_plan(lq: list[int], lk: list[int], head_numel: int) -> Plan:
    qo, ko = _offsets(lq), _offsets(lk)
    po = _offsets([a * c for a, c in zip(lq, lk, strict=True)])
    buckets = []
    for group in _groups(lq, lk, head_numel):
        n = len(group)
        q_len, k_len = max(lq[b] for b in group), max(lk[b] for b in group)
        q_read, q_dest, q_keep = _slots(group, lq, qo, q_len)
        k_read, k_dest, k_keep = _slots(group, lk, ko, k_len)
        q_real = q_real_dest = None
        if q_keep is not None:
            real, real_dest = array.array("q"), array.array("q")
            for i, b in enumerate(group):
                real.extend(range(i * q_len, i * q_len + lq[b]))
                real_dest.extend(range(qo[b], qo[b] + lq[b]))
            q_real, q_real_dest = _ints(real), _ints(real_dest)
        pair_range = None
        if isinstance(q_read, tuple) and isinstance(k_read, tuple):
            pair_range = (po[group[0]], po[group[0]] + n * q_len * k_len)
        buckets.append(
            Bucket(
                n,
                q_len,
                k_len,
                q_read,
                k_read,
                q_dest,
                k_dest,
                q_keep,
                q_real,
                q_real_dest,
                k_keep,
                pair_range,
                _ints(array.array("q", [po[b] for b in group])),
                _ints(array.array("q", [lq[b] for b in group])),
                _ints(array.array("q", [lk[b] for b in group])),
                _ints(array.array("q", group)),
            )
        )
    idle_q = any(a and not c for a, c in zip(lq, lk, strict=True))
    idle_k = any(c and not a for a, c in zip(lq, lk, strict=True))
    padded = any(b.q_keep is not None or b.key_keep is not None for b in buckets)
    return Plan(buckets, lq, lk, po[-1], idle_q, idle_k, padded)


def _slots(
    group: list[int], lengths: list[int], offsets: list[int], size: int
) -> tuple[Rows, Rows, Tensor | None]:
    """For a bucket's segments padded to ``size``: the rows to read, the destination of every
    slot, and which slots are real (``None`` when all are)."""
    n, total = len(group), offsets[-1]
    first = offsets[group[0]]
    if all(lengths[b] == size for b in group):
        if all(offsets[b] == first + i * size for i, b in enumerate(group)):
            return (first, first + n * size), (first, first + n * size), None
        rows = array.array("q")
        for b in group:
            rows.extend(range(offsets[b], offsets[b] + size))
        index = _ints(rows)
        return index, index, None
    read, dest, keep = array.array("q"), array.array("q"), array.array("b")
    for b in group:
        start, length, pad = offsets[b], lengths[b], size - lengths[b]
        read.extend(range(start, start + length))
        read.extend(itertools.repeat(start + length - 1, pad))
        dest.extend(range(start, start + length))
        dest.extend(itertools.repeat(total, pad))
        keep.extend(itertools.repeat(1, length))
        keep.extend(itertools.repeat(0, pad))
    return _ints(read), _ints(dest), _flags(keep)


def _to_device(p: Plan, device: torch.device) -> Plan:
    def move(x: Any) -> Any:
        return x.to(device) if isinstance(x, Tensor) else x

    for bucket in p.buckets:
        for field in dataclasses.fields(bucket):
            setattr(bucket, field.name, move(getattr(bucket, field.name)))
    return p
