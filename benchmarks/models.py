"""The model matrix side by side: torch-ragged, ``torch.nested`` (jagged), DanLing ``NestedTensor``.

Each module (torch's ``nn``, tiny random HF ``transformers`` modules) runs unmodified on each
library's batch of lengths ``[5, 1, 9, 3]`` (float64) and is compared with the same module on
every sequence as a ``(1, L, C)`` tensor: the output ("eager"), the parameter gradients of the
sum of squares ("grad"), and ``torch.compile(dynamic=True)`` over three batches of different
sizes and lengths ("one graph": right values and one captured graph). A cell is "yes" only when
the check passed, otherwise what went wrong. ``tests/test_models.py`` asserts the torch-ragged
column.

Usage: ``python benchmarks/models.py [--json out.json]`` (under a minute; the HF rows are skipped
without ``transformers``, the DanLing column without ``danling``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
from collections.abc import Callable
from typing import Any

import torch
from features import DanLing, Library, Nested, Ragged, check, close
from torch import nn

import ragged
from ragged.bench._report import Table, write_result

LENGTHS = [5, 1, 9, 3]
COMPILE_LENGTHS = [[3, 1, 4], [2, 5], [1, 2, 6, 3, 2]]
C = 8


class SelfAttention(nn.Module):
    """``attn(x, x, x)`` with torch's defaults (the weights are computed too); the output."""

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: Any) -> Any:
        return self.attn(x, x, x)[0]


class SelfDecoder(nn.Module):
    """A decoder layer with its own input as the memory (one input per library's batch)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: Any) -> Any:
        return self.layer(x, x)


def attention_modules() -> dict[str, Callable[[], nn.Module]]:
    """torch's attention modules (dropout 0, so that the outputs compare)."""

    def encoder_layer(norm_first: bool = False) -> nn.Module:
        return nn.TransformerEncoderLayer(C, 2, 16, 0.0, batch_first=True, norm_first=norm_first)

    return {
        "nn.MultiheadAttention(batch_first=True)": lambda: SelfAttention(
            nn.MultiheadAttention(C, 2, batch_first=True)
        ),
        "nn.TransformerEncoderLayer(batch_first=True)": encoder_layer,
        "nn.TransformerEncoderLayer(norm_first=True)": lambda: encoder_layer(True),
        "nn.TransformerEncoder(2 layers)": lambda: nn.TransformerEncoder(encoder_layer(), 2),
        "nn.TransformerDecoderLayer(memory: the input)": lambda: SelfDecoder(
            nn.TransformerDecoderLayer(C, 2, 16, 0.0, batch_first=True)
        ),
    }


def modules() -> dict[str, Callable[[], nn.Module]]:
    """The rows: name -> a builder of the module (``(B, L, C)`` in, first output compared)."""
    rows: dict[str, Callable[[], nn.Module]] = {
        "nn.Sequential(Linear, GELU, Linear)": lambda: nn.Sequential(
            nn.Linear(C, 16), nn.GELU(), nn.Linear(16, C)
        ),
        "nn.LayerNorm": lambda: nn.LayerNorm(C),
        "nn.RNN(batch_first=True)": lambda: nn.RNN(C, 6, batch_first=True),
        "nn.GRU(batch_first=True, 2 layers, bidirectional)": lambda: nn.GRU(
            C, 6, num_layers=2, bidirectional=True, batch_first=True
        ),
        "nn.LSTM(batch_first=True, 2 layers, bidirectional)": lambda: nn.LSTM(
            C, 6, num_layers=2, bidirectional=True, batch_first=True
        ),
        **attention_modules(),
    }
    if importlib.util.find_spec("transformers") is not None:
        import transformers
        from transformers.models.bert import modeling_bert
        from transformers.models.gpt2 import modeling_gpt2
        from transformers.models.llama import modeling_llama

        bert = transformers.BertConfig(hidden_size=C, intermediate_size=16, num_attention_heads=2)
        llama = transformers.LlamaConfig(hidden_size=C, intermediate_size=16, num_attention_heads=2)
        rows["HF BertIntermediate"] = lambda: modeling_bert.BertIntermediate(bert)
        rows["HF LlamaMLP"] = lambda: modeling_llama.LlamaMLP(llama)
        rows["HF LlamaRMSNorm"] = lambda: modeling_llama.LlamaRMSNorm(C)
        gpt2 = transformers.GPT2Config(
            n_embd=C,
            n_head=2,
            n_layer=1,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            attn_implementation="sdpa",
        )
        rows["HF GPT2MLP"] = lambda: modeling_gpt2.GPT2MLP(4 * C, gpt2)
        rows["HF GPT2Block"] = lambda: modeling_gpt2.GPT2Block(gpt2)
        rows.update(whole_models())
    return rows


class WithPositions(nn.Module):
    """An HF module called with positions ``0..L-1`` in every sequence, written as tensor code
    (``(B, L*)`` on a ragged batch, ``(1, L)`` on one sequence)."""

    def __init__(self, call: Callable[..., Any], **modules: nn.Module) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(modules)
        self.call = call

    def forward(self, x: Any) -> Any:
        positions = x.new_ones(x.shape[:2], dtype=torch.long).cumsum(1) - 1
        return self.call(self.parts, x, positions)


