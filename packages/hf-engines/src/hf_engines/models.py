"""Building Hugging Face models from a :class:`ModelConfig` (local files only).

A model path is a local directory or a model id, resolved by
:func:`hf_engines.hub.resolve_model_path`.
"""

from __future__ import annotations

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    PretrainedConfig,
    PreTrainedModel,
)

from hf_engines.config import ModelConfig


def load_hf_config(config: ModelConfig) -> PretrainedConfig:
    """The transformers config named by ``config``: read from ``path`` or built from a dict."""
    directory = config.local_path()
    if directory is not None:
        hf_config = AutoConfig.from_pretrained(
            directory,
            local_files_only=True,
            trust_remote_code=config.trust_remote_code,
        )
    else:
        assert config.hf_config is not None  # guaranteed by ModelConfig
        options = dict(config.hf_config)
        hf_config = AutoConfig.for_model(options.pop("model_type"), **options)
    if config.head == "value":
        hf_config.num_labels = 1
        # Token-classification heads default to dropout 0.1; a critic trained with it would
        # see noisy values in every update, unlike the deterministic values it is asked for.
        hf_config.classifier_dropout = 0.0
    return hf_config


def build_hf_model(config: ModelConfig) -> PreTrainedModel:
    """Load (or randomly initialise) the model on the CPU, identically on every rank.

    Random initialisation, of the whole model or only of a new value head, is seeded with
    ``config.seed`` inside a forked RNG, so every rank builds the same weights and the
    caller's RNG stream is left untouched.
    """
    hf_config = load_hf_config(config)
    auto_class = (
        AutoModelForCausalLM if config.head == "causal_lm" else AutoModelForTokenClassification
    )
    dtype = getattr(torch, config.dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        directory = config.local_path()
        if directory is not None:
            model = auto_class.from_pretrained(
                directory,
                config=hf_config,
                dtype=dtype,
                attn_implementation=config.attn_implementation,
                local_files_only=True,
                trust_remote_code=config.trust_remote_code,
            )
        else:
            model = auto_class.from_config(
                hf_config, dtype=dtype, attn_implementation=config.attn_implementation
            )
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"expected a transformers PreTrainedModel, got {type(model).__name__}")
    return model


def build_meta_hf_model(config: ModelConfig) -> PreTrainedModel:
    """The model's structure on the meta device: names, shapes, dtypes and ties, no storage.

    What a per-shard load needs to know about the model without materialising its weights
    (each rank then reads only its own slices from the checkpoint files).
    """
    hf_config = load_hf_config(config)
    auto_class = (
        AutoModelForCausalLM if config.head == "causal_lm" else AutoModelForTokenClassification
    )
    with torch.device("meta"):
        model = auto_class.from_config(
            hf_config,
            dtype=getattr(torch, config.dtype),
            attn_implementation=config.attn_implementation,
            trust_remote_code=config.trust_remote_code,
        )
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"expected a transformers PreTrainedModel, got {type(model).__name__}")
    return model


def transformer_blocks(model: PreTrainedModel) -> list[torch.nn.Module]:
    """The repeated blocks of ``model`` (its ``_no_split_modules`` classes), in order.

    These are the units sharded (and checkpointed) one at a time.
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [module for module in model.modules() if type(module).__name__ in names]
    if not blocks:
        raise ValueError(
            f"{type(model).__name__} declares no transformer block classes "
            "(_no_split_modules); this engine supports decoder models such as Llama and Qwen2"
        )
    return blocks
