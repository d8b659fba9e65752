#!/usr/bin/env bash
# Proof loop for issue 32, item 3 (no C++ abort when a 2-rank process exits).
#
# Runs hf-engines' 2-rank engine tests N times, each time next to another distributed job
# (tools/stress/gloo_job.py: 2-rank gloo jobs back to back) and two busy loops
# (`yes > /dev/null`), and counts passes and aborts ("exited with code -6" / "terminate
# called"). Every helper process it starts is killed by pid when it ends (or is stopped).
#
# Usage (repository root): bash tools/stress/engine_exit_loop.sh [N=20]
# Env: PY (default .venv/bin/python); PYTHONPATH is set to packages/*/src.
# Keep at most one of these loops running on a machine at a time. Exits 1 on any failure.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
N=${1:-20}
PY=${PY:-.venv/bin/python}
PYTHONPATH=$(ls -d "$PWD"/packages/*/src | paste -sd:)
export PYTHONPATH
TESTS=(packages/hf-engines/tests/test_fsdp_engine.py packages/hf-engines/tests/test_lora.py)
log_dir=$(mktemp -d /tmp/engine-exit-loop.XXXXXX)
helpers=()
neighbour=
cleanup() {
    for pid in "${helpers[@]}" $neighbour; do kill "$pid" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT
trap 'exit 143' INT TERM  # stop the loop (the EXIT trap then kills the helpers)

yes > /dev/null & helpers+=($!)
yes > /dev/null & helpers+=($!)
passes=0; aborts=0; other=0
for i in $(seq 1 "$N"); do
    "$PY" tools/stress/gloo_job.py 100000 > "$log_dir/neighbour$i.log" 2>&1 & neighbour=$!
    start=$(date +%s)
    "$PY" -m pytest "${TESTS[@]}" -x -q -p no:cacheprovider > "$log_dir/run$i.log" 2>&1
    rc=$?
    kill "$neighbour" 2>/dev/null; wait "$neighbour" 2>/dev/null
    neighbour_jobs=$(tail -1 "$log_dir/neighbour$i.log")
    if [ "$rc" = 0 ]; then
        passes=$((passes + 1)); what=pass
    elif grep -qE "code -6|terminate called" "$log_dir/run$i.log"; then
        aborts=$((aborts + 1)); what=ABORT
    else
        other=$((other + 1)); what="FAIL (rc $rc)"
    fi
    echo "iteration $i/$N: $what in $(( $(date +%s) - start ))s ($(tail -1 "$log_dir/run$i.log"); $neighbour_jobs)"
done
echo "engine_exit_loop: $N iterations: $passes passed, $aborts aborted, $other other failures (logs: $log_dir)"
[ "$passes" = "$N" ]
