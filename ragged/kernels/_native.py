"""Native streaming segment kernels: a small C library compiled on first use, loaded with ctypes.

Why native code. On sorted segments a reduction is one pass over the rows in order, with the
segment's accumulators in cache and each output written once. No torch composition does that on
CPU: measured here (one thread, ``[2**20, 64]`` float32 in 8192 segments; a copy into a warm
buffer takes 20-26 ms, so a pass that reads the values once has a floor of 10-13 ms)
``index_add_`` in chunks takes 15-17 ms, ``embedding_bag(mode="sum")`` 16-18 ms, a CSR matmul
37-39 ms, ``segment_reduce`` 70 ms, while the C loop below takes 12-13 ms, as long as a loop
that only reads the values, and level with JAX's ``segment_sum``. For softmax, logsumexp and the
scans the gap is wider: their torch compositions make several passes and full-size temporaries.

Why C through ctypes, not a torch C++ extension or Inductor. ``ragged/kernels/_native.c``
includes only libc headers: it compiles in about 3 s of CPU time (once per machine), where a
torch C++ extension including ``torch/extension.h`` took 32 s and a bare ``torch/library.h``
op 10 s (measured here, ``g++ -O2``); Inductor's generated C++ needs the same compiler plus its
own warm-up. Needs a C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang`` on the ``PATH``);
nothing is built at install time.

Cache and fallback. The library is built once per source, compiler, flags and CPU (the flags use
``-march=native``; the CPU's model and feature flags are part of the key, so a shared home
directory never loads code built for another CPU) into ``$RAGGED_CACHE_DIR`` (default
``$XDG_CACHE_HOME/torch-ragged`` or ``~/.cache/torch-ragged``), written to a temporary file and
renamed, so concurrent processes are safe. Without a compiler, when the build fails, or with
``RAGGED_NATIVE=0``, :func:`library` returns ``None`` and every caller takes its torch path:
same results, slower. The build is tried at most once per process.

What it computes. Float32 and float64 CPU tensors ``[N, D]`` whose inner elements are contiguous
(any row stride), grouped by int64 offsets into contiguous segments: sum, max/min, mean and
squared deviations (variance), logsumexp, softmax/log-softmax and the five scans, with their
backward passes. Sums, products and log-sum-exp accumulate in double for both dtypes (a float32
segment of 10^6 rows keeps the accuracy of a float64 sum); the float32 ``exp``/``log`` are
branch-free Cephes polynomials (about 1 ulp) so that the compiler vectorises them (with
``-fno-trapping-math``: without it GCC vectorised none of the exp loops, and logsumexp and
softmax ran 3-7x slower).
Every kernel checks that the offsets are non-decreasing and within the rows before reading (a
partition built with ``validate=False`` can be wrong) and raises ``ValueError`` otherwise.
Large outputs are allocated on transparent huge pages (:func:`empty`). With
``torch.get_num_threads() > 1`` the segments are split into ranges of about equal rows, one per
thread (the calls release the GIL); each segment is still reduced by one thread in row order,
so results do not depend on the thread count.

Callers (``ragged.kernels._segment``, ``ragged.kernels._scan``) decide when to use it: eager mode
only (``torch.compile`` traces the torch composites, which Inductor fuses), CPU, plain tensors
(not functorch wrappers: see :func:`usable`).
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

__all__ = ["differentiable", "empty", "library", "plain", "usable"]

_SOURCE = Path(__file__).with_name("_native.c")
_DTYPES = {torch.float32: "f32", torch.float64: "f64"}
_FLAGS = ("-O3", "-fno-trapping-math", "-std=c99", "-shared", "-fPIC")
_NATIVE_FLAGS = ("-march=native",)

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "lib": the loaded library or None once tried


def _cache_dir() -> Path:
    if "RAGGED_CACHE_DIR" in os.environ:
        return Path(os.environ["RAGGED_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torch-ragged"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_key() -> str:
    """What ``-march=native`` depends on: the CPU model and feature flags where readable."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        wanted = [ln for ln in lines if ln.startswith(("flags", "model name", "Features"))]
        return "\n".join(sorted(set(wanted)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _build(compiler: str, target: Path) -> bool:
    """Compile the source into ``target`` (atomically); ``False`` if the compiler fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for extra in (_NATIVE_FLAGS, ()):  # without -march=native where the compiler rejects it
        fd, tmp = tempfile.mkstemp(suffix=target.suffix, dir=target.parent)
        os.close(fd)
        cmd = [compiler, *_FLAGS, *extra, str(_SOURCE), "-o", tmp, "-lm"]
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=120, check=False)
            if done.returncode == 0:
                os.replace(tmp, target)
                return True
        except (OSError, subprocess.SubprocessError):
            pass
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return False


def _load() -> Any:
    if os.environ.get("RAGGED_NATIVE", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        return None
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join(
            [
                source,
                compiler.encode(),
                " ".join(_FLAGS + _NATIVE_FLAGS).encode(),
                _cpu_key().encode(),
                platform.platform().encode(),
            ]
        )
    ).hexdigest()[:20]
    suffix = ".dll" if os.name == "nt" else ".so"
    target = _cache_dir() / f"segment_{key}{suffix}"
    try:
        if not target.exists() and not _build(compiler, target):
            return None
        lib = ctypes.CDLL(str(target))
    except OSError:
        return None
    _declare(lib)
    return lib


def _declare(lib: Any) -> None:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.rg_advise_huge.argtypes = [ptr, i64]
    lib.rg_advise_huge.restype = i32
    rows = [ptr, i64, i64, ptr, i64, i64]  # values, row stride, D, offsets, B, N
    for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        signatures = {
            "rg_sum": [*rows, ptr],
            "rg_extreme": [*rows, real, i32, ptr],
            "rg_moments": [*rows, ptr, ptr],
            "rg_affine_rows": [*rows, ptr, ptr, ptr],
            "rg_extreme_bwd": [*rows, ptr, ptr, i64, ptr],
            "rg_logsumexp": [*rows, ptr],
            "rg_logsumexp_bwd": [*rows, ptr, ptr, i64, ptr],
            "rg_softmax": [*rows, i32, ptr],
            "rg_softmax_bwd": [ptr, ptr, i64, i64, ptr, i64, i64, i32, ptr],
            "rg_scan": [*rows, i32, i32, i32, ptr],
            "rg_scan_bwd": [ptr, i64, ptr, ptr, i64, i64, ptr, i64, i64, i32, i32, i32, ptr],
        }
        for name, args in signatures.items():
            fn = getattr(lib, f"{name}_{suffix}")
            fn.argtypes = args
            fn.restype = ctypes.c_int


def library() -> Any:
    """The loaded library, or ``None`` where it cannot be built (then torch paths run).

    The first call builds or loads it (about a second to build, once per machine).
    """
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                _state["lib"] = _load()
    return _state["lib"]


def plain(t: Tensor) -> bool:
    """A CPU tensor with its own storage (not a functorch wrapper, fake or meta tensor)."""
    if type(t) is not Tensor or t.device.type != "cpu" or t.layout != torch.strided:
        return False
    if t.is_neg() or t.is_conj():
        return False
    try:
        t.data_ptr()
    except RuntimeError:
        return False
    return True


def differentiable(t: Tensor) -> bool:
    """Whether a :func:`plain` tensor ``t`` carries a gradient graph or a forward-mode tangent
    (then no ``out=``, and no kernel outside an ``autograd.Function``)."""
    if t.requires_grad and torch.is_grad_enabled():
        return True
    return fwAD.unpack_dual(t).tangent is not None


def usable(values: Tensor, *others: Tensor | None) -> bool:
    """Whether the native kernels can run on ``values`` (and ``others``, same dtype)."""
    if values.dtype not in _DTYPES or not plain(values):
        return False
    if any(o is not None and (o.dtype != values.dtype or not plain(o)) for o in others):
        return False
    return library() is not None


_HUGE_MIN_BYTES = 4 << 20


def empty(shape: Any, dtype: torch.dtype) -> Tensor:
    """``torch.empty`` on the CPU, on transparent huge pages where possible (large buffers).

    Every fresh tensor over ~32 MB is mapped afresh by the default allocator and faulted in on
    first touch, 4 KB at a time: ~140 ms for 256 MB on these VMs, ~30 ms with 2 MB pages. Only
    a hint to the OS (Linux ``madvise``; nothing elsewhere, or when the library is missing).
    """
    out = torch.empty(shape, dtype=dtype)
    nbytes = out.numel() * out.element_size()
    if nbytes >= _HUGE_MIN_BYTES:
        lib = library()
        if lib is not None:
            lib.rg_advise_huge(out.data_ptr(), nbytes)
    return out


# --- calling the kernels ----------------------------------------------------------------------


def _rows(t: Tensor) -> tuple[Tensor, int, int]:
    """``t`` as ``[N, D]`` rows with contiguous inner elements: (tensor, row stride, D)."""
    n = t.shape[0]
    inner = t.shape[1:]
    d = 1
    for s in inner:
        d *= s
    # Inner elements contiguous among themselves (any row stride): view as [N, D].
    expected = 1
    ok = True
    for size, stride in zip(reversed(inner), reversed(t.stride()[1:]), strict=True):
        if size != 1 and stride != expected:
            ok = False
            break
        expected *= size
    if not ok:
        t = t.contiguous()
    row_stride = t.stride(0) if n > 1 else d
    return t, row_stride, d


def _check(code: int, func: str) -> None:
    if code == 1:
        raise ValueError(
            f"ragged.kernels.{func}: the segment offsets are not non-decreasing within the rows "
            "of the values (was the partition built with validate=False from bad input?)."
        )
    if code:
        raise MemoryError(f"ragged.kernels.{func}: out of memory")


def _offsets(offsets: Tensor) -> Tensor:
    if offsets.dtype == torch.int64 and offsets.is_contiguous():
        return offsets
    return offsets.to(torch.int64).contiguous()


class _PerSegment(NamedTuple):
    """A pointer to per-segment rows: a call on segments ``b0:b1`` starts ``b0`` rows later."""

    ptr: int
    row_bytes: int  # 0 for a row broadcast to every segment


_OFFSETS, _NUM = object(), object()  # where the (shifted) offsets and the segment count go
_PARALLEL_MIN_NUMEL = 1 << 18
_pool_state: dict[str, Any] = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    """The worker threads, made afresh when their count changes."""
    with _lock:
        pool = _pool_state.get("pool")
        if pool is None or _pool_state["workers"] != workers:
            if pool is not None:
                pool.shutdown(wait=False)
            pool = ThreadPoolExecutor(workers, thread_name_prefix="ragged-native")
            _pool_state.update(pool=pool, workers=workers)
    return pool


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads: forget the pool (and a held lock)."""
    global _lock
    _lock = threading.Lock()
    _pool_state.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _ranges(off: Tensor, numel: int) -> list[tuple[int, int]]:
    """Segment ranges with about equal rows, one per torch thread (the kernels release the GIL:
    each range runs on its own thread, as torch's own ops use ``torch.get_num_threads()``)."""
    num = off.shape[0] - 1
    threads = torch.get_num_threads()
    if threads <= 1 or num < 2 or numel < _PARALLEL_MIN_NUMEL:
        return [(0, num)]
    rows = int(off[-1])
    targets = torch.arange(1, threads, dtype=torch.int64) * rows // threads
    cuts = torch.searchsorted(off, targets).clamp(0, num).tolist()
    bounds = sorted({0, num, *cuts})
    return list(itertools.pairwise(bounds))


def _launch(name: str, dtype: torch.dtype, offsets: Tensor, numel: int, *args: Any) -> None:
    """Call kernel ``name`` for ``dtype`` over all segments, split across threads."""
    fn = getattr(library(), f"{name}_{_DTYPES[dtype]}")
    off = _offsets(offsets)

    def call(bounds: tuple[int, int]) -> int:
        b0, b1 = bounds
        real = []
        for a in args:
            if a is _OFFSETS:
                real.append(off.data_ptr() + 8 * b0)
            elif a is _NUM:
                real.append(b1 - b0)
            elif isinstance(a, _PerSegment):
                real.append(a.ptr + b0 * a.row_bytes)
            else:
                real.append(a)
        return int(fn(*real))

    ranges = _ranges(off, numel)
    run = map if len(ranges) == 1 else _pool(len(ranges)).map
    for code in list(run(call, ranges)):
        _check(code, name)


def _per_segment(t: Tensor) -> _PerSegment:
    """A ``[B, *inner]`` tensor (contiguous) as per-segment rows."""
    return _PerSegment(t.data_ptr(), t[0].numel() * t.element_size() if t.shape[0] else 0)


def _grad_rows(grad: Tensor, shape: Any) -> tuple[Tensor, int]:
    """A gradient as rows of contiguous inner elements: (tensor, row stride; 0 if broadcast)."""
    g, gs, _ = _rows(grad.expand(shape))
    return g, gs


def _reduced(values: Tensor, offsets: Tensor) -> Tensor:
    return values.new_empty((offsets.shape[0] - 1, *values.shape[1:]))


def segment_sum(values: Tensor, offsets: Tensor) -> Tensor:
    """``[B, *inner]`` sums of the segments ``values[offsets[b]:offsets[b + 1]]``."""
    v, rs, d = _rows(values)
    out = _reduced(values, offsets)
    n = v.shape[0]
    _launch(
        "rg_sum",
        v.dtype,
        offsets,
        v.numel(),
        v.data_ptr(),
        rs,
        d,
        _OFFSETS,
        _NUM,
        n,
        _per_segment(out),
    )
    return out


def segment_moments(values: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    """Per-segment mean and sum of squared deviations from it (NaN and 0 for empty ones)."""
    v, rs, d = _rows(values)
    mean = _reduced(values, offsets)
    m2 = torch.empty_like(mean)
    n = v.shape[0]
    _launch(
        "rg_moments",
        v.dtype,
        offsets,
        v.numel(),
        v.data_ptr(),
        rs,
        d,
        _OFFSETS,
        _NUM,
        n,
        _per_segment(mean),
        _per_segment(m2),
    )
    return mean, m2


def affine_rows(values: Tensor, offsets: Tensor, scale: Tensor, centre: Tensor) -> Tensor:
    """``scale[b] * (values - centre[b])`` for the rows of every segment ``b``."""
    v, rs, d = _rows(values)
    scale, centre = scale.contiguous(), centre.contiguous()
    out = empty(values.shape, values.dtype)
    n = v.shape[0]
    _launch(
        "rg_affine_rows",
        v.dtype,
        offsets,
        v.numel(),
        v.data_ptr(),
        rs,
        d,
        _OFFSETS,
        _NUM,
        n,
        _per_segment(scale),
        _per_segment(centre),
        out.data_ptr(),
    )
    return out


def segment_extreme(values: Tensor, offsets: Tensor, fill: float, largest: bool) -> Tensor:
    """Per-segment max (``largest``) or min; NaN propagates; empty segments give ``fill``."""
    v, rs, d = _rows(values)
    out = _reduced(values, offsets)
    n = v.shape[0]
    _launch(
        "rg_extreme",
        v.dtype,
        offsets,
        v.numel(),
        v.data_ptr(),
        rs,
        d,
        _OFFSETS,
        _NUM,
        n,
        fill,
        int(largest),
        _per_segment(out),
    )
    return out


def segment_extreme_backward(values: Tensor, offsets: Tensor, best: Tensor, grad: Tensor) -> Tensor:
    """Gradient of :func:`segment_extreme`: split evenly among the rows attaining it."""
    v, rs, d = _rows(values)
    best = best.contiguous()
    g, gs = _grad_rows(grad, best.shape)
    out = empty(values.shape, values.dtype)
    n = v.shape[0]
    _launch(
        "rg_extreme_bwd",
        v.dtype,
        offsets,
        v.numel(),
        v.data_ptr(),
        rs,
        d,
        _OFFSETS,
        _NUM,
        n,
        _per_segment(best),
        _PerSegment(g.data_ptr(), gs * g.element_size()),
        gs,
        out.data_ptr(),
    )
    return out


def segment_logsumexp(values: Tensor, offsets: Tensor) -> Tensor:
    """Per-segment ``log(sum(exp(rows)))``, shifted by the segment's finite maximum."""
    v, rs, d = _rows(values)
    out = _reduced(values, offsets)
    n = v.shape[0]
    _launch(
        "rg_logsumexp",
        v.dtype,
        offsets,
        v.numel(),
        v.data_ptr(),
        rs,
        d,
        _OFFSETS,
        _NUM,
        n,
        _per_segment(out),
    )
    return out


def segment_logsumexp_backward(
    values: Tensor, offsets: Tensor, out: Tensor, grad: Tensor
) -> Tensor:
    """``grad[b] * exp(values - out[b])`` for the rows of every segment ``b``."""
    v, rs, d = _rows(values)
    out = out.contiguous()
    g, gs = _grad_rows(grad, out.shape)
    result = empty(values.shape, values.dtype)
    n = v.shape[0]
    _launch(
        "rg_logsumexp_bwd",
        v.dtype,
        offsets,
        v.numel(),
        v.data_ptr(),
        rs,
        d,
        _OFFSETS,
        _NUM,
        n,
        _per_segment(out),
        _PerSegment(g.data_ptr(), gs * g.element_size()),
        gs,
        result.data_ptr(),
    )
    return result


def segment_softmax(values: Tensor, offsets: Tensor, log: bool) -> Tensor:
    """Softmax (or log-softmax) of the rows of every segment, elementwise over inner axes."""
    v, rs, d = _rows(values)
    out = empty(values.shape, values.dtype)
    n = v.shape[0]
    _launch(
        "rg_softmax",
        v.dtype,
        offsets,
        v.numel(),
        v.data_ptr(),
        rs,
        d,
        _OFFSETS,
        _NUM,
        n,
        int(log),
        out.data_ptr(),
    )
    return out


def segment_softmax_backward(out: Tensor, offsets: Tensor, grad: Tensor, log: bool) -> Tensor:
    """Vector-Jacobian product of :func:`segment_softmax` (``out`` its result)."""
    o, _, d = _rows(out.contiguous())
    g, gs = _grad_rows(grad, out.shape)
    result = empty(out.shape, out.dtype)
    n = o.shape[0]
    _launch(
        "rg_softmax_bwd",
        o.dtype,
        offsets,
        o.numel(),
        o.data_ptr(),
        g.data_ptr(),
        gs,
        d,
        _OFFSETS,
        _NUM,
        n,
        int(log),
        result.data_ptr(),
    )
    return result


SCAN_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "logsumexp": 4}


def segment_scan(
    values: Tensor, offsets: Tensor, op: str, reverse: bool, exclusive: bool
) -> Tensor:
    """The scan ``op`` within every segment (from its end with ``reverse``)."""
    v, rs, d = _rows(values)
    out = empty(values.shape, values.dtype)
    n = v.shape[0]
    _launch(
        "rg_scan",
        v.dtype,
        offsets,
        v.numel(),
        v.data_ptr(),
        rs,
        d,
        _OFFSETS,
        _NUM,
        n,
        SCAN_OPS[op],
        int(reverse),
        int(exclusive),
        out.data_ptr(),
    )
    return out


def segment_scan_backward(
    values: Tensor,
    offsets: Tensor,
    out: Tensor,
    grad: Tensor,
    op: str,
    reverse: bool,
    exclusive: bool,
) -> Tensor:
    """Vector-Jacobian product of :func:`segment_scan` for prod, max, min and logsumexp."""
    v, rs, d = _rows(values)
    out = out.contiguous()
    g, gs = _grad_rows(grad, out.shape)
    result = empty(values.shape, values.dtype)
    n = v.shape[0]
    _launch(
        "rg_scan_bwd",
        v.dtype,
        offsets,
        v.numel(),
        v.data_ptr(),
        rs,
        out.data_ptr(),
        g.data_ptr(),
        gs,
        d,
        _OFFSETS,
        _NUM,
        n,
        SCAN_OPS[op],
        int(reverse),
        int(exclusive),
        result.data_ptr(),
    )
    return result
