"""LoRA through ``peft``: adapters on a model, merged weights for the rollout, adapter files.

Only the FSDP engine uses this module, and only when ``LoRAConfig.rank > 0``; ``peft`` (the
``hf-engines[lora]`` extra) is imported here, lazily, so a full-weight run never needs it.

The adapters are injected into the Hugging Face model in place (``get_peft_model``): the
engine keeps sharding and calling the model itself, whose LoRA layers hold the frozen base
weight as ``<layer>.base_layer.weight`` and the adapters as ``<layer>.lora_A.default.weight``
(``(r, in)``) and ``<layer>.lora_B.default.weight`` (``(out, r)``). Nothing here changes the
trained weights: merging computes new tensors.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from hf_controller import ConfigurationError
from hf_engines.config import LoRAConfig

ADAPTER_NAME = "default"
"""The one adapter an engine trains (peft's default name)."""

_PEFT_PREFIX = "base_model.model."
"""What a ``PeftModel``'s state-dict names put before the wrapped model's own names."""


@dataclass(frozen=True)
class LoRALayer:
    """Where one adapted linear layer's tensors are in the model's ``state_dict()``."""

    base: str
    """``<layer>.base_layer.weight``: the frozen base weight ``(out, in)``."""
    lora_a: str
    """``<layer>.lora_A.default.weight``, shape ``(r, in)``."""
    lora_b: str
    """``<layer>.lora_B.default.weight``, shape ``(out, r)``."""
    scale: float
    """``alpha / r``: the merged weight is ``W + scale * B @ A``."""
    fan_in_fan_out: bool
    """The base stores ``W`` transposed (GPT-2's ``Conv1D``): add ``(B @ A).T``."""


def apply_lora(model: PreTrainedModel, config: LoRAConfig) -> Any:
    """Inject LoRA adapters into ``model`` in place; return the ``peft`` wrapper.

    Afterwards only adapter parameters have ``requires_grad``; ``model`` itself stays the
    object to shard, call and export (its class and ``config`` are unchanged).
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:  # the optional extra is missing
        raise ConfigurationError(
            f"lora.rank={config.rank} needs the peft package; install hf-engines[lora] "
            "(pip install 'hf-engines[lora]') or set lora.rank=0"
        ) from error
    targets: str | list[str] = list(config.target_modules)
    if config.target_modules == ("all-linear",):
        targets = "all-linear"  # peft expands this string, not a list holding it
    peft_config = LoraConfig(
        r=config.rank,
        # peft annotates an int but scales by alpha / r for any number (alpha=16.0 or 0.5).
        lora_alpha=cast(int, config.alpha),
        lora_dropout=config.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        wrapped = get_peft_model(model, peft_config, adapter_name=ADAPTER_NAME)
    except ValueError as error:  # e.g. no module matches target_modules
        raise ConfigurationError(
            f"lora.target_modules={list(config.target_modules)!r} does not fit "
            f"{type(model).__name__}: {error}; name linear layers of the model (e.g. q_proj, "
            "v_proj) or use [all-linear]"
        ) from error
    _check_linear_only(model)
    return wrapped


def _check_linear_only(model: torch.nn.Module) -> None:
    """Refuse adapters on non-linear layers (embeddings, convolutions): the merge and the
    adapter export handle ``lora.Linear`` layers only."""
    from peft.tuners.lora import Linear, LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and not isinstance(module, Linear):
            raise ConfigurationError(
                f"lora.target_modules matched {name!r}, a {type(module.get_base_layer()).__name__}"
                "; only linear layers are supported: leave it out of lora.target_modules"
            )


def lora_layers(model: torch.nn.Module) -> dict[str, LoRALayer]:
    """The adapted layers of ``model``, keyed by the base weight's name once merged
    (``<layer>.weight``, the plain Hugging Face name)."""
    from peft.tuners.lora import LoraLayer

    layers: dict[str, LoRALayer] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER_NAME in module.lora_A:
            layers[f"{name}.weight"] = LoRALayer(
                base=f"{name}.base_layer.weight",
                lora_a=f"{name}.lora_A.{ADAPTER_NAME}.weight",
                lora_b=f"{name}.lora_B.{ADAPTER_NAME}.weight",
                scale=float(module.scaling[ADAPTER_NAME]),
                fan_in_fan_out=bool(getattr(module, "fan_in_fan_out", False)),
            )
    return layers


def merged_weight(
    base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float, transpose: bool
) -> torch.Tensor:
    """``base + scale * lora_b @ lora_a`` in ``base``'s dtype (summed in float32).

    Shapes: ``base`` ``(out, in)`` (``(in, out)`` with ``transpose``), ``lora_a`` ``(r, in)``,
    ``lora_b`` ``(out, r)``.
    """
    delta = lora_b.float() @ lora_a.float() * scale
    if transpose:
        delta = delta.T
    return (base.float() + delta).to(base.dtype)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def iter_merged_params(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` of the model as if the adapters were merged.

    Names are the base Hugging Face model's (``...q_proj.weight``, no ``base_layer`` and no
    adapter tensors), what a rollout engine or ``from_pretrained`` expects. Collective under
    FSDP: every rank must consume the whole iterator. The model's own weights are untouched.
    """
    layers = lora_layers(model)
    by_base = {layer.base: (name, layer) for name, layer in layers.items()}
    adapters = {layer.lora_a for layer in layers.values()} | {
        layer.lora_b for layer in layers.values()
    }
    state = model.state_dict()
    for name, tensor in state.items():
        if name in adapters:
            continue
        if name in by_base:
            merged_name, layer = by_base[name]
            yield (
                merged_name,
                merged_weight(
                    _full(tensor),
                    _full(state[layer.lora_a]),
                    _full(state[layer.lora_b]),
                    layer.scale,
                    layer.fan_in_fan_out,
                ),
            )
        else:
            yield name.replace(".base_layer.", "."), _full(tensor)


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run the base model: every LoRA layer of ``model`` skips its adapter inside the block.

    peft's own ``disable_adapter()`` also flips ``requires_grad`` of the adapter weights;
    under FSDP2 a forward with them frozen can create the unsharded parameters without
    gradients, so this only sets the layers' disable flag (what peft's forward reads).
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [layer._disable_adapters for layer in layers]
    try:
        for layer in layers:
            layer._disable_adapters = True
        yield
    finally:
        for layer, flag in zip(layers, before, strict=True):
            layer._disable_adapters = flag


