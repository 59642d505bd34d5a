"""NaN follows torch per segment: max/min propagate it, argmax/argmin point at the first NaN,
sort puts it above every number (last ascending, first descending)."""

import hypothesis.strategies as st
import torch
from hypothesis import given

import ragged
from tests.strategies import lengths

NAN = float("nan")


@st.composite
def arrays_with_nan(draw):
    lens = draw(lengths(max_segments=5, max_length=5))
    total = sum(lens)
    inner = draw(st.sampled_from([(), (2,)]))
    pool = st.sampled_from([NAN, -1.0, 0.0, 1.0, 2.0, float("inf"), -float("inf")])
    flat = draw(st.lists(pool, min_size=total * (2 if inner else 1), max_size=total * 2))
    values = torch.tensor(flat[: total * (2 if inner else 1)], dtype=torch.float64)
    return ragged.from_lengths(values.reshape(total, *inner), lens)


def same(a, b):
    torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)


@given(arrays_with_nan())
def test_arg_reductions_point_at_the_first_nan(x):
    for op, ref in ((ragged.argmax, torch.argmax), (ragged.argmin, torch.argmin)):
        got = op(x, axis=1)
        for b, segment in enumerate(x.unbind()):
            if segment.shape[0]:
                same(got[b], ref(segment, dim=0))
            else:
                assert (got[b] == -1).all()


@given(arrays_with_nan())
def test_max_min_propagate_nan(x):
    for op, ref in ((ragged.max, torch.amax), (ragged.min, torch.amin)):
        got = op(x, axis=1)
        for b, segment in enumerate(x.unbind()):
            if segment.shape[0]:
                same(got[b], ref(segment, dim=0))


@given(arrays_with_nan(), st.booleans())
def test_sort_puts_nan_above_every_number(x, descending):
    got = ragged.sort(x, descending=descending)
    order = ragged.argsort(x, descending=descending)
    for b, segment in enumerate(x.unbind()):
        ref = torch.sort(segment, dim=0, descending=descending, stable=True)
        same(got[b], ref.values)
        same(order[b], ref.indices)


def test_the_issue_example():
    x = ragged.array([[1.0, NAN, 3.0], [2.0]])
    assert ragged.argmax(x, 1).tolist() == [1, 0]
    assert ragged.argmin(x, 1).tolist() == [1, 0]
    y = ragged.array([[NAN, 5.0, NAN], [], [4.0, NAN]])
    assert ragged.argmax(y, 1).tolist() == [0, -1, 1]
