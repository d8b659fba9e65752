"""The agent loop: model turns and environment replies, batched across episodes.

Each turn is one batched ``engine.generate`` call over the episodes still running, with
prompt + conversation so far as the new prompt (raw token lists, left-padded by the engine).
The per-episode Python work is per turn (decode, ``env.step``, encode), not per token.

Environment calls of one turn run concurrently (``AgentLoopConfig.concurrency`` threads,
``parallel.py``), each under ``step_timeout_s``. An environment that raises, hangs past its
timeout or answers something that is not a :class:`StepResult` ends *that* episode with
``env_error`` set (environment class, row, turn, cause); the others go on and every row is
in the output. A hung call's thread cannot be killed: the episode is abandoned and the
thread (a daemon) is left to finish on its own.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from hf_protocol import DataProto, fields, right_pad
from hf_rollout.base import RolloutEngine, build_rollout_output, read_prompts
from hf_rollout.config import SamplingConfig
from hf_rollout.multiturn.environment import Environment, StepResult
from hf_rollout.multiturn.parallel import CallOutcome, call_concurrently

logger = logging.getLogger(__name__)


@runtime_checkable
class TextCodec(Protocol):
    """Text <-> token ids (a tokenizer; wrap a transformers one to fix special tokens)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``."""
        ...


@dataclass(frozen=True)
class AgentLoopConfig:
    """Limits of one multi-turn episode."""

    max_turns: int = 4
    """Most model turns per episode."""
    max_response_tokens: int = 256
    """Most response tokens per episode, model and environment tokens together."""
    max_tool_response_tokens: int | None = None
    """Most tokens of one environment observation (longer ones are cut); None: no cap."""
    step_timeout_s: float = 30.0
    """How long one environment ``reset`` or ``step`` may take before its episode ends with
    an error (``env_error``); the hung call's thread is abandoned, not killed."""
    concurrency: int = 8
    """Most environment calls running at once (the episodes of one turn step concurrently,
    on this many threads)."""

    def __post_init__(self) -> None:
        limits = {
            "max_turns": self.max_turns,
            "max_response_tokens": self.max_response_tokens,
            "max_tool_response_tokens": self.max_tool_response_tokens or 1,
            "step_timeout_s": self.step_timeout_s,
            "concurrency": self.concurrency,
        }
        bad = {name: value for name, value in limits.items() if not value > 0}
        if bad:
            raise ValueError(f"AgentLoopConfig limits must be positive, got {bad}")


@dataclass
class _Episode:
    prompt: list[int]
    row: int
    index: int
    """Sampling index: the prompt's ``prompt_index`` (else its row) times ``n``, plus the
    sample; each turn seeds the episode's stream from it."""
    env: Environment | None = None
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    turns: int = 0
    done: bool = False
    reward: float = 0.0
    tool_calls: int = 0
    error: str = ""

    def append(self, tokens: list[int], log_probs: list[float] | None) -> None:
        self.tokens += tokens
        self.mask += [1 if log_probs is not None else 0] * len(tokens)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(tokens)

    def fail(self, env_name: str, call: str, turn: int, cause: str) -> None:
        """End the episode with an error naming the environment, row, turn and cause."""
        self.error = f"{env_name}.{call} failed on row {self.row}, turn {turn}: {cause}"
        self.done = True
        logger.warning("multi-turn episode ended: %s", self.error)


