"""Variable-length attention on torch's fused CUDA kernels: no padding, no buckets, no host read.

torch's flash-attention and memory-efficient kernels take packed rows ``[T, H, D]`` with the
cumulative sequence lengths of the batch (``cu_seqlens``, int32 ``[B + 1]``: the offsets) and
the longest sequence as a host integer. That is exactly a ragged axis: the offsets are the
partition's, and the maximum length is the partition's static metadata
(``RowPartition.max_length``, recorded by the factories from host data), so a call needs no
read of the device. ``torch.nested`` (jagged layout) calls the same private ops on CUDA
(``torch/nested/_internal/sdpa.py``, torch 2.13):

* flash: ``aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p,
  is_causal, return_debug_mask, scale=)``, output ``[Tq, H, D]``;
* memory-efficient: ``aten._efficient_attention_forward(q[None], k[None], v[None], bias,
  cu_q, cu_k, max_q, max_k, dropout_p, custom_mask_type, compute_log_sumexp, scale=)``,
  output ``[1, Tq, H, Dv]``; mask type 1 is causal from the top left (as SDPA's
  ``is_causal``).

Both ops carry autograd formulas in torch (``_flash_attention_backward`` and
``_efficient_attention_backward``, the ops torch.nested's gradients run through too), so
gradients flow with no ``autograd.Function`` here. They have no forward-AD, batching (vmap) or
double-backward rule: ``select`` keeps ``torch.func`` transforms and forward AD on the
general path, and double backward (``create_graph=True``) through this path raises torch's
"derivative not implemented" error (set ``ENABLED`` to ``False`` to use the general path).

Which kernel (``choose``, a pure function of static facts, tested on any machine):

* a CUDA tensor, both maximum lengths known, no pair bias (neither kernel takes a per-segment
  bias), none of the variants the kernels do not take (relative-position tables, ALiBi with a
  gradient, document or prefix masks, ``score_mod``, ``mask_mod``), at least one query row and
  one key row, and no ``torch.func`` transform or forward AD;
* flash for float16/bfloat16 with ``Dq == Dv``, a multiple of 8, at most 256: it takes
  grouped-query heads (``H_kv`` dividing ``H``) and a window (``window_size_left/right``,
  saved by torch's autograd formula for the backward) natively;
* else memory-efficient for float16/bfloat16/float32 with ``Dq`` and ``Dv`` multiples of 8
  (4 for float32), without a window, in eager mode only: under ``torch.compile`` torch 2.13's
  fake-tensor rule for its backward takes the wrong arguments, so compiled float32 attention
  keeps the tiled path. It takes equal heads only: with grouped-query heads the keys and
  values are repeated to ``H`` heads first (one copy, as torch's SDPA does for this kernel);
* and torch must agree that the kernel runs on this device with these settings
  (``torch.backends.cuda.can_use_flash_attention`` / ``can_use_efficient_attention`` on a
  dense probe: GPU architecture, the ``torch.backends.cuda.enable_*_sdp`` switches). Under
  ``torch.compile`` that answer is taken once, when the graph is traced.

Otherwise ``ragged.attention`` takes its general path (``_attention_tiles.py`` with static
bounds on accelerators, the CPU buckets on CPU). A query row whose segment has no keys gives
0, as on the general path: in cross-attention the output is masked with ``where`` (the kernels
leave such rows to their own conventions).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from .._partition import RowPartition

FLASH = "flash"
EFFICIENT = "efficient"

# Set to False to keep ragged.attention on its general path on every device.
ENABLED = True
# Device types whose tensors the fused kernels take (tests add "cpu" with an emulated kernel).
DEVICES = frozenset({"cuda"})

_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_EFFICIENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FLASH_MAX_HEAD_DIM = 256

# torch's private variable-length ops (the ones torch.nested calls); names, so tests can swap in
# an emulation on CPU.
_flash_forward = torch.ops.aten._flash_attention_forward
_efficient_forward = torch.ops.aten._efficient_attention_forward


@dataclasses.dataclass(frozen=True)
class Call:
    """The static facts of one attention call that decide the kernel (no tensor data).

    Attributes:
        device: device type of the queries (``"cuda"``, ``"cpu"``, ...).
        dtype: dtype of ``q``, ``k`` and ``v``.
        head_dim, value_dim: ``Dq`` (= ``Dk``) and ``Dv``.
        empty: ``q`` or ``k`` has no rows (a size known to be 0; under ``torch.compile`` a
            symbolic size is not guarded on, so it counts as not empty).
        max_q, max_k: the partitions' static maximum lengths, ``None`` when unknown.
        bias: a pair bias is given.
        transformed: a ``torch.func`` transform or forward-mode AD sees the inputs.
        compiling: ``torch.compile`` is tracing.
    """

    device: str
    dtype: torch.dtype
    head_dim: int
    value_dim: int
    empty: bool
    max_q: int | None
    max_k: int | None
    bias: bool = False
    transformed: bool = False
    compiling: bool = False
    window: bool = False
    variants: str = ""


class Choice(NamedTuple):
    """The kernel (``FLASH``, ``EFFICIENT`` or ``None``: the general path) and why."""

    kernel: str | None
    reason: str


def choose(call: Call, flash_ok: bool, efficient_ok: bool) -> Choice:
    """The fused kernel for ``call``, or ``None`` for the general path, with the reason.

    ``flash_ok`` / ``efficient_ok``: torch's own verdict for this device, dtype and head sizes
    (architecture, enabled backends); see ``torch_allows``.

    >>> call = Call("cuda", torch.float16, 64, 64, empty=False, max_q=40, max_k=40)
    >>> choose(call, flash_ok=True, efficient_ok=True)
    Choice(kernel='flash', reason='float16, head size 64')
    >>> choose(dataclasses.replace(call, max_k=None), True, True).reason
    'the maximum key length is not known statically (a host read)'
    """
    if call.device not in DEVICES:
        return Choice(None, f"device {call.device!r}: the fused kernels are CUDA kernels")
    if call.bias:
        return Choice(None, "a pair bias: the variable-length kernels take no per-segment bias")
    if call.variants:
        return Choice(None, f"{call.variants}: the variable-length kernels do not take it")
    if call.transformed:
        return Choice(None, "a torch.func transform or forward AD: the kernels have no rule")
    for side, known in (("query", call.max_q), ("key", call.max_k)):
        if known is None:
            return Choice(None, f"the maximum {side} length is not known statically (a host read)")
    if call.empty:
        return Choice(None, "no query rows or no key rows")
    dtype = str(call.dtype).removeprefix("torch.")
    sizes = f"head size {call.head_dim}" + (
        f", value size {call.value_dim}" if call.value_dim != call.head_dim else ""
    )
    if (
        call.dtype in _FLASH_DTYPES
        and call.value_dim == call.head_dim
        and call.head_dim % 8 == 0
        and call.head_dim <= FLASH_MAX_HEAD_DIM
        and flash_ok
    ):
        return Choice(FLASH, f"{dtype}, {sizes}")
    if call.window:
        return Choice(None, f"{dtype}, {sizes}, a window: only the flash kernel takes one")
    align = 4 if call.dtype == torch.float32 else 8
    if call.dtype not in _EFFICIENT_DTYPES:
        return Choice(None, f"{dtype}: the fused kernels take float16, bfloat16 and float32")
    if call.head_dim % align or call.value_dim % align:
        return Choice(None, f"{dtype}, {sizes}: not a multiple of {align}")
    if call.compiling:
        return Choice(None, f"{dtype} under torch.compile: the memory-efficient kernel is eager")
    if not efficient_ok:
        return Choice(None, f"{dtype}, {sizes}: torch cannot run its kernels here")
    return Choice(EFFICIENT, f"{dtype}, {sizes}")


# torch's verdict per (device index, dtype, head sizes, causal, dropout, grad): it does not
# change while a process runs unless the user flips the torch.backends.cuda switches.
_VERDICTS: dict[tuple[object, ...], tuple[bool, bool]] = {}


def torch_allows(
    index: int, dtype: str, head_dim: int, value_dim: int, causal: bool, dropout: bool, grad: bool
) -> tuple[bool, bool]:
    """Whether torch would run its (flash, memory-efficient) kernel here: asks
    ``torch.backends.cuda.can_use_*_attention`` about a small dense probe of the same dtype and
    head sizes on CUDA device ``index``. A constant when compiling (taken at trace time)."""
    key = (index, dtype, head_dim, value_dim, causal, dropout, grad)
    found = _VERDICTS.get(key)
    if found is None:
        from torch.backends.cuda import (
            SDPAParams,
            can_use_efficient_attention,
            can_use_flash_attention,
        )

        kind = getattr(torch, dtype)
        device = torch.device("cuda", index)
        q = torch.zeros((1, 1, 16, head_dim), dtype=kind, device=device, requires_grad=grad)
        v = torch.zeros((1, 1, 16, value_dim), dtype=kind, device=device, requires_grad=grad)
        params = SDPAParams(q, q, v, None, 0.5 if dropout else 0.0, causal, False)
        found = _VERDICTS[key] = (
            can_use_flash_attention(params),
            can_use_efficient_attention(params),
        )
    return found


# A constant when compiling: what ``torch.compiler.assume_constant_result`` sets, without
# importing Dynamo when ragged loads (tests/test_attention_varlen.py checks the two agree).
torch_allows._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _transformed(*tensors: Tensor) -> bool:
    """A ``torch.func`` transform wraps the tensors, or forward-mode AD gives them tangents."""
    return any(
        torch._C._functorch.is_functorch_wrapped_tensor(t)
        or fwAD.unpack_dual(t).tangent is not None
        for t in tensors
    )


def _known_zero(size: int | torch.SymInt) -> bool:
    """``size == 0`` for a plain int; a symbolic size (under ``torch.compile``) is not guarded on."""
    return isinstance(size, int) and size == 0


def select(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_level: RowPartition,
    k_level: RowPartition,
    *,
    bias: bool,
    causal: bool,
    dropout_p: float,
    window: bool = False,
    variants: str = "",
) -> str | None:
    """The fused kernel for this call, or ``None`` (see ``choose``). Reads no tensor data;
    on a CPU tensor it returns after one comparison."""
    if not ENABLED or q.device.type not in DEVICES:
        return None
    compiling = torch.compiler.is_compiling()
    call = Call(
        q.device.type,
        q.dtype,
        int(q.shape[-1]),
        int(v.shape[-1]),
        _known_zero(q.shape[0]) or _known_zero(k.shape[0]),
        q_level.max_length,
        k_level.max_length,
        bias,
        # Dynamo traces transforms itself; in eager mode a wrapped tensor means a transform.
        not compiling and _transformed(q, k, v),
        compiling,
        window,
        variants,
    )
    if call.device == "cuda":
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        dtype = str(q.dtype).removeprefix("torch.")
        flash_ok, efficient_ok = torch_allows(
            index, dtype, call.head_dim, call.value_dim, causal, dropout_p > 0.0, grad
        )
    else:  # another device type enabled in DEVICES (tests): no torch verdict to ask for
        flash_ok = efficient_ok = True
    return choose(call, flash_ok, efficient_ok).kernel


def attention(
    kernel: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_level: RowPartition,
    k_level: RowPartition,
    scale: float,
    causal: bool,
    dropout_p: float,
    window: tuple[int | None, int | None] | None = None,
) -> Tensor:
    """``[Tq, H, Dv]``: every query row attends over the keys of its segment, on ``kernel``.

    ``q``: ``[Tq, H, D]``, ``k``: ``[Tk, H_kv, D]``, ``v``: ``[Tk, H_kv, Dv]`` in the row
    order of ``q_level`` and ``k_level``, whose ``max_length`` must be known (``select``
    checks). ``window``: ``(left, right)`` for flash (``None`` sides unbounded).
    """
    max_q, max_k = q_level.max_length, k_level.max_length
    if max_q is None or max_k is None:
        raise ValueError("varlen attention needs the partitions' maximum lengths (see select)")
    # The kernels read rows with a unit stride in the last axis; contiguous() is free if so.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    cu_q = q_level.offsets.to(torch.int32)
    cu_k = cu_q if k_level is q_level else k_level.offsets.to(torch.int32)
    if kernel == FLASH:
        sizes = {}
        if window is not None:  # -1: unbounded; a causal window ends at the query
            left, right = window
            sizes["window_size_left"] = -1 if left is None else left
            sizes["window_size_right"] = 0 if causal else (-1 if right is None else right)
        out = _flash_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, causal, False, scale=scale, **sizes
        )[0]
    elif kernel == EFFICIENT:
        if k.shape[1] != q.shape[1]:  # grouped-query heads: this kernel takes equal heads
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        # The log-sum-exp is only computed when a backward pass will need it.
        lse = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        out = _efficient_forward(
            q[None],
            k[None],
            v[None],
            None,
            cu_q,
            cu_k,
            max_q,
            max_k,
            dropout_p,
            int(causal),
            lse,
            scale=scale,
        )[0][0]
    else:
        raise ValueError(f"no such kernel: {kernel!r}")
    if k_level is not q_level:
        # Cross-attention: a query row of a segment without keys gives 0 (and passes no
        # gradient), whatever the kernel writes there.
        has_keys = k_level.lengths.index_select(0, q_level.row_ids) > 0
        out = torch.where(has_keys[:, None, None], out, 0.0)
    return out
