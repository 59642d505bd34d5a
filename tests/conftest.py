import os

import hypothesis
import pytest
import torch

torch.set_num_threads(1)

# Checked by mypy, not run: its assertions are about static types (see the module).
collect_ignore = ["typing_check.py"]
torch.set_default_dtype(torch.float32)

for profile, examples in (("default", 25), ("nightly", 500)):
    hypothesis.settings.register_profile(
        profile,
        max_examples=examples,
        deadline=None,
        print_blob=True,
        suppress_health_check=[
            hypothesis.HealthCheck.too_slow,
            hypothesis.HealthCheck.function_scoped_fixture,
        ],
    )
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# CUDA cases: tests marked ``@pytest.mark.cuda`` (or using the ``cuda`` fixture) run where
# torch sees a CUDA device and are skipped elsewhere (``benchmarks/gpu_check.sh`` runs them).
NO_CUDA = "needs a CUDA device (torch.cuda.is_available() is False)"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA))


@pytest.fixture
def cuda():
    """The CUDA device; skips the test without one."""
    if not torch.cuda.is_available():
        pytest.skip(NO_CUDA)
    return torch.device("cuda")
