# Source this first in every device call:  source tools/gpu/unpack.sh
#
# Keeps what this call carried (.gpu/deps, .gpu/pN) in $HF_GPU_STORE (default /tmp/hybridflow-gpu,
# which lives as long as the machine stays warm), unpacks what is complete, and exports
# PYTHONPATH (the unpacked site folder) and the vLLM settings for the stages. Prints one
# "[unpack]" line per step; returns non-zero (without exiting the caller's shell) on a failure.
hf_gpu_unpack() {
  local store=${HF_GPU_STORE:-/tmp/hybridflow-gpu}
  mkdir -p "$store/parts" "$store/site" "$store/model"
  if [ -f .gpu/deps/deps.tar.xz ] && [ ! -f "$store/deps.done" ]; then
    tar -xJf .gpu/deps/deps.tar.xz -C "$store/site" || { echo "[unpack] deps: tar failed"; return 1; }
    touch "$store/deps.done"; echo "[unpack] deps ready"
    # pycosat (C, source only on PyPI) is built here: this image has a compiler and Python.h.
    # A failure is reported and the call goes on (only reasoning-gym needs it).
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
      --target "$store/site" .gpu/deps/pycosat-*.tar.gz \
      && echo "[unpack] pycosat built" || echo "[unpack] pycosat build FAILED: reasoning-gym will not import"
  fi
  local dir
  for dir in .gpu/p*; do
    [ -f "$dir/COUNT" ] || continue
    cp "$dir"/part.* "$dir/COUNT" "$dir/SHA256" "$store/parts/"
    echo "[unpack] kept $(ls "$dir" | grep part.)"
  done
  if [ -f "$store/parts/COUNT" ] && [ ! -f "$store/vllm.done" ]; then
    local count have
    count=$(cat "$store/parts/COUNT"); have=$(ls "$store/parts" | grep -c '^part\.')
    if [ "$have" -eq "$count" ]; then
      (cd "$store/parts" && for i in $(seq 0 $((count - 1))); do cat "part.$i"; done) > "$store/bundle.tar"
      echo "$(cat "$store/parts/SHA256")  $store/bundle.tar" | sha256sum -c --quiet - \
        || { echo "[unpack] bundle checksum differs"; return 1; }
      mkdir -p "$store/bundle" && tar -xf "$store/bundle.tar" -C "$store/bundle" && rm -f "$store/bundle.tar"
      tar -xJf "$store/bundle/vllm.tar.xz" -C "$store/site" || { echo "[unpack] vllm: tar failed"; return 1; }
      mv "$store/bundle"/*.gguf "$store/model/" && rm -rf "$store/bundle" "$store/parts"
      touch "$store/vllm.done"; echo "[unpack] vllm and the model ready"
    else
      echo "[unpack] $have of $count parts so far"
    fi
  fi
  export PYTHONPATH="$store/site${PYTHONPATH:+:$PYTHONPATH}"
  export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
}
hf_gpu_unpack
