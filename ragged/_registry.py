"""The public API, declared once.

Every public op is declared by ``op`` next to its implementation: its public name, family,
axis rule, the kinds of arguments it takes and the ``torch`` functions and ``Tensor`` methods it
corresponds to. Every other public name (classes, factories, converters, transforms, the
``ragged.nn``/``ragged.data``/... namespaces) is declared by ``public`` with its docs
section. From these declarations come:

* ``ragged.<name>`` and ``ragged.ops.__all__``: ``ragged/ops/__init__.py`` is generated from the
  registry (``python tools/generate.py``; a test checks that it is current), so type checkers
  see static re-exports;
* the error context: ops pass *themselves* to ``ragged._errors``, which names them as
  registered (``ragged.sum: ...``), so no message carries a hand-typed name;
* ``docs/api.md`` (the support matrix) and the reference pages and their navigation
  (``tools/generate.py``);
* the coverage tests (``tests/test_registry.py``): a public callable that is not declared, or a
  declared op without an op-table entry, fails the suite;
* the torch-native door (``ragged/ops/_torch/``): the ``torch`` functions and ``Tensor``
  methods an op answers (``torch=``, ``methods=``, with torch's spelling of its arguments in
  ``torch_args=``), and those answered without an op of their own (``torch_function``: the
  pointwise functions, ``torch.max`` with indices, ...), become the dispatch table of
  ``RaggedArray.__torch_function__``, the Tensor-style methods and ``docs/torch.md``. Each
  torch spelling (a torch function or a Tensor-style method) is declared once, as supported
  (an op, a pointwise family, a handler) or refused (``refuse``, next to its family's ops):
  ``claim`` records where, and a second declaration raises at import naming both places.

``@public`` returns its object unchanged. ``@op`` returns the function itself when the op checks
its arguments' version counters on its own hot path (``checks=True``: the elementwise ops, the
reductions, normalisations, scans and sorts, whose drivers check after their fast-path dispatch),
and otherwise a thin wrapper that checks every RaggedArray argument before the call (in eager
mode only; ``ragged._versions``: RaggedArrays are immutable, and an in-place edit of their
tensors raises instead of giving wrong results).

>>> import ragged
>>> spec = ragged._registry.lookup(ragged.sum)
>>> spec.qualname, spec.family, spec.rule.kind, [a.name for a in spec.args]
('ragged.sum', 'reductions', 'remove', ['x', 'axis', 'keepdims', 'fill_value'])
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ._axes import AxisRule
from ._storage_order import lift_axes, pointwise
from ._torch_args import TorchArgs, TorchParam
from ._versions import check_unchanged

__all__ = [
    "FAMILIES",
    "SECTIONS",
    "Arg",
    "Entry",
    "OpSpec",
    "TorchArgs",
    "TorchParam",
    "TorchSpec",
    "claim",
    "claims",
    "entries",
    "get",
    "lookup",
    "op",
    "ops",
    "public",
    "refuse",
    "spelling_name",
    "torch_function",
    "torch_functions",
]

T = TypeVar("T")

# Op families, in docs order: key -> (title, one-line description).
FAMILIES: dict[str, tuple[str, str]] = {
    "elementwise": ("Elementwise", "Operators and pointwise functions; the partition is kept."),
    "reductions": ("Reductions", "Sums, extrema, statistics and logical reductions."),
    "normalization": ("Normalisation", "Softmax and the layer, RMS and segment norms."),
    "scans": ("Scans", "Exact cumulative ops within each segment."),
    "sorting": ("Sorting", "Sort, argsort, top-k and run deduplication within segments."),
    "indexing": ("Indexing", "Take, filter, pad, truncate; `x[...]` on every axis."),
    "combining": ("Combining", "Concatenate, stack and split arrays."),
    "structure": (
        "Structure",
        "Merge and split ragged levels, positions within rows, combinations of rows.",
    ),
    "linalg": ("Linear algebra", "Matrix products with dense weights, and einsum."),
    "attention": ("Attention", "Variable-length scaled dot-product attention."),
    "pairs": ("Pair maps", "Per-segment outer products and pair-map algebra."),
    "sampling": ("Sampling", "Random rows within each segment."),
}

# Sections for the other public names, in docs order: key -> (title, one-line description).
SECTIONS: dict[str, tuple[str, str]] = {
    "arrays": ("Arrays and partitions", "The RaggedArray type, its partition and its shape."),
    "constructors": ("Constructors", "Validating factories from lists, lengths, offsets, ..."),
    "conversions": ("Conversions", "To padded tensors, masks, lists and nested tensors."),
    "transforms": ("Transforms", "map, vmap, reduce, collectives, compile and export."),
    "interop": ("Interoperability", "Other libraries' ragged formats."),
    "nn": ("ragged.nn", "Modules for RaggedArrays."),
    "data": ("ragged.data", "Collation, batch samplers and the micro-batch planner."),
    "distributed": ("ragged.distributed", "Collectives and sharding on torch.distributed."),
    "testing": ("ragged.testing", "Comparison and compile checks for tests."),
}

# The argument kinds an op may declare (``args="x: ragged, axis: axes?"``; ``?`` = optional).
KINDS = {
    "ragged": "a RaggedArray",
    "operand": "a RaggedArray, a tensor that broadcasts, or a number",
    "arrays": "a sequence of RaggedArrays",
    "tensor": "a dense tensor",
    "index": "indices: a RaggedArray or a tensor of ints",
    "axis": "one axis: an int or a name",
    "axes": "an axis, a tuple of axes, or None for all",
    "int": "an int",
    "sizes": "an int or a sequence of ints",
    "number": "a number",
    "bool": "a bool",
    "str": "a string",
    "callable": "a callable",
    "generator": "a torch.Generator",
    "any": "see the docstring",
}


@dataclasses.dataclass(frozen=True)
class Arg:
    """One declared argument: its parameter name, kind (see ``KINDS``) and whether optional."""

    name: str
    kind: str
    optional: bool


@dataclasses.dataclass(frozen=True, eq=False)
class Entry:
    """A public name: ``namespace.name`` is ``obj``, documented in ``section``."""

    name: str
    namespace: str
    obj: Any
    section: str

    @property
    def qualname(self) -> str:
        """The name users write, e.g. ``ragged.sum``."""
        return f"{self.namespace}.{self.name}"


@dataclasses.dataclass(frozen=True, eq=False)
class OpSpec(Entry):
    """A public op (``section`` is its family).

    Attributes:
        rule: its axis-name rule (``ragged._axes``).
        args: the declared arguments, in signature order.
        torch: the ``torch`` functions it corresponds to (``torch.sum``, ``F.softmax``, ...).
        methods: the ``Tensor`` method names it corresponds to (``"sum"``, ...); RaggedArray
            has them, with torch's arguments.
        torch_args: torch's signature for each of ``torch`` (and, last, the one the methods
            use), mapped onto the op's.
    """

    rule: AxisRule = dataclasses.field(default=None)  # type: ignore[assignment]
    args: tuple[Arg, ...] = ()
    torch: tuple[Any, ...] = ()
    methods: tuple[str, ...] = ()
    torch_args: tuple[TorchArgs, ...] = ()

    @property
    def family(self) -> str:
        """The op's family (a key of ``FAMILIES``)."""
        return self.section

    def torch_signature(self, fn: Any) -> TorchArgs:
        """torch's signature of ``fn`` (one of ``torch``), or the methods' (``fn=None``)."""
        for candidate, args in zip(self.torch, self.torch_args, strict=False):
            if candidate is fn:
                return args
        return self.torch_args[-1]


