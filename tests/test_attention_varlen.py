"""``ragged.attention`` on torch's variable-length CUDA kernels, checked without a GPU.

Three checks that run on any machine (the GPU run itself is in ``tests/test_cuda.py``):

* the kernel choice (:func:`choose`, a pure function of static facts);
* the real private ops (``aten._flash_attention_forward`` / ``_efficient_attention_forward``)
  called exactly as ``ragged.attention`` calls them, on the meta device: argument order, output
  shapes and dtypes, gradients through torch's autograd formulas, and one compiled graph;
* the dispatch end to end on CPU with the two ops replaced by an emulation of their documented
  contract (per-segment SDPA over ``cu_seqlens``, checking the int32 offsets and the maximum
  lengths it is given): values and gradients against per-segment SDPA.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import ragged
from ragged._partition import RowPartition
from ragged.kernels import _attention_varlen as varlen
from ragged.kernels._attention_varlen import EFFICIENT, FLASH, Call, choose
from tests.optable.attention import attention_reference

BASE = Call("cuda", torch.float16, 64, 64, empty=False, max_q=40, max_k=30)


@pytest.mark.parametrize(
    ("change", "flash_ok", "efficient_ok", "kernel", "reason"),
    [
        ({}, True, True, FLASH, "float16, head size 64"),
        ({"dtype": torch.bfloat16, "head_dim": 256, "value_dim": 256}, True, True, FLASH, ""),
        ({}, False, True, EFFICIENT, "float16, head size 64"),  # e.g. a pre-Ampere GPU
        ({"dtype": torch.float32}, True, True, EFFICIENT, "float32, head size 64"),
        ({"dtype": torch.float32, "head_dim": 12, "value_dim": 20}, True, True, EFFICIENT, ""),
        ({"value_dim": 32}, True, True, EFFICIENT, "float16, head size 64, value size 32"),
        ({"head_dim": 264, "value_dim": 264}, True, True, EFFICIENT, ""),  # past flash's 256
        ({"head_dim": 12, "value_dim": 12}, True, True, None, "not a multiple of 8"),
        ({"dtype": torch.float32, "head_dim": 6}, True, True, None, "not a multiple of 4"),
        ({"dtype": torch.float64}, True, True, None, "take float16, bfloat16 and float32"),
        ({}, False, False, None, "torch cannot run its kernels here"),
        ({"device": "cpu"}, True, True, None, "the fused kernels are CUDA kernels"),
        ({"bias": True}, True, True, None, "no per-segment bias"),
        ({"transformed": True}, True, True, None, "torch.func transform"),
        ({"max_q": None}, True, True, None, "maximum query length is not known"),
        ({"max_k": None}, True, True, None, "maximum key length is not known"),
        ({"empty": True}, True, True, None, "no query rows or no key rows"),
        ({"compiling": True}, True, True, FLASH, ""),
        ({"compiling": True, "dtype": torch.float32}, True, True, None, "under torch.compile"),
    ],
)
def test_kernel_choice(change, flash_ok, efficient_ok, kernel, reason):
    choice = choose(dataclasses.replace(BASE, **change), flash_ok, efficient_ok)
    assert choice.kernel == kernel
    assert reason in choice.reason


def test_cpu_tensors_never_take_the_fused_kernels():
    level = RowPartition.from_lengths(torch.tensor([2, 3]), 5, max_length=3)
    q = torch.randn(5, 2, 8, dtype=torch.float16)
    assert varlen.select(q, q, q, level, level, bias=False, causal=False, dropout_p=0.0) is None


# --- the real ops on the meta device ----------------------------------------------------------


def _levels(device: str) -> tuple[RowPartition, RowPartition]:
    q_level = RowPartition.from_lengths(torch.tensor([3, 0, 5, 1]), 9, max_length=5)
    k_level = RowPartition.from_lengths(torch.tensor([2, 4, 0, 1]), 7, max_length=4)
    return q_level.to(torch.device(device)), k_level.to(torch.device(device))


def _meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=True)


@pytest.mark.parametrize("cross", [False, True])
def test_flash_call_shapes_and_gradients_on_meta(cross):
    q_level, k_level = _levels("meta")
    k_level = k_level if cross else q_level
    q = _meta((9, 2, 8), torch.float16)
    k = _meta((k_level.num_children, 2, 8), torch.float16)
    v = _meta((k_level.num_children, 2, 8), torch.float16)
    out = varlen.attention(FLASH, q, k, v, q_level, k_level, 0.3, not cross, 0.1)
    assert (out.shape, out.dtype) == ((9, 2, 8), torch.float16)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_flash_call_with_grouped_heads_and_a_window_on_meta():
    """The real op takes ``H_kv`` dividing ``H`` and ``window_size_left/right``; torch's
    autograd formula saves the window for the backward (checked on the node)."""
    q_level, _ = _levels("meta")
    q = _meta((9, 4, 8), torch.bfloat16)
    kv = _meta((9, 2, 8), torch.bfloat16)
    out = varlen.attention(FLASH, q, kv, kv, q_level, q_level, 0.3, True, 0.0, (3, None))
    assert out.shape == (9, 4, 8)
    node = out.grad_fn
    while node is not None and "FlashAttention" not in type(node).__name__:
        node = node.next_functions[0][0]
    assert node is not None
    assert (node._saved_window_size_left, node._saved_window_size_right) == (3, 0)
    grads = torch.autograd.grad(out.sum(), (q, kv))
    assert [g.shape for g in grads] == [q.shape, kv.shape]


def test_efficient_call_shapes_on_meta():
    """Forward only: torch 2.13's meta rule for ``_efficient_attention_backward`` lacks the
    ``out`` argument (so the backward runs on CUDA only, and compiled float32 attention keeps
    the tiled path; see ``choose``)."""
    q_level, k_level = _levels("meta")
    q, k = _meta((9, 2, 4), torch.float32), _meta((7, 2, 4), torch.float32)
    v = _meta((7, 2, 12), torch.float32)
    for causal in (False, True):
        out = varlen.attention(EFFICIENT, q, k, v, q_level, k_level, 0.5, causal, 0.0)
        assert (out.shape, out.dtype) == ((9, 2, 12), torch.float32)
        assert out.requires_grad


def test_flash_call_compiles_to_one_graph_with_its_backward_on_meta():
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    q_level, _ = _levels("meta")

    @torch.compile(backend=counter, fullgraph=True, dynamic=True)
    def f(q: torch.Tensor) -> torch.Tensor:
        return varlen.attention(FLASH, q, q, q, q_level, q_level, 0.25, True, 0.0)

    q = _meta((9, 2, 16), torch.bfloat16)
    (grad,) = torch.autograd.grad(f(q).sum(), q)
    assert grad.shape == q.shape and counter.frame_count == 1


# --- the dispatch on CPU, with the ops emulated -----------------------------------------------


class Emulated:
    """Per-segment SDPA with the signatures and output layouts of torch's two varlen ops; it
    checks what ``ragged.attention`` hands them (int32 offsets, exact maximum lengths) and
    records the calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @staticmethod
    def _check(cu_q, cu_k, max_q, max_k):
        assert cu_q.dtype == cu_k.dtype == torch.int32
        assert isinstance(max_q, int) and isinstance(max_k, int)
        assert max_q == int(cu_q.diff().max()) and max_k == int(cu_k.diff().max())

    @staticmethod
    def _segments(q, k, v, cu_q, cu_k, causal, scale, left=-1, right=-1):
        """flash-attention's conventions: grouped-query heads, a window (-1: unbounded)."""
        parts = []
        for b in range(cu_q.numel() - 1):
            qs = q[cu_q[b] : cu_q[b + 1]].transpose(0, 1)
            ks = k[cu_k[b] : cu_k[b + 1]].transpose(0, 1)
            vs = v[cu_k[b] : cu_k[b + 1]].transpose(0, 1)
            i = torch.arange(qs.shape[1]).view(-1, 1)
            j = torch.arange(ks.shape[1]).view(1, -1)
            keep = (j <= i) if causal else torch.ones(i.shape[0], j.shape[1], dtype=torch.bool)
            keep = keep & ((j >= i - left) if left >= 0 else True)
            keep = keep & ((j <= i + right) if right >= 0 else True)
            # A query row without keys: SDPA would give NaN; the caller must mask it.
            out = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=keep, scale=scale, enable_gqa=True
            )
            parts.append(out.transpose(0, 1))
        return torch.cat(parts)

    def flash(
        self,
        q,
        k,
        v,
        cu_q,
        cu_k,
        max_q,
        max_k,
        dropout_p,
        causal,
        debug,
        *,
        scale,
        window_size_left=-1,
        window_size_right=-1,
    ):
        self._check(cu_q, cu_k, max_q, max_k)
        assert q.shape[-1] == v.shape[-1] and not debug and dropout_p == 0.0
        assert q.shape[1] % k.shape[1] == 0
        self.calls.append(FLASH)
        out = self._segments(
            q, k, v, cu_q, cu_k, causal, scale, window_size_left, window_size_right
        )
        return out, None, None, None, None

    def efficient(self, q, k, v, bias, cu_q, cu_k, max_q, max_k, dropout_p, mask, lse, *, scale):
        self._check(cu_q, cu_k, max_q, max_k)
        assert q.shape[0] == 1 and bias is None and mask in (0, 1) and dropout_p == 0.0
        assert q.shape[2] == k.shape[2] == v.shape[2]  # equal heads only
        assert lse == (q.requires_grad or k.requires_grad or v.requires_grad)
        self.calls.append(EFFICIENT)
        out = self._segments(q[0], k[0], v[0], cu_q, cu_k, bool(mask), scale)
        return out[None], None, None, None, max_q, max_k


