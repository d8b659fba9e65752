#!/usr/bin/env bash
# Build tools/bench/.venv-trl: a throwaway venv holding TRL 1.16.0, so bench_grpo.py can
# compare TRL's GRPOTrainer with HybridFlow and a plain torch loop on the same task.
#
# TRL (and what it pulls in: accelerate, datasets, pandas, pyarrow, ...) never goes into the
# product or the dev venv; this venv exists for it. torch is pinned to 2.13.0, the CPU build
# (any other version makes pip fetch a multi-GB CUDA build); transformers and tokenizers are
# pinned to the dev venv's versions so both sides of the comparison run the same model code.
# matplotlib is not needed here: the harness (bench_grpo.py) draws the plot in the dev venv.
# reasoning-gym and math-verify serve bench_real_grpo.py's TRL column: it scores SmolLM2's
# chain_sum answers with hf_algos.rewards.reasoning_gym (the task's own verifier), as the
# HybridFlow and plain-loop columns do.
#
# The task's data generator and reward are the quickstart's (hf_algos.examples, wired up
# by tools/bench/grpo_task.py), which build on hf-algos (hf_algos.data, hf_algos.rewards),
# so hf-protocol (with its dependencies: tensordict), omegaconf (hf_algos.examples registers
# its config resolvers) and hf-algos (editable, --no-deps: the reward and data modules need
# neither Ray nor the engines) are installed too.
#
# Idempotent: a second run reuses the venv and only checks that the pins hold.
#
# Usage (from anywhere):  bash tools/bench/setup_trl_venv.sh
# Environment: PYTHON (default python3.11), TRL_VENV (default tools/bench/.venv-trl).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${TRL_VENV:-$ROOT/tools/bench/.venv-trl}"
PYTHON="${PYTHON:-python3.11}"

TORCH_VERSION="2.13.0"
TRL_VERSION="1.16.0"
TRANSFORMERS_VERSION="5.24.0"
TOKENIZERS_VERSION="0.23.3"
REASONING_GYM_VERSION="0.1.25"
MATH_VERIFY_VERSION="0.9.0"

CONSTRAINTS=()
if [[ -f "$ROOT/tools/constraints.txt" ]]; then
    CONSTRAINTS=(-c "$ROOT/tools/constraints.txt")
fi

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup_trl_venv.sh: $PYTHON is missing or older than 3.11; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi

installed_versions() {
    "$VENV/bin/python" -c '
import torch, transformers, trl
print(torch.__version__.split("+")[0], transformers.__version__, trl.__version__)
' 2>/dev/null || true
}

WANTED="$TORCH_VERSION $TRANSFORMERS_VERSION $TRL_VERSION"
if [[ "$(installed_versions)" == "$WANTED" ]] && "$VENV/bin/python" -c 'import hf_controller, hf_algos, omegaconf, lazy_loader, reasoning_gym, math_verify' 2>/dev/null; then
    echo "already installed: torch $TORCH_VERSION, transformers $TRANSFORMERS_VERSION, trl $TRL_VERSION"
else
    echo "installing torch $TORCH_VERSION, trl $TRL_VERSION, transformers $TRANSFORMERS_VERSION"
    "$VENV/bin/python" -m pip install --quiet "${CONSTRAINTS[@]}" \
        "torch==$TORCH_VERSION" "trl==$TRL_VERSION" \
        "transformers==$TRANSFORMERS_VERSION" "tokenizers==$TOKENIZERS_VERSION" \
        "omegaconf==2.4.0" "lazy-loader>=0.4,<1" "reasoning-gym==$REASONING_GYM_VERSION" \
        "math-verify==$MATH_VERIFY_VERSION" -e "$ROOT/packages/hf-protocol"
    echo "installing hf-controller and hf-algos (editable, no dependencies: no Ray is needed)"
    "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT/packages/hf-controller" \
        -e "$ROOT/packages/hf-algos"
fi

PYTHONPATH="$ROOT:$ROOT/tools/bench${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" - <<'PY'
import torch

if torch.__version__.split("+")[0] != "2.13.0":
    raise SystemExit(f"torch {torch.__version__} was installed; the benchmark needs 2.13.0")

import accelerate
import datasets
import transformers
import trl
import grpo_task  # noqa: F401  (the task as the benchmark's columns use it)
import real_grpo_task  # noqa: F401  (bench_real_grpo.py's scorer and evaluator)
from trl import GRPOConfig, GRPOTrainer  # noqa: F401  (the imports this venv exists for)

print(
    f"ok: torch {torch.__version__}, transformers {transformers.__version__}, "
    f"trl {trl.__version__}, accelerate {accelerate.__version__}, datasets {datasets.__version__}"
)
PY
echo "run: .venv/bin/python tools/bench/bench_grpo.py --output docs/benchmarks.md"
