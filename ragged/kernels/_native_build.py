"""Building and loading the native segment kernels: ``ragged/kernels/_native.c``, compiled on
first use and loaded with ctypes (the calls are in ``ragged.kernels._native``).

Why native code. On sorted segments a reduction is one pass over the rows in order, with the
segment's accumulators in cache and each output written once. No torch composition does that on
CPU: measured here (one thread, ``[2**20, 64]`` float32 in 8192 segments; a copy into a warm
buffer takes 20-26 ms, so a pass that reads the values once has a floor of 10-13 ms)
``index_add_`` in chunks takes 15-17 ms, ``embedding_bag(mode="sum")`` 16-18 ms, a CSR matmul
37-39 ms, ``segment_reduce`` 70 ms, while the C loop takes 12-13 ms, as long as a loop
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
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["library", "load"]

_SOURCE = Path(__file__).with_name("_native.c")
_FLAGS = ("-O3", "-fno-trapping-math", "-std=c99", "-shared", "-fPIC")
_NATIVE_FLAGS = ("-march=native",)

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "lib": the loaded library or None once tried


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads: forget a held lock."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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


def _build(
    compiler: str,
    target: Path,
    defines: Sequence[str] = (),
    source: Path = _SOURCE,
    flags: Sequence[str] = (),
) -> bool:
    """Compile ``source`` into ``target`` (atomically), with the macros ``defines`` (``"N=V"``,
    for tools that build variants: the library builds with none) and the extra ``flags``;
    ``False`` if the compiler fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    macros = [f"-D{d}" for d in defines]
    for extra in (_NATIVE_FLAGS, ()):  # without -march=native where the compiler rejects it
        fd, tmp = tempfile.mkstemp(suffix=target.suffix, dir=target.parent)
        os.close(fd)
        cmd = [compiler, *_FLAGS, *flags, *extra, *macros, str(source), "-o", tmp, "-lm"]
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


def load(source: Path, stem: str, flags: Sequence[str] = ()) -> Any:
    """The C file ``source`` built (once per source, compiler, flags and CPU) into the cache as
    ``{stem}_{key}.so`` and loaded with ctypes; ``None`` without a compiler, when the build
    fails or with ``RAGGED_NATIVE=0``. The caller declares the functions' signatures."""
    if os.environ.get("RAGGED_NATIVE", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        return None
    key = hashlib.sha256(
        b"\0".join(
            [
                source.read_bytes(),
                compiler.encode(),
                " ".join((*_FLAGS, *flags, *_NATIVE_FLAGS)).encode(),
                _cpu_key().encode(),
                platform.platform().encode(),
            ]
        )
    ).hexdigest()[:20]
    suffix = ".dll" if os.name == "nt" else ".so"
    target = _cache_dir() / f"{stem}_{key}{suffix}"
    try:
        if not target.exists() and not _build(compiler, target, source=source, flags=flags):
            return None
        return ctypes.CDLL(str(target))
    except OSError:
        return None


def _load() -> Any:
    lib = load(_SOURCE, "segment")
    if lib is not None:
        _declare(lib)
    return lib


def _declare(lib: Any) -> None:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    rows = [ptr, i64, i64, ptr, i64, i64]  # values, row stride, D, offsets, B, N
    for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        signatures = {
            "rg_sum": [*rows, i32, ptr],
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