@pytest.fixture
def emulated(monkeypatch):
    """CPU tensors take the fused-kernel path, on the emulated ops."""
    fake = Emulated()
    monkeypatch.setattr(varlen, "DEVICES", frozenset({"cuda", "cpu"}))
    monkeypatch.setattr(varlen, "_flash_forward", fake.flash)
    monkeypatch.setattr(varlen, "_efficient_forward", fake.efficient)
    return fake


def _array(lengths, inner, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn((sum(lengths), *inner), generator=gen, dtype=torch.float64)
    return ragged.from_lengths(values.to(dtype).requires_grad_(), lengths)


def _reference(q, k, v, **kwargs):
    parts = [
        attention_reference(a.double(), b.double(), c.double(), **kwargs)
        for a, b, c in zip(q.unbind(), k.unbind(), v.unbind(), strict=True)
    ]
    return torch.cat(parts)


@pytest.mark.parametrize(
    ("dtype", "width", "kernel"),
    [(torch.float16, 8, FLASH), (torch.float32, 4, EFFICIENT), (torch.float32, 8, EFFICIENT)],
)
@pytest.mark.parametrize("kind", ["self", "causal", "cross", "scale"])
def test_dispatch_passes_offsets_and_max_lengths(emulated, dtype, width, kernel, kind):
    lengths = [3, 0, 7, 1, 4]
    q = _array(lengths, (2, width), 0, dtype)
    k, v = q, q.with_values(_array(lengths, (2, width), 1, dtype).values)
    if kind == "cross":  # key segments of other lengths, one empty under non-empty queries
        k = _array([2, 5, 0, 3, 6], (2, width), 2, dtype)
        v = k.with_values(_array([2, 5, 0, 3, 6], (2, width), 3, dtype).values)
    kwargs = {"causal": kind == "causal", "scale": 0.3 if kind == "scale" else None}
    out = ragged.attention(q, k, v, **kwargs)
    assert emulated.calls == [kernel]
    assert out.partition is q.partition and out.dtype == dtype
    want = _reference(q, k, v, **kwargs)
    tol = {"atol": 2e-3, "rtol": 2e-3} if dtype == torch.float16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out.values.double(), want, **tol)
    if kind == "cross":  # the query rows of segment 2 have no keys: 0
        assert out.values[3:10].eq(0).all()
    leaves = [q.values, k.values] + ([v.values] if v.values is not q.values else [])
    cotangent = torch.randn(out.values.shape, generator=torch.Generator().manual_seed(4))
    got = torch.autograd.grad(out.values, leaves, cotangent.to(dtype))
    want_grads = torch.autograd.grad(want, leaves, cotangent.double())
    for a, b in zip(got, want_grads, strict=True):
        torch.testing.assert_close(a.double(), b.double(), **tol)


