"""Trust boundaries that torch's own dispatch does not reach: dense conversions
(``torch.as_tensor``), ``torch.nn.init`` functions that read the shape before writing, and a
tuple of arrays to ``torch.cat``/``torch.stack`` under ``torch.compile``."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.init as init

import ragged

IMMUTABLE = "RaggedArrays are immutable"
NOT_DENSE = (
    "RaggedArray: a RaggedArray is no dense tensor, so torch.as_tensor, torch.tensor, "
    "torch.asarray, torch.from_dlpack and numpy.asarray cannot convert it; use x.values "
)


def _array(inner: tuple[int, ...] = (2,)) -> ragged.RaggedArray:
    total = 3
    values = torch.arange(float(total * int(np.prod(inner)))).reshape(total, *inner)
    return ragged.from_lengths(values, [2, 1])


# --- dense conversions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "convert",
    [torch.as_tensor, torch.tensor, torch.asarray, torch.from_dlpack, np.asarray, np.array],
    ids=lambda f: f.__name__,
)
def test_dense_conversions_name_values_and_to_padded(convert):
    x = _array()
    with pytest.raises(TypeError, match="^" + re.escape(NOT_DENSE)) as info:
        convert(x)
    assert "x.to_padded()" in str(info.value)
    assert "x.to_mask()" in str(info.value)


def test_dense_conversions_of_the_parts_still_work():
    x = _array()
    assert torch.equal(torch.as_tensor(x.values), x.values)
    padded = torch.as_tensor(x.to_padded())
    assert torch.equal(padded, torch.stack([x[0], torch.cat([x[1], x[1] * 0])]))
    assert x.to_list() == [[[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0]]]  # iteration is untouched


# --- torch.nn.init ----------------------------------------------------------------------------


def _init_functions() -> list[str]:
    """Every public function of torch.nn.init that takes a tensor first (the deprecated spellings
    without ``_`` included)."""
    names = []
    for name in dir(init):
        fn = getattr(init, name)
        if name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != init.__name__:
            continue
        params = list(inspect.signature(fn).parameters)
        if params and params[0] in ("tensor", "args"):
            names.append(name)
    return names


def _required_args(fn: Any) -> list[float]:
    """0.5 for each required argument after the tensor (``constant_``'s val, ``sparse_``'s
    sparsity)."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    return [0.5 for p in params if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]


def test_the_walk_finds_the_shape_readers():
    names = set(_init_functions())
    assert {"xavier_uniform_", "kaiming_normal_", "orthogonal_", "trunc_normal_", "eye_"} <= names
    assert {"zeros_", "ones_", "constant_", "sparse_", "dirac_", "xavier_normal"} <= names
    assert "calculate_gain" not in names


@pytest.mark.parametrize("inner", [(), (2,), (2, 3)], ids=["2d", "3d", "4d"])
@pytest.mark.parametrize("name", _init_functions())
def test_every_nn_init_function_raises_the_immutability_error(name, inner):
    fn = getattr(init, name)
    x = _array(inner)
    before = x.values.clone()
    target = name if name.endswith("_") else f"{name}_"  # the deprecated ones call the new
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(TypeError, match=IMMUTABLE) as info:
            fn(x, *_required_args(getattr(init, target)))
    message = str(info.value)
    assert f"torch.nn.init.{target}" in message
    assert "x.with_values(torch.nn.init." in message
    assert torch.equal(x.values, before)  # nothing was written
    assert x.values._version == x._values_version


def test_shape_reads_outside_nn_init_still_answer():
    x = _array((2,))
    assert (x.dim(), x.ndimension(), x.is_meta) == (3, 3, False)
    assert ragged.array([[1.0]]).to("meta").is_meta
    with pytest.raises(TypeError, match=r"^RaggedArray.zero_: RaggedArrays are immutable"):
        x.zero_()


# --- a tuple of arrays to torch.cat / torch.stack under torch.compile -------------------------


def test_tuple_of_arrays_to_cat_and_stack_compiles_in_one_graph():
    from torch._dynamo.testing import CompileCounter

    from ragged.ops._torch import _dynamo_tuples

    x = ragged.from_lengths(torch.arange(10.0, dtype=torch.float64).reshape(5, 2), [2, 0, 3])
    y = x.with_values(x.values * 10 - 1)

    def f(x, y):
        return (
            torch.cat((x, y), dim=1),
            torch.stack((x, y), dim=-1),
            torch.cat([x, y], dim=-1),
        )

    counter = CompileCounter()
    torch._dynamo.reset()
    got = torch.compile(f, backend=counter, fullgraph=True)(x, y)
    assert counter.frame_count == 1
    module = sys.modules[_dynamo_tuples.TARGET]
    assert getattr(module._flatten_vts, "__ragged_opens_tuples__", False)
    for out, want in zip(got, f(x, y), strict=True):
        assert torch.equal(out.values, want.values)
        assert torch.equal(out.lengths, want.lengths)
    # the per-segment reference
    for b in range(3):
        torch.testing.assert_close(got[0][b], torch.cat([x[b], y[b]], 0))
        torch.testing.assert_close(got[1][b], torch.stack([x[b], y[b]], -1))


