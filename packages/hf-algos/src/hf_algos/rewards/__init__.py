"""Rewards: rule-based scoring by ``data_source`` in worker processes, and reward models."""

from hf_algos.rewards.gsm8k import compute_gsm8k_score, extract_gsm8k_answer
from hf_algos.rewards.manager import RewardManager, RewardManagerConfig
from hf_algos.rewards.math_boxed import (
    compute_math_score,
    last_boxed_content,
    math_answers_equal,
    normalize_math_answer,
)
from hf_algos.rewards.placement import last_token_index, place_on_last_token
from hf_algos.rewards.pool import RewardError
from hf_algos.rewards.registry import (
    SCORING_FUNCTIONS,
    BatchedScoringFunction,
    ScoreFn,
    get_scoring_function,
    register_scoring_function,
)
from hf_algos.rewards.reward_model import RewardModelScorer
from hf_algos.rewards.signature import ACCEPTED_FORMS, ScoringCall, scoring_call

__all__ = [
    "ACCEPTED_FORMS",
    "SCORING_FUNCTIONS",
    "BatchedScoringFunction",
    "RewardError",
    "RewardManager",
    "RewardManagerConfig",
    "RewardModelScorer",
    "ScoreFn",
    "ScoringCall",
    "compute_gsm8k_score",
    "compute_math_score",
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