def run_agent_loop(
    engine: RolloutEngine,
    prompts: DataProto,
    make_env: Callable[[], Environment],
    codec: TextCodec,
    sampling: SamplingConfig,
    config: AgentLoopConfig,
    pad_token_id: int | None = None,
) -> DataProto:
    """Multi-turn rollouts of ``sampling.n`` episodes per prompt, each with its own env.

    Returns the fields of ``hf_rollout.build_rollout_output``: ``responses`` hold model and
    environment tokens in order, ``response_mask`` is 1 on model tokens and 0 on environment
    tokens (whose ``rollout_log_probs`` are 0), and the joined ``attention_mask`` covers
    both. The reply to the turn that ends an episode (``done``) is not appended: nothing
    would follow it. ``non_tensor_batch["num_turns"]`` counts model turns, ``tool_calls``
    the environment's tool calls, ``env_reward`` the sum of its rewards and ``env_error``
    why an environment failed (``""`` when it did not; see the module docstring). The
    environment's ``reset`` gets ``non_tensor_batch["raw_prompt"]`` when present, else the
    decoded prompt.
    """
    pad = pad_token_id if pad_token_id is not None else int(getattr(engine, "pad_token_id", 0))
    prompt_tensors = read_prompts(prompts, pad)
    input_ids, attention_mask, _ = prompt_tensors
    texts = prompts.non_tensor_batch.get(fields.RAW_PROMPT)
    episodes: list[_Episode] = []
    starts: list[tuple[str, dict[str, Any]]] = []
    indices = list(range(input_ids.shape[0]))
    if prompts.batch is not None and fields.PROMPT_INDEX in prompts.batch:
        indices = prompts.batch[fields.PROMPT_INDEX].tolist()
    for row in range(input_ids.shape[0]):
        ids = input_ids[row][attention_mask[row].bool()].tolist()
        text = str(texts[row]) if texts is not None else codec.decode(ids)
        for sample in range(sampling.n):
            index = int(indices[row]) * sampling.n + sample
            episodes.append(_Episode(prompt=ids, row=len(episodes), index=index))
            starts.append((text, episode_info(prompts, row)))
    _start_episodes(episodes, starts, make_env, config)
    turn_sampling = dataclasses.replace(sampling, n=1)
    for turn in range(config.max_turns):
        running = [episode for episode in episodes if not episode.done]
        if not running:
            break
        seed = None if sampling.seed is None else sampling.seed + turn
        room = max(config.max_response_tokens - len(e.tokens) for e in running)
        turn_sampling = dataclasses.replace(
            turn_sampling, seed=seed, max_new_tokens=min(sampling.max_new_tokens, room)
        )
        batch = DataProto.from_dict(
            tensors={fields.PROMPT_INDEX: torch.tensor([e.index for e in running])},
            non_tensors={fields.RAW_PROMPT_IDS: _as_object([e.prompt + e.tokens for e in running])},
        )
        out = engine.generate(batch, turn_sampling)
        assert out.batch is not None
        texts_out = [
            _append_model_turn(e, out, index, codec, config) for index, e in enumerate(running)
        ]
        steps = [_step_call(e.env, text) for e, text in zip(running, texts_out, strict=True)]
        outcomes = call_concurrently(steps, config.concurrency, config.step_timeout_s)
        for episode, outcome in zip(running, outcomes, strict=True):
            _take_reply(episode, outcome, codec, config, turn)
    return _episodes_to_output(prompts, prompt_tensors, episodes, sampling, pad)


def _as_object(lists: list[list[int]]) -> np.ndarray:
    array = np.empty(len(lists), dtype=object)
    array[:] = lists
    return array


def _start_episodes(
    episodes: list[_Episode],
    starts: list[tuple[str, dict[str, Any]]],
    make_env: Callable[[], Environment],
    config: AgentLoopConfig,
) -> None:
    """Build and reset every episode's environment, concurrently; failures end episodes."""

    def start(episode: _Episode, text: str, info: dict[str, Any]) -> Callable[[], None]:
        def call() -> None:
            episode.env = make_env()
            episode.env.reset(text, info)

        return call

    calls = [start(e, text, info) for e, (text, info) in zip(episodes, starts, strict=True)]
    outcomes = call_concurrently(calls, config.concurrency, config.step_timeout_s)
    for episode, outcome in zip(episodes, outcomes, strict=True):
        cause = _failure(outcome, config)
        if cause:
            built = episode.env is not None
            name = type(episode.env).__name__ if built else getattr(make_env, "__name__", "?")
            episode.fail(name, "reset" if built else "__init__", 0, cause)


def _step_call(env: Environment | None, text: str) -> Callable[[], Any]:
    assert env is not None  # a running episode's environment was built
    return lambda: env.step(text)


def _failure(outcome: CallOutcome, config: AgentLoopConfig) -> str:
    """Why an environment call failed (``""``: it did not)."""
    if outcome.timed_out:
        return (
            f"timed out after {config.step_timeout_s} s (the episode is abandoned; the call's "
            "thread is left to finish)"
        )
    if outcome.error is not None:
        return f"{type(outcome.error).__name__}: {outcome.error}"
    return ""