def test_dispatch_keeps_the_general_path_for_bias_transforms_and_unknown_lengths(emulated):
    x = _array([3, 0, 5], (2, 8), 0, torch.float32)
    pairs = ragged.Partition.outer(x.partition.levels[0], x.partition.levels[0])
    bias = ragged.RaggedArray(torch.zeros(pairs.num_values, 2), pairs)
    ragged.attention(x, x, x, bias=bias)
    torch.func.vmap(lambda v: ragged.attention(x, x, x.with_values(v)).values)(
        x.values.detach().expand(2, *x.values.shape)
    )
    torch.func.grad(lambda v: ragged.attention(x.with_values(v), x, x).values.sum())(
        x.values.detach()
    )
    unknown = ragged.RaggedArray(x.values, ragged.Partition.from_lengths(x.lengths, 8))
    ragged.attention(unknown, unknown, unknown)
    assert emulated.calls == []
    ragged.attention(x, x, x)
    assert emulated.calls == [EFFICIENT]


def test_accelerator_fallback_is_the_tiled_path_without_host_reads(monkeypatch):
    """Off CPU, when no fused kernel applies (here: float64, a pair bias), eager attention runs
    the tiled formulation with static bounds: no host read (run here on meta tensors, where any
    read fails) and the same values as per-segment SDPA (run on CPU as if it were a device)."""
    monkeypatch.setattr(ragged.ops._attention, "BUCKET_DEVICES", ())
    x = _array([3, 0, 5, 1], (2, 3), 0, torch.float64)
    k = _array([2, 4, 0, 6], (2, 3), 1, torch.float64)
    for q, key in ((x, x), (x, k)):
        out = ragged.attention(q, key, key, causal=key is q)
        torch.testing.assert_close(out.values, _reference(q, key, key, causal=key is q))
        meta = [a.to("meta") for a in (q, key)]
        if key is q:
            meta[1] = meta[0]
        assert ragged.attention(meta[0], meta[1], meta[1]).values.shape == q.values.shape


