"""RaggedArrays are immutable: factories own their index tensors, and in-place edits of an
array's tensors are caught by the version counters its ops check."""

import re

import pytest
import torch

import ragged

EDITED = (
    "was modified in place after it was built ({what}); RaggedArrays are immutable: build a new "
    "array instead, e.g. {param}.with_values(new_values) for new values or ragged.from_lengths "
    "/ ragged.from_offsets for a new partition."
)
PARTITION = "its partition's offsets, lengths or row ids were written"


def edited(func, what, param="x"):
    message = f"{func}: `{param}` {EDITED.format(what=what, param=param)}"
    return pytest.raises(ValueError, match=re.escape(message) + "$")


# --- factories own their index tensors ------------------------------------------------------


def _nt():
    return torch.nested.nested_tensor_from_jagged(torch.arange(5.0), torch.tensor([0, 2, 5]))


OWNERS = {
    "from_lengths": (lambda v, i: ragged.from_lengths(v, i), torch.tensor([2, 3])),
    "from_lengths unchecked": (
        lambda v, i: ragged.from_lengths(v, i, validate=False),
        torch.tensor([2, 3]),
    ),
    "from_offsets": (lambda v, i: ragged.from_offsets(v, i), torch.tensor([0, 2, 5])),
    "from_offsets unchecked": (
        lambda v, i: ragged.from_offsets(v, i, validate=False),
        torch.tensor([0, 2, 5]),
    ),
    "from_segment_ids": (
        lambda v, i: ragged.from_segment_ids(v, i, 2),
        torch.tensor([0, 0, 1, 1, 1]),
    ),
    "from_segment_ids unchecked": (
        lambda v, i: ragged.from_segment_ids(v, i, 2, validate=False),
        torch.tensor([0, 0, 1, 1, 1]),
    ),
    "from_pyg": (lambda v, i: ragged.from_pyg(v, i, 2), torch.tensor([0, 0, 1, 1, 1])),
    "from_nested_lengths": (
        lambda v, i: ragged.from_nested_lengths(v, [torch.tensor([1]), i]),
        torch.tensor([5]),
    ),
    "from_padded": (
        lambda v, i: ragged.from_padded(torch.arange(6.0).reshape(2, 3), i),
        torch.tensor([2, 3]),
    ),
}


@pytest.mark.parametrize("name", list(OWNERS))
def test_factories_own_their_index_tensors(name):
    make, index = OWNERS[name]
    values = torch.arange(5.0)
    x = make(values, index)
    before = x.to_list()
    index.copy_(index.flip(0))  # a reused buffer: the next batch's indices
    assert x.to_list() == before
    ragged.sum(x, axis=-1)  # no edit of x's own tensors happened
    if name != "from_padded":
        assert x.values.data_ptr() == values.data_ptr()  # values are not copied


def test_from_nested_owns_its_offsets():
    nt = _nt()
    x = ragged.from_nested(nt)
    nt.offsets()[1] = 4
    assert x.lengths.tolist() == [2, 3]
    assert x.values.data_ptr() == nt.values().data_ptr()


# --- in-place edits are caught ----------------------------------------------------------------


def fresh():
    x = ragged.from_lengths(torch.arange(10.0).reshape(5, 2), [2, 0, 3])
    return x, x * 1.0


EDITS = {
    "values.add_": lambda x: x.values.add_(1),
    "offsets item": lambda x: x.offsets.__setitem__(1, 1),
    "lengths.zero_": lambda x: x.lengths.zero_(),
    "segment_ids fill_": lambda x: x.segment_ids.fill_(0),
}


def moved(edit):
    if edit == "values.add_":
        return "its values' version counter moved from 0 to 1"
    return PARTITION


OPS = {
    "ragged.add": lambda x, y: x + y,
    "ragged.multiply": lambda x, y: x * 2.0,
    "ragged.negative": lambda x, y: -x,
    "ragged.where": lambda x, y: ragged.where(torch.tensor(True), x, 0.0),
    "ragged.apply": lambda x, y: ragged.apply(torch.exp, x),
    "ragged.sum": lambda x, y: ragged.sum(x, axis=1),
    "ragged.mean": lambda x, y: ragged.mean(x, axis=(1, 2)),
    "ragged.argmax": lambda x, y: ragged.argmax(x, axis=1),
    "ragged.softmax": lambda x, y: ragged.softmax(x, axis=1),
    "ragged.cumsum": lambda x, y: ragged.cumsum(x, axis=1),
    "ragged.sort": lambda x, y: ragged.sort(x),
}


