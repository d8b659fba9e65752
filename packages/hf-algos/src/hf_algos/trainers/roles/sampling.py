"""How a trainer samples: each step's seed and the sampling settings the rollout receives."""

from __future__ import annotations

import functools
import logging

from transformers import PreTrainedTokenizerBase

from hf_algos.config.keywords import build_from
from hf_algos.config.rollout import RolloutSection
from hf_controller import ConfigurationError
from hf_rollout import SamplingConfig

logger = logging.getLogger(__name__)


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
        stop_token_ids=stop_token_ids(tokenizer, tuple(rollout.stop)),
        seed=seed,
        greedy=greedy,
    )


@functools.lru_cache(maxsize=8)
def stop_token_ids(tokenizer: PreTrainedTokenizerBase, stops: tuple[str, ...]) -> tuple[int, ...]:
    """The ids of every vocabulary token whose text contains one of ``stops`` (``rollout.stop``),
    special tokens aside.

    A response then ends with the first such token, on every backend. The whole vocabulary is
    decoded once per tokenizer and stop list (a few seconds for 262k entries). A stop string no
    token contains cannot end anything and raises :class:`ConfigurationError`.
    """
    if not stops:
        return ()
    texts = tokenizer.batch_decode([[index] for index in range(len(tokenizer))])
    special = set(tokenizer.all_special_ids)  # "<bos>" holds no "b" a model writes
    found: set[int] = set()
    for stop in stops:
        ids = {index for index, text in enumerate(texts) if stop in text and index not in special}
        if not ids:
            raise ConfigurationError(
                f"rollout.stop: no token of tokenizer {tokenizer.name_or_path!r} contains "
                f"{stop!r}, so it cannot end a response; give a string a token holds (e.g. '\\n')"
            )
        found |= ids
    logger.info("rollout.stop %s: %d token ids end a response", list(stops), len(found))
    return tuple(sorted(found))
