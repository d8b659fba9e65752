"""The local backend: worker classes run inside the driver process (for debugging)."""

from hf_controller.local.worker_group import LocalWorkerGroup

__all__ = ["LocalWorkerGroup"]
