"""Train a small HF ``transformers`` BERT classifier on variable-length text, without padding.

The model is a ``transformers.BertModel`` (random init, 2 layers, hidden 64, 4 heads, SDPA
attention) with a mean pool over each sequence's tokens and a linear head. It is trained twice
from the same initial weights on the same batches:

* **ragged**: a batch is a RaggedArray ``(B, L*)`` of token ids; the model's own embedding
  modules and its ``BertEncoder`` run on it unmodified (``(B, L*, 64)`` RaggedArrays: no padding,
  no attention mask), and ``hidden.mean(dim=1)`` pools each sequence over its own tokens;
* **padded**: the same batch padded to its longest sequence, run through ``BertModel(input_ids,
  attention_mask)`` as usual, with a masked mean pool.

Both compute the same function: the script prints the largest logit difference of the two
paths, both losses per epoch (they go down together) and the real tokens per second of one
training step (forward, backward, optimizer step) of each.

``BertModel(inputs_embeds=...)`` does not take a RaggedArray yet (its embeddings compute
position ids as ``position_ids[:, :seq_length]`` from a ragged size), so the ragged path calls
the model's ``embeddings.word_embeddings`` / ``position_embeddings`` / ``token_type_embeddings``
/ ``LayerNorm`` itself, with positions from ``ragged.local_index``, then ``model.encoder``: the
same modules and weights the padded ``BertModel`` uses.

Task (synthetic "text"): token ids in ``0..29``, lengths log-normal between 8 and 256 (a padded
batch is mostly padding); the label is whether token 1 occurs more often than token 2.

Run: ``python examples/hf_bert.py`` (a few minutes on one CPU thread), ``--quick`` (or
``--small``) for a short run. Needs ``transformers``.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from torch import nn

import ragged

VOCAB = 30


class BertClassifier(nn.Module):
    """A ``BertModel`` without its pooler, a mean over each sequence's tokens, a linear head."""

    def __init__(self, config: transformers.BertConfig, classes: int = 2) -> None:
        super().__init__()
        self.bert = transformers.BertModel(config, add_pooling_layer=False)
        self.head = nn.Linear(config.hidden_size, classes)

    def forward(self, tokens: ragged.RaggedArray) -> torch.Tensor:
        """Logits ``(B, classes)`` of a RaggedArray ``(B, L*)`` of token ids, unpadded."""
        emb = self.bert.embeddings
        positions = ragged.local_index(tokens)  # 0 .. L_b - 1 in every sequence
        h = (
            emb.word_embeddings(tokens)
            + emb.position_embeddings(positions)
            + emb.token_type_embeddings.weight[0]  # token type 0, as BertModel's default
        )
        h = emb.dropout(emb.LayerNorm(h))  # (B, L*, hidden)
        h = self.bert.encoder(h).last_hidden_state  # the unmodified HF encoder
        return self.head(h.mean(dim=1))  # (B, hidden): each sequence's mean

    def padded(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The same logits from the padded batch ``(B, L)`` and its 0/1 attention mask."""
        h = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = mask[..., None].to(h.dtype)
        return self.head((h * weights).sum(1) / weights.sum(1))


def make_batches(count: int, size: int, gen: torch.Generator) -> list[dict[str, Any]]:
    """``count`` batches of ``size`` sequences, each ragged and padded, with labels."""
    batches = []
    for _ in range(count):
        raw = torch.exp(math.log(40) + 0.8 * torch.randn(size, generator=gen))
        lengths = raw.clamp(8, 256).round().long()
        tokens = ragged.from_lengths(
            torch.randint(0, VOCAB, (int(lengths.sum()),), generator=gen), lengths
        )
        ones = ragged.sum(tokens == 1, axis=1)
        twos = ragged.sum(tokens == 2, axis=1)
        batches.append(
            {
                "tokens": tokens,
                "ids": tokens.to_padded(),  # (B, L): the padding value is token 0
                "mask": tokens.to_mask().long(),
                "labels": (ones > twos).long(),
                "real": int(lengths.sum()),
            }
        )
    return batches


def train(
    model: BertClassifier, batches: list[dict[str, Any]], padded: bool, epochs: int
) -> tuple[list[float], float]:
    """Adam on the cross-entropy; the mean loss of every epoch and the real tokens/s."""
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses, took = [], 0.0
    for _ in range(epochs):
        total = 0.0
        for b in batches:
            started = time.process_time()
            logits = model.padded(b["ids"], b["mask"]) if padded else model(b["tokens"])
            loss = F.cross_entropy(logits, b["labels"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            took += time.process_time() - started
            total += float(loss.detach())
        losses.append(total / len(batches))
    return losses, epochs * sum(b["real"] for b in batches) / took


def accuracy(model: BertClassifier, batches: list[dict[str, Any]]) -> float:
    with torch.no_grad():
        right = sum(int((model(b["tokens"]).argmax(1) == b["labels"]).sum()) for b in batches)
    return right / sum(len(b["labels"]) for b in batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", "--small", action="store_true", help="a short run (CI)")
    parser.add_argument("--epochs", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    epochs = args.epochs or (3 if args.quick else 8)
    train_batches = make_batches(6 if args.quick else 40, 16 if args.quick else 32, gen)
    test_batches = make_batches(2 if args.quick else 4, 64, gen)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=256,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa",
    )
    model = BertClassifier(config)
    padded_model = copy.deepcopy(model)  # the same initial weights

    b = test_batches[0]
    with torch.no_grad():
        gap = (model(b["tokens"]) - model.padded(b["ids"], b["mask"])).abs().max()
    padded_share = b["ids"].numel() / b["real"]
    print(f"test accuracy before training: {accuracy(model, test_batches):.3f}")
    print(
        f"ragged and padded logits differ by at most {float(gap):.1e} (padded/real tokens {padded_share:.2f})"
    )

    ragged_losses, ragged_rate = train(model, train_batches, padded=False, epochs=epochs)
    padded_losses, padded_rate = train(padded_model, train_batches, padded=True, epochs=epochs)
    for epoch, (mine, theirs) in enumerate(zip(ragged_losses, padded_losses, strict=True)):
        print(f"epoch {epoch + 1}: loss ragged {mine:.4f}, padded {theirs:.4f}")
    print(f"test accuracy after training (ragged): {accuracy(model, test_batches):.3f}")
    print(
        f"tokens/s (real tokens, forward+backward+step): ragged {ragged_rate:,.0f}, "
        f"padded {padded_rate:,.0f} ({ragged_rate / padded_rate:.2f}x)"
    )


if __name__ == "__main__":
    main()
