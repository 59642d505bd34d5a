"""Variable-length attention in eager mode: segments grouped into length buckets.

Segments of equal length form a *bucket*; each bucket is one call of torch's CPU
flash-attention kernel on ``[n, H, L, D]`` (the kernel behind ``F.scaled_dot_product_attention``).
A bucket of one segment, or of segments that lie back to back in ``values``, reads its rows as a
view (no copy); others gather their rows.

Buckets may also merge near-equal lengths, padded to the longest (padded keys masked with
``-inf``, padded query rows dropped: still exact), by a cost model: merging a segment saves one
kernel call (:data:`CALL_COST`, in units of "pairs x head width") and costs its padded pairs. On
CPU the measured cost of a call is below that of masking, so by default buckets hold equal
lengths only; the padded buckets are kept (and tested) for devices where calls cost more.

Planning needs the lengths on the host: they are read once per partition *level* (partitions
are immutable; the plan is cached per level object, weakly), so a model with many attention
layers over one batch reads them once. The plan is built in plain Python and its index tensors
are made with ``torch.frombuffer``: a tensor made by a torch op inside a ``torch.func``
transform belongs to that transform (functorch wraps it), so a plan first built under
``hessian`` would otherwise leak wrapped tensors into later calls; ``frombuffer`` tensors are
plain. Index tensors that scale with the number of pairs (for a bias) are computed per call.

The kernel is an ``autograd.Function``:

* ``backward`` calls torch's flash backward kernel; for a bias that needs a gradient (the kernel
  does not return one) and for other head widths of ``v`` it recomputes the bucket's
  probabilities from the saved log-sum-exp with batched matmuls. Results go into buffers made from the incoming gradient, so it runs
  batched too (``autograd.grad(..., is_grads_batched=True)``; the flash kernel then runs through
  vmap's slow fallback, with torch's performance warning). When a graph of the gradient is being built
  (double backward), the matmul formulas run out of place with a differentiable softmax.
* ``jvp`` (forward-mode AD): ``dS = scale (dq k^T + q dk^T) + dbias``,
  ``dP = P (dS - rowsum(P dS))``, ``dO = dP v + P dv``, bucket by bucket.
* ``vmap`` folds the vmapped dimension into the heads: ``V`` attention problems with ``H`` heads
  are one problem with ``V * H`` heads.
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

# Buckets with at least this many query rows use torch's flash backward kernel when they can.
# Measured here it is as fast as the batched matmuls or faster for every bucket shape but very
# many very short segments, and one call instead of a dozen.
FLASH_BACKWARD_MIN = 1

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default

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


def _pair_index(bucket: Bucket, dump: int | None = None) -> Tensor:
    """Index of every (query, key) slot of the bucket in the bias values, ``[n, q_len,
    k_len]``: clamped into the segment where padded (``dump is None``, for reading), or the dump
    row ``dump`` there (for writing). Computed per call (its size is the bucket's pairs)."""
    device = bucket.pair_start.device
    i = torch.arange(bucket.q_len, device=device).view(1, -1, 1)
    j = torch.arange(bucket.k_len, device=device).view(1, 1, -1)
    nq, nk = bucket.q_counts.view(-1, 1, 1), bucket.k_counts.view(-1, 1, 1)
    start = bucket.pair_start.view(-1, 1, 1)
    if dump is None:
        return start + torch.minimum(i, nq - 1) * nk + torch.minimum(j, nk - 1)
    inside = (i < nq) & (j < nk)
    return torch.where(inside, start + i * nk + j, dump)


def _read(x: Tensor, rows: Rows, n: int, size: int) -> Tensor:
    """A bucket's rows of ``x`` (``[T, H, D]``) as ``[n, H, size, D]``."""
    block = x[rows[0] : rows[1]] if isinstance(rows, tuple) else x.index_select(0, rows)
    return block.view(n, size, *x.shape[1:]).transpose(1, 2)


def _write(buffer: Tensor, dest: Rows, part: Tensor) -> None:
    """Write a bucket's ``[n, H, size, D]`` result rows into ``buffer`` (``[T + 1, H, D]``; row
    ``T`` is a dump for padded slots)."""
    rows = part.transpose(1, 2)  # [n, size, H, D]
    if isinstance(dest, tuple):
        buffer[dest[0] : dest[1]].view_as(rows).copy_(rows)
    else:
        buffer.index_put_((dest.view(rows.shape[:2]),), rows)


def _buffer(sources: tuple[Tensor | None, ...], rows: int, tail: Any, like: Tensor) -> Tensor:
    """Zeros ``[rows + 1, *tail]`` (the last row is a dump) of ``like``'s dtype and device,
    batched under ``vmap`` when any source is: made from an empty slice of the sources rather
    than by a factory. The result is returned as the view ``[:rows]``."""
    anchor = None
    for source in sources:
        if source is not None:
            zero = source.reshape(-1)[:0].sum()
            anchor = zero if anchor is None else anchor + zero
    if anchor is None:
        return like.new_zeros((rows + 1, *tail))
    return anchor.to(like.dtype).expand(rows + 1, *tail).contiguous()


def _result(p: Plan, idle: bool, sources: tuple[Tensor | None, ...], shape: torch.Size) -> Tensor:
    """The buffer a gradient or tangent of ``shape`` is written into. Uninitialised and without
    a dump row when every row is written (no padding, no idle rows) and there is one source of
    that shape: its ``empty_like``, batched under ``vmap`` when the source is. Else
    :func:`_buffer` (batched when any source is)."""
    present = [s for s in sources if s is not None]
    if not p.padded and not idle and len(present) == 1 and present[0].shape == shape:
        return torch.empty_like(present[0], memory_format=torch.contiguous_format)
    like = next(s for s in sources if s is not None)
    return _buffer(sources, shape[0], tuple(shape[1:]), like)


def _trim(buffer: Tensor, rows: int) -> Tensor:
    """Drop the dump row of a :func:`_buffer` (no-op for an exact buffer)."""
    return buffer if buffer.shape[0] == rows else buffer[:rows]


def _mask(bucket: Bucket, bias: Tensor | None, dtype: torch.dtype, causal: bool) -> Tensor | None:
    """The additive mask of a bucket: the bias (``[n, H, q_len, k_len]``) plus ``-inf`` at padded
    keys; ``None`` when there is neither. With ``causal`` (self-attention) padded keys need no
    mask: they come after every real query row."""
    mask = None if bias is None else _bias_block(bucket, bias)
    if bucket.key_keep is not None and not causal:
        keep = bucket.key_keep.view(bucket.n, 1, 1, bucket.k_len)
        pad = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
        pad = pad.masked_fill_(~keep, float("-inf"))
        mask = pad if mask is None else mask + pad
    return mask


def _bias_block(bucket: Bucket, bias: Tensor) -> Tensor:
    """A bucket's block of the pair bias ``[pairs, H]`` as ``[n, H, q_len, k_len]``."""
    if bucket.pair_range is not None:
        block = bias[bucket.pair_range[0] : bucket.pair_range[1]]
    else:
        block = bias.index_select(0, _pair_index(bucket).view(-1))
    return block.view(bucket.n, bucket.q_len, bucket.k_len, -1).permute(0, 3, 1, 2)


def _scores(
    qb: Tensor, kb: Tensor, mask: Tensor | None, scale: float, causal: bool, inplace: bool = True
) -> Tensor:
    """Masked scores ``[n, H, q_len, k_len]`` (out of place when a graph is recorded)."""
    scores = torch.matmul(qb, kb.transpose(-1, -2))
    above = None
    if causal:
        shape = scores.shape[-2:]
        above = torch.ones(shape, dtype=torch.bool, device=scores.device).triu_(1)
    if not inplace:
        scores = scores * scale
        if mask is not None:
            scores = scores + mask
        return scores if above is None else scores.masked_fill(above, float("-inf"))
    scores.mul_(scale)
    if mask is not None:
        scores.add_(mask)
    return scores if above is None else scores.masked_fill_(above, float("-inf"))


def _safe_softmax(scores: Tensor) -> Tensor:
    """Softmax over the keys that gives 0, not NaN, for a row whose keys are all masked (as the
    flash kernel does), with finite derivatives of every order. The shift is detached:
    softmax is invariant to it."""
    peak = scores.detach().amax(-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, 0.0)
    weights = torch.exp(scores - peak)
    total = weights.sum(-1, keepdim=True)
    return weights / torch.where(total > 0, total, 1.0)


def _forward_bucket(
    qb: Tensor, kb: Tensor, vb: Tensor, mask: Tensor | None, scale: float, causal: bool
) -> tuple[Tensor, Tensor]:
    """Output ``[n, H, q_len, Dv]`` and log-sum-exp ``[n, H, q_len]`` of one bucket."""
    if qb.shape[-1] == vb.shape[-1] and qb.device.type == "cpu":
        return _flash(qb, kb, vb, 0.0, causal, attn_mask=mask, scale=scale)
    scores = _scores(qb, kb, mask, scale, causal)
    lse = torch.logsumexp(scores, -1)
    weights = scores.sub_(lse.unsqueeze(-1)).exp_()
    return torch.matmul(weights, vb), lse.to(lse_dtype(qb.dtype))


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the log-sum-exp the flash kernel returns for inputs of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _unit_stride(x: Tensor) -> Tensor:
    """``x`` with a unit stride on its last axis (the flash kernel needs it; a copy if not)."""
    return x if x.stride(-1) == 1 else x.contiguous()


# --- the kernel -------------------------------------------------------------------------------


def bucketed_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, p: Plan, scale: float, causal: bool
) -> Tensor:
    """Attention of ``q`` ``[Tq, H, D]`` over ``k``/``v`` ``[Tk, H, D(v)]`` by the plan ``p``."""
    out, _ = _BucketedAttention.apply(q, k, v, bias, p, scale, causal)
    return out


