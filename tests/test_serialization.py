"""Files are untrusted: every ragged object loaded by torch.load or pickle is checked first.

Round trips keep arrays (and shared partitions) intact; a file whose partition is inconsistent
raises a ValueError that names the inconsistency instead of loading (and then giving wrong
numbers, or crashing a kernel). Copies in memory and pickles between processes are trusted.
"""

import copy
import copyreg
import dataclasses
import io
import pickle
import re
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

import ragged
from ragged import Partition, RaggedArray, RowPartition


def saved(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def load(obj, **kwargs):
    return torch.load(saved(obj), **kwargs)


def examples():
    x = ragged.from_lengths(torch.arange(10.0).reshape(5, 2), [2, 0, 3], axes=("b", "t", "f"))
    docs = ragged.from_nested_lengths(torch.arange(6.0), [[2, 1], [3, 1, 2]])
    pairs = ragged.outer(ragged.array([[1.0, 2.0], [], [3.0]]), ragged.array([[1.0], [2.0], []]))
    units = ragged.sum(docs, axis=1, keepdims=True)  # a unit level in front: (B, 1, M*)
    assert units.partition.levels[0].unit
    return [x, docs, pairs, units, x[:0]]


@pytest.mark.parametrize("index", range(5))
def test_round_trip_keeps_the_array(index):
    x = examples()[index]
    for restored in (load(x), load(x, weights_only=False), pickle.loads(pickle.dumps(x))):
        assert type(restored) is RaggedArray
        assert restored.to_list() == x.to_list()
        assert restored.axes == x.axes
        for a, b in zip(restored.partition.levels, x.partition.levels, strict=True):
            assert (a.max_length, a.sum_squares, a.unit) == (b.max_length, b.sum_squares, b.unit)
            assert torch.equal(a.offsets, b.offsets) and torch.equal(a.row_ids, b.row_ids)
            assert (a.columns is None) == (b.columns is None)


def test_shared_partitions_stay_shared_and_metadata_round_trips():
    x = ragged.from_lengths(torch.arange(5.0), [2, 3])
    loaded = load({"x": x, "y": x * 2, "p": x.partition})
    assert loaded["x"].partition is loaded["y"].partition is loaded["p"]
    pairs = examples()[2]
    restored = load(pairs)
    assert restored.partition.levels[1].columns is not None
    assert ragged.sum(restored, axis=2).to_list() == ragged.sum(pairs, axis=2).to_list()


def test_meta_map_location_loads_without_data_checks():
    x = examples()[1]
    restored = load(x, map_location="meta")
    assert restored.device.type == "meta" and restored.shape.ragged_ndim == 2


def crafted(x, **fields):
    """``x`` with fields of its first level replaced, built around every constructor check
    (as a crafted file would be)."""
    level = object.__new__(RowPartition)
    level.__dict__.update({**_fields(x.partition.levels[0]), **fields})
    partition = object.__new__(Partition)
    partition.__dict__.update(levels=(level, *x.partition.levels[1:]))
    array = object.__new__(RaggedArray)
    array.__dict__.update(values=x.values, partition=partition, axes=x.axes)
    return array


def _fields(level):
    return {f.name: getattr(level, f.name) for f in dataclasses.fields(level)}


X = ragged.from_lengths(torch.arange(5.0), [2, 3])
LEVEL = "ragged.RowPartition (loaded from a file or pickle)"
CORRUPT = [
    (  # the repro: with it, ragged.topk segfaulted
        dict(
            offsets=torch.tensor([0, 4, 2, 5]),
            lengths=torch.tensor([4, -2, 3]),
            row_ids=torch.tensor([0, 0, 0, 0, 2]),
        ),
        f"{LEVEL}: `offsets` must be non-decreasing, got offsets[2] = 2 < offsets[1] = 4.",
    ),
    (  # one flipped byte: offsets [0, 4, 5] with lengths [2, 3]
        dict(offsets=torch.tensor([0, 4, 5])),
        f"{LEVEL}: `lengths` must be the differences of the offsets, got lengths[0] = 2 where "
        "the offsets give 4.",
    ),
    (
        dict(offsets=torch.tensor([1, 2, 5])),
        f"{LEVEL}: `offsets` must start at 0, got offsets[0] = 1.",
    ),
    (
        dict(offsets=torch.tensor([0, 2, 6]), lengths=torch.tensor([2, 4])),
        f"{LEVEL}: `offsets` must end at the number of children (len(row_ids) = 5), got "
        "offsets[-1] = 6.",
    ),
    (
        dict(row_ids=torch.tensor([0, 1, 1, 1, 1])),
        f"{LEVEL}: `row_ids` must give the row of each child, got row_ids[1] = 1, where the "
        "offsets put child 1 in row 0.",
    ),
    (
        dict(row_ids=torch.tensor([0, 0, 1, 1, 7])),
        f"{LEVEL}: `row_ids` must give the row of each child, got row_ids[4] = 7, where the "
        "offsets put child 4 in row 1.",
    ),
    (dict(max_length=2), f"{LEVEL}: `max_length` must be the longest length (3), got 2."),
    (dict(max_length=-1), f"{LEVEL}: `max_length` must be None or a non-negative int, got -1."),
    (
        dict(sum_squares=12),
        f"{LEVEL}: `sum_squares` must be the sum of the squared lengths (13), got 12.",
    ),
    (dict(unit=True), f"{LEVEL}: `unit` must be False: not every length is 1, got True."),
    (
        dict(offsets=torch.tensor([0, 2, 5], dtype=torch.int32)),
        f"{LEVEL}: `offsets` must be a 1-D int64 tensor, got Tensor(shape=(3,), "
        "dtype=torch.int32).",
    ),
    (
        dict(lengths=torch.tensor([[2, 3]])),
        f"{LEVEL}: `lengths` must be a 1-D int64 tensor, got Tensor(shape=(1, 2), "
        "dtype=torch.int64).",
    ),
    (
        dict(lengths=torch.tensor([2, 3, 0])),
        f"{LEVEL}: `offsets` must have len(lengths) + 1 = 4 entries, got 3 entries.",
    ),
    (
        dict(lengths=torch.tensor([2, 3], device="meta")),
        f"{LEVEL}: `lengths` must be on the offsets' device cpu, got meta.",
    ),
    (dict(columns="x"), f"{LEVEL}: `columns` must be a RowPartition, got str."),
]


@pytest.mark.parametrize(("fields", "message"), CORRUPT, ids=[m for _, m in CORRUPT])
def test_a_corrupt_file_raises_and_names_the_inconsistency(fields, message):
    bad = crafted(X, **fields)
    data = pickle.dumps(bad)
    for loader in (
        lambda: torch.load(saved(bad)),
        lambda: torch.load(saved(bad), weights_only=False),
        lambda: pickle.loads(data),
    ):
        with pytest.raises(ValueError, match=re.escape(message) + "$"):
            loader()


def test_array_and_partition_level_inconsistencies():
    short = crafted(X)
    short.__dict__["values"] = torch.arange(4.0)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "ragged.RaggedArray (loaded from a file or pickle): `values` must have one row per "
            "value of the partition (5), got 4 rows."
        ),
    ):
        load(short)
    named = crafted(X)
    named.__dict__["axes"] = ("a", "a")
    with pytest.raises(ValueError, match=re.escape("`axes` must be None or 2 unique names")):
        load(named)
    docs = examples()[1]
    unchained = object.__new__(Partition)
    unchained.__dict__["levels"] = (docs.partition.levels[0], X.partition.levels[0])
    with pytest.raises(
        ValueError,
        match=re.escape(
            "ragged.Partition (loaded from a file or pickle): `levels[1]` must have one row per "
            "child of levels[0] (3), got 2 rows."
        ),
    ):
        load(unchained)
    pairs = examples()[2]
    rows, cells = pairs.partition.levels
    wrong = object.__new__(Partition)
    wrong_cells = object.__new__(RowPartition)
    wrong_cells.__dict__.update({**_fields(cells), "columns": rows})  # columns of the wrong side
    wrong.__dict__["levels"] = (rows, wrong_cells)
    with pytest.raises(ValueError, match="must be the columns' length of each row's segment"):
        load(wrong)


