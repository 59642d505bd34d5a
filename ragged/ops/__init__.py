"""Pure functional ops on RaggedArrays (re-exported at the top level as ``ragged.<name>``).

Each op states its axis rule (keep all, remove one, ...) in its module docstring.
"""

from ._elementwise import abs as abs
from ._elementwise import add as add
from ._elementwise import apply as apply
from ._elementwise import bitwise_and as bitwise_and
from ._elementwise import bitwise_not as bitwise_not
from ._elementwise import bitwise_or as bitwise_or
from ._elementwise import bitwise_xor as bitwise_xor
from ._elementwise import divide as divide
from ._elementwise import eq as eq
from ._elementwise import floor_divide as floor_divide
from ._elementwise import ge as ge
from ._elementwise import gt as gt
from ._elementwise import le as le
from ._elementwise import logical_and as logical_and
from ._elementwise import logical_not as logical_not
from ._elementwise import logical_or as logical_or
from ._elementwise import logical_xor as logical_xor
from ._elementwise import lt as lt
from ._elementwise import maximum as maximum
from ._elementwise import minimum as minimum
from ._elementwise import multiply as multiply
from ._elementwise import ne as ne
from ._elementwise import negative as negative
from ._elementwise import power as power
from ._elementwise import remainder as remainder
from ._elementwise import subtract as subtract
from ._elementwise import where as where
from ._reduce import all as all
from ._reduce import amax as amax
from ._reduce import amin as amin
from ._reduce import any as any
from ._reduce import argmax as argmax
from ._reduce import argmin as argmin
from ._reduce import count as count
from ._reduce import count_nonzero as count_nonzero
from ._reduce import logsumexp as logsumexp
from ._reduce import max as max
from ._reduce import mean as mean
from ._reduce import min as min
from ._reduce import norm as norm
from ._reduce import prod as prod
from ._reduce import std as std
from ._reduce import sum as sum
from ._reduce import var as var

__all__ = [
    "abs",
    "add",
    "all",
    "amax",
    "amin",
    "any",
    "apply",
    "argmax",
    "argmin",
    "bitwise_and",
    "bitwise_not",
    "bitwise_or",
    "bitwise_xor",
    "count",
    "count_nonzero",
    "divide",
    "eq",
    "floor_divide",
    "ge",
    "gt",
    "le",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "logsumexp",
    "lt",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "multiply",
    "ne",
    "negative",
    "norm",
    "power",
    "prod",
    "remainder",
    "std",
    "subtract",
    "sum",
    "var",
    "where",
]
