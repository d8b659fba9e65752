"""Stage ``imports``: every module the GPU run needs imports; versions and the device, as JSON.

Usage: ``python tools/gpu/check_imports.py cuda|cpu [--without-vllm]`` (our packages on
``PYTHONPATH``). ``--without-vllm`` leaves vLLM and our vLLM backend out (the closed-set
proof's venv, tools/gpu/prove_closed_set.sh, holds no vLLM).
"""

from __future__ import annotations

import importlib
import json
import sys

MODULES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "accelerate",
    "numpy",
    "tensordict",
    "omegaconf",
    "datasets",
    "math_verify",
    "gguf",
    "reasoning_gym",
    "vllm",
    "hf_protocol",
    "hf_controller",
    "hf_engines",
    "hf_rollout",
    "hf_algos",
    "hf_algos.trainers.ppo.trainer",
    "hf_rollout.backends.vllm",
    "hf_engines.fsdp",
    "megatron.core",
    "hf_engines.megatron",
)


VLLM_MODULES = ("vllm", "hf_rollout.backends.vllm")
"""What ``--without-vllm`` leaves out."""


def main(device: str, without_vllm: bool = False) -> int:
    """Import each module; print one JSON object; 1 if any import failed."""
    found: dict[str, str] = {}
    failed: dict[str, str] = {}
    for name in MODULES:
        if without_vllm and name in VLLM_MODULES:
            continue
        try:
            module = importlib.import_module(name)
        except Exception as error:
            failed[name] = f"{type(error).__name__}: {error}"
            continue
        found[name] = str(getattr(module, "__version__", "-"))
    import torch

    info = {
        "python": sys.version.split()[0],
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "versions": found,
        "failed": failed,
    }
    print(json.dumps(info, indent=1))
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], "--without-vllm" in sys.argv[2:]))
