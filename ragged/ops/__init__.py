"""Pure functional ops on RaggedArrays (re-exported at the top level as ``ragged.<name>``).

One private module per family; each states its axis rule in its docstring and lists its public
names in ``__all__``.
"""

from . import _elementwise, _normalize, _reduce, _scan
from ._elementwise import *  # noqa: F403
from ._normalize import *  # noqa: F403
from ._reduce import *  # noqa: F403
from ._scan import *  # noqa: F403

__all__ = [
    *_elementwise.__all__,
    *_normalize.__all__,
    *_reduce.__all__,
    *_scan.__all__,
]
