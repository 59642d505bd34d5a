"""The example scripts run end to end with ``--small`` (what CI runs)."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_example(name, *extra, launcher=()):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, *launcher, str(ROOT / "examples" / name), "--small", *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_gnn_example_trains():
    out = run_example("gnn.py")
    first, last = (float(v) for v in out.splitlines()[-1].split()[1:4:2])
    assert last < first / 4, out


def test_ddp_example_keeps_gradients_in_sync():
    out = run_example("ddp.py")
    assert out.count("gradients equal on all ranks: True; equal to one process") == 2, out
    assert "done:" in out


def test_ddp_example_runs_under_torchrun():
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    out = run_example("ddp.py", launcher=torchrun)
    assert "torchrun, env://" in out, out
    assert out.count("gradients equal on all ranks: True; equal to one process") == 2, out
    assert "done:" in out


# Run in a fresh interpreter: the leak this guards against needs torch.distributed.nn.functional
# to be first imported while a process group exists, as in a spawned or torchrun process.
_DDP_TEARDOWN = """
import os
import ddp
ddp.run(0, 1, ddp.free_port(), ddp.parse_args(["--small"]))
names = []
for t in os.listdir("/proc/self/task"):
    try:  # a thread that ends while the tasks are listed is not left over
        names.append(open(f"/proc/self/task/{t}/comm").read().strip())
    except FileNotFoundError:
        pass
print(sorted(names))
"""


@pytest.mark.skipif(not pathlib.Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_ddp_example_frees_its_process_group():
    """After the example's ``run``, no gloo or store thread is left: ``destroy_process_group``
    freed the group. A group that outlives it is torn down in interpreter shutdown, which
    sometimes aborted the example (SIGABRT after "done")."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "examples"), str(ROOT), os.environ.get("PYTHONPATH", "")]
        ),
    }
    result = subprocess.run(
        [sys.executable, "-c", _DDP_TEARDOWN], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    threads = result.stdout.strip().splitlines()[-1]
    assert "done: " in result.stdout, result.stdout
    assert "gloo" not in threads and "tcpstore" not in threads, threads


def test_pairformer_example_trains_and_matches_padding():
    out = run_example("pairformer.py", "--check")
    difference = float(out.split("max |difference| ")[1].split()[0])
    assert difference < 1e-4, out
    losses = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step")]
    assert losses[-1] < losses[0], out
    assert "peak memory of one step" in out


def test_classifier_example_learns_and_matches_padded():
    out = run_example("classifier.py")
    accuracies = [
        float(line.split("test accuracy ")[1].split(",")[0])
        for line in out.splitlines()
        if "test accuracy" in line
    ]
    before = float(out.splitlines()[0].split(": ")[1])
    assert accuracies[-1] > before + 0.1, out
    assert "same logits: True" in out, out


def test_sampler_example_agrees_with_the_nonzero_sampler():
    out = run_example("sampler.py")
    assert "per-segment counts match: True (both equal min(k, L_b): True)" in out, out
    assert "ragged.sample_mask (sync-free)" in out


def test_torch_native_example_learns():
    out = run_example("torch_native.py")
    before = float(out.splitlines()[0].split(": ")[1])
    accuracies = [
        float(line.split("test accuracy ")[1])
        for line in out.splitlines()
        if line.startswith("epoch")
    ]
    assert len(accuracies) == 3 and max(accuracies) > before + 0.2, out
    assert "tokens/s (eager)" in out
