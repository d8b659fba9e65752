"""How a trainer samples: each step's seed and the sampling settings the rollout receives."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from hf_algos.config.keywords import build_from
from hf_algos.config.rollout import RolloutSection
from hf_rollout import SamplingConfig


def step_seed(seed: int, step: int, draw: int = 0) -> int:
    """The sampling seed of ``step``'s ``draw``-th generation in a run seeded ``seed``
    (``trainer.seed``): fixed by the step, so a resumed or restarted run samples the same
    responses, and distinct across steps and draws."""
    return seed * 1_000_003 + step + draw * 7_919_993


def sampling_config(
    rollout: RolloutSection,
    tokenizer: PreTrainedTokenizerBase,
    seed: int | None = None,
    greedy: bool = False,
    n: int | None = None,
) -> SamplingConfig:
    """Sampling for a step (``seed``) or, with ``greedy``, one deterministic answer: the one
    object that reaches the rollout workers (``meta_info["sampling"]``). ``n`` answers per
    prompt (default ``rollout.n``; 1 when greedy)."""
    return build_from(
        SamplingConfig,
        rollout,  # temperature, top_p, top_k, max_new_tokens: the section's own names
        n=1 if greedy else (rollout.n if n is None else n),
        eos_token_id=tokenizer.eos_token_id,
        seed=seed,
        greedy=greedy,
    )
