"""PyTorch Lightning on RaggedArray batches: the documented ``batch_size=`` of ``self.log``
(docs/data.md). Runs only where Lightning is installed (it is not a dependency); the docs page's
own example checks ``len(x)`` everywhere."""

from __future__ import annotations

import warnings

import pytest
import torch

import ragged

lightning = pytest.importorskip("lightning")


def _batches() -> list[dict[str, ragged.RaggedArray]]:
    """Two batches of 2 and 3 samples; their first segments have 5 and 1 rows."""
    return [
        {"x": ragged.from_lengths(torch.full((8, 1), 1.0), [5, 3])},
        {"x": ragged.from_lengths(torch.full((4, 1), 2.0), [1, 2, 1])},
    ]


class _Module(lightning.pytorch.LightningModule):
    def __init__(self, pass_size: bool) -> None:
        super().__init__()
        self.pass_size = pass_size
        self.weight = torch.nn.Parameter(torch.zeros(()))

    def training_step(self, batch, index):
        x = batch["x"]
        value = x.values.mean()  # 1.0 in the first batch, 2.0 in the second
        size = {"batch_size": len(x)} if self.pass_size else {}
        self.log("value", value, on_step=False, on_epoch=True, **size)
        return (self.weight * value).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _epoch_mean(pass_size: bool) -> float:
    trainer = lightning.pytorch.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers, loggers, batch sizes
        loader = torch.utils.data.DataLoader(_batches(), batch_size=None)
        trainer.fit(_Module(pass_size), loader)
    return float(trainer.callback_metrics["value"])


def test_lightning_guesses_a_segment_length_without_batch_size():
    from lightning.pytorch.utilities.data import extract_batch_size

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        guesses = [extract_batch_size(batch) for batch in _batches()]
    assert guesses == [5, 1]  # the first segments' lengths, not 2 and 3
    assert _epoch_mean(pass_size=False) == pytest.approx((5 * 1.0 + 1 * 2.0) / 6)


def test_batch_size_of_the_ragged_array_weights_the_epoch_mean_by_samples():
    assert _epoch_mean(pass_size=True) == pytest.approx((2 * 1.0 + 3 * 2.0) / 5)
