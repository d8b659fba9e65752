"""Zero renames: each config field reaches its consumer (a loss, an estimator, a worker's
config) under the field's own name, so a YAML key is the consumer's keyword."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import pytest

from hf_algos.advantages import ADVANTAGE_ESTIMATORS
from hf_algos.config import (
    ActorSection,
    AlgorithmSection,
    CriticSection,
    DPOSection,
    KLControlSection,
    MultiTurnSection,
    RolloutCorrectionSection,
    RolloutSection,
)
from hf_algos.config.keywords import keyword_names, section_kwargs
from hf_algos.kl import AdaptiveKLController, FixedKLController, apply_kl_penalty
from hf_algos.losses import critic_loss, dpo_loss_fn, ppo_actor_loss
from hf_algos.losses.rollout_correction import compute_rollout_correction
from hf_engines import EngineConfig, ModelConfig
from hf_engines.workers import ActorConfig, CriticConfig
from hf_rollout import MultiTurnConfig, RolloutConfig, SamplingConfig

ENGINE_CALL = {"outputs", "micro_batch"}
"""The engine's own arguments of a loss function (not configuration)."""

CONSUMERS: list[tuple[Callable[..., Any], type, set[str]]] = [
    (ppo_actor_loss, ActorSection, {"rollout_correction"}),
    (critic_loss, CriticSection, set()),
    (dpo_loss_fn, DPOSection, set()),
    (
        compute_rollout_correction,
        RolloutCorrectionSection,
        {"old_log_probs", "rollout_log_probs", "response_mask"},
    ),
    (AdaptiveKLController, KLControlSection, set()),
    (FixedKLController, KLControlSection, set()),
    (apply_kl_penalty, AlgorithmSection, {"data", "controller"}),
]
"""(consumer, the section configuring it, its keywords set by the trainer, not the YAML)."""

COPIED: list[tuple[type, type, set[str]]] = [
    (ActorSection, ActorConfig, {"engine", "ppo_mini_batch_size", "ppo_epochs", "shuffle", "lora"}),
    (CriticSection, CriticConfig, {"engine", "ppo_mini_batch_size", "ppo_epochs"}),
    (RolloutSection, RolloutConfig, {"backend", "dtype", "max_model_len", "engine_kwargs"}),
    (RolloutSection, SamplingConfig, {"n", "temperature", "top_p", "top_k", "max_new_tokens"}),
    (
        MultiTurnSection,
        MultiTurnConfig,
        {"max_turns", "max_tokens_per_turn", "max_tool_response_tokens", "step_timeout_s"},
    ),
]
"""(section, the worker config built from it by ``build_from``, the fields it passes on by
name): a field renamed on one side only would silently fall back to the default."""

ESTIMATOR_ONLY = {"whiten", "epsilon"}
"""Estimator hyper-parameters without a config key (their defaults are used)."""


def field_names(section: type) -> set[str]:
    """The field names of dataclass ``section``."""
    return {f.name for f in dataclasses.fields(section)}


@pytest.mark.parametrize(
    ("consumer", "section", "not_config"),
    CONSUMERS,
    ids=[consumer.__name__ for consumer, _, _ in CONSUMERS],
)
def test_every_keyword_of_a_consumer_is_a_field_of_its_section(
    consumer: Callable[..., Any], section: type, not_config: set[str]
) -> None:
    taken = set(keyword_names(consumer)) - ENGINE_CALL - not_config
    assert taken, f"{consumer.__name__} takes no keyword from config"
    assert taken <= field_names(section), (
        f"{consumer.__name__} takes {sorted(taken - field_names(section))}, which "
        f"{section.__name__} names differently"
    )


@pytest.mark.parametrize(
    ("section", "config", "passed"),
    COPIED,
    ids=[f"{section.__name__}-{config.__name__}" for section, config, _ in COPIED],
)
def test_a_worker_config_takes_the_section_fields_by_their_names(
    section: type, config: type, passed: set[str]
) -> None:
    shared = field_names(section) & set(keyword_names(config))
    assert passed <= shared, f"{config.__name__} does not take {sorted(passed - shared)}"


def test_every_estimator_hyperparameter_is_an_algorithm_field_or_estimator_only() -> None:
    algorithm = field_names(AlgorithmSection)
    taken = {name for e in ADVANTAGE_ESTIMATORS.values() for name in e.hyperparameters}
    assert taken - ESTIMATOR_ONLY <= algorithm
    assert {"gamma", "lam", "norm_adv_by_std"} <= taken & algorithm


def test_section_kwargs_passes_the_fields_a_consumer_takes_by_their_names() -> None:
    actor = ActorSection(
        engine=EngineConfig(model=ModelConfig(hf_config={"model_type": "llama"})),
        clip_low=0.1,
        clip_high=0.3,
        use_kl_loss=True,
        kl_loss_coef=0.05,
    )
    kwargs = section_kwargs(actor, keyword_names(ppo_actor_loss))
    assert kwargs["clip_low"] == 0.1 and kwargs["clip_high"] == 0.3
    assert kwargs["use_kl_loss"] is True and kwargs["kl_loss_coef"] == 0.05
    assert "engine" not in kwargs and "lora" not in kwargs
    functools.partial(ppo_actor_loss, **kwargs)  # every key is a keyword of the loss


def test_estimator_gets_norm_adv_by_std_from_the_algorithm_section() -> None:
    algorithm = AlgorithmSection(norm_adv_by_std=False, gamma=0.9)
    grpo = ADVANTAGE_ESTIMATORS["grpo"]
    assert section_kwargs(algorithm, grpo.hyperparameters) == {"norm_adv_by_std": False}
    gae = ADVANTAGE_ESTIMATORS["gae"]
    assert section_kwargs(algorithm, gae.hyperparameters) == {"gamma": 0.9, "lam": 1.0}


def test_the_resolved_correction_section_is_compute_rollout_corrections_keywords() -> None:
    section = RolloutCorrectionSection(mode="auto", rollout_is_cap=3.0, mis_low=0.4)
    resolved = dataclasses.asdict(section.resolved("fully_async"))
    assert resolved == {
        "mode": "tis",
        "level": "token",
        "rollout_is_cap": 3.0,
        "mis_low": 0.4,
        "mis_high": 2.0,
    }
    assert set(resolved) <= set(keyword_names(compute_rollout_correction))