def adapter_state_dict(
    model: torch.nn.Module, peft_model: Any, full: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The adapter tensors of ``full`` (the model's full ``state_dict()``, gathered) under
    the names ``peft`` writes in ``adapter_model.safetensors``."""
    from peft import get_peft_model_state_dict

    layers = lora_layers(model).values()
    names = [layer.lora_a for layer in layers] + [layer.lora_b for layer in layers]
    prefixed = {_PEFT_PREFIX + name: full[name] for name in names}
    state: dict[str, torch.Tensor] = get_peft_model_state_dict(
        peft_model, state_dict=prefixed, adapter_name=ADAPTER_NAME
    )
    return state


def gather_adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full CPU copies of the adapter tensors, by ``state_dict()`` name (collective)."""
    layers = lora_layers(model).values()
    wanted = {layer.lora_a for layer in layers} | {layer.lora_b for layer in layers}
    return {
        name: _full(tensor).detach().to("cpu", copy=True).contiguous()
        for name, tensor in model.state_dict().items()
        if name in wanted
    }


def write_adapter(
    directory: Path,
    model: torch.nn.Module,
    peft_model: Any,
    adapter: Mapping[str, torch.Tensor],
    base_path: str | None,
) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` (peft's layout, which
    ``PeftModel.from_pretrained(base, directory)`` loads); return ``directory``.

    ``adapter`` is :func:`gather_adapter`'s result; ``base_path`` is recorded as
    ``base_model_name_or_path``.
    """
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    peft_config = peft_model.peft_config[ADAPTER_NAME]
    peft_config.base_model_name_or_path = base_path
    peft_config.save_pretrained(str(directory))
    tensors = adapter_state_dict(model, peft_model, adapter)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    return directory


def is_adapter_dir(directory: str | Path) -> bool:
    """Whether ``directory`` holds a peft LoRA adapter (``adapter_config.json``)."""
    path = Path(directory) / "adapter_config.json"
    return path.is_file() and json.loads(path.read_text()).get("peft_type") == "LORA"


def load_merged_model(adapter_dir: str | Path, base_path: str | None = None) -> PreTrainedModel:
    """The base causal LM with the adapter of ``adapter_dir`` merged in (on the CPU).

    ``base_path`` defaults to the adapter's ``base_model_name_or_path``. What a checkpoint's
    ``adapter/`` directory turns into on export.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    base_path = base_path or config.get("base_model_name_or_path")
    if not base_path:
        raise ConfigurationError(
            f"{adapter_dir}/adapter_config.json names no base_model_name_or_path; pass the "
            "base model directory the adapter was trained on"
        )
    base = AutoModelForCausalLM.from_pretrained(base_path, local_files_only=True)
    merged: PreTrainedModel = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    return merged
