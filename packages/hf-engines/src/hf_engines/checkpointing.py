"""What every engine's checkpoint and export code shares: RNG state, optimizer-state moves,
and writing a Hugging Face model directory (``save_pretrained``).

Backend-neutral: the FSDP and Megatron engines each gather their full weights their own way
and hand them here to be written.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pickle
import random
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel

from hf_controller import ConfigurationError
from hf_engines.config import EngineConfig, ModelConfig, config_from_dict

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files of which any one means a directory holds a tokenizer (exported next to the model)."""


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


class CorruptCheckpointError(ConfigurationError):
    """A checkpoint file cannot be read: truncated, overwritten or otherwise damaged.

    Not a refusal of what the file holds (that is :class:`UnsafeCheckpointError`): the bytes
    themselves are not a complete file. A :class:`~hf_controller.ConfigurationError`, so the
    ``hybridflow`` command says it in one line (exit 2): the fix is another checkpoint.
    """


class CheckpointMismatchError(ConfigurationError):
    """A checkpoint holds another model: its tensors' names or shapes differ from this one's."""


_REFUSED_MARKERS = ("GLOBAL", "Unsupported global", "Unsupported class", "Unsupported operand")
"""What torch's weights-only unpickler says when it refuses an object (not a damaged file)."""


def corrupt_file_error(
    path: str | os.PathLike[str] | IO[bytes], error: BaseException
) -> CorruptCheckpointError:
    """The :class:`CorruptCheckpointError` of checkpoint file ``path`` that failed with
    ``error``: the file, its size, what the reader said, and the fix."""
    size = ""
    if isinstance(path, str | os.PathLike) and os.path.isfile(path):
        size = f" ({os.path.getsize(path)} bytes)"
    said = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    said = said.split(". ")[0][:160]  # torch's zip reader adds sentences of advice
    return CorruptCheckpointError(
        f"checkpoint file {str(path)!r}{size} is truncated or damaged and cannot be read "
        f"({type(error).__name__}{': ' + said if said else ''}); it was changed or cut "
        "after it was saved; use another checkpoint (an earlier global_step_<k>)"
    )


def load_state_file(path: str | os.PathLike[str] | IO[bytes], map_location: Any = None) -> Any:
    """``torch.load(path, weights_only=True)``: tensors, containers and plain values only.

    Raises :class:`UnsafeCheckpointError` naming the file and the refused object when the
    file references anything else (a function, a class), so loading a checkpoint never runs
    code that was pickled into it, and :class:`CorruptCheckpointError` naming the file when
    its bytes are not a whole checkpoint file (truncated, overwritten).
    """
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        # torch names the refused global on a line of its own ("... GLOBAL posix.system ...")
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        named = [line for line in lines if any(m in line for m in _REFUSED_MARKERS)]
        if not named:  # e.g. "pickle data was truncated": damaged bytes, not refused code
            raise corrupt_file_error(path, error) from error
        raise UnsafeCheckpointError(
            f"refused to load checkpoint file {str(path)!r}: it references Python code or "
            f"objects beyond tensors and plain data ({named[0]}). Checkpoints load with "
            "weights_only=True and never run pickled code; if you wrote this file yourself, "
            "save only tensors, numbers, strings, lists and dicts in it"
        ) from error
    except (EOFError, zipfile.BadZipFile) as error:
        raise corrupt_file_error(path, error) from error
    except RuntimeError as error:
        # torch's zip reader: "PytorchStreamReader failed reading zip archive: failed finding
        # central directory" (a cut file) or "... failed reading file data" (changed bytes)
        if "PytorchStreamReader" not in str(error):
            raise
        raise corrupt_file_error(path, error) from error


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move every tensor of the optimizer's state to ``device`` in place."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)


ENGINE_CONFIG_FILE = "engine_config.json"
"""The :class:`EngineConfig` a checkpoint was written with (JSON), inside its directory."""
HF_CONFIG_DIR = "hf_config"
"""Sub-directory of a checkpoint with the model's ``config.json`` (and generation config):
what rebuilds the model for an export without the original model directory."""


def save_model_metadata(
    directory: Path,
    config: EngineConfig,
    hf_config: PretrainedConfig,
    generation_config: GenerationConfig | None = None,
) -> None:
    """Write :data:`ENGINE_CONFIG_FILE` and :data:`HF_CONFIG_DIR` into a checkpoint directory.

    Small files (no weights), written by one rank; with them a checkpoint is exported to a
    Hugging Face directory without the run's config file or its model directory.
    """
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(dataclasses.asdict(config), indent=2, default=str)
    (directory / ENGINE_CONFIG_FILE).write_text(text + "\n")
    hf_config.save_pretrained(directory / HF_CONFIG_DIR)
    if generation_config is not None:
        generation_config.save_pretrained(directory / HF_CONFIG_DIR)


