#!/usr/bin/env bash
# The main job from a fresh clone, on a machine with only python3:
#   bash tools/quickstart.sh [key.sub=value ...]
# Sets up .venv (tools/setup_venv.sh), then runs the CPU quickstart recipe
# (recipes/quickstart: SFT warm-up + GRPO on a tiny local model, a few minutes on 2 cores).
# Arguments are passed on as config overrides, e.g. grpo.trainer.total_training_steps=100.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Keep the local Ray cluster on 127.0.0.1 instead of the machine's network address.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0

bash tools/setup_venv.sh .venv
.venv/bin/python -m recipes.quickstart.main "$@"