def forward(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, p: Plan, scale: float, causal: bool
) -> tuple[Tensor, Tensor]:
    """The output ``[Tq, H, Dv]`` and the log-sum-exp of every query row's scores ``[Tq, H]``
    (rows without keys: their entries are unspecified, and never read)."""
    q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
    heads = q.shape[1]
    make = q.new_zeros if p.idle_q else q.new_empty
    out = make((q.shape[0], heads, v.shape[-1]))
    lse = q.new_empty((q.shape[0], heads, 1), dtype=lse_dtype(q.dtype))
    for bucket in p.buckets:
        qb = _read(q, bucket.q_read, bucket.n, bucket.q_len)
        kb = _read(k, bucket.k_read, bucket.n, bucket.k_len)
        vb = _read(v, bucket.k_read, bucket.n, bucket.k_len)
        mask = _mask(bucket, bias, q.dtype, causal)
        ob, lse_b = _forward_bucket(qb, kb, vb, mask, scale, causal)
        lse_b = lse_b.unsqueeze(-1)  # [n, H, q_len, 1]
        if bucket.q_real is None or bucket.q_real_dest is None:
            _write(out, bucket.q_dest, ob)
            _write(lse, bucket.q_dest, lse_b)
        else:  # only the real rows: the outputs have no dump row (they are returned as is)
            for target, part in ((out, ob), (lse, lse_b)):
                rows = _rows_of(part).index_select(0, bucket.q_real)
                target.index_copy_(0, bucket.q_real_dest, rows)
    return out, lse.view(q.shape[0], heads)