def _malformed(result: Any) -> str:
    """Why ``result`` is not a usable :class:`StepResult` (``""``: it is)."""
    if not isinstance(result, StepResult):
        return f"returned {type(result).__name__}, expected StepResult"
    expected: dict[str, type | tuple[type, ...]] = {
        "observation": str,
        "reward": (int, float),
        "done": int,  # bool is an int
        "tool_calls": int,
    }
    for name, kinds in expected.items():
        if not isinstance(getattr(result, name), kinds):
            kind = type(getattr(result, name)).__name__
            return f"returned a StepResult whose {name} is {kind}"
    if not math.isfinite(result.reward) or result.tool_calls < 0:
        return f"returned reward {result.reward} / tool_calls {result.tool_calls}"
    return ""


def _append_model_turn(
    episode: _Episode, out: DataProto, index: int, codec: TextCodec, config: AgentLoopConfig
) -> str:
    """Append one model turn of ``episode`` (cut to the token budget); its decoded text."""
    assert out.batch is not None
    keep = out.batch[fields.RESPONSE_MASK][index].bool()
    room = config.max_response_tokens - len(episode.tokens)
    tokens = out.batch[fields.RESPONSES][index][keep].tolist()[:room]
    log_probs = out.batch[fields.ROLLOUT_LOG_PROBS][index][keep].tolist()[:room]
    episode.append(tokens, log_probs)
    episode.turns += 1
    return codec.decode(tokens)


def _take_reply(
    episode: _Episode, outcome: CallOutcome, codec: TextCodec, config: AgentLoopConfig, turn: int
) -> None:
    """Apply the environment's reply to the turn: reward, observation, done or error."""
    name = type(episode.env).__name__
    cause = _failure(outcome, config) or _malformed(outcome.value)
    if cause:
        episode.fail(name, "step", turn + 1, cause)
        return
    result: StepResult = outcome.value
    episode.reward += result.reward
    episode.tool_calls += result.tool_calls
    room = config.max_response_tokens - len(episode.tokens)
    if not result.done and result.observation:
        observation = codec.encode(result.observation)[: config.max_tool_response_tokens]
        episode.append(observation[:room], None)
        room = config.max_response_tokens - len(episode.tokens)
    episode.done = result.done or room <= 0 or turn + 1 >= config.max_turns


def _episodes_to_output(
    prompts: DataProto,
    prompt_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    episodes: list[_Episode],
    sampling: SamplingConfig,
    pad: int,
) -> DataProto:
    responses, present = right_pad([e.tokens for e in episodes], pad, dtype=torch.int64)
    mask, _ = right_pad([e.mask for e in episodes], 0, dtype=torch.int64)
    log_probs, _ = right_pad([e.log_probs for e in episodes], 0.0, dtype=torch.float32)
    output = build_rollout_output(
        prompts, prompt_tensors, responses, mask, log_probs, sampling.n,
        sampling.effective_temperature, pad, response_attention_mask=present,
    )  # fmt: skip
    columns = output.non_tensor_batch
    columns[fields.NUM_TURNS] = np.array([e.turns for e in episodes], dtype=np.int64)
    columns[fields.TOOL_CALLS] = np.array([e.tool_calls for e in episodes], dtype=np.int64)
    columns[fields.ENV_REWARD] = np.array([e.reward for e in episodes], dtype=np.float64)
    columns[fields.ENV_ERROR] = np.array([e.error for e in episodes], dtype=object)
    return output


def episode_info(prompts: DataProto, row: int) -> dict[str, Any]:
    """What an environment's ``reset`` gets for ``row``: its ``data_source``,
    ``ground_truth`` (from ``reward_model``) and ``extra_info``, where the batch has them."""
    columns = prompts.non_tensor_batch
    info: dict[str, Any] = {}
    if fields.DATA_SOURCE in columns:
        info["data_source"] = columns[fields.DATA_SOURCE][row]
    reward_model = columns.get(fields.REWARD_MODEL)
    if reward_model is not None and isinstance(reward_model[row], dict):
        info["ground_truth"] = reward_model[row].get("ground_truth")
    if fields.EXTRA_INFO in columns:
        info["extra_info"] = columns[fields.EXTRA_INFO][row]
    return info