@pytest.mark.parametrize("edit", list(EDITS))
@pytest.mark.parametrize("op", list(OPS))
def test_an_edit_of_an_argument_is_caught(edit, op):
    x, y = fresh()
    OPS[op](x, y)  # fine before the edit
    EDITS[edit](x)
    param = "a RaggedArray argument" if op in ("ragged.where", "ragged.apply") else "x"
    with edited(op, moved(edit), param):
        OPS[op](x, y)


def test_the_second_operand_and_attention_arguments_are_checked():
    x, y = fresh()
    y.values.mul_(2)
    with edited("ragged.add", "its values' version counter moved from 0 to 1", "y"):
        x + y
    with edited("ragged.subtract", "its values' version counter moved from 0 to 1", "y"):
        1.0 - y
    q = ragged.from_lengths(torch.randn(5, 1, 4), [2, 3])
    k = ragged.from_lengths(torch.randn(5, 1, 4), [2, 3])  # its own (equal) partition
    ragged.attention(q, k, k)
    k.offsets[1] = 1
    with edited("ragged.attention", PARTITION, "k"):
        ragged.attention(q, k, k)


def test_with_values_and_factories_are_the_way_out():
    x, _ = fresh()
    x.values.add_(1)
    y = x.with_values(x.values.clone())  # new values: fine
    assert ragged.sum(y, axis=1).tolist() == [[4.0, 6.0], [0.0, 0.0], [21.0, 24.0]]
    x.offsets[1] = 1
    with edited("ragged.sum", PARTITION, "x"):
        ragged.sum(x.with_values(x.values.clone()), axis=1)  # the edited partition stays
    z = ragged.from_offsets(x.values.clone(), x.offsets.clone())
    assert z.lengths.tolist() == [1, 1, 3]


def test_an_edit_anywhere_in_the_base_of_the_values_counts():
    base = torch.zeros(5, 4)
    x = ragged.from_lengths(base[:, :2], [2, 3])
    base[:, 3] = 1.0  # outside the rows x uses, but views share the base's counter
    with edited("ragged.sum", "its values' version counter moved from 0 to 1"):
        ragged.sum(x, axis=1)


def test_parameters_edited_by_an_optimizer_step_are_caught():
    weight = torch.nn.Parameter(torch.ones(3, 2))
    x = ragged.from_lengths(weight, [1, 2])
    optimizer = torch.optim.SGD([weight], lr=0.1)
    ragged.sum(x, axis=1).sum().backward()
    optimizer.step()
    with edited("ragged.sum", "its values' version counter moved from 0 to 1"):
        ragged.sum(x, axis=1)
    assert ragged.sum(ragged.from_lengths(weight, [1, 2]), axis=1).shape == (2, 2)


def test_unchecked_cases_still_work():
    # Inference tensors have no version counter: nothing to record, nothing to check.
    with torch.inference_mode():
        x = ragged.from_lengths(torch.arange(5.0), [2, 3])
        assert ragged.sum(x + 1, axis=1).tolist() == [3.0, 12.0]
    assert ragged.sum(x, axis=1).tolist() == [1.0, 9.0]
    # torch.func transforms rebuild arrays around their own tensors.
    y = ragged.from_lengths(torch.arange(5.0), [2, 3])
    grads = torch.func.grad(lambda a: ragged.sum(a * a, axis=1).sum())(y)
    assert grads.values.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    batched = torch.func.vmap(lambda v: ragged.sum(y.with_values(v), axis=1))(torch.ones(3, 5))
    assert batched.tolist() == [[2.0, 3.0]] * 3


def test_compiled_code_does_not_read_version_counters():
    x = ragged.from_lengths(torch.arange(5.0), [2, 3])
    compiled = torch.compile(lambda a: ragged.sum(a * 2, axis=1), backend="eager", fullgraph=True)
    assert compiled(x).tolist() == [2.0, 18.0]


# --- in-place spellings say the array is immutable and name the functional one ----------------

IMMUTABLE = "RaggedArrays are immutable (no in-place edits); use the functional spelling "


def test_every_in_place_tensor_method_is_refused_by_name():
    from ragged.ops._torch._immutable import IN_PLACE

    expected = {n for n in dir(torch.Tensor) if n.endswith("_") and not n.startswith("_")}
    assert set(IN_PLACE) == expected - {"requires_grad_"}
    x, _ = fresh()
    for name in IN_PLACE:
        with pytest.raises(TypeError, match=re.escape(f"RaggedArray.{name}: {IMMUTABLE}")):
            getattr(x, name)(1)
    assert x.to_list() == fresh()[0].to_list()  # nothing was written