def _rows_of(x: Tensor) -> Tensor:
    """``[n, H, len, D]`` -> ``[n * len, H, D]``."""
    return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[-1])


class _BucketedAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, p: Plan, scale: float, causal: bool
    ) -> tuple[Tensor, Tensor]:
        return forward(q, k, v, bias, p, scale, causal)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        q, k, v, bias, p, scale, causal = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, bias, out, lse)
        ctx.save_for_forward(q, k, v, bias)
        ctx.plan, ctx.scale, ctx.causal = p, scale, causal

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _grad_lse: Any) -> tuple[Any, ...]:
        q, k, v, bias, out, lse = ctx.saved_tensors
        need = ctx.needs_input_grad[:4]
        grads = vjp(ctx.plan, q, k, v, bias, out, lse, grad, ctx.scale, ctx.causal, need)
        return (*(g if n else None for g, n in zip(grads, need, strict=True)), None, None, None)

    @staticmethod
    def jvp(ctx: Any, dq: Any, dk: Any, dv: Any, dbias: Any, *_: Any) -> tuple[Tensor, None]:
        q, k, v, bias = ctx.saved_tensors
        tangent = _jvp(ctx.plan, q, k, v, bias, dq, dk, dv, dbias, ctx.scale, ctx.causal)
        return tangent, None

    @staticmethod
    def vmap(info: Any, in_dims: Any, *args: Any) -> Any:
        q, k, v, bias, p, scale, causal = args
        size = info.batch_size

        def fold(x: Tensor | None, dim: int | None) -> Tensor | None:
            if x is None:
                return None
            if dim is None:
                x = x.unsqueeze(1).expand(x.shape[0], size, *x.shape[1:])
            else:
                x = x.movedim(dim, 1)
            return x.reshape(x.shape[0], -1, *x.shape[3:])  # [rows, V * H, ...]

        q2, k2, v2 = (fold(x, d) for x, d in zip((q, k, v), in_dims[:3], strict=True))
        b2 = fold(bias, in_dims[3])
        out, lse = _BucketedAttention.apply(q2, k2, v2, b2, p, scale, causal)
        out = out.view(out.shape[0], size, -1, out.shape[-1])
        lse = lse.view(lse.shape[0], size, -1)
        return (out, lse), (1, 1)


