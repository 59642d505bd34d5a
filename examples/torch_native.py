"""A sequence classifier written only with torch functions and nn modules, trained on RaggedArrays.

The model never names ``ragged``: ``nn.Embedding``, ``nn.LayerNorm``, ``nn.Linear``, ``F.gelu``,
``torch.softmax(dim=1)`` and ``torch.sum(dim=1)`` take the RaggedArray batch as they would take a
padded one, and mean the same thing without the padding (``docs/torch.md``). Only building the
batch from variable-length token lists uses ``ragged.from_lengths``.

Task (synthetic): a sequence of tokens in ``0..9``, 4 to 40 long; its class is whether token 1
occurs more often than token 2. The model embeds the tokens, applies two pre-norm MLP blocks,
pools each sequence with a learned softmax over its tokens, and classifies the pooled vector.
It trains with Adam on a cross-entropy loss and reports test accuracy per epoch, eagerly or under
``torch.compile(dynamic=True)`` (``--compile``: one graph for every batch shape).

Run: ``python examples/torch_native.py`` (under a minute on one CPU thread), ``--small`` for CI.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import ragged


class Block(nn.Module):
    """Pre-norm MLP with a residual connection."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Classifier(nn.Module):
    def __init__(self, vocab: int = 10, dim: int = 32, hidden: int = 64, classes: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(Block(dim, hidden), Block(dim, hidden))
        self.score = nn.Linear(dim, 1)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        h = self.blocks(self.embed(tokens))  # (B, L*, dim)
        weights = torch.softmax(self.score(h), dim=1)  # over each sequence's tokens
        pooled = torch.sum(weights * h, dim=1)  # (B, dim): dense
        return self.head(pooled)


def make_batch(size: int, gen: torch.Generator):
    """``size`` sequences as one RaggedArray of token ids ``(B, L*)``, and their labels."""
    lengths = torch.randint(4, 41, (size,), generator=gen)
    tokens = torch.randint(0, 10, (int(lengths.sum()),), generator=gen)
    batch = ragged.from_lengths(tokens, lengths)
    ones = torch.stack([(s == 1).sum() for s in batch.unbind()])
    twos = torch.stack([(s == 2).sum() for s in batch.unbind()])
    return batch, (ones > twos).long()


def accuracy(model: nn.Module, batches) -> float:
    with torch.no_grad():
        right = sum(int((model(x).argmax(1) == y).sum()) for x, y in batches)
    return right / sum(len(y) for _, y in batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument("--compile", action="store_true", help="torch.compile(dynamic=True)")
    parser.add_argument("--epochs", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    epochs = args.epochs or (3 if args.small else 12)
    train = [make_batch(64, gen) for _ in range(6 if args.small else 30)]
    test = [make_batch(128, gen) for _ in range(2)]

    model = Classifier()
    forward = torch.compile(model, dynamic=True) if args.compile else model
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    print(f"test accuracy before training: {accuracy(model, test):.3f}")
    start = time.perf_counter()
    for epoch in range(epochs):
        total = 0.0
        with ragged.dynamic_shapes():  # one compiled graph for every batch shape
            for x, y in train:
                loss = F.cross_entropy(forward(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach())
        print(
            f"epoch {epoch + 1}: loss {total / len(train):.4f}, "
            f"test accuracy {accuracy(model, test):.3f}",
            flush=True,
        )
    rows = sum(int(x.values.shape[0]) for x, _ in train) * epochs
    took = time.perf_counter() - start
    print(f"done: {rows / took:,.0f} tokens/s ({'compiled' if args.compile else 'eager'})")


if __name__ == "__main__":
    main()
