"""Trust boundaries that torch's own dispatch does not reach: dense conversions
(``torch.as_tensor``), ``torch.nn.init`` functions that read the shape before writing, and a
tuple of arrays to ``torch.cat``/``torch.stack`` under ``torch.compile``."""

from __future__ import annotations

import inspect
import re
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
