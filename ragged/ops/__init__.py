"""Pure functional ops on RaggedArrays (re-exported at the top level as ``ragged.<name>``).

One private module per family; each states its axis rule in its docstring and lists its public
names in a literal ``__all__``.
"""

from . import _attention, _combine, _elementwise, _index, _linalg, _reduce, _sample, _sort
from ._attention import *  # noqa: F403
from ._combine import *  # noqa: F403
from ._elementwise import *  # noqa: F403
from ._index import *  # noqa: F403
from ._linalg import *  # noqa: F403
from ._reduce import *  # noqa: F403
from ._sample import *  # noqa: F403
from ._sort import *  # noqa: F403

__all__: list[str] = []
__all__ += _attention.__all__
__all__ += _combine.__all__
__all__ += _elementwise.__all__
__all__ += _index.__all__
__all__ += _linalg.__all__
__all__ += _reduce.__all__
__all__ += _sample.__all__
__all__ += _sort.__all__
