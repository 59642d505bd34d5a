import os

import hypothesis
import torch

torch.set_num_threads(1)
torch.set_default_dtype(torch.float32)

hypothesis.settings.register_profile(
    "default",
    max_examples=40,
    deadline=None,
    print_blob=True,
    suppress_health_check=[
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.function_scoped_fixture,
    ],
)
hypothesis.settings.register_profile(
    "nightly",
    max_examples=500,
    deadline=None,
    print_blob=True,
    suppress_health_check=[
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.function_scoped_fixture,
    ],
)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
