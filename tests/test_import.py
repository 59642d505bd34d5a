"""``import ragged`` stays light: no sympy, Dynamo, Inductor, export or plotting at import."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = [
    "sympy",
    "torch._dynamo",
    "torch._inductor",
    "matplotlib",
    "torch.fx.experimental.symbolic_shapes",
]


def test_import_loads_no_compiler_stack():
    code = (
        f"import sys, json, ragged; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.splitlines()[-1]) == []
