"""Pure functional ops on RaggedArrays (re-exported at the top level as ``ragged.<name>``).

One private module per family; each states its axis rule in its docstring and lists its public
names in a literal ``__all__``.
"""

from . import (
    _attention,
    _combine,
    _einsum,
    _elementwise,
    _index,
    _linalg,
    _logical,
    _normalize,
    _pairs,
    _reduce,
    _sample,
    _scan,
    _sort,
    _statistics,
)
from ._attention import *  # noqa: F403
from ._combine import *  # noqa: F403
from ._einsum import *  # noqa: F403
from ._elementwise import *  # noqa: F403
from ._index import *  # noqa: F403
from ._linalg import *  # noqa: F403
from ._logical import *  # noqa: F403
from ._normalize import *  # noqa: F403
from ._pairs import *  # noqa: F403
from ._reduce import *  # noqa: F403
from ._sample import *  # noqa: F403
from ._scan import *  # noqa: F403
from ._sort import *  # noqa: F403
from ._statistics import *  # noqa: F403

__all__: list[str] = []
__all__ += _attention.__all__
__all__ += _combine.__all__
__all__ += _einsum.__all__
__all__ += _elementwise.__all__
__all__ += _index.__all__
__all__ += _linalg.__all__
__all__ += _logical.__all__
__all__ += _normalize.__all__
__all__ += _pairs.__all__
__all__ += _reduce.__all__
__all__ += _sample.__all__
__all__ += _scan.__all__
__all__ += _sort.__all__
__all__ += _statistics.__all__
