"""Transforms: ``map`` (row-wise), ``vmap`` (per segment), ``reduce`` (custom monoids), the
collectives of a named ``vmap``, and compile settings. Re-exported at the top level."""

from ._collectives import pmax as pmax
from ._collectives import pmean as pmean
from ._collectives import pmin as pmin
from ._collectives import psum as psum
from ._compile import dynamic_shapes as dynamic_shapes
from ._compile import jit as jit
from ._export import RaggedExportedProgram as RaggedExportedProgram
from ._export import export as export
from ._export import load_exported as load_exported
from ._map import map as map
from ._reduce import reduce as reduce
from ._vmap import RaggedVmapFallbackWarning as RaggedVmapFallbackWarning
from ._vmap import vmap as vmap

__all__ = [
    "RaggedExportedProgram",
    "RaggedVmapFallbackWarning",
    "dynamic_shapes",
    "export",
    "jit",
    "load_exported",
    "map",
    "pmax",
    "pmean",
    "pmin",
    "psum",
    "reduce",
    "vmap",
]
