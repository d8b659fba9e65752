"""verl's device helpers (``verl.utils.device``): which accelerator this process uses.

HybridFlow knows CUDA and CPU; verl's other platforms (NPU, ROCm through HIP names) are
not supported, so these answer ``"cuda"`` when torch sees a GPU and ``"cpu"`` otherwise.
"""

from __future__ import annotations

from typing import Any


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # hf-controller alone needs no torch: no GPU it could drive
        return False
    return bool(torch.cuda.is_available())


def get_device_name() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"`` (verl's name for the device type)."""
    return "cuda" if _cuda_available() else "cpu"


def get_nccl_backend() -> str:
    """The torch.distributed backend for this device: ``"nccl"`` on GPUs, ``"gloo"`` on CPU."""
    return "nccl" if _cuda_available() else "gloo"


def get_torch_device() -> Any:
    """The torch module of this device type (``torch.cuda``, or ``torch.cpu``)."""
    import torch

    return getattr(torch, get_device_name())


def is_cuda_available() -> bool:
    """Whether torch sees a GPU."""
    return _cuda_available()
