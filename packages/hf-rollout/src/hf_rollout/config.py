"""Typed configs of a rollout: how to sample (:class:`SamplingConfig`) and which engine
to build (:class:`RolloutConfig`). Both are checked on construction, so a bad value fails
before any model is loaded, with the fix in the message."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from hf_controller import ConfigurationError

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

_C = TypeVar("_C")


def _from_dict(cls: type[_C], values: Mapping[str, Any]) -> _C:
    """Build dataclass ``cls`` from ``values``; unknown keys are an error listing valid ones."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ConfigurationError(
            f"{cls.__name__}: unknown key(s) {unknown}; valid keys are {sorted(names)}"
        )
    return cls(**values)


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample responses for one ``generate`` call."""

    n: int = 1
    """Samples per prompt; the output holds each prompt ``n`` times in a row."""
    temperature: float = 1.0
    """Softmax temperature (> 0). ``0`` is accepted and means greedy."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this much probability."""
    top_k: int = -1
    """Keep only the ``top_k`` most likely tokens; ``-1`` turns it off."""
    max_new_tokens: int = 32
    """Most tokens generated per sample (the eos / stop token included)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a sample (kept in the response, ``response_mask`` 1)."""
    eos_token_id: int | None = None
    """End-of-sequence id; ``None`` takes the model's own (generation config), if any."""
    seed: int | None = None
    """Seed of this call's random draws; ``None`` continues the engine's generator."""
    greedy: bool = False
    """Take the most likely token; temperature / top-p / top-k are then ignored."""

    def __post_init__(self) -> None:
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.n < 1:
            raise ConfigurationError(f"SamplingConfig.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ConfigurationError(
                f"SamplingConfig.temperature must be >= 0, got {self.temperature} "
                "(use greedy=True or temperature=0 for greedy decoding)"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigurationError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ConfigurationError(
                f"SamplingConfig.top_k must be -1 (off) or >= 1, got {self.top_k}"
            )
        if self.max_new_tokens < 1:
            raise ConfigurationError(
                f"SamplingConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}"
            )

    @property
    def is_greedy(self) -> bool:
        """Whether decoding is greedy (``greedy=True`` or ``temperature == 0``)."""
        return self.greedy or self.temperature == 0

    @property
    def effective_temperature(self) -> float:
        """The temperature log-probs are taken at: 1.0 when greedy."""
        return 1.0 if self.is_greedy else float(self.temperature)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SamplingConfig:
        """Build from a dict (e.g. a YAML section); unknown keys are an error.

        Not for requests: a rollout worker takes the :class:`SamplingConfig` object itself
        in ``meta_info["sampling"]``.
        """
        return _from_dict(cls, values)


@dataclass(frozen=True)
class MultiTurnConfig:
    """A multi-turn (agent) rollout: the environment each episode talks to and its limits.

    Set as :attr:`RolloutConfig.multi_turn`, it makes ``RolloutWorker.generate_sequences`` run
    ``hf_rollout.multiturn.run_agent_loop``; the request's ``sampling.max_new_tokens`` bounds
    each episode's whole response (model and environment tokens together).
    """

    tokenizer_path: str
    """Local tokenizer directory: the environment reads the model's text through it, and its
    observations are encoded with it (no special tokens added)."""
    environment: str = "tools"
    """A name in ``hf_rollout.multiturn.ENVIRONMENTS``, ``path/to/file.py:Class`` or
    ``package.module:Class`` (a class registered only in the driver's code does not exist in
    a worker process: name it by module or file)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment class (e.g. ``{"tools": ["calc"]}``)."""
    max_turns: int = 4
    """Most model turns per episode."""
    max_tokens_per_turn: int | None = None
    """Most tokens of one model turn; ``None``: what is left of the episode's budget (a
    model that does not stop after its tool call then spends the budget in one turn)."""
    max_tool_response_tokens: int | None = 64
    """Most tokens of one environment reply (longer ones are cut); ``None``: no cap."""
    step_timeout_s: float = 30.0
    """How long one environment step may take before its episode ends with an error."""
    concurrency: int = 8
    """Most environment steps running at once."""
    trust_remote_code: bool = False
    """Let the tokenizer directory run its own code."""

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ConfigurationError(
                f"MultiTurnConfig.max_turns must be >= 1, got {self.max_turns}"
            )
        if self.max_tokens_per_turn is not None and self.max_tokens_per_turn < 1:
            raise ConfigurationError(
                f"MultiTurnConfig.max_tokens_per_turn must be >= 1 or None, got "
                f"{self.max_tokens_per_turn}"
            )
        limits = {
            "max_tool_response_tokens": self.max_tool_response_tokens or 1,
            "step_timeout_s": self.step_timeout_s,
            "concurrency": self.concurrency,
        }
        bad = {name: value for name, value in limits.items() if not value > 0}
        if bad:
            raise ConfigurationError(f"MultiTurnConfig limits must be positive, got {bad}")


@dataclass
class RolloutConfig:
    """Which rollout engine to build and on what model."""

    backend: str = "native"
    """Engine name, a key of ``hf_rollout.ROLLOUT_BACKENDS`` (native, vllm, sglang)."""
    model_path: str | None = None
    """Local Hugging Face model directory (``from_pretrained``); the trainer resolves a
    model id to its directory in the local Hugging Face cache before building this."""
    trust_remote_code: bool = False
    """Let a model directory run its own code (``auto_map`` in its ``config.json``)."""
    model_config: dict[str, Any] | None = None
    """A transformers config dict (with ``model_type``) for a randomly initialised model;
    weights usually arrive later through ``update_weights``."""
    dtype: str = "float32"
    """Weights and compute dtype: float32, bfloat16 or float16."""
    max_model_len: int = 2048
    """Longest prompt + response, in tokens; longer prompts are refused."""
    pad_token_id: int | None = None
    """Pad id of prompts and responses; ``None`` takes the model's pad (else eos, else 0)."""
    seed: int = 0
    """Seed of the engine's random generator (and of a random model initialisation)."""
    device: str | None = None
    """Torch device; ``None`` picks ``cuda`` when available, else ``cpu``."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Backend-specific options, passed through to the backend (see its docstring)."""
    prefix_cache_rows: int = 0
    """Prefix reuse for multi-turn episodes: the native engine keeps the KV cache of this
    many recently generated sequences, and a prompt that extends one prefills only its new
    tokens; vLLM gets ``enable_prefix_caching=True`` (its own block cache, sized by its
    memory); SGLang's radix cache is always on. ``0`` turns it off. Every backend drops its
    cached prefixes at a weight update (they belong to the old weights)."""
    multi_turn: MultiTurnConfig | None = None
    """Run multi-turn episodes against an environment (a dict of its fields is accepted);
    ``None``: one response per sample."""

    def __post_init__(self) -> None:
        if isinstance(self.multi_turn, Mapping):
            self.multi_turn = _from_dict(MultiTurnConfig, self.multi_turn)
        if (self.model_path is None) == (self.model_config is None):
            raise ConfigurationError(
                "RolloutConfig needs exactly one of model_path (a local HF directory) or "
                f"model_config (a config dict); got model_path={self.model_path!r}, "
                f"model_config={'set' if self.model_config is not None else None}"
            )
        if self.model_config is not None and "model_type" not in self.model_config:
            raise ConfigurationError(
                "RolloutConfig.model_config needs a 'model_type' key (e.g. 'qwen2'); got keys "
                f"{sorted(self.model_config)}"
            )
        if self.dtype not in _DTYPES:
            raise ConfigurationError(
                f"RolloutConfig.dtype {self.dtype!r} is not supported; "
                f"choose from {sorted(_DTYPES)}"
            )
        if self.prefix_cache_rows < 0:
            raise ConfigurationError(
                f"RolloutConfig.prefix_cache_rows must be >= 0 (0 turns prefix reuse off), "
                f"got {self.prefix_cache_rows}"
            )
        if self.max_model_len < 2:
            raise ConfigurationError(
                f"RolloutConfig.max_model_len must be >= 2, got {self.max_model_len}"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        """:attr:`dtype` as a ``torch.dtype``."""
        return _DTYPES[self.dtype]

    def resolve_device(self) -> torch.device:
        """:attr:`device`, or ``cuda`` when available, else ``cpu``."""
        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RolloutConfig:
        """Build from a dict (e.g. a recipe's YAML section); unknown keys are an error."""
        return _from_dict(cls, values)