def whole_models() -> dict[str, Callable[[], nn.Module]]:
    """Llama's decoder layer (rotary, grouped-query SDPA) and whole models on ``inputs_embeds``
    with what they document for packed inputs (``position_ids``; no attention mask)."""
    import transformers
    from transformers.models.bert import modeling_bert
    from transformers.models.llama import modeling_llama

    sizes = {"hidden_size": C, "intermediate_size": 16, "num_attention_heads": 2}
    sizes |= {"num_hidden_layers": 2, "vocab_size": 32, "attn_implementation": "sdpa"}
    llama = transformers.LlamaConfig(num_key_value_heads=1, **sizes)
    bert = transformers.BertConfig(
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **sizes,
    )
    return {
        "HF LlamaDecoderLayer (with its rotary embedding)": lambda: WithPositions(
            lambda m, x, p: m["layer"](x, position_embeddings=m["rotary"](x, p)),
            layer=modeling_llama.LlamaDecoderLayer(llama, 0),
            rotary=modeling_llama.LlamaRotaryEmbedding(llama),
        ),
        "HF LlamaModel(inputs_embeds, position_ids, use_cache=False)": lambda: WithPositions(
            lambda m, x, p: (
                m["model"](inputs_embeds=x, position_ids=p, use_cache=False).last_hidden_state
            ),
            model=modeling_llama.LlamaModel(llama),
        ),
        "HF BertModel(inputs_embeds, position_ids)": lambda: WithPositions(
            lambda m, x, p: m["model"](inputs_embeds=x, position_ids=p).last_hidden_state,
            model=modeling_bert.BertModel(bert),
        ),
    }


def first(result: Any) -> Any:
    """The output of a module's result (``(output, h_n)`` for the recurrent modules)."""
    return result[0] if isinstance(result, tuple) else result


def batch(lengths: list[int], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, C, generator=gen, dtype=torch.float64) for n in lengths]


def parameter_grads(module: nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    module.zero_grad()
    loss.backward()
    grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    module.zero_grad()
    return grads


def model_checks(lib: Library, build: Callable[[], nn.Module]) -> dict[str, str]:
    """eager, grad and one graph of one module on ``lib``'s batches."""
    torch.manual_seed(0)
    module = build().double()
    segs = batch(LENGTHS, 0)
    expected = [first(module(s[None]))[0] for s in segs]

    def eager() -> bool | str:
        parts = lib.parts(first(module(lib.build(segs))))
        ok = len(parts) == len(segs) and all(map(close, parts, expected))
        return ok or "wrong values"

    def grad() -> bool | str:
        got = parameter_grads(
            module, sum(p.pow(2).sum() for p in lib.parts(first(module(lib.build(segs)))))
        )
        want = parameter_grads(module, sum(e.pow(2).sum() for e in expected))
        same = len(got) == len(want) and all(map(close, got, want))
        return same or "wrong gradient"

    def compiled() -> bool | str:
        torch._dynamo.reset()
        graphs: list[Any] = []

        def backend(gm: Any, example: Any) -> Any:
            graphs.append(gm)
            return gm.forward

        fn = torch.compile(module, backend=backend, dynamic=True)
        scope = ragged.dynamic_shapes if isinstance(lib, Ragged) else contextlib.nullcontext
        for seed, lengths in enumerate(COMPILE_LENGTHS):
            segments = batch(lengths, seed + 1)
            # allow_rnn: without it Dynamo runs torch's recurrent modules eagerly, for everyone.
            config = torch._dynamo.config.patch(specialize_float=True, allow_rnn=True)
            with scope(), config:
                parts = lib.parts(first(fn(lib.build(segments))))
            if not all(
                close(g, first(module(s[None]))[0]) for g, s in zip(parts, segments, strict=True)
            ):
                return "wrong values"
        torch._dynamo.reset()
        graphs = [gm for gm in graphs if len(gm.graph.nodes)]
        if not graphs:
            return "right values, no graph (Dynamo runs it eagerly)"
        return True if len(graphs) == 1 else f"{len(graphs)} graphs for 3 batches"

    return {"eager": check(eager), "grad": check(grad), "one graph": check(compiled)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the result document here")
    parser.add_argument("--quick", action="store_true", help="(the same: the checks are quick)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    libraries: list[Library] = [Ragged(), Nested()]
    if importlib.util.find_spec("danling") is not None:
        libraries.append(DanLing())
    columns = [
        f"{lib.name}: {kind}" for lib in libraries for kind in ("eager", "grad", "one graph")
    ]
    rows = []
    for name, build in modules().items():
        cells = [v for lib in libraries for v in model_checks(lib, build).values()]
        rows.append([name, *cells])
    table = Table(
        f"Modules run unmodified on a batch of lengths {LENGTHS} (float64), against per-sequence "
        "runs; compiled over three batches",
        ["module", *columns],
        rows,
        [f"torch {torch.__version__}", "'yes' means the check passed; failures quote the error."],
    )
    print(table.text())
    if args.json:
        write_result(args.json, "models", [table], quick=args.quick, metric="pass/fail checks")


if __name__ == "__main__":
    main()
