"""``benchmarks/model_stacks.py``: every variant of each stack computes the padded model's
outputs on the real rows (else its times compare different functions)."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import model_stacks
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


@pytest.mark.parametrize("model", ["bert", "gpt"])
def test_every_variant_computes_the_padded_outputs(model):
    if model == "bert":
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    batch = model_stacks.Batch([5, 1, 9, 3], seed=1)
    variants = (model_stacks.bert_variants if model == "bert" else model_stacks.gpt_variants)(batch)
    names = model_stacks.available(model_stacks.VARIANTS)
    with torch.no_grad():
        expected = variants["padded"](False)
        assert expected.shape == (18, model_stacks.E)
        for name in names:
            torch.testing.assert_close(variants[name](False), expected, atol=1e-5, rtol=1e-4)


def test_flop_ratio_counts_tokens_and_pairs():
    lengths = [2, 4]
    e, ff, layers = model_stacks.E, model_stacks.FF, model_stacks.LAYERS
    per_token = 2 * (4 * e * e + 2 * e * ff)
    full = layers * (per_token * 6 + 4 * e * (4 + 16))
    causal = layers * (per_token * 6 + 4 * e * (3 + 10))
    assert model_stacks.flops(lengths, padded=False, causal=False) == full
    assert model_stacks.flops(lengths, padded=False, causal=True) == causal
    assert model_stacks.flops(lengths, padded=True, causal=False) == layers * (
        per_token * 8 + 4 * e * 32
    )