def test_torch_allows_is_a_compile_time_constant():
    """Marked as torch.compiler.assume_constant_result marks (without importing Dynamo early)."""
    marked = torch.compiler.assume_constant_result(lambda: None)
    assert varlen.torch_allows._dynamo_marked_constant is marked._dynamo_marked_constant is True


@pytest.mark.parametrize(("dtype", "kernel"), [(torch.float16, FLASH), (torch.float32, EFFICIENT)])
@pytest.mark.parametrize("kind", ["gqa", "gqa_window_causal", "window"])
def test_dispatch_of_grouped_heads_and_windows(emulated, dtype, kernel, kind):
    """Grouped-query heads go to flash as they are (to the memory-efficient kernel repeated);
    a window goes to flash as ``window_size_left/right`` and keeps other dtypes on the general
    path."""
    lengths = [3, 0, 7, 1, 4]
    q = _array(lengths, (4, 8), 0, dtype)
    kv = ragged.RaggedArray(_array(lengths, (2, 8), 1, dtype).values, q.partition)
    kwargs = {
        "gqa": {},
        "gqa_window_causal": {"window": (2, None), "causal": True},
        "window": {"window": (1, 2)},
    }[kind]
    out = ragged.attention(q, kv, kv, **kwargs)
    windowed = "window" in kwargs
    assert emulated.calls == ([] if windowed and kernel == EFFICIENT else [kernel])
    want = torch.cat(
        [
            attention_reference(a.double(), b.double(), b.double(), **kwargs)
            for a, b in zip(q.unbind(), kv.unbind(), strict=True)
        ]
    )
    tol = {"atol": 2e-3, "rtol": 2e-3} if dtype == torch.float16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out.values.double(), want, **tol)


def test_variants_the_kernels_do_not_take_keep_the_general_path(emulated):
    x = _array([3, 0, 5], (2, 8), 0, torch.float16)
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float16)
    ragged.attention(x, x, x, alibi=slopes)
    ragged.attention(x, x, x, relative_bias=torch.zeros(3, 2, dtype=torch.float16))
    ragged.attention(x, x, x, causal=True, prefix=1)
    ragged.attention(
        x, x, x, document_ids=ragged.RaggedArray(torch.zeros(8, dtype=torch.int64), x.partition)
    )
    ragged.attention(x, x, x, score_mod=lambda s, b, h, i, j: s)
    ragged.attention(x, x, x, mask_mod=lambda b, h, i, j: i >= j)
    assert emulated.calls == []
