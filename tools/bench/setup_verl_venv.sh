#!/usr/bin/env bash
# Build tools/bench/.venv-verl: a throwaway venv in which verl and our packages import
# side by side, so the benchmarks compare them on one Ray: verl's DataProto with
# hf-protocol's (bench_dataproto_transport.py), verl's single controller with
# hf-controller (bench_controller.py).
#
# verl goes in with --no-deps: its full dependency list (vllm, wandb, datasets, ...)
# is not needed to pickle a DataProto or run a CPU worker group. Only what
# `from verl.protocol import DataProto` imports is added: omegaconf and transformers
# (verl.utils imports both), packaging. `from verl.single_controller.ray import
# RayWorkerGroup` needs nothing beyond that (the check at the end imports it).
# tensordict and transformers stay inside the ranges verl 0.9.1 declares, so verl is
# measured as its users run it.
#
# Never install verl into the product or the dev venv; this venv exists for that.
#
# Usage (from anywhere):  bash tools/bench/setup_verl_venv.sh
# Environment: PYTHON (default python3.11), VERL_VENV (default tools/bench/.venv-verl).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VERL_VENV:-$ROOT/tools/bench/.venv-verl}"
PYTHON="${PYTHON:-python3.11}"

# torch must be exactly 2.13.0: any other version makes pip fetch a multi-GB CUDA build.
TORCH_PIN="torch==2.13.0"
RAY_PIN="ray==2.60.0"
VERL_PIN="verl==0.9.1"
# The ranges verl 0.9.1 declares for the two packages its protocol module imports.
TENSORDICT_SPEC="tensordict>=0.8.0,<=0.10.0,!=0.9.0"
TRANSFORMERS_SPEC="transformers>=5.5.3,<5.11,!=5.6.0"

CONSTRAINTS=()
if [[ -f "$ROOT/tools/constraints.txt" ]]; then
    CONSTRAINTS=(-c "$ROOT/tools/constraints.txt")
fi

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup_verl_venv.sh: $PYTHON is missing or older than 3.11; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet)

echo "installing torch, tensordict, numpy, ray"
"${PIP[@]}" "${CONSTRAINTS[@]}" "$TORCH_PIN" "$TENSORDICT_SPEC" numpy "$RAY_PIN"

echo "installing $VERL_PIN (no dependencies) and what verl.protocol imports"
echo "(pip's 'verl 0.9.1 requires ..., which is not installed' lines are expected: --no-deps)"
"${PIP[@]}" --no-deps "$VERL_PIN"
"${PIP[@]}" "${CONSTRAINTS[@]}" "$TORCH_PIN" "$TENSORDICT_SPEC" "$RAY_PIN" \
    packaging omegaconf "$TRANSFORMERS_SPEC"

echo "installing hf-protocol and hf-controller (editable, no dependencies)"
"${PIP[@]}" --no-deps -e "$ROOT/packages/hf-protocol" -e "$ROOT/packages/hf-controller"

"$VENV/bin/python" - <<'EOF'
import torch

if torch.__version__.split("+")[0] != "2.13.0":
    raise SystemExit(f"torch {torch.__version__} was installed; the benchmark needs 2.13.0")

import hf_controller
import hf_protocol
import ray
import tensordict
import verl

# The imports this venv exists for.
from verl.protocol import DataProto  # noqa: F401
from verl.single_controller.base import Worker  # noqa: F401
from verl.single_controller.ray import RayWorkerGroup  # noqa: F401

print(
    f"ok: torch {torch.__version__}, ray {ray.__version__}, tensordict {tensordict.__version__}, "
    f"verl {verl.__version__}, hf-protocol {hf_protocol.__version__}, "
    f"hf-controller {hf_controller.__version__}"
)
EOF
echo "run: $VENV/bin/python tools/bench/bench_dataproto_transport.py --output docs/benchmarks.md"
echo " or: $VENV/bin/python tools/bench/bench_controller.py --output docs/benchmarks.md"