@pytest.mark.parametrize(
    ("call", "label", "spelling"),
    [
        (lambda x: x.add_(1), "RaggedArray.add_", "x.add(...)"),
        (lambda x: x.mul_(2), "RaggedArray.mul_", "x.mul(...)"),
        (lambda x: x.clamp_(0, 1), "RaggedArray.clamp_", "x.clamp(...)"),
        (lambda x: x.zero_(), "RaggedArray.zero_", "x.with_values(torch.zeros_like(x.values))"),
        (lambda x: x.fill_(1), "RaggedArray.fill_", "x.with_values(torch.full_like(x.values, "),
        (lambda x: x.copy_(x), "RaggedArray.copy_", "x.with_values(src.values)"),
        (lambda x: x.masked_fill_(x > 1, 0), "RaggedArray.masked_fill_", "x.masked_fill(mask, "),
        (lambda x: x.uniform_(), "RaggedArray.uniform_", "x.with_values(new_values)"),
        (lambda x: x.normal_(), "RaggedArray.normal_", "x.with_values(new_values)"),
        (lambda x: x.__setitem__(0, 1.0), "RaggedArray.__setitem__", "ragged.where(mask, value"),
        (lambda x: torch.nn.init.zeros_(x), "torch.nn.init.zeros_", "x.with_values(torch.nn."),
        (lambda x: torch.nn.init.ones_(x), "torch.nn.init.ones_", "x.with_values(torch.nn.ini"),
    ],
)
def test_in_place_spellings_name_the_functional_one(call, label, spelling):
    x, _ = fresh()
    with pytest.raises(TypeError, match=re.escape(f"{label}: {IMMUTABLE}{spelling}")) as info:
        call(x)
    assert "ragged.where(mask, new, x)" in str(info.value)
    assert "x.with_values(new_values)" in str(info.value)
    with pytest.raises(TypeError, match=r"RaggedArray.__setitem__: RaggedArrays are immutable"):
        x[0] = 1.0


@pytest.mark.parametrize(
    "fn", [torch.nn.init.normal_, torch.nn.init.uniform_, torch.nn.init.kaiming_uniform_]
)
def test_nn_init_functions_are_refused(fn):
    x, _ = fresh()
    with pytest.raises(TypeError, match=r"RaggedArrays are immutable and torch.nn.init") as info:
        fn(x)
    assert "x.with_values(torch.nn.init.normal_(torch.empty_like(x.values)))" in str(info.value)
    with pytest.raises(TypeError, match="RaggedArrays are immutable"):
        torch.nn.init.constant_(x, 0.5)


def test_tolist_and_item_name_what_to_use():
    x, _ = fresh()
    with pytest.raises(TypeError, match=r"^RaggedArray.tolist: .* use x.to_list\(\)"):
        x.tolist()
    with pytest.raises(TypeError, match=r"^RaggedArray.item: .* ragged.sum\(x, axis=None\)"):
        x.item()


def test_grad_is_an_array_of_the_partition():
    x = ragged.from_lengths(torch.arange(5.0, dtype=torch.float64), [2, 0, 3], axes=("b", "l"))
    assert x.grad is None
    assert x.requires_grad_() is x
    ragged.sum(x * x, axis=1).sum().backward()
    assert x.grad.partition is x.partition and x.grad.axes == x.axes
    assert x.grad.to_list() == [[2 * v for v in s] for s in x.detach().to_list()]


def test_autograd_grad_takes_arrays():
    x = ragged.from_lengths(torch.arange(5.0, dtype=torch.float64), [2, 0, 3]).requires_grad_()
    w = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(ragged.sum(x * x * w, axis=1).sum(), x, retain_graph=True)
    assert isinstance(gx, ragged.RaggedArray) and gx.partition is x.partition
    assert gx.to_list() == [[6 * v for v in s] for s in x.detach().to_list()]
    y = x * w  # an array output with array grad_outputs
    gx, gw = torch.autograd.grad([y], [x, w], [y.with_values(torch.ones_like(y.values))])
    assert gx.to_list() == [[3.0, 3.0], [], [3.0, 3.0, 3.0]]
    assert gw.tolist() == x.values.detach().sum().tolist()