def vjp(
    p: Plan,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    out: Tensor,
    lse: Tensor,
    grad: Tensor,
    scale: float,
    causal: bool,
    need: tuple[bool, ...],
) -> tuple[Tensor | None, ...]:
    """Gradients bucket by bucket, with batched matmuls.

    First order (no graph of the gradient): probabilities from the saved log-sum-exp, updated
    in place in fresh temporaries. When a graph of the gradient is being built (double
    backward), every step is out of place and the probabilities come from a differentiable
    softmax (the saved log-sum-exp carries no gradient; the saved output does, through this
    Function).
    """
    graph = torch.is_grad_enabled()
    q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
    heads, width, width_v = q.shape[1], q.shape[2], v.shape[2]
    delta = None  # [Tq, H, 1]: rowsum(dO * O), for the matmul formulas
    sources = (grad,)
    dq = _result(p, p.idle_q, sources, q.shape) if need[0] else None
    dk = _result(p, p.idle_k, sources, k.shape) if need[1] else None
    dv = _result(p, p.idle_k, sources, v.shape) if need[2] else None
    dbias = None
    if need[3] and bias is not None:
        dbias = _buffer(sources, bias.shape[0], (heads,), q)
    flash = not graph and not need[3] and width == width_v and q.device.type == "cpu"
    for bucket in p.buckets:
        n, q_len, k_len = bucket.n, bucket.q_len, bucket.k_len
        qb = _read(q, bucket.q_read, n, q_len)
        kb = _read(k, bucket.k_read, n, k_len)
        vb = _read(v, bucket.k_read, n, k_len)
        gb = _read(grad, bucket.q_read, n, q_len)
        q_keep = None if bucket.q_keep is None else bucket.q_keep.view(n, 1, q_len, 1)
        if q_keep is not None:  # padded query rows carry no gradient
            gb = torch.where(q_keep, gb, 0.0)
        # Padded slots read the log-sum-exp of the row they were read from (the same scores).
        lse_b = _read(lse.unsqueeze(-1), bucket.q_read, n, q_len).squeeze(-1)  # [n, H, q_len]
        mask = _mask(bucket, bias, q.dtype, causal)
        if flash and q_len >= FLASH_BACKWARD_MIN:
            ob = _read(out, bucket.q_read, n, q_len)
            dqb, dkb, dvb = _flash_backward(
                gb, qb, kb, vb, ob, lse_b.contiguous(), 0.0, causal, attn_mask=mask, scale=scale
            )
            for buffer, dest, part in ((dq, bucket.q_dest, dqb), (dk, bucket.k_dest, dkb)):
                if buffer is not None:
                    _write(buffer, dest, part)
            if dv is not None:
                _write(dv, bucket.k_dest, dvb)
            continue
        # Batched matmuls want contiguous [n, H, L, D] operands: copy each once.
        qb, kb, vb, gb = qb.contiguous(), kb.contiguous(), vb.contiguous(), gb.contiguous()
        if delta is None:
            delta = (grad * out).sum(-1, keepdim=True)
        db = _read(delta, bucket.q_read, n, q_len)  # [n, H, q_len, 1]
        if q_keep is not None:
            db = torch.where(q_keep, db, 0.0)
        scores = _scores(qb, kb, mask, scale, causal, inplace=not graph)
        dweights = torch.matmul(gb, vb.transpose(-1, -2))
        if graph:
            weights = _safe_softmax(scores)
            dscores = (dweights - db) * weights
        else:
            weights = scores.sub_(lse_b.unsqueeze(-1).to(scores.dtype)).exp_()
            dscores = dweights.sub_(db).mul_(weights)
        if dv is not None:
            _write(dv, bucket.k_dest, torch.matmul(weights.transpose(-1, -2), gb))
        if dq is not None:
            _write(dq, bucket.q_dest, torch.matmul(dscores, kb) * scale)
        if dk is not None:
            _write(dk, bucket.k_dest, torch.matmul(dscores.transpose(-1, -2), qb) * scale)
        if dbias is not None:
            block = dscores.permute(0, 2, 3, 1)  # [n, q_len, k_len, H]
            if bucket.pair_range is not None:
                dbias[bucket.pair_range[0] : bucket.pair_range[1]].view_as(block).copy_(block)
            else:
                dbias.index_put_((_pair_index(bucket, dump=dbias.shape[0] - 1),), block)
    shapes = (q.shape, k.shape, v.shape, None if bias is None else bias.shape)
    return tuple(
        None if x is None or shape is None else _trim(x, shape[0])
        for x, shape in zip((dq, dk, dv, dbias), shapes, strict=True)
    )


