"""Eager overhead on tiny inputs: ragged ops against the plain torch op on the values.

Usage: ``python tools/overhead.py`` from a checkout (one thread; the minimum over 15 batches of
2000 calls, robust on a shared machine). The same cases as the eager-overhead table of
``benchmarks/ops.py``, plus ``ragged.add`` and ``ragged.softmax``; run it on two checkouts to
compare them (docs/benchmarks-history.md, "Eager overhead before and after the op registry").
"""

import time

import torch

import ragged

torch.set_num_threads(1)


def per_call(fn, number=2000, repeat=15):
    for _ in range(200):
        fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        out.append((time.perf_counter() - t) / number)
    return min(out)


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
for label, a, b in cases:
    ta, tb = per_call(a), per_call(b)
    print(f"{label:24s} ragged {ta * 1e6:6.2f} us  torch {tb * 1e6:6.2f} us  ratio {ta / tb:4.2f}x")
