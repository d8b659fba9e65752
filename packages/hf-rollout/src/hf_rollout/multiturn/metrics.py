"""Metrics of a multi-turn rollout, from the columns :func:`run_agent_loop` writes."""

from __future__ import annotations

import numpy as np

from hf_protocol import DataProto, fields

__all__ = ["multi_turn_metrics"]

_COLUMNS = (fields.NUM_TURNS, fields.TOOL_CALLS, fields.ENV_REWARD, fields.ENV_ERROR)


_NAMES = (
    "multi_turn/num_turns/mean",
    "multi_turn/num_turns/max",
    "multi_turn/tool_calls/mean",
    "multi_turn/tool_call_rate",
    "multi_turn/env_errors",
    "multi_turn/env_reward/mean",
    "multi_turn/env_tokens/mean",
)


def multi_turn_metrics(output: DataProto) -> dict[str, float]:
    """Per-batch means and counts of a multi-turn rollout's episodes.

    ``multi_turn/num_turns/mean`` and ``/max`` (model turns), ``multi_turn/tool_calls/mean``,
    ``multi_turn/tool_call_rate`` (fraction of episodes with at least one tool call),
    ``multi_turn/env_errors`` (episodes an environment failure ended),
    ``multi_turn/env_reward/mean`` and ``multi_turn/env_tokens/mean`` (environment tokens
    per episode: attended response tokens with ``response_mask`` 0). Reads the
    ``non_tensor_batch`` columns ``num_turns``, ``tool_calls``, ``env_reward`` and
    ``env_error`` (each ``(B,)``) and the ``responses`` / ``attention_mask`` /
    ``response_mask`` tensors; an empty batch gives zeros.
    """
    columns = output.non_tensor_batch
    missing = [name for name in _COLUMNS if name not in columns]
    if missing:
        raise KeyError(
            f"multi_turn_metrics needs the columns {missing} that run_agent_loop writes; "
            f"the batch has {sorted(columns)}: pass the agent loop's output"
        )
    turns = np.asarray(columns[fields.NUM_TURNS], dtype=np.float64)
    if len(turns) == 0:
        return dict.fromkeys(_NAMES, 0.0)
    calls = np.asarray(columns[fields.TOOL_CALLS], dtype=np.float64)
    rewards = np.asarray(columns[fields.ENV_REWARD], dtype=np.float64)
    errors = [str(error) for error in columns[fields.ENV_ERROR]]
    env_tokens = 0.0
    if output.batch is not None and fields.RESPONSES in output.batch:
        width = output.batch[fields.RESPONSES].shape[1]
        attended = output.batch[fields.ATTENTION_MASK][:, -width:]
        outside = (attended - output.batch[fields.RESPONSE_MASK]).clamp(min=0)
        env_tokens = float(outside.sum(-1).float().mean())
    return {
        "multi_turn/num_turns/mean": float(turns.mean()),
        "multi_turn/num_turns/max": float(turns.max()),
        "multi_turn/tool_calls/mean": float(calls.mean()),
        "multi_turn/tool_call_rate": float((calls >= 1).mean()),
        "multi_turn/env_errors": float(sum(1 for error in errors if error)),
        "multi_turn/env_reward/mean": float(rewards.mean()),
        "multi_turn/env_tokens/mean": env_tokens,
    }
