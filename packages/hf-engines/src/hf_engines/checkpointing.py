"""What every engine's checkpoint and export code shares: RNG state, optimizer-state moves,
and writing a Hugging Face model directory.

Backend-neutral: the FSDP and Megatron engines each gather their full weights their own way
and hand them here to be written.
"""

from __future__ import annotations

import copy
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import IO, Any

import torch
from safetensors.torch import save_file
from transformers import GenerationConfig, PretrainedConfig

TOKENIZER_FILES = (
    "tokenizer*",
    "special_tokens_map.json",
    "vocab*",
    "merges.txt",
    "chat_template*",
)
"""Tokenizer and chat-template files copied from the source model directory on export."""


def rng_state() -> dict[str, Any]:
    """This process's random number generator states (torch CPU, CUDA, Python)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds pickled code (or objects beyond tensors and plain data).

    Checkpoints are loaded with ``torch.load(weights_only=True)``, which never imports or
    calls anything named in the file; a file that needs more is refused with this error.
    """


def load_state_file(path: str | os.PathLike[str] | IO[bytes], map_location: Any = None) -> Any:
    """``torch.load(path, weights_only=True)``: tensors, containers and plain values only.

    Raises :class:`UnsafeCheckpointError` naming the file and the refused object when the
    file references anything else (a function, a class), so loading a checkpoint never runs
    code that was pickled into it.
    """
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        # torch names the refused global on a line of its own ("... GLOBAL posix.system ...")
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        named = [line for line in lines if "GLOBAL" in line]
        first = (named or lines or [repr(error)])[0]
        raise UnsafeCheckpointError(
            f"refused to load checkpoint file {str(path)!r}: it references Python code or "
            f"objects beyond tensors and plain data ({first}). Checkpoints load with "
            "weights_only=True and never run pickled code; if you wrote this file yourself, "
            "save only tensors, numbers, strings, lists and dicts in it"
        ) from error


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move every tensor of the optimizer's state to ``device`` in place."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)


def write_hf_directory(
    directory: Path,
    weights: dict[str, torch.Tensor],
    hf_config: PretrainedConfig,
    class_name: str,
    source_dir: str | None,
    generation_config: GenerationConfig | None = None,
) -> None:
    """Write ``config.json`` (``architectures = [class_name]``), ``model.safetensors`` and,
    when given, ``generation_config.json``; copy the tokenizer files of ``source_dir``.

    Not collective: the caller runs it on the one rank that holds the full ``weights``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(hf_config)
    config.architectures = [class_name]
    config.save_pretrained(directory)
    if generation_config is not None:
        generation_config.save_pretrained(directory)
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    if source_dir is not None:
        for pattern in TOKENIZER_FILES:
            for path in Path(source_dir).glob(pattern):
                shutil.copy2(path, directory / path.name)