def test_the_classes_themselves_are_not_callable_from_a_file():
    # A file that calls a constructor directly would skip the data checks: the weights-only
    # loader refuses the class (only the checking rebuild function is allow-listed).
    class Direct:
        def __reduce__(self):
            return (RowPartition, (torch.tensor([0, 9]), torch.tensor([9]), torch.zeros(1), 9))

    with pytest.raises(pickle.UnpicklingError, match=re.escape("ragged._partition.RowPartition")):
        torch.load(saved(Direct()))


def test_an_object_left_without_its_state_is_rejected():
    class Empty:
        def __reduce__(self):
            return (ragged._serialization.import_ragged_before_torch_load, ("Partition", {}))

    with pytest.raises(ValueError, match=re.escape("must give the fields ['levels'], got []")):
        load(Empty())
    with pytest.raises(ValueError, match="unknown ragged type 'Tensor'"):
        ragged._serialization.import_ragged_before_torch_load("Tensor", {})


def legacy_pickle(obj):
    """A pickle as earlier versions wrote it: the classes by value (``NEWOBJ`` + state)."""

    class Legacy(pickle.Pickler):
        def reducer_override(self, o):
            if type(o) in (RaggedArray, Partition, RowPartition):
                names = [f.name for f in dataclasses.fields(o) if f.init]
                return (copyreg.__newobj__, (type(o),), {n: getattr(o, n) for n in names})
            return NotImplemented

    buffer = io.BytesIO()
    Legacy(buffer).dump(obj)
    return buffer.getvalue()


def test_legacy_pickles_are_checked_too():
    x = examples()[1]
    assert pickle.loads(legacy_pickle(x)).to_list() == x.to_list()
    with pytest.raises(ValueError, match=re.escape("`offsets` must start at 0")):
        pickle.loads(legacy_pickle(crafted(X, offsets=torch.tensor([1, 2, 5]))))


def test_copies_and_process_pickles_are_trusted_and_keep_sharing():
    x = ragged.from_lengths(torch.arange(5.0), [2, 3])
    y = x * 2
    assert copy.copy(x) is x and copy.copy(x.partition) is x.partition
    a, b = copy.deepcopy([x, y])
    assert a.partition is b.partition and a.partition is not x.partition
    assert a.to_list() == x.to_list() and a.values is not x.values
    a, b = pickle.loads(ForkingPickler.dumps([x, y]))
    assert a.partition is b.partition and b.to_list() == y.to_list()


def test_torch_load_without_import_ragged_says_import_ragged(tmp_path):
    path = tmp_path / "x.pt"
    torch.save(ragged.array([[1.0, 2.0], [3.0]]), path)
    code = f"import torch; torch.load({str(path)!r})"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0
    assert "import_ragged_before_torch_load" in done.stderr
    assert torch.load(path).to_list() == [[1.0, 2.0], [3.0]]  # here ragged is imported