@dataclasses.dataclass(frozen=True, eq=False)
class TorchSpec:
    """torch functions and Tensor methods answered without an op of their own.

    Declared with ``torch_function`` next to their handler (``ragged/ops/_pointwise.py`` for
    the pointwise functions, ``ragged/ops/_torch/`` for the others).

    Attributes:
        fns: the torch callables (``torch.exp``, ``torch.nn.functional.gelu``).
        methods: the RaggedArray methods with this meaning (``"exp"``).
        handler: called with torch's arguments (a method gets ``self`` first); ``None`` for a
            function that RaggedArrays refuse with ``hint``.
        family: where its row goes in ``docs/torch.md`` (a key of ``FAMILIES``, or
            ``"tensor"`` for conversions and properties).
        meaning: what it computes on a RaggedArray, for the docs.
        see: the ragged functions it relates to (``"ragged.amax"``), for the docs.
        hint: for a refused function, what to use instead (the end of its TypeError).
        grad: differentiable (the docs and the tests read it).
        compile: traced into one graph by ``torch.compile`` (the docs and the tests read it).
        checks: the handler checks its arguments itself (the version counters of every
            RaggedArray, ``out=``, the alignment of operands); otherwise the dispatch table
            wraps it in that check (``ragged.ops._torch._table.guarded``).
    """

    fns: tuple[Any, ...]
    methods: tuple[str, ...]
    handler: Callable[..., Any] | None
    family: str
    meaning: str
    see: tuple[str, ...] = ()
    hint: str = ""
    grad: bool = True
    compile: bool = True
    checks: bool = False


