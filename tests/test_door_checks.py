"""The torch door checks every call the same way: every registered entry point is walked.

Every torch function of ``RaggedArray.__torch_function__``'s table and every Tensor-style method
(``ragged.ops._torch``) is called on a small array: once as is (the call must work), then with
arrays edited in place (values, then offsets: a ``ValueError``), with ``out=`` (a ``TypeError``
that writes nothing) and, where it takes a second RaggedArray operand, with one whose axes do
not line up (a ``ValueError``). The calls are found, not listed: a new entry point is walked
as soon as it is declared, and one that no call pattern reaches fails the suite.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import ragged
from ragged import _registry
from ragged.ops import _torch

Arrays = dict[str, Any]


def _arrays(misaligned: bool = False) -> Arrays:
    """``x``: (3, [2, 0, 3], 3) float64 in (0.1, 0.9); ``y``: the other operand (``x``'s twin,
    or (3, [2, 0, 3]) when ``misaligned``); ``i``: ints in [0, 3); ``m``: (3, [2, 0, 3], 3, 3)."""
    gen = torch.Generator().manual_seed(0)
    x = ragged.from_lengths(
        torch.rand(5, 3, generator=gen, dtype=torch.float64) * 0.8 + 0.1, [2, 0, 3]
    )
    y = x.with_values(x.values[:, 0].clone() if misaligned else x.values.flip(0))
    i = x.with_values(torch.randint(0, 3, (5, 3), generator=gen))
    m = x.with_values(x.values[:, :, None] * x.values[:, None, :])
    return {"x": x, "y": y, "i": i, "m": m}


def _dense(*shape: int) -> torch.Tensor:
    return torch.full(shape, 0.5, dtype=torch.float64)


# Call patterns, tried in order until one works on fresh arrays: (uses the operand ``y``, call).
PATTERNS: list[tuple[bool, Callable[[Any, Arrays], Any]]] = [
    (False, lambda f, a: f(a["x"])),
    (True, lambda f, a: f(a["x"], a["y"])),
    (False, lambda f, a: f(a["x"], 1)),
    (False, lambda f, a: f(a["x"], -1)),
    (True, lambda f, a: f(a["x"], a["y"], a["y"])),
    (False, lambda f, a: f(a["x"], 0.5)),
    (True, lambda f, a: f(a["x"] > 0.5, a["y"], 0.5)),
    (False, lambda f, a: f(a["x"], a["x"] > 0.5, 0.5)),
    (True, lambda f, a: f([a["x"], a["y"]])),
    (True, lambda f, a: f([a["x"], a["y"]], -1)),
    (False, lambda f, a: f(a["x"], 1, 1)),
    (False, lambda f, a: f(a["x"], -1, -1)),
    (False, lambda f, a: f(a["x"], 2)),
    (False, lambda f, a: f(a["x"], (3,))),
    (False, lambda f, a: f(a["x"], torch.float32)),
    (False, lambda f, a: f(a["i"])),
    (False, lambda f, a: f(a["i"], 5)),
    (False, lambda f, a: f(a["i"], a["i"])),
    (False, lambda f, a: f(a["i"], _dense(4, 2))),
    (True, lambda f, a: f(a["x"], a["y"], 0.5)),
    (False, lambda f, a: f(a["x"], 0.1, 2.0)),
    (False, lambda f, a: f(a["x"], 0.5, False)),
    (False, lambda f, a: f(a["x"], _dense(3, 3))),
    (True, lambda f, a: f("bld,bld->bl", a["x"], a["y"])),
    (False, lambda f, a: f(_dense(3), a["x"])),
    (True, lambda f, a: f(_dense(3), a["x"], a["y"])),
    (False, lambda f, a: f(_dense(3), a["x"], 0.5)),
    (False, lambda f, a: f(_dense(3), a["x"] > 0.5, a["x"])),
    (False, lambda f, a: f(_dense(3), a["x"] > 0.5, 0.5)),
    (False, lambda f, a: f(torch.ones(3, dtype=torch.long), a["i"])),
    (False, lambda f, a: f(_dense(3, 3), a["m"])),
    (False, lambda f, a: f(_dense(2), a["x"], _dense(3, 2))),
    (False, lambda f, a: f(a["x"], (0, 2, 1))),  # permute
    (False, lambda f, a: f(a["x"], a["x"].shape)),  # reshape, view, expand, new_zeros
    (False, lambda f, a: f(a["x"], 2, (3, 1))),  # unflatten
    (False, lambda f, a: f(a["x"], 1, -1)),  # chunk
    (False, lambda f, a: f(a["x"], a["x"].shape, 0.5)),  # new_full
    (False, lambda f, a: f(_dense(3, 4, 3), 1, a["i"])),  # gather of a dense buffer
    *[(False, lambda f, a, g=gates: _recurrent(f, a["x"], g)) for gates in (1, 3, 4)],
    (True, lambda f, a: _attend(f, a["x"], a["y"])),
    (False, lambda f, a: f(a["m"])),  # tril, triu of two inner axes
    (False, lambda f, a: f(a["x"], a["x"].transpose(1, 2))),  # bmm: the pair map
    (False, lambda f, a: f(a["x"] @ a["x"].mT, a["x"], a["x"].transpose(1, 2))),  # baddbmm
]


def _attend(f: Any, x: Any, y: Any) -> Any:
    """``F.multi_head_attention_forward`` as ``nn.MultiheadAttention(3, 1)`` calls it: the
    sequence-first views ``(L*, B, E)`` of ``x`` (the queries) and ``y`` (keys and values)."""
    kv = y.transpose(0, 1)
    weights = (_dense(9, 3), None, None, None, False, 0.0, _dense(3, 3), None)
    return f(x.transpose(0, 1), kv, kv, 3, 1, *weights)


RECURRENT_GATES = {torch.gru: 3, torch.lstm: 4, torch.rnn_tanh: 1, torch.rnn_relu: 1}


def _recurrent(f: Any, x: Any, gates: int) -> Any:
    """``torch.gru`` (3 gates), ``torch.lstm`` (4) or ``torch.rnn_*`` (1) as the modules call
    them: hidden size 2, one layer, batch first. Weights of another gate count could crash
    torch's kernel: a recurrent function is called with its own only (``f`` may also be the
    ``out=`` wrapper of the function whose pattern this is)."""
    if RECURRENT_GATES.get(f, gates) != gates:
        raise TypeError("another recurrent function")
    params = [_dense(2 * gates, 3), _dense(2 * gates, 2), _dense(2 * gates), _dense(2 * gates)]
    h0 = _dense(1, 3, 2)
    return f(x, (h0, h0) if gates == 4 else h0, params, True, 1, 0.0, False, False, True)


# Entry points for which the other operand's shape is an answer (equal: False) or not read
# (type_as: its dtype and device only), not an error.
ANSWERS_MISMATCH = {"torch.equal", "torch.Tensor.equal", "RaggedArray.equal", "RaggedArray.type_as"}


def _entries() -> list[tuple[str, Any]]:
    refused = {fn for e in _registry.torch_functions() if e.handler is None for fn in e.fns}
    found = [(_torch.display_name(f), f) for f in _torch.dispatch_table() if f is not None]
    # torch.autograd.grad takes outputs and inputs, not operands of an op (it reads no values
    # and writes none): tests/test_immutability.py covers it.
    found = [(label, f) for label, f in found if f not in refused and f is not torch.autograd.grad]
    return found + [(f"RaggedArray.{name}", name) for name in _torch.method_table()]


def _caller(key: Any) -> Callable[..., Any]:
    if isinstance(key, str):
        return lambda first, *rest, **kwargs: getattr(first, key)(*rest, **kwargs)
    return key


def _pattern(key: Any) -> tuple[bool, Callable[[Any, Arrays], Any]] | None:
    f = _caller(key)
    for uses_y, pattern in PATTERNS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pattern(f, _arrays())
        except Exception:
            continue
        return uses_y, pattern
    return None


ENTRIES = _entries()


def test_every_entry_point_is_walked() -> None:
    assert len(ENTRIES) > 400  # the torch functions and the methods
    missing = [label for label, key in ENTRIES if _pattern(key) is None]
    assert missing == [], "no call pattern reaches these entry points: add one to PATTERNS"


@pytest.mark.parametrize(("label", "key"), ENTRIES, ids=[label for label, _ in ENTRIES])
def test_every_entry_point_checks_edits_out_and_alignment(label: str, key: Any) -> None:
    found = _pattern(key)
    if found is None:
        pytest.skip("not reached (test_every_entry_point_is_walked fails)")
    uses_y, pattern = found
    f = _caller(key)

    arrays = _arrays()
    for a in arrays.values():
        a.values.add_(0)  # an in-place edit: the version counter moves
    with pytest.raises(ValueError, match="modified in place"):
        pattern(f, arrays)

    arrays = _arrays()
    arrays["x"].offsets[1] = 2  # the same value, written in place (shared by all four)
    with pytest.raises(ValueError, match="modified in place"):
        pattern(f, arrays)

    # Refused by the door ("`out=` is not supported"), or by torch's own argument parser
    # before the call reaches it (torch.where's overload with `out` takes tensors only).
    out = torch.zeros(5, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"out|argument"):
        pattern(lambda *args, **kwargs: f(*args, **kwargs, out=out), _arrays())
    assert not out.any()

    if uses_y and label not in ANSWERS_MISMATCH:
        # A ValueError naming the shapes (x * mask's), or a TypeError for a layout that
        # cannot hold them (F.scaled_dot_product_attention).
        with pytest.raises((ValueError, TypeError), match=r"axes|shape"):
            pattern(f, _arrays(misaligned=True))


# --- the cases of issue 25 -----------------------------------------------------------------------


def _mask_case() -> tuple[Any, Any]:
    x = ragged.from_lengths(torch.randn(5, 1, dtype=torch.float64), [2, 3])
    return x, x.with_values(x.values[:, 0] > 0)


@pytest.mark.parametrize(
    "call",
    [
        lambda x, c: torch.where(c, x, 0.0),
        lambda x, c: x.masked_fill(c, 0.0),
        lambda x, c: torch.lerp(x, x, c.double()),
        lambda x, c: torch.clamp(x, min=c.double()),
        lambda x, c: torch.addcmul(x, c.double(), x),
        lambda x, c: x * c,
    ],
    ids=["where", "masked_fill", "lerp", "clamp", "addcmul", "multiply"],
)
def test_a_mask_of_fewer_axes_is_refused_as_by_multiply(call) -> None:
    x, c = _mask_case()
    with pytest.raises(ValueError, match=r"ragged operands of (3 and 2|2 and 3) axes would line"):
        call(x, c)


@pytest.mark.parametrize(
    ("ragged_dtype", "dense_dtype"),
    [(torch.float32, torch.float64), (torch.int32, torch.int64), (torch.float16, torch.float32)],
)
@pytest.mark.parametrize("shape", [(1,), (), (1, 1)])
def test_dtype_promotion_follows_torch(ragged_dtype, dense_dtype, shape) -> None:
    x = ragged.from_lengths(torch.ones(5, dtype=ragged_dtype), [2, 3])
    t = torch.ones(shape, dtype=dense_dtype)
    expected = torch.result_type(torch.ones(2, 3, dtype=ragged_dtype), t)
    for result in (x + t, t + x, torch.add(x, t), torch.maximum(x, t), torch.where(x > 0, x, t)):
        assert result.dtype == expected


def test_out_writes_nothing() -> None:
    x, _ = _mask_case()
    for fn in (torch.exp, torch.sigmoid, torch.tanh):
        out = torch.zeros(5, 1, dtype=torch.float64)
        with pytest.raises(TypeError, match=r"`out=` is not supported"):
            fn(x, out=out)
        assert not out.any()
