"""``check_compile``: one graph across batches, no data-dependent sizes, no host syncs.

"Compiles with ``fullgraph=True``" is not proof of a sync-free op: in torch 2.13 ``.item()``,
``nonzero`` and friends become *unbacked* symbolic sizes instead of graph breaks. This helper
compiles a function once, runs it on many batches, compares every result with eager mode, and
inspects every captured graph for unbacked symbols and host-sync calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from .._registry import public
from ._compare import assert_close

_SYNC_METHODS = {"item", "tolist", "nonzero", "numpy", "cpu"}
_SYNC_FUNCTIONS = {torch.nonzero, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.nonzero}


@public("testing", namespace="ragged.testing")
@dataclasses.dataclass
class CompileReport:
    """What ``check_compile`` saw.

    Attributes:
        graphs: number of graphs Dynamo captured (one per compilation).
        unbacked: graph nodes that introduced a data-dependent (unbacked) size.
        syncs: graph nodes that read a tensor back to the host.
    """

    graphs: int = 0
    unbacked: list[str] = dataclasses.field(default_factory=list)
    syncs: list[str] = dataclasses.field(default_factory=list)


class _Recorder:
    def __init__(self, backend: str | Callable[..., Any], report: CompileReport) -> None:
        self.backend = (
            torch._dynamo.lookup_backend(backend) if isinstance(backend, str) else backend
        )
        self.report = report

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.report.graphs += 1
        inputs: set[Any] = set()
        for node in gm.graph.nodes:
            symbols = _unbacked(node.meta.get("example_value"))
            if node.op == "placeholder":
                inputs |= symbols  # sizes marked unbacked on purpose (mark_unbacked)
            elif symbols - inputs:
                self.report.unbacked.append(_describe(node))
            if _is_sync(node):
                self.report.syncs.append(_describe(node))
        return self.backend(gm, example_inputs)


def _unbacked(value: Any) -> set[Any]:
    if value is None:
        return set()
    try:
        return set(free_unbacked_symbols(value))
    except AssertionError:  # torch 2.13 asserts on some unbacked symbols it cannot trace back;
        # counting them as one unknown keeps the check conservative (re-check on a torch upgrade)
        return {"<unbacked>"}


def _describe(node: torch.fx.Node) -> str:
    target = getattr(node.target, "__name__", str(node.target))
    trace = node.meta.get("stack_trace") or ""
    where = trace.strip().splitlines()[-2].strip() if trace.strip() else ""
    return f"{node.op} {target} {where}".strip()


def _is_sync(node: torch.fx.Node) -> bool:
    if node.op == "call_method" and node.target in _SYNC_METHODS:
        return True
    if node.op == "call_function":
        if node.target in _SYNC_FUNCTIONS:
            return True
        if node.target is torch.repeat_interleave and "output_size" not in node.kwargs:
            return len(node.args) > 1 and isinstance(node.args[1], torch.fx.Node)
    return False


@public("testing", namespace="ragged.testing")
def check_compile(
    fn: Callable[..., Any],
    batches: Iterable[Sequence[Any]],
    *,
    backend: str | Callable[..., Any] = "aot_eager",
    max_graphs: int = 1,
    allow_unbacked: bool = False,
    dynamic: bool = True,
    fullgraph: bool = True,
    grad: bool = False,
    **tolerances: Any,
) -> CompileReport:
    """Compile ``fn`` once and check it across ``batches`` of arguments.

    For each batch the compiled and eager results must agree (``tolerances`` go to
    [`ragged.testing.assert_close`][ragged.testing.assert_close]). Afterwards the number of captured graphs must be at
    most ``max_graphs`` and, unless ``allow_unbacked``, no graph may contain a data-dependent
    size or a host sync.

    Args:
        fn: the function to compile.
        batches: argument tuples, e.g. RaggedArrays of different batch sizes and lengths.
        backend: a ``torch.compile`` backend; ``"aot_eager"`` also traces the backward.
        max_graphs: most graphs allowed across all batches.
        allow_unbacked: accept data-dependent sizes (ops documented as such, e.g. filter).
        dynamic: passed to ``torch.compile``.
        fullgraph: passed to ``torch.compile``.
        grad: also compare gradients of ``sum`` of the outputs with respect to every
            floating-point leaf that requires grad.

    Returns:
        The [`CompileReport`][ragged.testing.CompileReport].

    Raises:
        AssertionError: a result differs, too many graphs, or an unbacked size or sync.

    >>> import ragged, torch
    >>> batches = [(ragged.from_lengths(torch.randn(n * 3, 2), [n, 2 * n]),) for n in (2, 3, 5)]
    >>> check_compile(lambda x: x.values.sum(), batches, backend="eager").graphs
    1
    """
    torch._dynamo.reset()
    report = CompileReport()
    compiled = torch.compile(
        fn, backend=_Recorder(backend, report), dynamic=dynamic, fullgraph=fullgraph
    )
    try:
        for args in batches:
            expected = fn(*args)
            actual = compiled(*args)
            assert_close(actual, expected, **tolerances)
            if grad:
                _compare_grads(fn, compiled, args, tolerances)
    finally:
        torch._dynamo.reset()  # drop the compiled code so later checks start clean
    if report.graphs > max_graphs:
        raise AssertionError(f"check_compile: {report.graphs} graphs, expected <= {max_graphs}")
    if not allow_unbacked and (report.unbacked or report.syncs):
        found = "\n  ".join(report.unbacked + report.syncs)
        raise AssertionError(f"check_compile: data-dependent sizes or host syncs:\n  {found}")
    return report


def _compare_grads(
    fn: Callable[..., Any], compiled: Callable[..., Any], args: Sequence[Any], tolerances: Any
) -> None:
    def leaves(tree: Any) -> list[torch.Tensor]:
        found = torch.utils._pytree.tree_leaves(tree)
        return [t for t in found if isinstance(t, torch.Tensor) and t.requires_grad]

    def scalar(out: Any) -> torch.Tensor:
        # RaggedArrays flatten to their values.
        found = torch.utils._pytree.tree_leaves(out)
        parts = [t.sum() for t in found if isinstance(t, torch.Tensor) and t.is_floating_point()]
        return torch.stack(parts).sum()

    inputs = leaves(args)
    if not inputs:
        return
    expected = torch.autograd.grad(scalar(fn(*args)), inputs, allow_unused=True)
    actual = torch.autograd.grad(scalar(compiled(*args)), inputs, allow_unused=True)
    for a, e in zip(actual, expected, strict=True):
        if a is None or e is None:
            if (a is None) != (e is None):
                raise AssertionError("check_compile: gradient present in one mode only")
            continue
        torch.testing.assert_close(a, e, **tolerances)
