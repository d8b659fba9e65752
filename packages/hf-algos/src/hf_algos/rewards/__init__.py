"""Rewards: rule-based scoring by ``data_source`` in worker processes, and reward models.

Public names are imported on first use (``hf_algos._lazy``), so importing one light
submodule does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_algos._lazy import lazy_exports

if TYPE_CHECKING:
    from hf_algos.rewards.gsm8k import compute_gsm8k_score, extract_gsm8k_answer
    from hf_algos.rewards.manager import RewardManager, RewardManagerConfig
    from hf_algos.rewards.math_boxed import (
        compute_math_score,
        last_boxed_content,
        math_answers_equal,
        normalize_math_answer,
    )
    from hf_algos.rewards.pool import RewardError
    from hf_algos.rewards.reasoning_gym import (
        ANSWER_FORMATS,
        compute_reasoning_gym_score,
        extract_answer,
    )
    from hf_algos.rewards.registry import (
        SCORING_FUNCTIONS,
        BatchedScoringFunction,
        ScoreFn,
        get_scoring_function,
        register_scoring_function,
    )
    from hf_algos.rewards.reward_model import RewardModelScorer
    from hf_algos.rewards.signature import ACCEPTED_FORMS, ScoringCall, scoring_call
    from hf_algos.rewards.token_scores import last_token_index, place_on_last_token
    from hf_algos.rewards.weighted import WeightedRewardFunctions

_WHERE = {
    "ACCEPTED_FORMS": "hf_algos.rewards.signature",
    "ANSWER_FORMATS": "hf_algos.rewards.reasoning_gym",
    "BatchedScoringFunction": "hf_algos.rewards.registry",
    "RewardError": "hf_algos.rewards.pool",
    "RewardManager": "hf_algos.rewards.manager",
    "RewardManagerConfig": "hf_algos.rewards.manager",
    "RewardModelScorer": "hf_algos.rewards.reward_model",
    "SCORING_FUNCTIONS": "hf_algos.rewards.registry",
    "ScoreFn": "hf_algos.rewards.registry",
    "ScoringCall": "hf_algos.rewards.signature",
    "WeightedRewardFunctions": "hf_algos.rewards.weighted",
    "compute_gsm8k_score": "hf_algos.rewards.gsm8k",
    "compute_math_score": "hf_algos.rewards.math_boxed",
    "compute_reasoning_gym_score": "hf_algos.rewards.reasoning_gym",
    "extract_answer": "hf_algos.rewards.reasoning_gym",
    "extract_gsm8k_answer": "hf_algos.rewards.gsm8k",
    "get_scoring_function": "hf_algos.rewards.registry",
    "last_boxed_content": "hf_algos.rewards.math_boxed",
    "last_token_index": "hf_algos.rewards.token_scores",
    "math_answers_equal": "hf_algos.rewards.math_boxed",
    "normalize_math_answer": "hf_algos.rewards.math_boxed",
    "place_on_last_token": "hf_algos.rewards.token_scores",
    "register_scoring_function": "hf_algos.rewards.registry",
    "scoring_call": "hf_algos.rewards.signature",
}

__all__ = [
    "ACCEPTED_FORMS",
    "ANSWER_FORMATS",
    "SCORING_FUNCTIONS",
    "BatchedScoringFunction",
    "RewardError",
    "RewardManager",
    "RewardManagerConfig",
    "RewardModelScorer",
    "ScoreFn",
    "ScoringCall",
    "WeightedRewardFunctions",
    "compute_gsm8k_score",
    "compute_math_score",
    "compute_reasoning_gym_score",
    "extract_answer",
    "extract_gsm8k_answer",
    "get_scoring_function",
    "last_boxed_content",
    "last_token_index",
    "math_answers_equal",
    "normalize_math_answer",
    "place_on_last_token",
    "register_scoring_function",
    "scoring_call",
]
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
