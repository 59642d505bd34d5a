"""``examples/hf_bert.py``: an HF BERT classifier trained on RaggedArrays and padded, with
``--small`` (the CI run)."""

import pytest

from tests.test_examples import run_example

pytest.importorskip("transformers")


def test_hf_bert_example_learns_and_matches_the_padded_model():
    out = run_example("hf_bert.py")
    gap = float(out.split("differ by at most ")[1].split()[0])
    assert gap < 1e-4, out
    epochs = [line.split() for line in out.splitlines() if line.startswith("epoch")]
    ragged_losses = [float(e[4].rstrip(",")) for e in epochs]
    padded_losses = [float(e[6]) for e in epochs]
    assert len(epochs) >= 2 and ragged_losses[-1] < ragged_losses[0], out
    assert all(abs(a - b) < 1e-2 for a, b in zip(ragged_losses, padded_losses, strict=True)), out
    rates = out.split("forward+backward+step): ")[1]
    assert "ragged " in rates and "padded " in rates, out
