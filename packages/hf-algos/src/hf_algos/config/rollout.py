"""``rollout``: generation, its backend and sampling (the weights come from the actor).

Multi-turn episodes are configured by ``rollout.multi_turn``
(:mod:`hf_algos.config.multiturn`).

Each section checks its own values in ``__post_init__``; checks that need several
sections are in :mod:`hf_algos.config.cross_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hf_algos.config.multiturn import MultiTurnSection
from hf_algos.config.values import require_positive
from hf_controller import ConfigurationError


@dataclass(frozen=True)
class RolloutSection:
    """Generation: backend and sampling; the weights come from the actor."""

    backend: str = "native"
    """Rollout backend name in ``hf_rollout.ROLLOUT_BACKENDS`` (native, vllm, sglang)."""
    n: int = 1
    """Responses sampled per prompt (the group size of GRPO / RLOO)."""
    temperature: float = 1.0
    """Sampling temperature (also used to recompute log-probs)."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 disables it."""
    top_k: int = -1
    """Top-k sampling; -1 disables it."""
    max_new_tokens: int = 32
    """Longest response, in tokens."""
    stop: tuple[str, ...] = ()
    """Strings that end a response (vLLM's ``stop``), besides the eos: a response ends with
    the first token whose text contains one of them (that token is kept). For base models
    answering a raw or few-shot prompt, e.g. ``["\\n"]`` stops at the end of the answer line.
    Every backend gets them as token ids (:func:`hf_algos.trainers.roles.sampling.
    stop_token_ids`); a string no token contains is refused."""
    max_model_len: int = 2048
    """Longest prompt + response the backend must hold."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    """Weights and compute dtype of the rollout engine; ``None``: the actor's
    ``model.dtype``, or with ``actor.engine.fsdp.param_dtype=auto`` what that resolves to.
    ``auto``: ``bfloat16`` on a CPU with AMX or AVX512_BF16 or a GPU with native bf16, when
    the checkpoint is bf16 or fp32, else ``float32`` (one log line says which and why).
    vLLM on a GPU wants ``bfloat16`` while the actor keeps fp32 master weights (verl's
    ``rollout.dtype``); pushed weights are cast on load."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Backend-specific options, passed through."""
    partial: bool = False
    """``trainer.async_mode=fully_async``: generate in chunks of ``partial_chunk_tokens``, going
    on with the newest weights after a push; ``false``: a generation ends on its weights."""
    partial_chunk_tokens: int = 16
    """``partial=true``: new tokens per generation chunk."""
    multi_turn: MultiTurnSection = field(default_factory=MultiTurnSection)
    """Multi-turn tool use: episodes against an environment (off by default)."""
    max_replacements: int = 2
    """``trainer.placement=separate``: how many times in a run a rollout group whose worker
    died or missed its call deadline is replaced by a new one (given the actor's current
    weights; the prompts it held are generated again), or a weight push that failed with
    every process alive is pushed again over a reopened channel (the two counted
    together). Past it, the worker's error ends the run as before; 0 never recovers."""

    def __post_init__(self) -> None:
        require_positive("rollout.max_replacements", self.max_replacements, allow_zero=True)
        require_positive("rollout.partial_chunk_tokens", self.partial_chunk_tokens)
        require_positive("rollout.n", self.n)
        require_positive("rollout.temperature", self.temperature)
        require_positive("rollout.max_new_tokens", self.max_new_tokens)
        if isinstance(self.stop, str) or any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigurationError(
                f"rollout.stop={self.stop!r} must be a list of non-empty strings, e.g. ['\\n']"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigurationError(f"rollout.top_p={self.top_p!r} must be in (0, 1]")
