"""Eager overhead on tiny inputs: ragged ops against the plain torch op on the values.

Usage: ``python tools/overhead.py [reductions]`` from a checkout (one thread; the minimum over
15 batches of 2000 calls, robust on a shared machine). The same cases as the eager-overhead table
of ``benchmarks/ops.py``, plus ``ragged.add`` and ``ragged.softmax``; run it on two checkouts to
compare them (docs/benchmarks-history.md, "Eager overhead before and after the op registry").
``reductions`` times only the reductions over the ragged axis (``ragged.mean``/``ragged.sum``
and their torch spellings) on B=4, lengths [3, 0, 5, 2], D=8 float32 against the plain kernel
call (an ``index_add_``, divided by the lengths for the mean): docs/benchmarks.md, "Eager
overhead of reductions".
"""

import sys
import time

import torch

import ragged

torch.set_num_threads(1)


def per_call(*fns, number=2000, repeat=15):
    """The minimum time per call of each of ``fns``, their batches interleaved (so that load
    from other processes reaches both sides of a ratio alike), in this thread's CPU time (time
    spent descheduled on a busy machine does not count)."""
    for fn in fns:
        for _ in range(200):
            fn()
    out = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t = time.thread_time()
            for _ in range(number):
                fn()
            out[i] = min(out[i], (time.thread_time() - t) / number)
    return out


gen = torch.Generator().manual_seed(3)
lengths = [3, 8, 1, 5]
values = torch.randn(sum(lengths), 8, generator=gen)
other = torch.randn(sum(lengths), 8, generator=gen)
x = ragged.from_lengths(values, lengths)
y = x.with_values(other)
ids = x.partition.levels[0].row_ids
linear = torch.nn.Linear(8, 8)
cases = [
    ("x + y", lambda: x + y, lambda: values + other),
    ("ragged.add(x, y)", lambda: ragged.add(x, y), lambda: values + other),
    (
        "ragged.sum(x, 1)",
        lambda: ragged.sum(x, axis=1),
        lambda: values.new_zeros(4, 8).index_add_(0, ids, values),
    ),
    ("ragged.softmax(x, 1)", lambda: ragged.softmax(x, 1), lambda: torch.softmax(values, 0)),
    # The torch-native door: RaggedArray.__torch_function__ and the Tensor-style methods.
    ("torch.exp(x)", lambda: torch.exp(x), lambda: torch.exp(values)),
    ("x.exp()", lambda: x.exp(), lambda: values.exp()),
    (
        "torch.sum(x, 1)",
        lambda: torch.sum(x, 1),
        lambda: values.new_zeros(4, 8).index_add_(0, ids, values),
    ),
    ("nn.Linear(8, 8)(x)", lambda: linear(x), lambda: linear(values)),
]
if sys.argv[1:] == ["reductions"]:
    small = ragged.from_lengths(
        torch.randn(10, 8, generator=gen), [3, 0, 5, 2], axes=("batch", "seq", "feature")
    )
    sv, sids = small.values, small.partition.levels[0].row_ids
    counts = small.lengths[:, None]  # int64, as the partition holds them

    def plain_sum():
        return sv.new_zeros(4, 8).index_add_(0, sids, sv)

    def plain_mean():
        return sv.new_zeros(4, 8).index_add_(0, sids, sv) / counts

    cases = [
        ('ragged.mean(x, "seq")', lambda: ragged.mean(small, "seq"), plain_mean),
        ("torch.mean(x, dim=1)", lambda: torch.mean(small, dim=1), plain_mean),
        ('ragged.sum(x, "seq")', lambda: ragged.sum(small, "seq"), plain_sum),
        ("torch.sum(x, dim=1)", lambda: torch.sum(small, dim=1), plain_sum),
    ]
for label, a, b in cases:
    ta, tb = per_call(a, b)
    print(f"{label:24s} ragged {ta * 1e6:6.2f} us  torch {tb * 1e6:6.2f} us  ratio {ta / tb:4.2f}x")