_ENTRIES: dict[str, Entry] = {}
_TORCH: list[TorchSpec] = []
# Each torch spelling (a torch callable, or ``"RaggedArray.<name>"`` for a Tensor-style method)
# -> (what declared it, where: ``file:line``). A spelling is declared once, as supported or
# refused: a second declaration raises at import, naming both.
_CLAIMS: dict[Any, tuple[str, str]] = {}
_HERE = __file__


def _where() -> str:
    """``file:line`` of the declaration being made: the first caller outside this module and
    the declaring helpers (``_spelling.torch_handler``)."""
    frame = inspect.currentframe()
    while frame is not None:
        name = frame.f_code.co_filename
        if name != _HERE and not name.endswith("_spelling.py"):
            return f"{name.rsplit('ragged/', 1)[-1]}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def spelling_name(key: Any) -> str:
    """How users spell a torch callable or method key, for messages (``torch.exp``)."""
    if isinstance(key, str):
        return key
    name = torch.overrides.resolve_name(key)
    return name or getattr(key, "__qualname__", repr(key))


def claim(keys: tuple[Any, ...], what: str) -> None:
    """Record that ``what`` declares the torch spellings ``keys`` (torch callables, or
    ``"RaggedArray.<name>"``); raise if one of them is already declared."""
    where = _where()
    for key in keys:
        known = _CLAIMS.get(key)
        if known is not None or keys.count(key) > 1:
            known = known or (what, where)
            raise ValueError(
                f"{spelling_name(key)} is declared twice: as {known[0]} at {known[1]} and as "
                f"{what} at {where}; a torch spelling is declared once, as supported or "
                "refused: remove one of them."
            )
    _CLAIMS.update(dict.fromkeys(keys, (what, where)))


def claims() -> dict[Any, tuple[str, str]]:
    """Every declared torch spelling -> (what declared it, ``file:line``)."""
    return dict(_CLAIMS)


def _parse_args(name: str, fn: Callable[..., Any], schema: str) -> tuple[Arg, ...]:
    args = []
    for item in filter(None, (s.strip() for s in schema.split(","))):
        arg, _, kind = (s.strip() for s in item.partition(":"))
        optional = kind.endswith("?")
        kind = kind.rstrip("?")
        if kind not in KINDS:
            raise ValueError(f"{name}: unknown argument kind {kind!r} for {arg!r}")
        args.append(Arg(arg.lstrip("*"), kind, optional))
    params = [p for p in inspect.signature(fn).parameters]
    if [a.name for a in args] != params:
        raise ValueError(f"{name}: declared arguments {[a.name for a in args]} != {params}")
    return tuple(args)


