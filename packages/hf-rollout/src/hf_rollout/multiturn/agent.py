"""The rollout worker's multi-turn path: a tokenizer as the agent loop's codec, and the
environment factory and limits of :class:`~hf_rollout.config.MultiTurnConfig`.

Token-in-token-out: the ids the engine sampled go into the training sequence as they are;
only environment replies are encoded (``add_special_tokens=False``), and the model's text
is decoded once per turn for the environment to read, never re-encoded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from hf_protocol import DataProto
from hf_rollout.base import RolloutEngine
from hf_rollout.config import MultiTurnConfig, SamplingConfig
from hf_rollout.multiturn.environment import Environment, environment_factory
from hf_rollout.multiturn.loop import AgentLoopConfig, run_agent_loop

__all__ = ["AgentRollout", "TokenizerCodec"]


class TokenizerCodec:
    """A transformers tokenizer as the agent loop's ``TextCodec``: ``encode`` adds no
    special tokens (an observation is spliced into the middle of a sequence, where a BOS
    would not be), ``decode`` drops them (the environment reads the model's text without
    its EOS)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_path(cls, path: str, trust_remote_code: bool = False) -> TokenizerCodec:
        """The codec of the tokenizer saved in the local directory ``path``."""
        from transformers import AutoTokenizer

        return cls(
            AutoTokenizer.from_pretrained(
                path, local_files_only=True, trust_remote_code=trust_remote_code
            )
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens."""
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens dropped."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))


class AgentRollout:
    """Multi-turn generation as :class:`MultiTurnConfig` says, for one rollout worker.

    Built once per worker (:meth:`from_config` loads the tokenizer and checks the
    environment spec by building one environment); :meth:`generate` runs one batch of
    episodes, ``sampling.n`` per prompt.
    """

    def __init__(
        self, config: MultiTurnConfig, make_env: Callable[[], Environment], codec: Any
    ) -> None:
        self.config = config
        self.make_env = make_env
        self.codec = codec

    @classmethod
    def from_config(cls, config: MultiTurnConfig) -> AgentRollout:
        """The environment factory and tokenizer codec of ``config``."""
        make_env = environment_factory(config.environment, **config.env_kwargs)
        codec = TokenizerCodec.from_path(config.tokenizer_path, config.trust_remote_code)
        return cls(config, make_env, codec)

    def generate(
        self, engine: RolloutEngine, prompts: DataProto, sampling: SamplingConfig, pad: int
    ) -> DataProto:
        """Episodes for ``prompts``; ``sampling.max_new_tokens`` bounds each whole response
        (model and environment tokens), ``config.max_tokens_per_turn`` each model turn.
        Returns ``run_agent_loop``'s output: the rollout fields with ``response_mask`` 0 on
        environment tokens, and the columns ``num_turns``, ``tool_calls``, ``env_reward``,
        ``env_error``."""
        limits = AgentLoopConfig(
            max_turns=self.config.max_turns,
            max_response_tokens=sampling.max_new_tokens,
            max_tool_response_tokens=self.config.max_tool_response_tokens,
            step_timeout_s=self.config.step_timeout_s,
            concurrency=self.config.concurrency,
        )
        per_turn = self.config.max_tokens_per_turn
        if per_turn is not None:  # the loop caps a turn at sampling's max_new_tokens
            sampling = dataclasses.replace(
                sampling, max_new_tokens=min(per_turn, sampling.max_new_tokens)
            )
        return run_agent_loop(engine, prompts, self.make_env, self.codec, sampling, limits, pad)
