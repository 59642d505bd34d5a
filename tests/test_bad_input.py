"""Malformed input, driven by hypothesis: every case raises the error a plain-Python reference
predicts (type and exact message), or builds exactly the array the reference describes.

Covers the factories' index arguments (lengths, offsets, segment ids: negative, too large,
unsorted, overflowing int64 sums, beyond int64), files (a valid array's partition with fields
replaced, checked on load), crafted pickles, and ``validate=False``, which trusts its input but
must never crash: whatever it is given, it builds a well-formed partition.
"""

import io
import itertools
import pickle
import re
import warnings

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

import ragged
from ragged import Partition, RaggedArray, RowPartition
from ragged._serialization import import_ragged_before_torch_load
from ragged._validate import check_level

INT64 = (-(2**63), 2**63 - 1)
# Small numbers (the interesting boundaries) and int64 extremes (wrap-around).
ints = st.one_of(
    st.integers(-3, 8),
    st.sampled_from([2**62, 2**63 - 1, -(2**63), 2**62 + 5, -(2**62)]),
)
wide_ints = st.one_of(ints, st.sampled_from([2**64, 5 - 2**64, 2**70]))


def raises(error, message):
    return pytest.raises(error, match=re.escape(message) + "$")


def _level_is_well_formed(level, total):
    fields = {f: getattr(level, f) for f in ("offsets", "lengths", "row_ids")}
    fields.update(max_length=None, sum_squares=None, columns=None, unit=False)
    check_level("test", fields)  # the loader's complete checks
    assert int(level.offsets[-1]) == total == level.num_children


# --- lengths --------------------------------------------------------------------------------


def lengths_error(lens, total, func="ragged.from_lengths", param="lengths"):
    """The reference: which error a list of lengths must raise, or None."""
    what = "values.shape[0]" if param == "lengths" else None
    for b, n in enumerate(lens):
        if n < 0:
            return f"{func}: `{param}` must be non-negative, got {param}[{b}] = {n}."
    for b, n in enumerate(lens):
        if n > total:
            return f"{func}: `{param}` must be at most {what} = {total}, got {param}[{b}] = {n}."
    if sum(lens) != total:
        return f"{func}: `{param}` must sum to {what} = {total}, got sum {sum(lens)}."
    return None


@given(st.lists(wide_ints, max_size=5), st.integers(0, 6), st.booleans())
def test_lengths(lens, total, as_tensor):
    values = torch.arange(float(total))
    as_tensor = as_tensor and all(INT64[0] <= n <= INT64[1] for n in lens)
    arg = torch.tensor(lens, dtype=torch.int64) if as_tensor else lens
    expected = lengths_error(lens, total)
    if expected is None:
        assert ragged.from_lengths(values, arg).lengths.tolist() == lens
    else:
        with raises(ValueError, expected):
            ragged.from_lengths(values, arg)
    if not as_tensor:
        return
    tensor = arg
    # validate=False trusts the lengths, and never crashes: the partition is well formed.
    if not lens and total:
        with raises(
            ValueError,
            f"ragged.from_lengths: `lengths` must sum to values.shape[0] = {total}, got sum 0.",
        ):
            ragged.from_lengths(values, tensor, validate=False)
        return
    x = ragged.from_lengths(values, tensor, validate=False)
    _level_is_well_formed(x.partition.levels[0], total)
    if expected is None:
        assert x.lengths.tolist() == lens
    ragged.topk(x, 1), ragged.cumsum(x, 1), x.to_padded()  # no crash