def _register(entry: Entry) -> None:
    known = _ENTRIES.get(entry.qualname)
    if known is not None and known.obj is not entry.obj:
        raise ValueError(f"{entry.qualname} is declared twice")
    _ENTRIES[entry.qualname] = entry
    # The error context (ragged._errors.name_of); objects without a __dict__ keep their name.
    # The functions a declaration wraps (the layout liftings, ragged._storage_order) too: the
    # op's own code names itself through them.
    target = entry.obj
    while target is not None:
        with contextlib.suppress(AttributeError, TypeError):
            target.__ragged_name__ = entry.qualname
        target = getattr(target, "__wrapped__", None)


def op(
    family: str,
    *,
    rule: AxisRule,
    args: str,
    torch: tuple[Any, ...] = (),
    methods: tuple[str, ...] = (),
    torch_args: str = "",
    name: str | None = None,
    namespace: str = "ragged",
    checks: bool = False,
) -> Callable[[T], T]:
    """Declare a public op ``ragged.<name>`` (the function's own name by default).

    Args:
        family: a key of ``FAMILIES``: where it lives in ``ragged/ops/`` and in the docs.
        rule: its axis-name rule, one of ``ragged._axes``'s rules.
        args: its arguments as ``"name: kind"`` items (``?`` marks optional ones; see
            ``KINDS``), checked against the signature when the module loads.
        torch: the ``torch`` functions it answers (``RaggedArray.__torch_function__``); an item
            ``(fn, "signature")`` gives ``fn`` its own signature instead of ``torch_args``.
        methods: the ``Tensor`` methods it answers: RaggedArray gets them, with torch's
            arguments.
        torch_args: torch's signature (see ``TorchArgs``); required with ``torch`` or
            ``methods``.
        name: the public name, if not the function's.
        namespace: where users find it: ``ragged`` for functions, ``RaggedArray`` for an op that
            is only a method (``x[...]``).
        checks: the op checks its RaggedArray arguments' version counters itself; otherwise
            the declaration wraps it in a check (see the module docstring).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown op family {family!r}")

    def declare(fn: T) -> T:
        public_name = name or fn.__name__  # type: ignore[attr-defined]
        if (torch or methods) and not torch_args:
            raise ValueError(f"{public_name}: `torch` and `methods` need `torch_args`")
        declared = _parse_args(public_name, fn, args)  # type: ignore[arg-type]
        obj = fn if checks else _checked(fn, declared)  # type: ignore[arg-type]
        # Permuted arrays (ragged._storage_order): run on the storage order, the layout put back.
        obj = pointwise(obj) if family == "elementwise" else lift_axes(obj, declared)  # type: ignore[arg-type]
        fns = tuple(item[0] if isinstance(item, tuple) else item for item in torch)
        signatures = tuple(
            TorchArgs.parse(fn, item[1] if isinstance(item, tuple) else torch_args)  # type: ignore[arg-type]
            for item in torch
        )
        if torch_args:
            signatures += (TorchArgs.parse(fn, torch_args),)  # type: ignore[arg-type]
        spec = OpSpec(public_name, namespace, obj, family, rule, declared, fns, methods, signatures)
        claim((*fns, *(f"RaggedArray.{m}" for m in methods)), f"the op {spec.qualname}")
        _register(spec)
        return obj  # type: ignore[return-value]

    return declare


# Argument kinds that can hold RaggedArrays (``arrays``: a sequence of them).
_RAGGED_KINDS = frozenset({"ragged", "operand", "index", "arrays", "any"})


def _checked(fn: Callable[..., Any], declared: tuple[Arg, ...]) -> Callable[..., Any]:
    """``fn`` behind a check of its RaggedArray arguments' version counters (eager only)."""
    params = list(inspect.signature(fn).parameters.values())
    targets = []  # (position or None for keyword-only, name, is *args)
    for k, (arg, param) in enumerate(zip(declared, params, strict=True)):
        if arg.kind not in _RAGGED_KINDS or param.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        positional = param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD)
        star = param.kind is inspect.Parameter.VAR_POSITIONAL
        targets.append((k if positional or star else None, arg.name, star))

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        # While torch.compile traces, check_unchanged checks the layout only (static; the
        # version counters are not): a permuted array is refused there too.
        for position, name, star in targets:
            if star:
                value: Any = args[position:]
            elif position is not None and position < len(args):
                value = args[position]
            else:
                value = kwargs.get(name)
            _check_value(checked, name, value)
        return fn(*args, **kwargs)

    return checked


