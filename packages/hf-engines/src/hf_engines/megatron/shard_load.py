"""Per-shard loading: each rank reads only its own tensor slices from the safetensors files.

The Hugging Face model is never built with weights: its structure comes from a meta-device
build (:func:`hf_engines.models.build_meta_hf_model`), and every tensor of this rank's
megatron stage is assembled from slices read with safetensors' ``get_slice`` (rows of
q/k/v, gate/up and the embeddings, columns of o_proj and down_proj, whole norms). The
slices go through the same converter as a full load (:func:`hf_layer_to_mcore` with this
rank's query groups), so both loads give identical parameters; peak memory is this rank's
shard plus one layer's slices, not the whole model.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from safetensors import safe_open

from hf_engines.config import ModelConfig
from hf_engines.megatron.convert import hf_layer_to_mcore
from hf_engines.megatron.weights import copy_shard, local_to_global_names

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
_ROW_SPLIT = (
    "q_proj.weight",
    "q_proj.bias",
    "k_proj.weight",
    "k_proj.bias",
    "v_proj.weight",
    "v_proj.bias",
    "gate_proj.weight",
    "up_proj.weight",
    "embed_tokens.weight",
    "lm_head.weight",
)
"""HF tensors whose rows are split over tensor-parallel ranks (megatron's column-parallel)."""
_COLUMN_SPLIT = ("o_proj.weight", "down_proj.weight")
"""HF tensors whose columns are split over tensor-parallel ranks (megatron's row-parallel)."""
_OUTER = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
}


def _safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's ``*.safetensors`` files (those the index lists, when there is one)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return sorted({directory / name for name in weight_map.values()})
    return sorted(directory.glob("*.safetensors"))


def shard_source(model: ModelConfig, hf_names: Iterable[str], tied: bool) -> Path | None:
    """The directory to load shards from, or None when only a full load can build the model.

    A per-shard load needs a local directory of safetensors files holding every tensor of
    the model (``hf_names``, less a tied ``lm_head``). A model built from ``hf_config``
    (random weights), ``*.bin`` weights or a head missing from the files (a critic started
    from a causal LM gets a freshly initialised value head) are loaded whole instead.
    """
    directory = model.local_path()
    if directory is None:
        return None
    files = _safetensors_files(Path(directory))
    if not files:
        return None
    stored: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            stored.update(handle.keys())
    needed = {name for name in hf_names if not (tied and name == "lm_head.weight")}
    return Path(directory) if needed <= stored else None


class _SliceReader:
    """Reads this rank's tensor-parallel slice of any tensor of the checkpoint files."""

    def __init__(self, handles: dict[str, Any], dtype: torch.dtype) -> None:
        self._handles = handles
        self._dtype = dtype
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()

    def names(self) -> list[str]:
        """Every tensor name in the checkpoint."""
        return list(self._handles)

    def read(self, name: str, replicated: bool = False) -> torch.Tensor:
        """This rank's slice of ``name`` (whole when ``replicated`` or not split), as dtype."""
        view = self._handles[name].get_slice(name)
        shape = view.get_shape()
        dim = None
        if not replicated and self.tp_size > 1:
            if name.endswith(_ROW_SPLIT):
                dim = 0
            elif name.endswith(_COLUMN_SPLIT):
                dim = 1
        if dim is None:
            tensor = view[:]
        else:
            if shape[dim] % self.tp_size != 0:
                raise ValueError(
                    f"{name}: dimension {dim} of shape {shape} does not split over "
                    f"tensor_model_parallel_size={self.tp_size}"
                )
            step = shape[dim] // self.tp_size
            start, stop = self.tp_rank * step, (self.tp_rank + 1) * step
            tensor = view[start:stop] if dim == 0 else view[:, start:stop]
        return tensor.to(self._dtype)


def _layer_shards(reader: _SliceReader, layer: int, groups: int) -> dict[str, torch.Tensor]:
    """Decoder layer ``layer``'s local megatron tensors (layer-local names) for this rank."""
    prefix = f"model.layers.{layer}."
    hf_layer = {
        name[len(prefix) :]: reader.read(name) for name in reader.names() if name.startswith(prefix)
    }
    return hf_layer_to_mcore(hf_layer, groups // reader.tp_size)


def _outer_shard(reader: _SliceReader, global_name: str, value_head: bool) -> torch.Tensor:
    """A non-layer megatron tensor's local shard: embeddings, final norm or output layer."""
    if global_name in _OUTER:
        return reader.read(_OUTER[global_name])
    if global_name == "output_layer.bias":
        return reader.read("score.bias", replicated=True)
    if global_name != "output_layer.weight":
        raise KeyError(f"no Hugging Face tensor is known for megatron parameter {global_name!r}")
    if value_head:
        return reader.read("score.weight", replicated=True)
    # Tied embeddings (no lm_head in the files): the last stage's copy of the embeddings.
    tied = "lm_head.weight" not in reader.names()
    return reader.read("model.embed_tokens.weight" if tied else "lm_head.weight")


@torch.no_grad()
def load_shards(model: GPTModel, directory: Path, groups: int, value_head: bool) -> None:
    """Fill this rank's stage of ``model`` from the safetensors files in ``directory``.

    ``groups`` is the model's number of query groups (KV heads). Reads one decoder layer's
    slices at a time; every parameter of the stage must be found (an error names it).
    """
    dtype = next(model.parameters()).dtype
    state = model.state_dict(keep_vars=True)
    by_layer: dict[int, list[tuple[str, str]]] = {}
    with contextlib.ExitStack() as stack:
        handles: dict[str, Any] = {}
        for path in _safetensors_files(directory):
            handle = stack.enter_context(safe_open(str(path), framework="pt"))
            handles.update(dict.fromkeys(handle.keys(), handle))
        reader = _SliceReader(handles, dtype)
        for local, global_name in local_to_global_names(model).items():
            match = _LAYER.match(global_name)
            if match:
                by_layer.setdefault(int(match.group(1)), []).append((local, match.group(2)))
            else:
                copy_shard(state[local], _outer_shard(reader, global_name, value_head), global_name)
        for layer, names in by_layer.items():
            shards = _layer_shards(reader, layer, groups)
            for local, layer_name in names:
                if layer_name not in shards:
                    raise KeyError(
                        f"no weight for megatron parameter decoder.layers.{layer}.{layer_name} "
                        f"in {directory}"
                    )
                copy_shard(state[local], shards[layer_name], f"decoder.layers.{layer}.{layer_name}")