def load_engine_config(directory: Path) -> EngineConfig:
    """The :class:`EngineConfig` that :func:`save_model_metadata` wrote into ``directory``."""
    path = directory / ENGINE_CONFIG_FILE
    if not path.is_file():
        present = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
        raise FileNotFoundError(
            f"{str(directory)!r} has no {ENGINE_CONFIG_FILE} (present: {present}); it is not "
            "an engine checkpoint, or one written before engines saved their config. Pass a "
            "role directory of a checkpoint (e.g. global_step_<k>/actor)"
        )
    return config_from_dict(EngineConfig, json.loads(path.read_text()))


DEFAULT_MAX_SHARD_SIZE = "5GB"
"""Largest safetensors shard an export writes (``save_pretrained``'s ``max_shard_size``)."""


def export_dtype(dtype: str | torch.dtype | None, training_dtype: torch.dtype) -> torch.dtype:
    """The dtype an export writes: ``dtype`` when given (``"bfloat16"`` or a torch dtype),
    else ``training_dtype`` (the dtype the parameters are trained in: lossless)."""
    if dtype is None:
        return training_dtype
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(
            f"dtype={dtype!r} is not a floating-point torch dtype; use float32, bfloat16 or "
            "float16 (or leave it unset to keep the training dtype)"
        )
    return value


@dataclass(frozen=True)
class HFExport:
    """How an engine's weights are written as a Hugging Face directory."""

    model_class: type[PreTrainedModel]
    """The transformers class recorded in ``architectures`` (and whose ``save_pretrained``
    writes the files)."""
    dtype: torch.dtype
    """Dtype of the floating-point weights written (see :func:`export_dtype`)."""
    source_dir: str | None = None
    """The model directory trained from; its tokenizer is saved next to the export."""
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE
    """Largest safetensors file; a bigger model is split with an index file."""
    trust_remote_code: bool = False
    """Whether the source tokenizer may run its own code when loaded for saving."""


def hf_export(
    model: ModelConfig,
    model_class: type[PreTrainedModel],
    dtype: str | torch.dtype | None = None,
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
) -> HFExport:
    """The :class:`HFExport` of an engine training ``model`` (an instance of ``model_class``):
    ``dtype`` defaults to ``model.dtype``, the tokenizer comes from the model's directory."""
    return HFExport(
        model_class=model_class,
        dtype=export_dtype(dtype, getattr(torch, model.dtype)),
        source_dir=model.local_path(),
        max_shard_size=max_shard_size,
        trust_remote_code=model.trust_remote_code,
    )


def write_hf_directory(
    directory: Path,
    weights: dict[str, torch.Tensor],
    hf_config: PretrainedConfig,
    export: HFExport,
    generation_config: GenerationConfig | None = None,
) -> None:
    """Write ``weights`` as a Hugging Face directory with ``save_pretrained``.

    Sharded safetensors of at most ``export.max_shard_size`` (with an index when more than
    one), floating-point weights cast to ``export.dtype`` and ``config.json`` recording it,
    ``architectures = [model_class.__name__]``, ``generation_config.json`` when given, the
    model's own code files for a remote-code model, and the tokenizer of
    ``export.source_dir`` (when it has one) saved by the tokenizer's own ``save_pretrained``.

    Not collective: the caller runs it on the one rank that holds the full ``weights``. The
    model is instantiated on the meta device (no memory) only to drive ``save_pretrained``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(hf_config)
    config.architectures = [export.model_class.__name__]
    config.dtype = export.dtype
    dtype = export.dtype
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}
    with torch.device("meta"):
        model = export.model_class._from_config(config)
    if generation_config is not None:
        model.generation_config = generation_config
    model.save_pretrained(directory, state_dict=state, max_shard_size=export.max_shard_size)
    if export.source_dir is not None:
        save_tokenizer(export.source_dir, directory, export.trust_remote_code)
    follow_umask(directory)


def follow_umask(directory: Path) -> None:
    """Give every file under ``directory`` (and the directories) the mode a plain ``open``
    gives under the process's umask (e.g. 0644 / 0755 with umask 022). ``save_pretrained``
    writes the safetensors through a private temporary file (0600) while the rest follow the
    umask: one mode for every file of an export."""
    umask = os.umask(0o022)  # read it (the only way), then put it back at once
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.rglob("*"):
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def save_tokenizer(source_dir: str | Path, directory: Path, trust_remote_code: bool) -> bool:
    """Load the tokenizer of ``source_dir`` and ``save_pretrained`` it into ``directory``.

    Returns ``False`` (writing nothing) when ``source_dir`` holds no tokenizer, e.g. a
    model directory saved without one.
    """
    if not any((Path(source_dir) / name).is_file() for name in TOKENIZER_FILES):
        return False
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        str(source_dir), local_files_only=True, trust_remote_code=trust_remote_code
    )
    tokenizer.save_pretrained(directory)
    return True
