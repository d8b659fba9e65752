"""Loading a torch.distributed.checkpoint (DCP) directory without unpickling code.

DCP's reader unpickles ``.metadata`` with plain :mod:`pickle` and its default planner loads
every non-tensor item with ``torch.load(weights_only=False)``: a crafted checkpoint could run
code on load. Here the metadata is first read with an unpickler that admits only DCP's own
metadata classes (and the few torch and pathlib types they hold), and non-tensor items load
with ``weights_only=True``.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import ReadItem

from hf_engines.checkpointing import (
    CorruptCheckpointError,
    UnsafeCheckpointError,
    corrupt_file_error,
    load_state_file,
)

_ALLOWED_MODULES = ("torch.distributed.checkpoint.metadata",)
_ALLOWED_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _RefusedGlobal(pickle.UnpicklingError):
    """The metadata names a global outside the allowed list (code, not a damaged file)."""


class _MetadataUnpickler(pickle.Unpickler):
    """Admits DCP's metadata classes, torch dtypes and the types listed above; nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        allowed = module in _ALLOWED_MODULES or (module, name) in _ALLOWED_GLOBALS
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            allowed = True
        if not allowed:
            raise _RefusedGlobal(f"Unsupported global: {module}.{name}")
        return super().find_class(module, name)


def check_metadata(path: Path) -> Metadata:
    """Read a DCP ``.metadata`` file with the restricted unpickler and return it.

    Raises :class:`UnsafeCheckpointError` when it names code, and
    :class:`CorruptCheckpointError` when its bytes are not a whole metadata file (truncated,
    overwritten): a damaged file is not blamed as code.
    """
    try:
        with path.open("rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
    except _RefusedGlobal as error:
        raise UnsafeCheckpointError(
            f"refused to load checkpoint file {str(path)!r}: it references Python code or "
            f"objects beyond DCP's metadata ({error}). Checkpoints never run pickled code on "
            "load; re-save it with hf_engines (engine.save_checkpoint)"
        ) from error
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as error:
        raise corrupt_file_error(path, error) from error
    if not isinstance(metadata, Metadata):
        raise corrupt_file_error(path, TypeError(f"holds a {type(metadata).__name__}"))
    return metadata


def check_storage_sizes(directory: Path, metadata: Metadata) -> None:
    """Raise :class:`CorruptCheckpointError` when a data file of the DCP checkpoint in
    ``directory`` is missing or shorter than ``metadata`` says (a truncated ``.distcp``):
    found before DCP reads it, without reading the data."""
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        file = directory / name
        found = file.stat().st_size if file.is_file() else None
        if found is None or found < size:
            what = "is missing" if found is None else f"has {found} bytes"
            raise CorruptCheckpointError(
                f"checkpoint file {str(file)!r} {what}, but the checkpoint's .metadata needs "
                f"at least {size}: it is truncated or was removed after it was saved; use "
                "another checkpoint (an earlier global_step_<k>)"
            )


class SafeFileSystemReader(FileSystemReader):
    """A :class:`FileSystemReader` whose ``.metadata`` is checked before DCP unpickles it."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Check the metadata file, then read it as DCP does."""
        check_metadata(Path(self.path) / ".metadata")
        return super().read_metadata(*args, **kwargs)


class SafeLoadPlanner(DefaultLoadPlanner):
    """A :class:`DefaultLoadPlanner` loading non-tensor items with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Load a non-tensor item (e.g. an optimizer's ``param_groups``) as plain data only."""
        loaded = load_state_file(value)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
