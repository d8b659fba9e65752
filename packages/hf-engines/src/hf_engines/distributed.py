"""Process-group facts every engine backend needs, independent of FSDP or Megatron."""

from __future__ import annotations

import torch
import torch.distributed as dist


def resolve_compute_device(device: str, section: str) -> torch.device:
    """The compute device for a ``device`` setting (``"cpu"``, ``"cuda"`` or ``"auto"``):
    CUDA when asked, or with ``auto`` when the default process group's backend is NCCL.

    ``section`` (``"fsdp"``, ``"megatron"``) names the config key in the error raised when
    CUDA is asked for but none is visible.
    """
    use_cuda = device == "cuda" or (device == "auto" and "nccl" in str(dist.get_backend()).lower())
    if not use_cuda:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{section}.device asks for CUDA but no CUDA device is visible; set "
            f"{section}.device='cpu' and use the gloo backend to run on the CPU"
        )
    return torch.device("cuda", torch.cuda.current_device())
