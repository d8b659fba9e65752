"""The trainer side of multi-turn rollouts (``rollout.multi_turn``): the rollout workers'
config, tool schemas for the chat template, episode scoring and the ``multi_turn/*`` metrics.

Scoring follows ``rollout.multi_turn.reward`` (see :mod:`hf_algos.config.multiturn`): the
score lands on each row's last model token, and an episode with an ``env_error`` is scored
like any other and counted, never raised.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from hf_algos.config.data import DataSection
from hf_algos.config.keywords import build_from
from hf_algos.config.multiturn import MultiTurnSection
from hf_algos.rewards.token_scores import place_on_last_token
from hf_algos.trainers.roles.protocols import RewardScorer
from hf_controller import ConfigurationError
from hf_protocol import DataProto, fields
from hf_rollout import MultiTurnConfig
from hf_rollout.multiturn import multi_turn_metrics

Metrics = dict[str, float]
RewardMode = Literal["function", "environment", "both"]


def rollout_multi_turn(
    section: MultiTurnSection, tokenizer: PreTrainedTokenizerBase, trust_remote_code: bool
) -> MultiTurnConfig | None:
    """The rollout workers' :class:`hf_rollout.MultiTurnConfig` of ``section`` (``None`` when
    off), reading text with the run's ``tokenizer`` (loaded again from its directory)."""
    if not section.enable:
        return None
    return build_from(
        MultiTurnConfig,
        section,  # max_turns, max_tokens_per_turn, ...: the section's own names
        tokenizer_path=str(tokenizer.name_or_path),
        environment=worker_environment_spec(section.environment),
        env_kwargs=section.environment_kwargs(),
        trust_remote_code=trust_remote_code,
    )


def worker_environment_spec(spec: str) -> str:
    """``spec`` as a rollout worker process can load it: a name registered by hf-rollout
    itself stays a name; one registered by other code becomes ``module:Class`` (the worker
    has not run that code's registration)."""
    from hf_rollout.multiturn import ENVIRONMENTS

    cls = ENVIRONMENTS.get(spec)
    if cls is None or cls.__module__.split(".")[0] == "hf_rollout":
        return spec
    if cls.__module__ == "__main__":
        raise ConfigurationError(
            f"rollout.multi_turn.environment={spec!r} is registered by the script itself "
            f"(__main__), which rollout worker processes cannot import; name its file "
            f"instead: 'path/to/script.py:{cls.__qualname__}'"
        )
    return f"{cls.__module__}:{cls.__qualname__}"


def data_with_tools(data: DataSection, section: MultiTurnSection) -> DataSection:
    """``data`` with the tools' schemas in ``chat_template_kwargs["tools"]`` (unless set
    there already) when multi-turn and the chat template are on and the environment takes
    tools: the chat template then tells the model about them."""
    from hf_rollout.multiturn import tool_schemas

    kwargs = dict(data.chat_template_kwargs)
    if not (section.enable and data.may_use_chat_template) or "tools" in kwargs:
        return data
    tools = section.environment_kwargs().get("tools")
    if not tools:
        return data
    kwargs["tools"] = tool_schemas(list(tools))
    return dataclasses.replace(data, chat_template_kwargs=kwargs)


def combine_episode_scores(
    function_scores: torch.Tensor, env_reward: torch.Tensor, mode: RewardMode
) -> torch.Tensor:
    """Each episode's score under ``rollout.multi_turn.reward``.

    Shape: function_scores ``(B,)``, env_reward ``(B,)`` -> ``(B,)`` float32.
    """
    if mode == "function":
        return function_scores.float()
    if mode == "environment":
        return env_reward.float()
    return function_scores.float() + env_reward.float()


def whole_response_view(batch: DataProto) -> DataProto:
    """``batch`` with ``response_mask`` set to the response part of ``attention_mask``
    (model AND environment tokens), so a reward function decodes the whole conversation;
    the other tensors are shared, not copied."""
    assert batch.batch is not None
    width = batch.batch[fields.RESPONSES].shape[1]
    tensors: dict[str, torch.Tensor] = {str(k): batch.batch[k] for k in batch.batch.keys()}  # noqa: SIM118
    tensors[fields.RESPONSE_MASK] = batch.batch[fields.ATTENTION_MASK][:, -width:]
    return DataProto.from_dict(tensors, dict(batch.non_tensor_batch), dict(batch.meta_info))


class MultiTurnScorer:
    """Scores multi-turn episodes: the wrapped scorer (reward function or reward model) on
    the whole response, the environment's ``env_reward``, or their sum, placed on the last
    model token; its ``meta_info["metrics"]`` adds :func:`episode_metrics`."""

    def __init__(self, inner: RewardScorer | None, mode: RewardMode) -> None:
        if inner is None and mode != "environment":
            raise ValueError(f"rollout.multi_turn.reward={mode!r} needs a reward scorer")
        self.inner, self.mode = inner, mode

    def score(self, batch: DataProto) -> DataProto:
        """``token_level_scores`` ``(B, R)`` to union into ``batch``, with the metrics."""
        assert batch.batch is not None
        mask = batch.batch[fields.RESPONSE_MASK]
        rows = mask.shape[0]
        env_reward = torch.as_tensor(
            np.asarray(batch.non_tensor_batch.get(fields.ENV_REWARD, np.zeros(rows)), float)
        )
        if self.inner is not None and self.mode != "environment":
            scored = self.inner.score(whole_response_view(batch))
            assert scored.batch is not None
            function_scores = scored.batch[fields.TOKEN_LEVEL_SCORES].sum(-1)
            non_tensors, meta = scored.non_tensor_batch, dict(scored.meta_info)
        else:
            function_scores, non_tensors, meta = torch.zeros(rows), {}, {}
        scores = combine_episode_scores(function_scores, env_reward, self.mode)
        meta[fields.METRICS] = {**meta.get(fields.METRICS, {}), **episode_metrics(batch)}
        return DataProto.from_dict(
            {fields.TOKEN_LEVEL_SCORES: place_on_last_token(scores, mask)}, non_tensors, meta
        )

    def close(self) -> None:
        """Close the wrapped scorer."""
        if self.inner is not None:
            self.inner.close()


def episode_metrics(batch: DataProto) -> Metrics:
    """``multi_turn/*`` of a generated batch (``hf_rollout.multiturn.multi_turn_metrics``);
    empty for a batch that is not multi-turn."""
    if fields.NUM_TURNS not in batch.non_tensor_batch or len(batch) == 0:
        return {}
    return multi_turn_metrics(batch)
