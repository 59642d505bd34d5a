"""Native tiled attention on CPU: ``ragged/kernels/_native_attention.c``, loaded with ctypes.

Why. The eager CPU path groups sequences into length buckets and calls torch's CPU
flash-attention kernel once per bucket (``_attention_buckets.py``). Measured on the batch of
issue 27 (``benchmarks/attention.py``) that kernel ran at 26-35% of the matmul rate of one
``[512, 64] @ [64, 512]`` tile, with its time in the kernel itself. The native kernel is a
flash-attention-2 loop in C over the packed rows, with no buckets, copies or padding: per
(sequence, head, block of ``BLOCK_Q`` query rows) the scores of a block of ``BLOCK_K`` keys are
one GEMM call of torch's own BLAS (``sgemm_``/``dgemm_``, exported by ``libtorch_cpu``: MKL on
x86 wheels), the online softmax runs in C on the tile while it is in cache, and ``P V`` is a
second GEMM into the block's accumulator; the output is written once with each row's
log-sum-exp. In float32, where the build targets AVX-512 (``-march=native`` on such a CPU;
:func:`micro_kernel`), the forward skips BLAS: the keys are copied once, transposed, into tiles
of 64, and a micro-kernel of the library's own keeps the scores of 6 query rows by up to 64
keys in registers, runs the online softmax there and adds ``P V`` into the rows' accumulators;
on the causal diagonal it computes only the 16-key vectors that its rows see. The float32
backward does the same with ``P``, ``dP`` and ``dS`` per 6 rows (head widths a multiple of 16).
On the batch of issue 27 that made the forward 1.4-1.6x and the backward 1.5x faster than the
BLAS tiles (``MICRO_KERNEL = False`` keeps those). The backward recomputes the probabilities from that log-sum-exp (four more GEMMs
per tile); one work item is a sequence and a key-value head, so grouped-query gradients of the
keys and values add up in one thread's cache and no two threads write one row. Work is split
over ``torch.get_num_threads()`` threads (pthreads in the C code, items taken largest first
from a shared counter; each item runs on one thread in a fixed order, so results do not depend
on the thread count; a call too small to pay for starting a thread stays on fewer).

What it takes (:func:`runs`): float32 or float64 plain CPU tensors ``q`` ``[Tq, H, D]``,
``k`` ``[Tk, H_kv, D]``, ``v`` ``[Tk, H_kv, Dv]`` with ``H_kv`` dividing ``H``, causal (from
the top left, as SDPA's ``is_causal``) or not, and none of the other variants (pair bias,
windows, ALiBi, relative positions, document or prefix masks, ``mask_mod``, ``score_mod``,
dropout): those keep the bucket path. A query row whose segment has no keys gives 0.

How it is wired. In eager mode :func:`attention` is an ``autograd.Function`` whose backward
runs the native backward (or, when a graph of the gradient is recorded or the gradient is
batched, the bucket path's matmul formulas); ``torch.func`` transforms and forward-mode AD see
wrapped tensors and keep the bucket path, which has their rules. Under ``torch.compile`` the
custom op ``ragged::bucketed_attention`` (``_attention_op.py``) calls :func:`forward` and
:func:`backward` inside when :func:`runs`: one graph, no host read. ``ENABLED = False`` keeps
every call on the bucket path; without a C compiler or with ``RAGGED_NATIVE=0`` the library
is not built and the same happens.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from . import _attention_buckets as buckets
from . import _native_build
from ._attention_mods import Extras, Variant
from ._native import differentiable, plain

__all__ = [
    "BACKWARD_BLOCK_K",
    "BACKWARD_BLOCK_Q",
    "BLOCK_K",
    "BLOCK_Q",
    "ENABLED",
    "MICRO_KERNEL",
    "attention",
    "backward",
    "forward",
    "micro_kernel",
    "offsets_of",
    "profile",
    "runs",
]

# Set to False to keep ragged.attention on the bucket path on CPU.
ENABLED = True
# Query rows and keys of one tile, forward and backward (docs/benchmarks.md, "Attention").
BLOCK_Q = 64
BLOCK_K = 512
BACKWARD_BLOCK_Q = 64
BACKWARD_BLOCK_K = 64
# float32 on the kernel's own AVX-512 micro-kernel where the build has it (the C file says
# how); False keeps it on the BLAS tiles above.
MICRO_KERNEL = True

_SOURCE = Path(__file__).with_name("_native_attention.c")
_DTYPES = {torch.float32: ("f32", ctypes.c_float), torch.float64: ("f64", ctypes.c_double)}
_lock = threading.Lock()
_state: dict[str, Any] = {}


def _libtorch_symbols() -> tuple[int, int, int] | None:
    """Addresses of ``sgemm_``, ``dgemm_`` and MKL's ``MKL_Set_Num_Threads_Local`` (0 if absent;
    the lower-case name is the Fortran interface, which takes a pointer)
    in the loaded ``libtorch_cpu``; ``None`` when it exports no BLAS."""
    names = ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll")
    folder = Path(torch.__file__).with_name("lib")
    for name in names:
        path = folder / name
        if not path.exists():
            continue
        try:
            lib = ctypes.CDLL(str(path))
            found = [
                ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value or 0
                if hasattr(lib, symbol)
                else 0
                for symbol in ("sgemm_", "dgemm_", "MKL_Set_Num_Threads_Local")
            ]
        except OSError:
            return None
        if found[0] and found[1]:
            return found[0], found[1], found[2]
    return None


def _load(profiled: bool = False) -> Any:
    symbols = _libtorch_symbols()
    if symbols is None:
        return None
    flags = ("-pthread", "-fopenmp-simd", *(("-DRGA_PROFILE",) if profiled else ()))
    lib = _native_build.load(_SOURCE, "attention_profile" if profiled else "attention", flags)
    if lib is None:
        return None
    lib.rga_profile.argtypes = [ctypes.c_void_p]
    lib.rga_profile.restype = ctypes.c_int
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.rga_micro_kernel.argtypes = []
    lib.rga_micro_kernel.restype = i32
    lib.rga_init.argtypes = [ptr, ptr, ptr]
    lib.rga_init.restype = i32
    lib.rga_init(*(s or None for s in symbols))
    for suffix, real in _DTYPES.values():
        fwd = getattr(lib, f"rga_forward_{suffix}")
        fwd.argtypes = [*[ptr] * 5, *[i64] * 7, real, i32, i64, i64, i32, i32, ptr, ptr]
        fwd.restype = i32
        bwd = getattr(lib, f"rga_backward_{suffix}")
        bwd.argtypes = [ptr] * 8 + [*[i64] * 7, real, i32, i64, i64, i32, i32, ptr, ptr, ptr]
        bwd.restype = i32
    return lib


def library() -> Any:
    """The loaded kernel library, or ``None`` where it cannot be built or has no BLAS."""
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                _state["lib"] = _load()
    return _state["lib"]


def micro_kernel() -> bool:
    """Whether this build runs float32 on its own micro-kernel (AVX-512)."""
    lib = library()
    return lib is not None and bool(lib.rga_micro_kernel())


def profile(run: Callable[[], Any]) -> tuple[float, float]:
    """Where the kernel's time goes (for ``benchmarks/attention.py --profile``): calls ``run()``
    on a build that counts time-stamp ticks, and returns the ticks inside the kernels' work
    items and the share of them inside the GEMM calls (the rest: the softmax in C, the
    rescaling and the writes). Raises ``RuntimeError`` where the profiling build is unavailable
    (it reads the x86 time-stamp counter)."""
    lib = _load(profiled=True)
    if lib is None:
        raise RuntimeError("ragged.kernels._native_attention.profile: no profiling build here")
    ticks = (ctypes.c_uint64 * 2)()
    normal = library()
    _state["lib"] = lib
    try:
        lib.rga_profile(ticks)
        run()
        lib.rga_profile(ticks)
    finally:
        _state["lib"] = normal
    return float(ticks[1]), ticks[0] / max(ticks[1], 1)


def runs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    extras: Extras,
    variant: Variant,
    dropout_p: float = 0.0,
) -> bool:
    """Whether the native kernel computes this call (see the module docstring)."""
    if not ENABLED or q.dtype not in _DTYPES or bias is not None or dropout_p != 0.0:
        return False
    if any(x is not None for x in extras):
        return False
    if variant.windowed or variant.mask_mod is not None or variant.score_mod is not None:
        return False
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        return False
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        return False
    if not all(plain(x) and x.dtype == q.dtype and not _tangent(x) for x in (q, k, v)):
        return False
    return library() is not None


def _tangent(x: Tensor) -> bool:
    """Forward-mode AD sees ``x`` (the Function has no jvp: the bucket path has one)."""
    return fwAD.unpack_dual(x).tangent is not None


def offsets_of(lengths: Tensor) -> Tensor:
    """int64 offsets ``[B + 1]`` of segments of ``lengths`` (``[B]``)."""
    out = lengths.new_zeros(lengths.shape[0] + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


def _check(code: int, func: str) -> None:
    if code == 1:
        raise ValueError(
            f"ragged.kernels.{func}: the segment offsets are not non-decreasing within the rows "
            "(was the partition built with validate=False from bad input?)."
        )
    if code:
        raise MemoryError(f"ragged.kernels.{func}: out of memory")


def _offsets(offsets: Tensor) -> Tensor:
    return offsets.to(torch.int64).contiguous()


def _call(
    kernel: str,
    inputs: tuple[Tensor, ...],
    qkv: tuple[Tensor, Tensor, Tensor],
    scale: float,
    causal: bool,
    outputs: tuple[Tensor, ...],
) -> None:
    """Run ``rga_{kernel}`` on the pointers of ``inputs`` (data, then the two offsets), the sizes
    of ``q``, ``k``, ``v``, the settings, and the pointers of ``outputs``."""
    q, k, v = qkv
    fn = getattr(library(), f"rga_{kernel}_{_DTYPES[q.dtype][0]}")
    heads = (q.shape[1], k.shape[1], q.shape[2], v.shape[2])  # H, H_kv, D, Dv
    sizes = (inputs[-1].shape[0] - 1, q.shape[0], k.shape[0], *heads)  # B, Tq, Tk, ...
    code = fn(
        *(x.data_ptr() for x in inputs),
        *sizes,
        scale,
        int(causal),
        *((BLOCK_Q, BLOCK_K) if kernel == "forward" else (BACKWARD_BLOCK_Q, BACKWARD_BLOCK_K)),
        torch.get_num_threads(),
        int(MICRO_KERNEL),
        *(x.data_ptr() for x in outputs),
    )
    _check(code, f"native_attention.{kernel}")


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_offsets: Tensor,
    k_offsets: Tensor,
    scale: float,
    causal: bool,
) -> tuple[Tensor, Tensor]:
    """Output ``[Tq, H, Dv]`` and log-sum-exp ``[Tq, H]`` (0 where a row has no keys)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    qo, ko = _offsets(q_offsets), _offsets(k_offsets)
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
    lse = q.new_empty((q.shape[0], q.shape[1]))
    _call("forward", (q, k, v, qo, ko), (q, k, v), scale, causal, (out, lse))
    return out, lse


def backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    q_offsets: Tensor,
    k_offsets: Tensor,
    scale: float,
    causal: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``q``, ``k`` and ``v`` from the output's ``grad`` (``out`` and ``lse`` from
    :func:`forward`); rows outside every segment get 0."""
    q, k, v, out = q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous()
    grad = grad.contiguous()
    lse = lse.to(q.dtype).contiguous()
    qo, ko = _offsets(q_offsets), _offsets(k_offsets)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # all written
    inputs = (q, k, v, out, grad, lse, qo, ko)
    _call("backward", inputs, (q, k, v), scale, causal, (dq, dk, dv))
    return dq, dk, dv


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_offsets: Tensor,
    k_offsets: Tensor,
    scale: float,
    causal: bool,
    fallback: Any,
) -> Tensor:
    """``[Tq, H, Dv]``, differentiable (first order natively). ``fallback()`` gives the bucket
    plan for the backward when a graph of the gradient is recorded or the gradient is batched
    (``_attention_buckets.vjp`` then runs, as on the bucket path)."""
    out, _ = _NativeAttention.apply(q, k, v, q_offsets, k_offsets, scale, causal, fallback)
    return out


class _NativeAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_offsets: Tensor,
        k_offsets: Tensor,
        scale: float,
        causal: bool,
        fallback: Any,
    ) -> tuple[Tensor, Tensor]:
        return forward(q, k, v, q_offsets, k_offsets, scale, causal)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        q, k, v, q_offsets, k_offsets, scale, causal, fallback = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        # no zero gradient made for lse (a parallel fill that woke torch's thread pool, whose
        # spinning took a core from the kernel's threads)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, q_offsets, k_offsets, out, lse)
        ctx.scale, ctx.causal, ctx.fallback = scale, causal, fallback

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None, _grad_lse: Any) -> tuple[Any, ...]:
        if grad is None:  # no gradient reached the output
            return (None,) * 8
        q, k, v, q_offsets, k_offsets, out, lse = ctx.saved_tensors
        need = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled() or not plain(grad) or differentiable(grad):
            variant = Variant(causal=ctx.causal)
            grads = buckets.vjp(
                ctx.fallback(),
                q,
                k,
                v,
                None,
                Extras(),
                out,
                lse,
                grad,
                ctx.scale,
                variant,
                (*need, False),
            )
        else:
            grads = backward(grad, q, k, v, out, lse, q_offsets, k_offsets, ctx.scale, ctx.causal)
        return (*(g if n else None for g, n in zip(grads[:3], need, strict=True)), *[None] * 5)