def test_the_issue_overflow_repros():
    values = torch.arange(5.0)
    big = torch.tensor([2**62, 2**62, 2**62, 2**62 + 5])  # an int64 sum wraps to 5
    with raises(
        ValueError,
        "ragged.from_lengths: `lengths` must be at most values.shape[0] = 5, got "
        "lengths[0] = 4611686018427387904.",
    ):
        ragged.from_lengths(values, big)
    with raises(
        ValueError,
        "ragged.from_lengths: `lengths` must be non-negative, got lengths[1] = "
        "-18446744073709551611.",
    ):
        ragged.from_lengths(values, [2**64, 5 - 2**64])
    x = ragged.from_lengths(values, big, validate=False)  # trusted: wrong, but no crash
    _level_is_well_formed(x.partition.levels[0], 5)


# --- offsets --------------------------------------------------------------------------------


def first_decrease(values):
    """The first ``i`` with ``values[i] < values[i - 1]``, or None."""
    return next((i for i in range(1, len(values)) if values[i] < values[i - 1]), None)


def start_or_order_error(func, offsets):
    """The reference for offsets' first two rules: they start at 0 and never decrease."""
    if offsets[0] != 0:
        return f"{func}: `offsets` must start at 0, got offsets[0] = {offsets[0]}."
    i = first_decrease(offsets)
    if i is not None:
        return (
            f"{func}: `offsets` must be non-decreasing, got offsets[{i}] = {offsets[i]} < "
            f"offsets[{i - 1}] = {offsets[i - 1]}."
        )
    return None


def offsets_error(offsets, total, func="ragged.from_offsets"):
    if not offsets:
        return f"{func}: `offsets` must have at least one entry (B + 1 for B segments), got []."
    error = start_or_order_error(func, offsets)
    if error is not None:
        return error
    if offsets[-1] != total:
        return f"{func}: `offsets` must end at values.shape[0] = {total}, got offsets[-1] = {offsets[-1]}."
    return None


@given(st.lists(ints, max_size=5), st.integers(0, 6), st.booleans())
def test_offsets(offsets, total, as_tensor):
    values = torch.arange(float(total))
    arg = torch.tensor(offsets, dtype=torch.int64) if as_tensor else offsets
    expected = offsets_error(offsets, total)
    if expected is None:
        x = ragged.from_offsets(values, arg)
        assert x.offsets.tolist() == offsets
    else:
        with raises(ValueError, expected):
            ragged.from_offsets(values, arg)
    if as_tensor and offsets and not (len(offsets) == 1 and total):
        x = ragged.from_offsets(values, arg, validate=False)
        _level_is_well_formed(x.partition.levels[0], total)
        if expected is None:
            assert x.offsets.tolist() == offsets
        ragged.sort(x), ragged.sum(x, 1)  # no crash


# --- segment ids ----------------------------------------------------------------------------


def ids_error(ids, num, func="ragged.from_segment_ids"):
    for i, n in enumerate(ids):
        if not INT64[0] <= n <= INT64[1]:
            return f"{func}: `segment_ids` must hold int64 values, got segment_ids[{i}] = {n}."
    if num == 0 and ids:
        return f"{func}: `segment_ids` must be in [0, 0), got ids for 0 segments."
    i = first_decrease(ids)
    if i is not None:
        return (
            f"{func}: `segment_ids` must be sorted (non-decreasing), got segment_ids[{i}] = "
            f"{ids[i]} < segment_ids[{i - 1}] = {ids[i - 1]}."
        )
    if ids and (min(ids) < 0 or max(ids) >= num):
        bad = min(ids) if min(ids) < 0 else max(ids)
        return f"{func}: `segment_ids` must be in [0, {num}), got id {bad}."
    return None


@given(st.lists(wide_ints, max_size=5), st.integers(0, 4))
def test_segment_ids(ids, num):
    values = torch.arange(float(len(ids)))
    expected = ids_error(ids, num)
    if expected is None:
        x = ragged.from_segment_ids(values, ids, num)
        assert x.segment_ids.tolist() == ids and x.num_segments == num
    else:
        with raises(ValueError, expected):
            ragged.from_segment_ids(values, ids, num)
    if all(INT64[0] <= n <= INT64[1] for n in ids) and (num or not ids):
        tensor = torch.tensor(ids, dtype=torch.int64)
        for make in (
            lambda: ragged.from_segment_ids(values, tensor, num, validate=False),
            lambda: ragged.from_pyg(values, tensor, num, validate=False),
        ):
            x = make()
            _level_is_well_formed(x.partition.levels[0], len(ids))
            assert x.lengths.tolist() == [
                sum(min(max(i, 0), num - 1) == b for i in ids) for b in range(num)
            ]


