"""Features side by side: torch-ragged, ``torch.nested`` (jagged) and DanLing ``NestedTensor``.

Every cell is a check that runs here and compares with a per-segment reference (float64, a batch
with an empty segment): "yes" only when the result is right, otherwise what went wrong
(the exception, or "wrong values" / "wrong gradient"). Nothing is asserted from documentation.

Usage: ``python benchmarks/features.py [--json out.json]`` (a few seconds; DanLing columns are
skipped when ``danling`` is not installed).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import ragged
from ragged.bench._report import Table, write_result

LENGTHS = [3, 0, 2]
D = 4


def segments() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(n, D, generator=gen, dtype=torch.float64) for n in LENGTHS]


def close(a: Any, b: Any) -> bool:
    try:
        return bool(
            torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=1e-6, equal_nan=True)
        )
    except Exception:
        return False


class Library:
    """How one library builds a batch, reads it back and does the common ops."""

    name = ""

    def build(self, segs: list[torch.Tensor]) -> Any:
        raise NotImplementedError

    def reduce(self, x: Any, op: str) -> torch.Tensor:
        raise NotImplementedError

    def softmax(self, x: Any) -> list[torch.Tensor]:
        raise NotImplementedError

    def leaf(self, segs: list[torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """A batch whose values require grad, and the tensor to take the gradient of."""
        raise NotImplementedError

    def like(self, x: Any, segs: list[torch.Tensor]) -> Any:
        """A batch with ``x``'s structure (the library's idiom, e.g. for jvp tangents)."""
        return self.build(segs)

    def grad_of_values(self, x: Any, leaf: torch.Tensor) -> list[torch.Tensor]:
        raise NotImplementedError

    def parts(self, x: Any) -> list[torch.Tensor]:
        """The segments of a batch that an op returned."""
        return list(x.unbind())


class Ragged(Library):
    name = "torch-ragged"

    def build(self, segs):
        return ragged.array(segs)

    def reduce(self, x, op):
        return {"sum": ragged.sum, "mean": ragged.mean, "max": ragged.amax}[op](x, axis=1)

    def softmax(self, x):
        return list(ragged.softmax(x, 1).unbind())

    def leaf(self, segs):
        x = ragged.array(segs)
        v = x.values.clone().requires_grad_()
        return x.with_values(v), v

    def grad_of_values(self, x, leaf):
        return list(torch.split(leaf.grad, LENGTHS))

    def like(self, x, segs):
        return x.with_values(torch.cat(segs))  # the same partition object


class Nested(Library):
    name = "torch.nested (jagged)"

    def build(self, segs):
        return torch.nested.nested_tensor(segs, layout=torch.jagged)

    def reduce(self, x, op):
        if op == "max":
            return x.amax(dim=1)
        return getattr(x, op)(dim=1)

    def softmax(self, x):
        return list(torch.softmax(x, dim=1).unbind())

    def leaf(self, segs):
        v = torch.cat(segs).requires_grad_()
        offsets = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
        return torch.nested.nested_tensor_from_jagged(v, offsets), v

    def grad_of_values(self, x, leaf):
        return list(torch.split(leaf.grad, LENGTHS))

    def like(self, x, segs):
        return torch.nested.nested_tensor_from_jagged(torch.cat(segs), x.offsets())  # same offsets


class DanLing(Library):
    name = "DanLing NestedTensor"

    def build(self, segs):
        from danling import NestedTensor

        return NestedTensor(segs)

    def reduce(self, x, op):
        if op == "max":
            return x.amax(dim=1)
        return getattr(x, op)(dim=1)

    def softmax(self, x):
        return [t for t in torch.softmax(x, dim=1)]

    def leaf(self, segs):
        leaves = [s.clone().requires_grad_() for s in segs]
        return self.build(leaves), leaves

    def grad_of_values(self, x, leaf):
        return [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaf]

    def parts(self, x):
        return list(x)


REFERENCE = {"sum": 0.0, "mean": float("nan"), "max": float("-inf")}


def reference_reduce(segs: list[torch.Tensor], op: str) -> torch.Tensor:
    rows = []
    for s in segs:
        if s.shape[0] == 0:
            rows.append(torch.full((D,), REFERENCE[op], dtype=s.dtype))
        else:
            rows.append({"sum": s.sum(0), "mean": s.mean(0), "max": s.amax(0)}[op])
    return torch.stack(rows)


def check(fn: Callable[[], bool | str]) -> str:
    try:
        out = fn()
    except Exception as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"fails: {type(error).__name__}: {message[:70]}"
    if out is True:
        return "yes"
    return out if isinstance(out, str) else "wrong result"


def checks(lib: Library) -> dict[str, str]:
    segs = segments()
    out: dict[str, str] = {}
    for op in ("sum", "mean", "max"):
        out[f"{op} over the ragged axis"] = check(
            lambda op=op: (
                close(lib.reduce(lib.build(segs), op), reference_reduce(segs, op)) or "wrong values"
            )
        )

        def backward(op=op) -> bool | str:
            x, leaf = lib.leaf(segs)
            weights = torch.arange(1.0, D + 1, dtype=torch.float64)
            out = lib.reduce(x, op)
            (torch.where(torch.isfinite(out), out, 0.0) * weights).sum().backward()
            expected = []
            for s in segs:
                t = s.clone().requires_grad_()
                if s.shape[0]:
                    r = {"sum": t.sum(0), "mean": t.mean(0), "max": t.amax(0)}[op]
                    (r * weights).sum().backward()
                expected.append(t.grad if t.grad is not None else torch.zeros_like(t))
            got = lib.grad_of_values(x, leaf)
            return all(close(g, e) for g, e in zip(got, expected, strict=True)) or "wrong gradient"

        out[f"{op} backward"] = check(backward)
    out["softmax over the ragged axis"] = check(
        lambda: (
            all(
                close(g, torch.softmax(s, 0))
                for g, s in zip(lib.softmax(lib.build(segs)), segs, strict=True)
                if s.shape[0]
            )
            or "wrong values"
        )
    )

    def softmax_grad() -> bool | str:
        x, leaf = lib.leaf(segs)
        weights = torch.arange(1.0, D + 1, dtype=torch.float64)
        total = sum((t * weights).square().sum() for t in lib.softmax(x) if t.shape[0])
        total.backward()
        expected = []
        for s in segs:
            t = s.clone().requires_grad_()
            if s.shape[0]:
                (torch.softmax(t, 0) * weights).square().sum().backward()
            expected.append(t.grad if t.grad is not None else torch.zeros_like(t))
        got = lib.grad_of_values(x, leaf)
        return all(close(g, e) for g, e in zip(got, expected, strict=True)) or "wrong gradient"

    out["softmax gradient"] = check(softmax_grad)

    def func_grad() -> bool | str:
        x = lib.build(segs)
        g = torch.func.grad(lambda x: lib.reduce(x, "sum").square().sum())(x)
        values = g.values if isinstance(g, ragged.RaggedArray) else torch.cat(list(g.unbind()))
        expected = torch.cat([2 * s.sum(0).expand_as(s) for s in segs])
        return close(values, expected) or "wrong gradient"

    out["torch.func.grad"] = check(func_grad)

    def func_vmap() -> bool | str:
        x = lib.build(segs)
        weights = torch.randn(5, D, dtype=torch.float64)
        got = torch.func.vmap(lambda w: (lib.reduce(x, "sum") * w).sum())(weights)
        expected = torch.stack([(reference_reduce(segs, "sum") * w).sum() for w in weights])
        return close(got, expected) or "wrong values"

    out["torch.func.vmap"] = check(func_vmap)

    def func_jvp() -> bool | str:
        x = lib.build(segs)
        tangent = lib.like(x, [torch.ones_like(s) for s in segs])
        _, t_out = torch.func.jvp(lambda x: lib.reduce(x, "sum"), (x,), (tangent,))
        return (
            close(t_out, torch.tensor([[float(n)] * D for n in LENGTHS], dtype=torch.float64))
            or "wrong values"
        )

    out["torch.func.jvp"] = check(func_jvp)

    def compile_graphs() -> bool | str:
        torch._dynamo.reset()
        graphs = []

        def backend(gm: Any, example: Any) -> Any:
            graphs.append(gm)
            return gm.forward

        fn = torch.compile(lambda x: lib.reduce(x, "sum"), backend=backend, dynamic=True)
        gen = torch.Generator().manual_seed(1)
        for lengths in ([3, 2, 4], [5, 1, 2, 2], [2, 6], [1, 3, 3, 3, 2]):
            batch = [torch.randn(n, D, generator=gen, dtype=torch.float64) for n in lengths]
            with ragged.dynamic_shapes() if isinstance(lib, Ragged) else contextlib.nullcontext():
                fn(lib.build(batch))
        torch._dynamo.reset()
        return True if len(graphs) == 1 else f"{len(graphs)} graphs for 4 batch shapes"

    out["torch.compile: one graph across batches"] = check(compile_graphs)

    def two_ragged_axes() -> bool | str:
        if isinstance(lib, Ragged):
            x = lib.build(segs)
            pairs = ragged.outer(x, x, torch.mul)
            expected = [s[:, None] * s[None, :] for s in segs]
            return [e.tolist() for e in expected] == pairs.to_list() or "wrong values"
        if isinstance(lib, Nested):
            blocks = [s[:, None] * s[None, :] for s in segs]
            torch.nested.nested_tensor(blocks, layout=torch.jagged)
            return True
        blocks = [s[:, None] * s[None, :] for s in segs]
        nested = lib.build(blocks)
        return (
            close(nested.sum(dim=(1, 2)), torch.stack([b.sum((0, 1)) for b in blocks]))
            or "wrong values"
        )

    out["two ragged axes (pair map)"] = check(two_ragged_axes)

    def pytree() -> bool | str:
        leaves = torch.utils._pytree.tree_leaves(lib.build(segs))
        if all(type(leaf) is torch.Tensor and leaf.is_floating_point() for leaf in leaves):
            return True
        return "not a pytree of plain float tensors"

    out["pytree (immutable, values as the leaf)"] = check(pytree)
    return out


def torch_function_checks(lib: Library) -> dict[str, str]:
    """Plain torch code on the library's batch, each against a per-segment reference."""
    segs = segments()
    nonempty = [s for s in segs if s.shape[0]]
    out: dict[str, str] = {}

    def same_parts(got: Any, expected: list[torch.Tensor]) -> bool | str:
        parts = lib.parts(got)
        if len(parts) != len(expected):
            return f"{len(parts)} segments, expected {len(expected)}"
        return all(close(g, e) for g, e in zip(parts, expected, strict=True)) or "wrong values"

    out["torch.exp, F.gelu (elementwise)"] = check(
        lambda: same_parts(F.gelu(torch.exp(lib.build(segs))), [F.gelu(s.exp()) for s in segs])
    )
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(D, 5), nn.GELU(), nn.LayerNorm(5)).double()
    out["nn.Sequential(Linear, GELU, LayerNorm)"] = check(
        lambda: same_parts(net(lib.build(segs)), [net(s) for s in segs])
    )
    out["torch.sum(x, dim=1)"] = check(
        lambda: (
            close(torch.sum(lib.build(segs), dim=1), reference_reduce(segs, "sum"))
            or "wrong values"
        )
    )
    out["torch.softmax(x, dim=1)"] = check(
        lambda: (
            all(
                close(g, torch.softmax(s, 0))
                for g, s in zip(lib.parts(torch.softmax(lib.build(segs), dim=1)), segs, strict=True)
                if s.shape[0]
            )
            or "wrong values"
        )
    )
    out["torch.cat([x, x], dim=1) (ragged axis)"] = check(
        lambda: same_parts(
            torch.cat([lib.build(segs), lib.build(segs)], dim=1), [torch.cat([s, s]) for s in segs]
        )
    )
    out["torch.cat([x, x], dim=0) (batch axis)"] = check(
        lambda: same_parts(torch.cat([lib.build(segs), lib.build(segs)], dim=0), segs + segs)
    )

    def embedding() -> bool | str:
        ids = [torch.arange(n) % 3 for n in LENGTHS]
        emb = nn.Embedding(3, D).double()
        return same_parts(emb(lib.build(ids)), [emb(i) for i in ids])

    out["nn.Embedding on integer ids"] = check(embedding)

    def assert_close() -> bool | str:
        torch.testing.assert_close(lib.build(segs), lib.build([s.clone() for s in segs]))
        changed = [s.clone() for s in segs]
        changed[-1][0, 0] += 1.0
        try:
            torch.testing.assert_close(lib.build(segs), lib.build(changed))
        except AssertionError:
            return True
        return "a mismatch passed"

    out["torch.testing.assert_close"] = check(assert_close)

    def attention() -> bool | str:
        x = lib.build(nonempty)
        got = F.scaled_dot_product_attention(x, x, x, is_causal=True)
        expected = [
            F.scaled_dot_product_attention(s[None], s[None], s[None], is_causal=True)[0]
            for s in nonempty
        ]
        return same_parts(got, expected)

    out["F.scaled_dot_product_attention (B, L*, E)"] = check(attention)

    def compiled_module() -> bool | str:
        torch._dynamo.reset()
        graphs = []

        def backend(gm: Any, example: Any) -> Any:
            graphs.append(gm)
            return gm.forward

        fn = torch.compile(lambda x: net(x), backend=backend, dynamic=True)
        gen = torch.Generator().manual_seed(1)
        for lengths in ([3, 2, 4], [5, 1, 2, 2], [2, 6], [1, 3, 3, 3, 2]):
            batch = [torch.randn(n, D, generator=gen, dtype=torch.float64) for n in lengths]
            with ragged.dynamic_shapes() if isinstance(lib, Ragged) else contextlib.nullcontext():
                result = fn(lib.build(batch))
            if not all(close(g, net(s)) for g, s in zip(lib.parts(result), batch, strict=True)):
                return "wrong values"
        torch._dynamo.reset()
        return True if len(graphs) == 1 else f"{len(graphs)} graphs for 4 batch shapes"

    out["torch.compile(nn.Sequential): one graph across batches"] = check(compiled_module)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the result document here")
    parser.add_argument("--quick", action="store_true", help="(the same: the checks are quick)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    libraries: list[Library] = [Ragged(), Nested()]
    if importlib.util.find_spec("danling") is not None:
        libraries.append(DanLing())
    results = {lib.name: checks(lib) for lib in libraries}
    torch_results = {lib.name: torch_function_checks(lib) for lib in libraries}
    versions = f"torch {torch.__version__}" + (
        f", danling {importlib.metadata.version('danling')}"
        if "DanLing NestedTensor" in results
        else ", danling not installed"
    )
    notes = [versions, "'yes' means the result matched the reference; failures quote the error."]
    tables = [
        Table(
            f"Features, checked on a batch with lengths {LENGTHS} (float64) against per-segment "
            "references",
            ["feature", *results],
            [[f, *(r[f] for r in results.values())] for f in next(iter(results.values()))],
            notes,
        ),
        Table(
            "Plain torch code on the batch (torch functions, nn modules), against per-segment "
            "references",
            ["torch code", *torch_results],
            [
                [f, *(r[f] for r in torch_results.values())]
                for f in next(iter(torch_results.values()))
            ],
            [*notes, "F is torch.nn.functional; every call is the plain torch spelling."],
        ),
    ]
    for table in tables:
        print(table.text())
        print()
    if args.json:
        write_result(args.json, "features", tables, quick=args.quick, metric="pass/fail checks")


if __name__ == "__main__":
    main()