def test_import_ragged_does_not_import_dynamo_for_the_tuple_hook():
    code = (
        "import sys, ragged; "
        "from ragged.ops._torch import _dynamo_tuples as m; "
        "assert 'torch._dynamo' not in sys.modules; "
        "assert any(type(f).__name__ == '_Finder' for f in sys.meta_path); "
        "import torch._dynamo; "
        "mod = sys.modules[m.TARGET]; "
        "assert mod._flatten_vts.__ragged_opens_tuples__; "
        "assert not any(type(f).__name__ == '_Finder' for f in sys.meta_path)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=_env())


def _env() -> dict[str, str]:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    return env


# --- score_mod / mask_mod checks under torch.compile -----------------------------------------

MOD_CASES = {
    "score_mod arity": (
        {"score_mod": lambda s, b, h, i: s},
        TypeError,
        "ragged.attention: `score_mod` must take 5 arguments (score, b, h, q_idx, kv_idx), got "
        "signature (s, b, h, i).",
    ),
    "mask_mod arity": (
        {"mask_mod": lambda b, h, *rest, scale: b >= 0},
        TypeError,
        "ragged.attention: `mask_mod` must take 4 arguments (b, h, q_idx, kv_idx), got "
        "signature (b, h, *rest, scale).",
    ),
    "score_mod 0-d": (
        {"score_mod": lambda s, b, h, i, j: s.sum()},
        ValueError,
        "ragged.attention: `score_mod` must return a floating tensor of the score's shape",
    ),
    "mask_mod float": (
        {"mask_mod": lambda b, h, i, j: (i >= j).float()},
        ValueError,
        "ragged.attention: `mask_mod` must return a boolean tensor that broadcasts",
    ),
}


def _error_chain(error: BaseException) -> str:
    texts = []
    while error is not None:
        texts.append(str(error))
        error = error.__cause__
    return "\n".join(texts)


@pytest.mark.parametrize("case", list(MOD_CASES))
def test_mod_checks_hold_under_compile(case):
    kwargs, kind, message = MOD_CASES[case]
    q = ragged.from_lengths(torch.randn(5, 2, 4, dtype=torch.float64), [2, 3])
    with pytest.raises(kind, match="^" + re.escape(message)):
        ragged.attention(q, q, q, **kwargs)  # eager
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda q: ragged.attention(q, q, q, **kwargs), backend="eager")
        with pytest.raises(kind, match="^" + re.escape(message)):
            compiled(q)  # Dynamo traces the check, raises it, and the eager rerun names it
        full = torch.compile(
            lambda q: ragged.attention(q, q, q, **kwargs), backend="eager", fullgraph=True
        )
        with pytest.raises(torch._dynamo.exc.Unsupported) as info:
            full(q)
        assert message in _error_chain(info.value)  # raised while tracing, not after
    finally:
        torch._dynamo.reset()


def test_checked_mods_compile_in_one_graph():
    from torch._dynamo.testing import CompileCounter

    q = ragged.from_lengths(torch.randn(5, 2, 4, dtype=torch.float64), [2, 3])

    def f(q):
        return ragged.attention(
            q,
            q,
            q,
            score_mod=lambda s, b, h, i, j: s - 0.1 * (i - j).abs(),
            mask_mod=lambda b, h, i, j: i >= j,
        )

    counter = CompileCounter()
    torch._dynamo.reset()
    try:
        got = torch.compile(f, backend=counter, fullgraph=True)(q)
    finally:
        torch._dynamo.reset()
    assert counter.frame_count == 1
    want = f(q)
    torch.testing.assert_close(got.values, want.values)
    for b, n in enumerate([2, 3]):  # the per-segment reference
        seg = q[b].transpose(0, 1)  # (heads, n, d)
        scores = seg @ seg.transpose(-1, -2) / 2.0
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        scores = (scores - 0.1 * (i - j).abs()).masked_fill(i < j, float("-inf"))
        ref = (scores.softmax(-1) @ seg).transpose(0, 1)
        torch.testing.assert_close(got[b], ref)


# --- conversions check in-place edits --------------------------------------------------------


@pytest.mark.parametrize("convert", ["to_padded", "to_mask"])
def test_conversions_refuse_an_edited_array(convert):
    x = _array()
    x.values.add_(1)
    if convert == "to_padded":
        with pytest.raises(ValueError, match=r"^ragged.to_padded: `x` was modified in place"):
            x.to_padded()
    y = _array()
    y.offsets[1] = 1
    with pytest.raises(
        ValueError,
        match=rf"^ragged.{convert}: `x` was modified in place .*"
        r"its partition's offsets",
    ):
        getattr(y, convert)()
    fresh = _array()
    assert getattr(fresh, convert)().shape[:2] == (2, 2)


# --- recurrent modules in the sequence-first layout ------------------------------------------


@pytest.mark.parametrize("module", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
def test_sequence_first_recurrent_modules_name_batch_first(module):
    x = ragged.from_lengths(torch.randn(5, 3), [2, 3])
    with pytest.raises(ValueError, match=rf"^nn.{module.__name__}: `batch_first` must be True"):
        module(3, 4)(x)
    out = module(3, 4, batch_first=True)(x)[0]
    assert out.lengths.tolist() == [2, 3]
    assert x.size(1).lengths.tolist() == [2, 3]  # other callers still get the RaggedSize