# --- files ----------------------------------------------------------------------------------


FILE = "ragged.RowPartition (loaded from a file or pickle)"


def file_error(offsets, lengths, row_ids, max_length, sum_squares, unit):
    """The reference for a loaded level (sizes already consistent)."""
    children = len(row_ids)
    error = start_or_order_error(FILE, offsets)
    if error is not None:
        return error
    if offsets[-1] != children:
        return (
            f"{FILE}: `offsets` must end at the number of children (len(row_ids) = {children}), "
            f"got offsets[-1] = {offsets[-1]}."
        )
    steps = [b - a for a, b in itertools.pairwise(offsets)]
    for i, (n, step) in enumerate(zip(lengths, steps, strict=True)):
        if n != step:
            return (
                f"{FILE}: `lengths` must be the differences of the offsets, got lengths[{i}] = "
                f"{n} where the offsets give {step}."
            )
    rows = [r for r, n in enumerate(steps) for _ in range(n)]
    for c, (got, want) in enumerate(zip(row_ids, rows, strict=True)):
        if got != want:
            return (
                f"{FILE}: `row_ids` must give the row of each child, got row_ids[{c}] = {got}, "
                f"where the offsets put child {c} in row {want}."
            )
    longest = max(steps, default=0)
    if max_length is not None and max_length != longest:
        return f"{FILE}: `max_length` must be the longest length ({longest}), got {max_length}."
    squares = sum(n * n for n in steps)
    if sum_squares is not None and sum_squares != squares:
        return (
            f"{FILE}: `sum_squares` must be the sum of the squared lengths ({squares}), got "
            f"{sum_squares}."
        )
    if unit and any(n != 1 for n in steps):
        return f"{FILE}: `unit` must be False: not every length is 1, got True."
    return None


@st.composite
def corrupt_levels(draw):
    """A valid level's fields, some replaced with random values of the right sizes."""
    lens = draw(st.lists(st.integers(0, 3), max_size=4))
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    row_ids = [b for b, n in enumerate(lens) for _ in range(n)]
    fields = {
        "offsets": offsets,
        "lengths": list(lens),
        "row_ids": row_ids,
        "max_length": max(lens, default=0),
        "sum_squares": sum(n * n for n in lens),
        "unit": False,
    }
    for name in draw(st.sets(st.sampled_from(sorted(fields)))):
        if name in ("offsets", "lengths", "row_ids"):
            size = len(fields[name])
            fields[name] = draw(st.lists(ints, min_size=size, max_size=size))
        elif name == "unit":
            fields[name] = True
        else:
            fields[name] = draw(st.one_of(st.none(), st.integers(0, 12)))
    return fields


@given(corrupt_levels())
def test_files(fields):
    level = object.__new__(RowPartition)
    tensors = {
        k: torch.tensor(fields[k], dtype=torch.int64) for k in ("offsets", "lengths", "row_ids")
    }
    level.__dict__.update(
        tensors,
        max_length=fields["max_length"],
        sum_squares=fields["sum_squares"],
        columns=None,
        unit=fields["unit"],
    )
    expected = file_error(**fields)
    buffer = io.BytesIO()
    torch.save(level, buffer)
    buffer.seek(0)
    if expected is None:
        loaded = torch.load(buffer)
        assert loaded.offsets.tolist() == fields["offsets"]
    else:
        with raises(ValueError, expected):
            torch.load(buffer)


# --- crafted pickles ------------------------------------------------------------------------

