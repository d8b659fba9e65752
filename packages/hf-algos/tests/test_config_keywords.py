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
    RolloutCorrectionSection,
)
from hf_algos.config.keywords import keyword_names, section_kwargs
from hf_algos.kl import AdaptiveKLController, FixedKLController
from hf_algos.losses import critic_loss, dpo_loss_fn, ppo_actor_loss
from hf_algos.losses.rollout_correction import CorrectionSettings
from hf_engines import EngineConfig, ModelConfig

ENGINE_CALL = {"outputs", "micro_batch"}
"""The engine's own arguments of a loss function (not configuration)."""

CONSUMERS: list[tuple[Callable[..., Any], type, set[str]]] = [
    (ppo_actor_loss, ActorSection, {"rollout_correction"}),
    (critic_loss, CriticSection, set()),
    (dpo_loss_fn, DPOSection, set()),
    (CorrectionSettings, RolloutCorrectionSection, set()),
    (AdaptiveKLController, KLControlSection, set()),
    (FixedKLController, KLControlSection, set()),
]
"""(consumer, the section configuring it, its keywords set by the trainer, not the YAML)."""

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


def test_correction_settings_are_the_section_with_auto_resolved() -> None:
    section = RolloutCorrectionSection(mode="auto", rollout_is_cap=3.0, mis_low=0.4)
    assert section.settings("fully_async") == CorrectionSettings(
        mode="tis", rollout_is_cap=3.0, mis_low=0.4
    )
