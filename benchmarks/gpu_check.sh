#!/usr/bin/env bash
# GPU check: on a CUDA machine with this repository checked out, make a venv, install torch (a
# CUDA build) and torch-ragged, then run the CUDA tests and the ops and encoder suites on the GPU.
# Budget: under 8 minutes on one H100/H200 class GPU, the torch download included.
#
# Usage:
#   bash benchmarks/gpu_check.sh                 # the check (needs a CUDA GPU)
#   bash benchmarks/gpu_check.sh --dry-run       # the same steps on the CPU with tiny sizes
#   bash benchmarks/gpu_check.sh --system-torch  # no download: use the torch python3 already has
#   bash benchmarks/gpu_check.sh --system-torch --wheels DIR
#                                                # ... and first the wheels in DIR (offline)
#
# --system-torch runs $PYTHON itself, with no venv (a venv made from an interpreter that is
# itself a venv's would not see that venv's packages) and nothing installed into it: the
# repository goes on PYTHONPATH. Its torch, pytest and hypothesis are used as they are; a torch
# older than the 2.13 the package asks for is reported and used. --wheels DIR installs every
# wheel in DIR (pip --no-index --no-deps) into a scratch folder on PYTHONPATH first: for an
# offline machine whose Python lacks a package (optree, say), fetch it elsewhere with e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_28_x86_64 -d DIR "optree>=0.13"
#
# Environment:
#   BUDGET       seconds for steps 2-5 together (default 480): each step's own limit is cut to
#                what is left, and a step with less than 20 s left is skipped (reported; the
#                script then exits non-zero), so the whole check ends inside a lease.
#   OUT          folder for the results (default: benchmarks/results/gpu_check); it receives
#                gpu_check.log (everything printed), env.txt (GPU, driver, versions), tests.xml
#                (JUnit), ops-reductions.json, ops-rows.json and encoder.json (result documents
#                of the full-size suites; each suite prints every op's times as it goes, so the
#                log keeps what a step cut short had measured).
#   VENV         the venv to create or reuse (default: .venv-gpu in the repository).
#   PYTHON       the interpreter that makes the venv, or with --system-torch runs everything
#                (default: python3).
#   TORCH_SPEC   the torch requirement (default: torch==2.13.0, the version the CPU suite and
#                ragged's calls into torch's private attention ops were written against).
#   TORCH_INDEX  a pip index for torch (default: none, i.e. PyPI). PyPI's Linux x86-64 wheel of
#                torch 2.13.0 is already a CUDA build (CUDA runtime from NVIDIA's wheels; it needs
#                only the driver) compiled for Hopper (sm_90) among others, so no index URL has to
#                be guessed. To pick a CUDA version, set e.g.
#                TORCH_INDEX=https://download.pytorch.org/whl/cu130 (match the driver: nvidia-smi).
#
# Steps (each has its own time limit; a failed step is reported and the next one still runs,
# and the script exits non-zero if any failed):
#   1. venv + install (--system-torch: no venv, the repository on PYTHONPATH; --wheels first);
#   2. tests: tests/test_cuda.py (the op table under torch.cuda.set_sync_debug_mode("error"),
#      attention on the fused kernels against CPU, one compiled graph), plus the CPU-side checks
#      of the same code (tests/test_attention_varlen.py, tests/test_host_reads.py);
#   3. benchmarks/ops.py --device cuda (full size: [2**20, 64] float32, 8192 segments), in two
#      processes: the reductions, logsumexp and softmax, then the scans and sort (a result
#      document each, so that the first survives a second cut short by its time limit);
#   4. benchmarks/encoder.py --device cuda --no-compile (full size, eager: compiling every
#      variant with Inductor would not fit the budget; run it by hand with --compile);
#   5. python -m ragged.bench --device cuda --quick (the runner end to end on the GPU).
#   Most telling first: when the budget runs out, the runner's smoke run goes.
set -uo pipefail

dry_run=0
system_torch=0
wheels=""
while [ "$#" -gt 0 ]; do
    arg="$1"
    shift
    case "$arg" in
        --dry-run) dry_run=1 ;;
        --system-torch) system_torch=1 ;;
        --wheels)
            if [ "$#" = 0 ] || [ ! -d "$1" ]; then
                echo "gpu_check.sh: --wheels takes a folder of wheels, got: ${1:-nothing}" >&2
                exit 2
            fi
            wheels="$(cd "$1" && pwd)"
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "gpu_check.sh: unknown argument: $arg (see --help)" >&2
            exit 2
            ;;
    esac
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo" || exit 2
out="${OUT:-$repo/benchmarks/results/gpu_check}"
venv="${VENV:-$repo/.venv-gpu}"
python="${PYTHON:-python3}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
torch_index="${TORCH_INDEX:-}"
budget="${BUDGET:-480}"
if ! [[ "$budget" =~ ^[0-9]+$ ]]; then
    echo "gpu_check.sh: BUDGET takes whole seconds, got: $budget" >&2
    exit 2
fi
mkdir -p "$out"
log="$out/gpu_check.log"
: >"$log"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

if [ "$dry_run" = 1 ]; then
    device=cpu
    quick=(--quick)
else
    device=cuda
    quick=()
fi
export PYTHONUNBUFFERED=1
start=$SECONDS
failed=()
skipped=()
deadline=""  # set after the install: steps 2-5 share $budget seconds

say() { echo "$*" | tee -a "$log"; }