def _is_array(value: Any) -> bool:
    """Whether ``value`` is a RaggedArray (the core cannot import the class); read from its type,
    which torch.compile traces for any value (a slice of an index too)."""
    return "_values_version" in getattr(type(value), "__dataclass_fields__", ())


def _check_value(func: Any, name: str, value: Any) -> None:
    if _is_array(value):
        check_unchanged(func, value, names=(name, ""))
    elif isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            if _is_array(item):
                check_unchanged(func, item, names=(f"{name}[{k}]", ""))


def public(section: str, *, namespace: str = "ragged", name: str | None = None) -> Callable[[T], T]:
    """Declare a public name that is not an op (a class, factory, converter or transform).

    Args:
        section: a key of ``SECTIONS``.
        namespace: where users import it from (``ragged``, ``ragged.nn``, ...).
        name: the public name, if not the object's own.
    """
    if section not in SECTIONS:
        raise ValueError(f"unknown docs section {section!r}")

    def declare(obj: T) -> T:
        _register(Entry(name or obj.__name__, namespace, obj, section))  # type: ignore[attr-defined]
        return obj

    return declare


def torch_function(
    *fns: Any,
    family: str,
    meaning: str,
    methods: tuple[str, ...] = (),
    see: tuple[str, ...] = (),
    grad: bool = True,
    compile: bool = True,
    checks: bool = False,
) -> Callable[[T], T]:
    """Declare the handler of torch functions (and Tensor methods) that no op answers.

    The handler takes torch's arguments (``self`` first for a method) and returns the result;
    it is entered in the dispatch table of ``RaggedArray.__torch_function__`` for each of
    ``fns`` and installed as each of ``methods``. See ``TorchSpec`` for the other fields.
    """
    if family not in FAMILIES and family != "tensor":
        raise ValueError(f"unknown family {family!r}")

    def declare(handler: T) -> T:
        spec = TorchSpec(fns, methods, handler, family, meaning, see, "", grad, compile, checks)  # type: ignore[arg-type]
        keys = (*fns, *(f"RaggedArray.{m}" for m in methods))
        claim(keys, f"the {family} handler {getattr(handler, '__qualname__', handler)}")
        _TORCH.append(spec)
        return handler

    return declare


def refuse(*fns: Any, family: str, hint: str, see: tuple[str, ...] = ()) -> None:
    """Declare torch functions that RaggedArrays refuse, and what to use instead (``hint``).

    Declared next to the ops of ``family``; a function is supported or refused, not both.
    """
    claim(fns, f"a refusal ({family})")
    _TORCH.append(TorchSpec(fns, (), None, family, "not supported", see, hint, False, False))


def torch_functions() -> list[TorchSpec]:
    """Every ``torch_function`` and ``refuse`` declaration, in declaration order."""
    return list(_TORCH)


def entries(namespace: str | None = None) -> list[Entry]:
    """Every declared name (of one namespace), in declaration order."""
    return [e for e in _ENTRIES.values() if namespace is None or e.namespace == namespace]


def ops() -> list[OpSpec]:
    """Every declared op, in declaration order."""
    return [e for e in _ENTRIES.values() if isinstance(e, OpSpec)]


def get(qualname: str) -> Any:
    """The declaration of ``qualname`` (``"ragged.sum"``, ``"RaggedArray.__getitem__"``).

    >>> get("ragged.softmax").family
    'normalization'
    """
    entry = _ENTRIES.get(qualname)
    if entry is None:
        raise KeyError(f"{qualname} is not a declared public name")
    return entry


def lookup(obj: Any) -> Any:
    """The declaration of a public object (an ``OpSpec`` for ops), or ``None``."""
    name = getattr(obj, "__ragged_name__", None)
    return None if name is None else _ENTRIES.get(name)
