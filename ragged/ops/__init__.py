"""Pure functional ops on RaggedArrays, re-exported at the top level as ``ragged.<name>``.

Generated from the op registry by ``python tools/generate.py``; do not edit. Each op is
declared once, by ``@op`` next to its implementation in ``ragged/ops/``.
"""

from ._attention import attention as attention
from ._combining import concat as concat
from ._combining import split as split
from ._combining import stack as stack
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
from ._indexing._padding import first as first
from ._indexing._padding import last as last
from ._indexing._padding import pad as pad
from ._indexing._padding import pad_to as pad_to
from ._indexing._padding import truncate as truncate
from ._indexing._take import filter as filter
from ._indexing._take import take as take
from ._linalg._einsum import einsum as einsum
from ._linalg._matmul import linear as linear
from ._linalg._matmul import matmul as matmul
from ._normalization import layer_norm as layer_norm
from ._normalization import log_softmax as log_softmax
from ._normalization import normalize as normalize
from ._normalization import rms_norm as rms_norm
from ._normalization import softmax as softmax
from ._pairs import outer as outer
from ._pairs import pair_dot as pair_dot
from ._pairs import pair_matmul as pair_matmul
from ._pairs import transpose as transpose
from ._reductions._logical import all as all
from ._reductions._logical import any as any
from ._reductions._logical import argmax as argmax
from ._reductions._logical import argmin as argmin
from ._reductions._logical import count as count
from ._reductions._logical import count_nonzero as count_nonzero
from ._reductions._reduce import amax as amax
from ._reductions._reduce import amin as amin
from ._reductions._reduce import max as max
from ._reductions._reduce import mean as mean
from ._reductions._reduce import min as min
from ._reductions._reduce import prod as prod
from ._reductions._reduce import sum as sum
from ._reductions._statistics import logsumexp as logsumexp
from ._reductions._statistics import norm as norm
from ._reductions._statistics import std as std
from ._reductions._statistics import var as var
from ._sampling import sample as sample
from ._sampling import sample_balanced as sample_balanced
from ._sampling import sample_mask as sample_mask
from ._scans import cummax as cummax
from ._scans import cummin as cummin
from ._scans import cumprod as cumprod
from ._scans import cumsum as cumsum
from ._scans import logcumsumexp as logcumsumexp
from ._sorting import argsort as argsort
from ._sorting import sort as sort
from ._sorting import topk as topk
from ._sorting import unique_consecutive as unique_consecutive
from ._structure import combinations as combinations
from ._structure import flatten as flatten
from ._structure import local_index as local_index
from ._structure import unflatten as unflatten
from ._triangle import triangle_multiply as triangle_multiply

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
    "argsort",
    "attention",
    "bitwise_and",
    "bitwise_not",
    "bitwise_or",
    "bitwise_xor",
    "combinations",
    "concat",
    "count",
    "count_nonzero",
    "cummax",
    "cummin",
    "cumprod",
    "cumsum",
    "divide",
    "einsum",
    "eq",
    "filter",
    "first",
    "flatten",
    "floor_divide",
    "ge",
    "gt",
    "last",
    "layer_norm",
    "le",
    "linear",
    "local_index",
    "log_softmax",
    "logcumsumexp",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "logsumexp",
    "lt",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "multiply",
    "ne",
    "negative",
    "norm",
    "normalize",
    "outer",
    "pad",
    "pad_to",
    "pair_dot",
    "pair_matmul",
    "power",
    "prod",
    "remainder",
    "rms_norm",
    "sample",
    "sample_balanced",
    "sample_mask",
    "softmax",
    "sort",
    "split",
    "stack",
    "std",
    "subtract",
    "sum",
    "take",
    "topk",
    "transpose",
    "triangle_multiply",
    "truncate",
    "unflatten",
    "unique_consecutive",
    "var",
    "where",
]