# step NAME SECONDS COMMAND...: run with a time limit (cut to what is left of the budget once
# the deadline is set), output to the terminal and the log.
step() {
    local name="$1" limit="$2"
    shift 2
    if [ -n "$deadline" ]; then
        local left=$((deadline - SECONDS))
        if [ "$left" -lt 20 ]; then
            say ""
            say "!! $name: skipped, ${left} s left of the ${budget} s budget (BUDGET)"
            skipped+=("$name")
            return 1
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    say ""
    say "== $name (limit ${limit} s, at $((SECONDS - start)) s)"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
    local status="${PIPESTATUS[0]}"
    if [ "$status" != 0 ]; then
        [ "$status" = 124 ] && say "!! $name: ran past ${limit} s"
        say "!! $name failed (exit $status)"
        failed+=("$name")
        return 1
    fi
    return 0
}

say "gpu_check: repository $repo, device $device, results in $out"

# --- 1. venv and install ----------------------------------------------------------------------
if [ "$system_torch" = 1 ]; then
    py="$(command -v "$python")" || {
        say "!! no interpreter $python (PYTHON)"
        exit 1
    }
    say "== $py as it is (--system-torch); the repository on PYTHONPATH"
    export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
else
    if [ -x "$venv/bin/python" ]; then
        say "== reusing the venv $venv"
    else
        step "venv" 120 "$python" -m venv "$venv" || exit 1
    fi
    py="$venv/bin/python"
    index=()
    [ -n "$torch_index" ] && index=(--index-url "$torch_index")
    step "install $torch_spec ${torch_index:-from PyPI}" 300 \
        "$py" -m pip install -q "$torch_spec" "${index[@]}" || exit 1
    step "install torch-ragged with its test extras" 180 "$py" -m pip install -q -e ".[test]" || exit 1
fi
if [ -n "$wheels" ]; then
    site="$scratch/site"
    step "install the wheels of $wheels (no index, no dependencies)" 120 \
        "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl || exit 1
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
step "environment" 60 "$py" - "$device" "$out/env.txt" <<'EOF' || exit 1
import importlib.util, platform, subprocess, sys
import torch
device, path = sys.argv[1:]
lines = [f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}"]
missing = [m for m in ("optree", "pytest", "hypothesis") if importlib.util.find_spec(m) is None]
if not missing:
    import ragged
    lines.append(f"torch-ragged {ragged.__version__} from {ragged.__file__}")
if torch.__version__.split("+")[0].split(".")[:2] != ["2", "13"]:
    lines.append(f"note: torch-ragged is written against torch 2.13; this is torch {torch.__version__}")
if device == "cuda" and torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    lines.append(f"GPU {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB")
    lines.append(f"flash attention built: {torch.backends.cuda.is_flash_attention_available()}")
    try:
        lines.append(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)
    except OSError:
        lines.append("nvidia-smi: not found")
print("\n".join(lines))
open(path, "w").write("\n".join(lines) + "\n")
if missing:
    sys.exit(f"missing packages: {', '.join(missing)} (without network: carry their wheels)")
if device == "cuda" and not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device: a CPU build of torch, or no driver (nvidia-smi?)")
EOF

deadline=$((SECONDS + budget))

# --- 2. tests ---------------------------------------------------------------------------------
step "CUDA tests" 240 "$py" -m pytest -q -p no:cacheprovider -rs --junitxml="$out/tests.xml" \
    tests/test_cuda.py tests/test_attention_varlen.py tests/test_host_reads.py

# --- 3-5. benchmarks --------------------------------------------------------------------------
if [ "$dry_run" = 1 ]; then
    ops_args=(--quick)
    ops_first="sum,softmax"
    ops_second="cumsum"
    encoder_args=(--quick --variants padded ragged loop)
else
    ops_args=()
    ops_first="sum,mean,max,min,logsumexp,softmax"
    ops_second="cumsum,cumprod,cummax,cummin,logcumsumexp,sort"
    encoder_args=(--no-compile)
fi
step "benchmarks/ops.py --device $device ${quick[*]} --ops $ops_first" 150 \
    "$py" benchmarks/ops.py --device "$device" "${ops_args[@]}" --ops "$ops_first" \
    --json "$out/ops-reductions.json"
step "benchmarks/ops.py --device $device ${quick[*]} --ops $ops_second" 150 \
    "$py" benchmarks/ops.py --device "$device" "${ops_args[@]}" --ops "$ops_second" \
    --json "$out/ops-rows.json"
step "benchmarks/encoder.py --device $device ${encoder_args[*]}" 150 \
    "$py" benchmarks/encoder.py --device "$device" "${encoder_args[@]}" --json "$out/encoder.json"
step "python -m ragged.bench --device $device --quick (ops, encoder)" $((150 + 150 * dry_run)) \
    "$py" -m ragged.bench --device "$device" --quick --suite ops --suite encoder \
    --out "$scratch/bench"

say ""
say "gpu_check: $((SECONDS - start)) s; results in $out (gpu_check.log, env.txt, tests.xml, ops-*.json, encoder.json)"
if [ "${#failed[@]}" != 0 ] || [ "${#skipped[@]}" != 0 ]; then
    for name in "${failed[@]}"; do say "gpu_check: FAILED: $name"; done
    for name in "${skipped[@]}"; do say "gpu_check: not run (budget): $name"; done
    exit 1
fi
say "gpu_check: passed"
