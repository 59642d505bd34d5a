"""Test helpers for code that uses RaggedArrays: comparison and compile checks.

>>> import ragged, ragged.testing, torch
>>> x = ragged.array([[1.0, 2.0], [3.0]])
>>> ragged.testing.assert_close(x, x.with_values(x.values + 1e-9))
"""

from ._compare import assert_close as assert_close
from ._compile import CompileReport as CompileReport
from ._compile import check_compile as check_compile

__all__ = ["CompileReport", "assert_close", "check_compile"]