def _jvp(
    p: Plan,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    dq: Tensor | None,
    dk: Tensor | None,
    dv: Tensor | None,
    dbias: Tensor | None,
    scale: float,
    causal: bool,
) -> Tensor:
    """The output tangent, bucket by bucket (tangents may be batched)."""
    q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
    shape = (q.shape[0], q.shape[1], v.shape[2])
    out = _result(p, p.idle_q, (dq, dk, dv, dbias), torch.Size(shape))
    for bucket in p.buckets:
        n, q_len, k_len = bucket.n, bucket.q_len, bucket.k_len
        qb = _read(q, bucket.q_read, n, q_len)
        kb = _read(k, bucket.k_read, n, k_len)
        vb = _read(v, bucket.k_read, n, k_len)
        mask = _mask(bucket, bias, q.dtype, causal)
        weights = _safe_softmax(_scores(qb, kb, mask, scale, causal, inplace=False))
        dscores = None
        if dq is not None:
            dscores = torch.matmul(_read(dq, bucket.q_read, n, q_len), kb.transpose(-1, -2))
        if dk is not None:
            term = torch.matmul(qb, _read(dk, bucket.k_read, n, k_len).transpose(-1, -2))
            dscores = term if dscores is None else dscores + term
        if dscores is not None:
            dscores = dscores * scale
        if dbias is not None:
            term = _bias_block(bucket, dbias)
            dscores = term if dscores is None else dscores + term
        tangent = None
        if dscores is not None:
            dweights = weights * (dscores - (weights * dscores).sum(-1, keepdim=True))
            tangent = torch.matmul(dweights, vb)
        if dv is not None:
            term = torch.matmul(weights, _read(dv, bucket.k_read, n, k_len))
            tangent = term if tangent is None else tangent + term
        if tangent is not None:
            _write(out, bucket.q_dest, tangent)
    return _trim(out, shape[0])
