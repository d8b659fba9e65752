"""The FSDP2 engine (``torch.distributed.fsdp.fully_shard`` on a device mesh)."""

from hf_engines.fsdp.engine import FSDPEngine

__all__ = ["FSDPEngine"]