CLASSES = {"RaggedArray": RaggedArray, "Partition": Partition, "RowPartition": RowPartition}
# With every field present but None, the first check each kind makes.
ALL_NONE = {
    "RaggedArray": "`partition` must be a Partition, got NoneType.",
    "Partition": "`levels` must be a non-empty tuple of RowPartition, got NoneType.",
    "RowPartition": "`offsets` must be a 1-D int64 tensor, got NoneType.",
}


class Call:
    """Pickles as ``fn(*args)``: a crafted file's call of the rebuild function."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


@st.composite
def crafted_states(draw):
    kind = draw(st.sampled_from(sorted(CLASSES)))
    names = list(ragged._serialization._FIELDS[CLASSES[kind]])
    state = draw(
        st.one_of(
            st.sets(st.sampled_from([*names, "extra"])).map(lambda ks: dict.fromkeys(ks)),
            st.sampled_from(["not a dict", 3, None, ()]),
        )
    )
    return kind, names, state


@given(crafted_states())
def test_crafted_pickles(case):
    kind, names, state = case
    func = f"ragged.{kind} (loaded from a file or pickle)"
    if isinstance(state, dict) and set(state) == set(names):
        message = f"{func}: {ALL_NONE[kind]}"
    else:
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        message = f"{func}: the file must give the fields {names}, got {got}."
    crafted = Call(import_ragged_before_torch_load, kind, state)
    data = io.BytesIO()
    torch.save(crafted, data)
    for load in (
        lambda: torch.load(io.BytesIO(data.getvalue())),
        lambda: pickle.loads(pickle.dumps(crafted)),
    ):
        with raises(ValueError, message):
            load()


@given(st.sampled_from([RaggedArray, Partition, RowPartition, RowPartition.from_lengths]))
def test_a_file_cannot_call_the_trusting_constructors(target):
    data = io.BytesIO()
    torch.save(Call(target, torch.tensor([0, 9])), data)
    data.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global"):
        torch.load(data)


# --- errors that came from torch internals --------------------------------------------------


X = ragged.array([[1.0, 2.0], [3.0]])


def _strided_nested():
    with warnings.catch_warnings():  # torch warns that the strided layout is a prototype
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor([torch.ones(2), torch.zeros(1)])


TORCH_INTERNALS = [
    (
        lambda: ragged.from_nested(_strided_nested()),
        TypeError,
        "ragged.from_nested: `nt` must be a torch.nested tensor with layout=torch.jagged, got "
        "nested Tensor(layout=torch.strided, dtype=torch.float32).",
    ),
    (
        lambda: ragged.array([[1.0, None]]),
        TypeError,
        "ragged.array: `data` must hold numbers, got data[0][1] = None.",
    ),
    (
        lambda: ragged.array([[1, "a"]]),
        TypeError,
        "ragged.array: `data` must hold numbers, got data[0][1] = 'a'.",
    ),
    (
        lambda: ragged.array([[2**70], [3]]),
        ValueError,
        "ragged.array: `data` must hold integers within int64 (pass dtype=torch.float64 for "
        "larger ones), got data[0][0] = 1180591620717411303424.",
    ),
    (
        lambda: ragged.from_lengths(
            torch.zeros(5, device="meta"), torch.tensor([2, 3], device="meta")
        ),
        ValueError,
        "ragged.from_lengths: `lengths` must hold data to read (pass validate=False, or a list, "
        "for meta tensors), got a tensor on the meta device.",
    ),
    (
        lambda: ragged.sort(ragged.array([[3, 1], [2]], dtype=torch.uint16)),
        TypeError,
        "ragged.sort: `x` must have a dtype among torch.float64, torch.float32, torch.float16, "
        "torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, "
        "torch.bool, got torch.uint16.",
    ),
    (
        lambda: ragged.sum(X, 1.0),
        TypeError,
        "ragged.sum: `axis` must be an int or an axis name, got float.",
    ),
    (
        lambda: ragged.sum(X, True),
        TypeError,
        "ragged.sum: `axis` must be an int or an axis name, got bool.",
    ),
    (
        lambda: RaggedArray(torch.zeros(4), X.partition),
        ValueError,
        "ragged.RaggedArray: `values` must have one row per value of the partition (3), got "
        "shape (4,).",
    ),
    (
        lambda: RaggedArray(torch.zeros(3), "not a partition"),
        TypeError,
        "ragged.RaggedArray: `partition` must be a ragged.Partition, got str.",
    ),
    (
        lambda: Partition(
            (RowPartition.from_lengths(torch.tensor([2, 1]), 3), X.partition.levels[0])
        ),
        ValueError,
        "ragged.Partition: `levels[1]` must have one row per child of levels[0] (3), got 2 rows.",
    ),
    (
        lambda: Partition(
            (
                RowPartition(
                    torch.tensor([0, 3]),
                    torch.tensor([3], dtype=torch.int32),
                    torch.zeros(3, dtype=torch.int64),
                    3,
                ),
            )
        ),
        TypeError,
        "ragged.Partition: `levels` must hold 1-D int64 index tensors, got Tensor(shape=(1,), "
        "dtype=torch.int32).",
    ),
]


@pytest.mark.parametrize(
    ("make", "error", "message"), TORCH_INTERNALS, ids=[m for _, _, m in TORCH_INTERNALS]
)
def test_errors_are_ours(make, error, message):
    with raises(error, message):
        make()


def test_meta_index_tensors_say_what_to_pass():
    meta = torch.ones(2, 3, device="meta")
    with raises(
        ValueError,
        "ragged.from_padded: `mask` must hold data to read (pass lengths as a list, for meta "
        "tensors), got a tensor on the meta device.",
    ):
        ragged.from_padded(meta, mask=meta.bool())
    batch = torch.zeros(3, dtype=torch.int64, device="meta")
    with raises(
        ValueError,
        "ragged.from_pyg: `batch` must hold data to read (pass num_graphs, and validate=False, "
        "for meta tensors), got a tensor on the meta device.",
    ):
        ragged.from_pyg(meta[0], batch)
    assert ragged.from_pyg(meta[0], batch, 1, validate=False).num_segments == 1


def test_meta_arrays_build_with_host_lengths_or_validate_false():
    values = torch.zeros(5, 2, device="meta")
    x = ragged.from_lengths(values, [2, 3])
    assert x.device.type == "meta" and x.partition.max_length() == 3
    x = ragged.from_lengths(values, torch.tensor([2, 3], device="meta"), validate=False)
    assert x.device.type == "meta" and x.num_segments == 2


# --- packed HF batches: cu_seq_lens_* and max_length_* ------------------------------------------

HF = "ragged.from_hf_packed: `batch` "


@pytest.mark.parametrize(
    ("cu", "longest", "error", "message"),
    [
        (
            [0, 3, 2, 5],
            None,
            ValueError,
            "must hold non-decreasing `cu_seq_lens_q`, got "
            "cu_seq_lens_q[2] = 2 < cu_seq_lens_q[1] = 3.",
        ),
        (
            [0, -1, 5],
            None,
            ValueError,
            "must hold non-decreasing `cu_seq_lens_q`, got "
            "cu_seq_lens_q[1] = -1 < cu_seq_lens_q[0] = 0.",
        ),
        (
            [1, 3, 5],
            None,
            ValueError,
            "must hold `cu_seq_lens_q` starting at 0, got cu_seq_lens_q[0] = 1.",
        ),
        (
            [0, 3, 4],
            None,
            ValueError,
            "must hold `cu_seq_lens_q` ending at the number of tokens "
            "5, got cu_seq_lens_q[-1] = 4.",
        ),
        (
            [0, 2, 5],
            2,
            ValueError,
            "must hold `max_length_q` at least the longest sequence (3), got max_length_q = 2.",
        ),
        ([0, 2, 5], "a", TypeError, "must hold an int `max_length_q`, got str."),
        (
            [0.0, 5.0],
            None,
            TypeError,
            "must hold int `cu_seq_lens_q` [B + 1], got Tensor(shape=(2,), dtype=torch.float32).",
        ),
    ],
)
def test_from_hf_packed_checks_boundaries(cu, longest, error, message):
    batch = {"input_ids": torch.arange(5)[None], "cu_seq_lens_q": torch.tensor(cu)}
    if longest is not None:
        batch["max_length_q"] = longest
    with raises(error, HF + message):
        ragged.from_hf_packed(batch)
    k = dict(batch, cu_seq_lens_q=torch.tensor([0, 2, 5]), max_length_q=3)
    k["cu_seq_lens_k"] = batch["cu_seq_lens_q"]
    if longest is not None:
        k["max_length_k"] = longest
    with raises(error, HF + message.replace("_q", "_k")):
        ragged.from_hf_packed(k)


def test_from_hf_packed_valid_and_unchecked():
    batch = {"input_ids": torch.arange(5)[None], "cu_seq_lens_q": torch.tensor([0, 2, 2, 5])}
    batch["max_length_q"] = 3
    x = ragged.from_hf_packed(batch)
    assert x.to_list() == [[0, 1], [], [2, 3, 4]]
    assert x.to_padded().tolist() == [[0, 1, 0], [0, 0, 0], [2, 3, 4]]
    batch["max_length_q"] = 2
    assert ragged.from_hf_packed(batch, validate=False).lengths.tolist() == [2, 0, 3]


# --- raw torch errors become ragged errors ----------------------------------------------------


def _awkward_datetimes():
    import datetime

    ak = pytest.importorskip("awkward")
    return ragged.from_awkward(ak.Array([[datetime.datetime(2020, 1, 1)], []]))


def _awkward_too_deep():
    ak = pytest.importorskip("awkward")
    return ragged.from_awkward(ak.Array([[1, 2], [3]]), ragged_ndim=3)


def _nested():
    nt = torch.nested.nested_tensor_from_jagged(torch.arange(5.0), torch.tensor([0, 2, 5]))
    return ragged.array(nt)


TOKENS = ragged.from_lengths(torch.tensor([1, 2, 30]), [1, 2])
ROWS3 = ragged.from_lengths(torch.zeros(5, 3), [2, 3])
RAW = {
    "embedding float": (
        lambda: torch.nn.Embedding(10, 3)(TOKENS.float()),
        TypeError,
        "torch.nn.functional.embedding: `input` must hold integer indices (int64 or int32); "
        "cast with x.long(), got dtype torch.float32.",
    ),
    "embedding out of range": (
        lambda: torch.nn.Embedding(10, 3)(TOKENS),
        ValueError,
        "torch.nn.functional.embedding: `input` must hold indices in [0, 10) (the rows of "
        "`weight`), got an index outside (index out of range in self).",
    ),
    "linear dtype": (
        lambda: torch.nn.Linear(3, 2)(ROWS3.double()),
        TypeError,
        "torch.nn.functional.linear: `weight` must have the dtype of `input` (torch.float64); "
        "cast one of them: x.to(torch.float32) or module.to(torch.float64), got torch.float32.",
    ),
    "layer norm width": (
        lambda: ragged.nn.RaggedLayerNorm(5)(ROWS3),
        ValueError,
        "RaggedLayerNorm: `input` must end in the normalized_shape (5,) (its inner axes), got "
        "inner shape (3,).",
    ),
    "awkward datetimes": (
        _awkward_datetimes,
        TypeError,
        "ragged.from_awkward: `array` must hold numbers or booleans (torch has no such dtype; "
        "convert first, e.g. ak.values_astype(array, numpy.int64) for datetimes), got numpy "
        "dtype datetime64[us].",
    ),
    "awkward ragged_ndim": (
        _awkward_too_deep,
        ValueError,
        "ragged.from_awkward: `ragged_ndim` must be at most the number of list dimensions of "
        "`array` (1), got 3.",
    ),
    "vmap of a number": (
        lambda: ragged.vmap(lambda s: 3)(ROWS3),
        TypeError,
        "ragged.vmap: `f` must return tensors or RaggedArrays (in any pytree); wrap a number "
        "with torch.tensor(...), got int.",
    ),
    "collate with an unknown ragged key": (
        lambda: ragged.data.collate(
            [{"a": torch.zeros(2)}, {"a": torch.zeros(3)}], ragged_keys=["zz"]
        ),
        ValueError,
        "ragged.data.collate: `samples` must have one shape at ['a'] to stack it (name it in "
        "`ragged_keys`, which holds ['zz'], to batch it as a RaggedArray), got shapes "
        "[(2,), (3,)].",
    ),
    "array of a nested tensor": (
        _nested,
        TypeError,
        "ragged.array: `data` must be a list of segments (for a torch.nested tensor use "
        "ragged.from_nested), got nested Tensor(layout=torch.jagged, dtype=torch.float32).",
    ),
}


@pytest.mark.parametrize("case", list(RAW))
def test_raw_errors_are_ragged_errors(case):
    call, error, message = RAW[case]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ragged.RaggedVmapFallbackWarning)  # no loop retried
        with raises(error, message):
            call()


def test_checked_modules_still_compute():
    assert torch.nn.Embedding(31, 2)(TOKENS).values.shape == (3, 2)
    norm = ragged.nn.RaggedLayerNorm(3).double()
    torch.testing.assert_close(norm(ROWS3.double()).values, norm(ROWS3.values.double()))
    assert ragged.vmap(lambda s: s.sum())(ROWS3).tolist() == [0.0, 0.0]


# --- sampler states ---------------------------------------------------------------------------


def _sampler(lengths=tuple(range(1, 21)), replicas=1, kind="budget"):
    from ragged.data import BucketBatchSampler, TokenBudgetBatchSampler

    if kind == "bucket":
        return BucketBatchSampler(list(lengths), 3, bucket_width=5, seed=0)
    return TokenBudgetBatchSampler(list(lengths), 30, seed=0, num_replicas=replicas, rank=0)


def _state(**changes):
    sampler = _sampler()
    next(iter(sampler))
    state = sampler.state_dict()
    state.update(changes)
    return state


LOAD = "ragged.data.TokenBudgetBatchSampler.load_state_dict: "
KEYS = "['sampler', 'lengths', 'num_replicas', 'epoch', 'batches', 'generator_state']"
STATES = {
    "None": (None, TypeError, "`state` must be a dict from state_dict(), got NoneType."),
    "foreign keys": (
        {"foo": 1},
        ValueError,
        f"`state` must have the keys {KEYS} (a state_dict() of this sampler), got keys ['foo'].",
    ),
    "another sampler": (
        _sampler(kind="bucket").state_dict(),
        ValueError,
        "`state['sampler']` must be saved by a sampler of the same sampler "
        "('TokenBudgetBatchSampler'), got 'BucketBatchSampler'.",
    ),
    "other lengths": (
        _sampler(lengths=range(2, 22)).state_dict(),
        ValueError,
        "`state['lengths']` must be saved by a sampler of the same lengths ",
    ),
    "other replicas": (
        _sampler(replicas=2).state_dict(),
        ValueError,
        "`state['num_replicas']` must be saved by a sampler of the same num_replicas (1), got 2.",
    ),
    "epoch a": (
        _state(epoch="a"),
        TypeError,
        "`state['epoch']` must be a non-negative int, got 'a'.",
    ),
    "batches -1": (
        _state(batches=-1),
        TypeError,
        "`state['batches']` must be a non-negative int, got -1.",
    ),
    "batches 999": (
        _state(batches=999),
        ValueError,
        "`state['batches']` must be at most the batches of its epoch (",
    ),
    "generator": (
        _state(generator_state=[1, 2]),
        TypeError,
        "`state['generator_state']` must be None or a generator state (a 1-D uint8 tensor), "
        "got list.",
    ),
}


@pytest.mark.parametrize("case", list(STATES))
def test_sampler_states_are_checked(case):
    state, error, message = STATES[case]
    sampler = _sampler()
    expected = list(sampler)
    with pytest.raises(error, match="^" + re.escape(LOAD + message)):
        sampler.load_state_dict(state)
    assert list(sampler) == _sampler_epoch(1)  # a refused state leaves the sampler as it was
    assert expected == _sampler_epoch(0)


def _sampler_epoch(epoch):
    sampler = _sampler()
    sampler.set_epoch(epoch)
    return list(sampler)


def test_a_valid_state_still_resumes():
    sampler = _sampler()
    iterator = iter(sampler)
    taken = [next(iterator), next(iterator)]
    resumed = _sampler()
    resumed.load_state_dict(sampler.state_dict())
    assert taken + list(resumed) == _sampler_epoch(0)


# --- attention arguments ----------------------------------------------------------------------

Q = ragged.from_lengths(torch.randn(5, 2, 4, generator=torch.Generator().manual_seed(0)), [2, 3])
ATTENTION = {
    "negative prefix": (
        {"causal": True, "prefix": torch.tensor([1, -1])},
        ValueError,
        "`prefix` must be a non-negative int or an integer tensor [B], got prefix[1] = -1.",
    ),
    "window beyond int64": (
        {"window": (2**70, 0)},
        ValueError,
        "`window` must be a pair of ints below 2**63 (None for no bound on a side), got "
        f"({2**70}, 0).",
    ),
    "0-d score_mod": (
        {"score_mod": lambda s, b, h, i, j: s.sum()},
        ValueError,
        "`score_mod` must return a floating tensor of the score's shape ",
    ),
    "score_mod arity": (
        {"score_mod": lambda s, b: s},
        TypeError,
        "`score_mod` must take 5 arguments (score, b, h, q_idx, kv_idx), got signature (s, b).",
    ),
    "mask_mod arity": (
        {"mask_mod": lambda s, b, h, i, j: s},
        TypeError,
        "`mask_mod` must take 4 arguments (b, h, q_idx, kv_idx), got signature (s, b, h, i, j).",
    ),
    "float mask_mod": (
        {"mask_mod": lambda b, h, i, j: (i >= j).float()},
        ValueError,
        "`mask_mod` must return a boolean tensor that broadcasts to its arguments' shape ",
    ),
    "0-d mask_mod": (
        {"mask_mod": lambda b, h, i, j: torch.tensor(True)},
        ValueError,
        "`mask_mod` must return a boolean tensor that broadcasts to its arguments' shape ",
    ),
}


@pytest.mark.parametrize("case", list(ATTENTION))
def test_attention_arguments_are_checked(case):
    kwargs, error, message = ATTENTION[case]
    with pytest.raises(error, match="^" + re.escape("ragged.attention: " + message)):
        ragged.attention(Q, Q, Q, **kwargs)


def test_checked_mods_still_compute():
    masked = ragged.attention(Q, Q, Q, mask_mod=lambda b, h, i, j: i >= j)
    torch.testing.assert_close(masked.values, ragged.attention(Q, Q, Q, causal=True).values)
    prefix = ragged.attention(Q, Q, Q, causal=True, prefix=torch.tensor([0, 9]))
    causal, full = ragged.attention(Q, Q, Q, causal=True), ragged.attention(Q, Q, Q)
    torch.testing.assert_close(prefix[0], causal[0])  # no prefix: causal
    torch.testing.assert_close(prefix[1], full[1])  # a prefix past the end: bidirectional
