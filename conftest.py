"""Settings for every test run (doctests in ragged/ and docs/, and tests/)."""

import torch

torch.set_num_threads(1)


def pytest_sessionfinish(session, exitstatus):
    # Drop compiled code before interpreter exit: Dynamo's weakref callbacks otherwise print
    # "Exception ignored ... KeyError: '__builtins_dict___0'" at shutdown (torch 2.13).
    torch._dynamo.reset()
