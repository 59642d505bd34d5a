"""Benchmark helpers and runner: ``python -m ragged.bench [--quick] [--device cuda]``.

The suites live in ``benchmarks/*.py`` (a checkout, not the installed package); each writes a
result document with ``--json PATH``. The runner (``ragged.bench.__main__``) runs every suite in
a fresh process, keeps the documents, logs and plots in ``benchmarks/results/``, and with
``--write-docs`` draws the plots into ``docs/img/`` and rewrites the marked tables of
``docs/benchmarks.md``. Timing, device and reporting helpers shared by the suites are
re-exported here.
"""

from ._report import Table as Table
from ._report import describe as describe
from ._report import machine as machine
from ._report import replace_section as replace_section
from ._report import write_result as write_result
from ._timing import Timing as Timing
from ._timing import add_device_option as add_device_option
from ._timing import compare as compare
from ._timing import peak_memory as peak_memory
from ._timing import per_call as per_call
from ._timing import pin_cpu as pin_cpu
from ._timing import synchronize as synchronize
from ._timing import use_device as use_device

__all__ = [
    "Table",
    "Timing",
    "add_device_option",
    "compare",
    "describe",
    "machine",
    "peak_memory",
    "per_call",
    "pin_cpu",
    "replace_section",
    "synchronize",
    "use_device",
    "write_result",
]
