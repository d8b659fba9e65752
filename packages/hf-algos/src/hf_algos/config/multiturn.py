"""``rollout.multi_turn``: multi-turn tool-using rollouts (an agent loop per sample).

A section of its own, beside ``rollout`` (:mod:`hf_algos.config.rollout`). The loop is
``hf_rollout.multiturn.run_agent_loop``, run by the rollout worker; the trainer turns this
section into an ``hf_rollout.MultiTurnConfig`` (:mod:`hf_algos.trainers.ppo.multiturn`).

Rewards (``reward``):

* ``function``: the reward function (``data_source`` / ``reward.function_path``) scores the
  decoded WHOLE response, model turns and environment replies in order (as verl does), so it
  can read the conversation; an episode cut short by ``max_turns`` or the token budget ends
  with an environment reply, so parse the final answer after the last one;
* ``environment``: the score is the episode's ``env_reward`` (its steps' rewards summed); the
  reward function is not called (the rows need no scoring function);
* ``both``: their sum.

Either way the score sits on the last MODEL token (``response_mask`` 1), never on an
environment token. An episode that ended with an environment error (``env_error`` set: the
environment raised, timed out or answered malformed output) is scored the same way (its
``env_reward`` is what it earned before the error) and counted in ``multi_turn/env_errors``;
it never stops the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hf_controller import ConfigurationError


@dataclass(frozen=True)
class MultiTurnSection:
    """Multi-turn rollouts: each sample is an episode of model turns and environment replies;
    ``response_mask`` is 1 on model tokens only, so losses, KL and advantages ignore the
    replies. ``rollout.max_new_tokens`` bounds the whole episode's response."""

    enable: bool = False
    """Run the agent loop instead of one response per sample."""
    max_turns: int = 4
    """Most model turns per episode (verl: ``max_assistant_turns``)."""
    max_tokens_per_turn: int | None = None
    """Most tokens of one model turn; ``None``: what is left of ``rollout.max_new_tokens``
    (a model that does not stop after its tool call then spends it all in one turn)."""
    max_tool_response_tokens: int = 64
    """Most tokens of one environment reply; longer ones are cut (verl:
    ``max_tool_response_length``)."""
    environment: str = "tools"
    """A name in ``hf_rollout.multiturn.ENVIRONMENTS`` (``tools``, ``calculator``),
    ``path/to/file.py:Class`` or ``package.module:Class``."""
    tools: tuple[str, ...] = ("calc",)
    """Tools (names in ``hf_rollout.multiturn.TOOLS``) of an environment that takes a
    ``tools`` argument (``tools``); their schemas go to the chat template's ``tools=`` when
    ``data.apply_chat_template`` is on."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Further keyword arguments of the environment class."""
    step_timeout_s: float = 30.0
    """Seconds one environment step may take before its episode ends with an error."""
    prefix_cache_rows: int = 1024
    """Conversations whose KV cache the native rollout keeps between turns, so a turn
    prefills only the new tool reply instead of the whole conversation (vLLM: its prefix
    cache is turned on); dropped at every weight update. ``0``: re-prefill every turn."""
    reward: Literal["function", "environment", "both"] = "function"
    """``function``: the reward function scores the decoded WHOLE response (model turns and
    environment replies, as verl); ``environment``: the episode's summed ``env_reward`` (no
    reward function runs); ``both``: their sum. The score sits on the last model token; an
    episode with an ``env_error`` is scored alike and counted in ``multi_turn/env_errors``."""

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ConfigurationError(
                f"rollout.multi_turn.max_turns={self.max_turns!r} must be >= 1 (model turns "
                "per episode)"
            )
        if self.max_tool_response_tokens < 1:
            raise ConfigurationError(
                f"rollout.multi_turn.max_tool_response_tokens={self.max_tool_response_tokens!r}"
                " must be >= 1"
            )
        if self.max_tokens_per_turn is not None and self.max_tokens_per_turn < 1:
            raise ConfigurationError(
                f"rollout.multi_turn.max_tokens_per_turn={self.max_tokens_per_turn!r} must be "
                ">= 1, or null for the whole remaining budget"
            )
        if self.prefix_cache_rows < 0:
            raise ConfigurationError(
                f"rollout.multi_turn.prefix_cache_rows={self.prefix_cache_rows!r} must be "
                ">= 0 (0 turns prefix reuse off)"
            )
        # Worded as sections.require_positive words it (sections imports this module).
        if self.step_timeout_s <= 0:
            raise ConfigurationError(
                f"rollout.multi_turn.step_timeout_s={self.step_timeout_s!r} must be > 0"
            )
        if self.enable:
            self.environment_kwargs()  # builds one environment: bad names fail now

    def environment_kwargs(self) -> dict[str, Any]:
        """The environment's keyword arguments: ``env_kwargs`` plus ``tools`` when its class
        takes them. Builds one environment to check the spec and the tool names, raising
        :class:`~hf_controller.ConfigurationError` listing the registered ones."""
        from hf_rollout.multiturn import ENVIRONMENTS, TOOLS, environment_factory

        unknown = [name for name in self.tools if name not in TOOLS]
        if unknown:
            raise ConfigurationError(
                f"rollout.multi_turn.tools: unknown tools {unknown}; registered ones are "
                f"{sorted(TOOLS)} (register more with hf_rollout.multiturn.register_tool)"
            )
        kwargs = dict(self.env_kwargs)
        if "tools" not in kwargs and _takes_tools(self.environment):
            kwargs["tools"] = list(self.tools)
        try:
            environment_factory(self.environment, **kwargs)
        except ValueError as error:  # EnvironmentSpecError, or the class refusing its kwargs
            known = sorted(ENVIRONMENTS)
            listed = "" if "registered ones" in str(error) else f" (registered: {known})"
            raise ConfigurationError(
                f"rollout.multi_turn.environment={self.environment!r}: {error}{listed}"
            ) from error
        return kwargs


def _takes_tools(spec: str) -> bool:
    """Whether the environment class of ``spec`` has a ``tools`` parameter (False for a
    spec that names nothing: the factory then reports it)."""
    import inspect

    from hf_rollout.multiturn import ENVIRONMENTS

    cls = ENVIRONMENTS.get(spec)
    if cls is None:
        return False  # a custom class: it gets env_kwargs only
    return "tools" in inspect.signature(cls).parameters


def check_multi_turn(section: MultiTurnSection, async_mode: str, partial: bool) -> None:
    """Multi-turn runs generate and train in turn: refuse the async modes and partial
    rollouts, whose chunked, queued generation the agent loop does not take part in."""
    if not section.enable:
        return
    if partial:
        raise ConfigurationError(
            "rollout.multi_turn.enable=true does not work with rollout.partial=true (a partial "
            "rollout continues single responses in chunks, not episodes); set "
            "rollout.partial=false"
        )
    if async_mode != "off":
        raise ConfigurationError(
            f"rollout.multi_turn.enable=true runs with trainer.async_mode='off' only (got "
            f"{async_mode!r}: the async pipelines are not tested with the agent loop); set "
            "trainer.async_mode=off"
        )
