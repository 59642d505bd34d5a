"""Train a small Transformer classifier on variable-length token sequences, with no padding.

The task: does the bigram ``(A, B)`` (token ``A`` immediately followed by token ``B``) occur in
the sequence? Half of the sequences contain it once; the others never do. Lengths are skewed
between 8 and 256 tokens, so a padded batch is mostly padding.

The pipeline is ragged end to end:

* a ``Dataset`` of ``{"tokens": LongTensor[L], "label": int}`` samples;
* ``DataLoader(batch_sampler=ragged.data.TokenBudgetBatchSampler(...),
  collate_fn=ragged.data.collate)``: batches of about ``--tokens`` real tokens, collated into a
  RaggedArray ``(B, L*)`` of tokens (no padding) and a dense label tensor;
* the model: token and position embeddings on the packed rows, a relative-position pair bias
  ``(B, L*, L*, heads)`` (a pair map over each sequence, like T5's), a
  ``ragged.nn.RaggedTransformerEncoder``, a mean over each sequence, a linear head.

After training it times the same model run padded: ``nn.TransformerEncoder`` (the same weights,
loaded from the ragged model's state dict) on the padded batch with ``src_key_padding_mask`` and
the bias as a float attention mask, and prints tokens/s of both (real tokens per second of one
training step: forward, backward, optimizer step) and that both compute the same loss.

Run: ``python examples/classifier.py`` (under a minute), or ``--small`` for CI (about 12 s of
CPU time on one thread: 900 samples, 2 epochs; wall time grows on a loaded machine).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import ragged
from ragged.data import TokenBudgetBatchSampler, collate

VOCAB, PATTERN, MAX_LEN = 16, (3, 7), 256


# --- data -------------------------------------------------------------------------------------


class BigramDataset(Dataset):
    """Random sequences; label 1 iff the bigram ``PATTERN`` occurs (then exactly once)."""

    def __init__(self, size: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        u = torch.rand(size, generator=gen)
        self.lengths = (8 + (MAX_LEN - 8) * u**3).long().tolist()  # skewed to short
        self.samples = []
        a, b = PATTERN
        for i, n in enumerate(self.lengths):
            tokens = torch.randint(VOCAB, (n,), generator=gen)
            # Remove every occurrence: a "b" after an "a" becomes another token.
            hits = (tokens[:-1] == a) & (tokens[1:] == b)
            tokens[1:] = torch.where(hits, (b + 1) % VOCAB, tokens[1:])
            label = i % 2
            if label:  # plant it once (a != b: this creates no other occurrence)
                at = int(torch.randint(n - 1, (1,), generator=gen))
                tokens[at], tokens[at + 1] = a, b
            self.samples.append({"tokens": tokens, "label": label})

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.samples[index]


def loader(dataset: BigramDataset, tokens: int, seed: int) -> DataLoader:
    sampler = TokenBudgetBatchSampler(
        dataset.lengths, tokens, generator=torch.Generator().manual_seed(seed)
    )
    # ragged_keys: "tokens" is ragged even in a batch whose lengths happen to be equal.
    return DataLoader(
        dataset, batch_sampler=sampler, collate_fn=partial(collate, ragged_keys=["tokens"])
    )


# --- the model --------------------------------------------------------------------------------


class Classifier(torch.nn.Module):
    """Embeddings, a relative-position pair bias, a ragged Transformer encoder, mean, head."""

    def __init__(self, d: int, heads: int, layers: int, max_distance: int = 8) -> None:
        super().__init__()
        self.heads, self.max_distance = heads, max_distance
        self.embed = torch.nn.Embedding(VOCAB, d)
        self.position = torch.nn.Embedding(MAX_LEN, d)
        self.relative = torch.nn.Embedding(2 * max_distance + 1, heads)
        layer = ragged.nn.RaggedTransformerEncoderLayer(d, heads, 2 * d, dropout=0.0)
        self.encoder = ragged.nn.RaggedTransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(d, 2)

    def forward(self, tokens: ragged.RaggedArray) -> torch.Tensor:
        level = tokens.partition.levels[0]
        positions = level.positions()  # of every token within its sequence
        x = tokens.with_values(self.embed(tokens.values) + self.position(positions))
        # The pair bias: one (query, key) entry per pair of tokens of the same sequence.
        pairs = ragged.Partition.outer(level, level)
        query = positions.index_select(0, pairs.levels[1].row_ids)
        offset = pairs.levels[1].positions() - query
        distance = offset.clamp(-self.max_distance, self.max_distance) + self.max_distance
        bias = ragged.RaggedArray(self.relative(distance), pairs)
        x = self.encoder(x, bias)
        return self.head(ragged.mean(x, axis=1))


class PaddedClassifier(torch.nn.Module):
    """The same model on padded batches: ``nn.TransformerEncoder`` with a key padding mask."""

    def __init__(self, ragged_model: Classifier, layers: int) -> None:
        super().__init__()
        d, heads = ragged_model.embed.embedding_dim, ragged_model.heads
        self.source = ragged_model
        layer = torch.nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.encoder.load_state_dict(ragged_model.encoder.state_dict())

    def forward(self, padded: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        m = self.source
        b, n = padded.shape
        positions = torch.arange(n)
        x = m.embed(padded) + m.position(positions)
        offset = positions[None, :] - positions[:, None]  # key - query
        distance = offset.clamp(-m.max_distance, m.max_distance) + m.max_distance
        bias = m.relative(distance).permute(2, 0, 1)  # [H, n, n]
        mask = bias.unsqueeze(0).expand(b, -1, -1, -1).reshape(b * m.heads, n, n)
        padding = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))  # same type as mask
        x = self.encoder(x, mask=mask, src_key_padding_mask=padding)
        pooled = (x * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
        return m.head(pooled)


# --- training ---------------------------------------------------------------------------------


def progress(items: Iterable[Any], total: int, description: str) -> Iterator[Any]:
    """``tqdm`` when it is installed, else a plain textual bar."""
    try:
        from tqdm import tqdm

        yield from tqdm(items, total=total, desc=description, leave=False)
        return
    except ImportError:
        pass
    if not sys.stdout.isatty():  # a log file: no bar
        yield from items
        return
    width = 30
    for i, item in enumerate(items, 1):
        yield item
        done = width * i // max(total, 1)
        print(f"\r{description} [{'#' * done}{'.' * (width - done)}] {i}/{total}", end="")
    print("\r" + " " * (width + len(description) + 20) + "\r", end="", flush=True)


def evaluate(model: Classifier, data: DataLoader) -> float:
    correct = total = 0
    with torch.no_grad():
        for batch in data:
            predicted = model(batch["tokens"]).argmax(-1)
            correct += int((predicted == batch["label"]).sum())
            total += len(batch["label"])
    return correct / total


def train(args: argparse.Namespace) -> tuple[Classifier, list[Any]]:
    torch.manual_seed(0)
    train_set = BigramDataset(args.samples, seed=0)
    test_set = BigramDataset(args.samples // 4, seed=1)
    model = Classifier(args.dim, args.heads, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    test_loader = loader(test_set, args.tokens, seed=1)
    print(f"accuracy before training: {evaluate(model, test_loader):.3f}")
    batches: list[Any] = []
    tokens = 0
    elapsed = 0.0
    for epoch in range(args.epochs):
        data = loader(train_set, args.tokens, seed=epoch)
        losses = []
        for batch in progress(data, len(data), f"epoch {epoch + 1}/{args.epochs}"):
            start = time.perf_counter()
            loss = F.cross_entropy(model(batch["tokens"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            elapsed += time.perf_counter() - start
            tokens += batch["tokens"].values.shape[0]
            losses.append(loss.item())
            if len(batches) < args.compare:
                batches.append(batch)
        accuracy = evaluate(model, test_loader)
        print(
            f"epoch {epoch + 1}: loss {sum(losses) / len(losses):.3f}, "
            f"test accuracy {accuracy:.3f}, {tokens / elapsed:,.0f} tokens/s (ragged)"
        )
    return model, batches


def compare_padded(model: Classifier, batches: list[Any], layers: int) -> None:
    """Tokens/s of one training step, ragged against padded, on the same batches."""
    padded_model = PaddedClassifier(model, layers)
    torch.backends.mha.set_fastpath_enabled(False)
    timings = {}
    for name, net in (("ragged", model), ("padded", padded_model)):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.0)  # time the step, keep weights
        tokens, elapsed = 0, 0.0
        for batch in batches:
            x = batch["tokens"]
            start = time.perf_counter()
            logits = net(x) if name == "ragged" else net(x.to_padded(), x.to_mask())
            loss = F.cross_entropy(logits, batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            elapsed += time.perf_counter() - start
            tokens += x.values.shape[0]
        timings[name] = tokens / elapsed
    x = batches[0]["tokens"]
    with torch.no_grad():
        same = torch.allclose(model(x), padded_model(x.to_padded(), x.to_mask()), atol=1e-4)
    occupancy = sum(b["tokens"].values.shape[0] for b in batches) / sum(
        b["tokens"].to_padded().numel() for b in batches
    )
    print(
        f"training step on {len(batches)} batches (occupancy {occupancy:.2f}): "
        f"ragged {timings['ragged']:,.0f} tokens/s, padded nn.TransformerEncoder "
        f"{timings['padded']:,.0f} tokens/s ({timings['ragged'] / timings['padded']:.1f}x); "
        f"same logits: {same}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run (CI)")
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096, help="token budget per batch")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--compare", type=int, default=8, help="batches for the padded timing")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.small:
        args.samples, args.epochs, args.compare = 900, 2, 2
    torch.set_num_threads(args.threads)
    model, batches = train(args)
    compare_padded(model, batches, args.layers)


if __name__ == "__main__":
    main()
