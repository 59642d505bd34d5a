"""torch functions and Tensor-style methods on RaggedArrays: the dispatch table, from the registry.

``RaggedArray.__torch_function__`` looks the called function up in one dict and calls its
handler with torch's arguments. The dict is generated here from the registry:

* every op's ``torch=`` functions, and its ``methods=`` as RaggedArray methods, call the op with
  the arguments translated from torch's spelling (``TorchArgs``: ``dim`` -> ``axis``,
  ``keepdim`` -> ``keepdims``, torch's defaults); a call whose arguments already line up with
  the op's (``torch.sum(x, 1)``) goes straight to the op;
* the pointwise functions (``ragged/ops/_pointwise.py``) run on the values;
* the handlers declared below with ``torch_function`` (``torch.max`` with indices,
  ``torch.allclose``, ``F.normalize``, ``torch.stack``, ``F.scaled_dot_product_attention``,
  ``x.size()``, ...) and the refusals, whose TypeError says what to use instead;
* any other function raises a TypeError naming it and the nearest ragged functions.

``dim`` is the logical axis (0 batch, 1 ragged, then the inner axes; negative from the end).
An error of the op is re-raised with torch's name and argument names (``torch.softmax: `dim`
...``); this costs nothing unless an error is raised. The table is ``docs/torch.md``.

>>> import ragged, torch
>>> x = ragged.array([[1.0, 2.0], [], [3.0]])
>>> torch.sum(x, dim=1), x.sum(1, keepdim=True).shape
(tensor([3., 0., 3.]), torch.Size([3, 1]))
>>> torch.softmax(x, dim=0)
Traceback (most recent call last):
ValueError: torch.softmax: `dim` cannot be the batch axis (segments differ in length), got 0.
"""

from ._immutable import refusals as immutable_refusals
from ._spelling import display_name as display_name
from ._spelling import spelled as spelled
from ._table import dispatch_table as dispatch_table
from ._table import install as install
from ._table import method_table as method_table

__all__ = [
    "dispatch_table",
    "display_name",
    "immutable_refusals",
    "install",
    "method_table",
    "spelled",
]
