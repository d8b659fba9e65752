"""Config loading: YAML + dotted overrides, typed conversion, and errors that name the fix."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hf_algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    get_advantage_estimator,
    register_advantage_estimator,
)
from hf_algos.config import (
    DPOConfig,
    RLConfig,
    SFTConfig,
    config_to_dict,
    load_config,
)
from hf_algos.config.cross_checks import DPO_MICRO_BATCH_ROWS
from hf_algos.trainers.dpo import pairs_per_micro_batch
from hf_algos.trainers.ppo.trainer import roles_needed
from hf_controller import ConfigurationError

# a random model has no tokenizer; any existing directory passes the config-time check
MODEL = [
    "+actor.engine.model.hf_config.model_type=llama",
    f"data.tokenizer_path={Path(__file__).parent}",
]
BASE = [*MODEL, "rollout.n=4", "data.train_batch_size=4", "actor.ppo_mini_batch_size=8"]


def load(*overrides: str) -> RLConfig:
    return load_config(RLConfig, overrides=[*BASE, *overrides])


def test_yaml_then_overrides_with_types(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "actor:\n  engine:\n    model: {hf_config: {model_type: llama, hidden_size: 32}}\n"
        "    optim: {lr: 1e-5, betas: [0.9, 0.95]}\n  ppo_mini_batch_size: 8\n"
        f"data: {{train_batch_size: 4, tokenizer_path: {tmp_path}}}\nrollout: {{n: 4}}\n"
        "trainer: {loggers: [console, jsonl], use_gpu: 'false'}\n"
    )
    config = load_config(
        RLConfig, path, ["actor.engine.optim.lr=2e-6", "trainer.save_freq=3", "rollout.top_k=5"]
    )
    assert config.actor.engine.optim.lr == pytest.approx(2e-6)
    assert isinstance(config.actor.engine.optim.lr, float)
    assert config.actor.engine.optim.betas == (0.9, 0.95)
    assert config.actor.engine.model.hf_config == {"model_type": "llama", "hidden_size": 32}
    assert config.trainer.loggers == ("console", "jsonl")
    assert config.trainer.use_gpu is False
    assert (config.trainer.save_freq, config.rollout.top_k) == (3, 5)
    # YAML's "1e-5" (a string to PyYAML) became a float before validation
    assert load_config(RLConfig, path).actor.engine.optim.lr == pytest.approx(1e-5)
    assert config_to_dict(config)["rollout"]["n"] == 4
    # tuple fields stay OmegaConf TupleConfigs after loading; the plain form (config.yaml of
    # a run) holds lists, not their str() ("('console', 'jsonl')")
    plain = config_to_dict(config)
    assert plain["trainer"]["loggers"] == ["console", "jsonl"]
    assert plain["actor"]["engine"]["optim"]["betas"] == [0.9, 0.95]


def test_optional_section_and_lists() -> None:
    config = load(
        "algorithm.adv_estimator=gae",
        "+critic.engine.model.hf_config.model_type=llama",
        "critic.ppo_mini_batch_size=16",
        "trainer.loggers=[console,tensorboard]",
    )
    assert config.critic is not None and config.critic.ppo_mini_batch_size == 16
    assert config.trainer.loggers == ("console", "tensorboard")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["actor.bogus=1"], "actor.bogus: Key 'bogus' not in 'ActorSection'"),
        (["trainer.nope.deeper=1"], "trainer.nope"),
        (["actor.engine.optim.lrr=1"], "Did you mean: 'lr'?"),
        (["actor.engine.optim.lr=fast"], "actor.engine.optim.lr: Value 'fast'"),
        (["rollout.n=2.5"], "rollout.n: Value '2.5'"),
        (["trainer.progress_bar=maybe"], "'maybe' is not a valid bool"),
        (["trainer.placement=cloud"], "'hybrid', 'separate'"),
        (["data.train_files=[missing.jsonl]"], "do not exist: ['missing.jsonl']"),
        (
            ["actor.engine.model.path=/nowhere", "actor.engine.model.hf_config=null"],
            "model.path='/nowhere' does not exist",
        ),
        (["trainer.n_workers=17"], "some of the 17 actor workers (trainer.n_workers) without"),
        (["algorithm.adv_estimator=gae"], "needs a value model"),
        (["rollout.n=1", "data.train_batch_size=8"], "rollout.n >= 2"),
        (
            [
                "algorithm.adv_estimator=reinforce_plus_plus_baseline",
                "rollout.n=1",
                "data.train_batch_size=8",
            ],
            "'reinforce_plus_plus_baseline' compares responses within a prompt's group",
        ),
        (["algorithm.adv_estimator=grpo2"], "not a registered advantage estimator"),
        (
            ["+critic.engine.model.hf_config.model_type=llama", "critic.ppo_mini_batch_size=16"],
            "'grpo' does not use values; remove the critic section",
        ),
        (["trainer.test_freq=2"], "data.val_files is empty"),
        (["trainer.resume_mode=path"], "resume_from"),
        (["trainer.backend=local", "trainer.n_workers=2"], "n_workers=1"),
        (["data.tokenizer_path=null"], "set data.tokenizer_path"),
        (["data.tokenizer_path=/nowhere"], "does not exist"),
    ],
)
def test_errors_name_value_and_fix(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        load(*overrides)
    assert expected in str(error.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["data.train_batch_size=15", "rollout.n=7", "trainer.n_workers=2"],
        ["actor.ppo_mini_batch_size=3"],  # 16 rows -> mini-batches of 6, 5, 5
        ["actor.ppo_mini_batch_size=32"],  # larger than the step: one mini-batch
        ["trainer.n_workers=3"],  # 16 rows -> 6/5/5 per worker
        ["trainer.n_workers=16", "actor.engine.micro_batch.micro_batch_size=3"],
        ["trainer.placement=separate", "trainer.rollout_workers=3"],
    ],
)
def test_uneven_batches_validate(overrides: list[str]) -> None:
    # Nothing has to divide: ranks, mini-batches and micro-batches are all balanced splits.
    config = load(*overrides)
    assert config.actor.ppo_mini_batch_size >= 1


def test_override_syntax_errors() -> None:
    for bad in ("novalue", "=3", "a..b=1"):  # a parse error, naming the override
        with pytest.raises(
            ConfigurationError, match=rf"override '{re.escape(bad)}' (does not|names no)"
        ):
            load(bad)
    with pytest.raises(ConfigurationError, match=r"rollout\.n"):
        load("rollout.n.deeper=2")


def test_dpo_and_sft_checks() -> None:
    dpo = load_config(
        DPOConfig,
        overrides=[
            *MODEL,
            "data.train_batch_size=4",
            "dpo.mini_batch_size=2",
            "actor.engine.micro_batch.micro_batch_size=2",
        ],
    )
    assert dpo.dpo.beta == pytest.approx(0.1)
    with pytest.raises(ConfigurationError, match="must be even"):
        load_config(
            DPOConfig,
            overrides=[
                *MODEL,
                "data.train_batch_size=4",
                "actor.engine.micro_batch.micro_batch_size=3",
            ],
        )
    # the engine's default (token packing) is DPO_MICRO_BATCH_ROWS rows: whole pairs
    default = load_config(DPOConfig, overrides=[*MODEL, "data.train_batch_size=4"])
    actor = pairs_per_micro_batch(default.actor)
    assert actor.engine.micro_batch.micro_batch_size == DPO_MICRO_BATCH_ROWS == 8
    pairs = [*MODEL, "actor.engine.micro_batch.micro_batch_size=2"]
    # 5 pairs on 3 workers in mini-batches of 3 pairs: the update keeps pairs whole.
    uneven = ["data.train_batch_size=5", "dpo.mini_batch_size=3", "trainer.n_workers=3"]
    assert load_config(DPOConfig, overrides=[*pairs, *uneven])
    with pytest.raises(ConfigurationError, match="use at most 2 workers"):
        load_config(DPOConfig, overrides=[*pairs, "data.train_batch_size=2", "trainer.n_workers=3"])
    with pytest.raises(ConfigurationError, match=r"rollout\.n=1 must be >= 2"):
        load_config(
            DPOConfig,
            overrides=[*MODEL, "dpo.online=true", "actor.engine.micro_batch.micro_batch_size=2"],
        )
    sft = load_config(
        SFTConfig, overrides=[*MODEL, "data.train_batch_size=4", "actor.ppo_mini_batch_size=2"]
    )
    assert sft.loss_mask == "response"
    uneven = [*MODEL, "data.train_batch_size=5", "actor.ppo_mini_batch_size=3"]
    assert load_config(SFTConfig, overrides=[*uneven, "trainer.n_workers=2"])
    with pytest.raises(ConfigurationError, match="use at most 5 workers"):
        load_config(SFTConfig, overrides=[*uneven, "trainer.n_workers=6"])


# ---------------------------------------------------------------------- estimator registry


def toy_value_advantage(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A made-up estimator that reads ``values``: ``scale * (r_t - V_t)``; ``(B, R)`` in/out."""
    advantages = scale * (token_level_rewards - values) * response_mask
    return advantages, advantages + values


@pytest.fixture
def toy_estimator() -> Iterator[str]:
    """``toy_value_advantage`` registered for one test, then removed from the registry."""
    register_advantage_estimator("toy_value", toy_value_advantage)
    try:
        yield "toy_value"
    finally:
        del ADVANTAGE_ESTIMATORS["toy_value"]


def test_a_new_estimator_reading_values_gets_a_critic_with_no_other_edit(
    toy_estimator: str,
) -> None:
    with pytest.raises(ConfigurationError, match="'toy_value' reads values, so it needs a value"):
        load(f"algorithm.adv_estimator={toy_estimator}")
    config = load(
        f"algorithm.adv_estimator={toy_estimator}",
        "+critic.engine.model.hf_config.model_type=llama",
        "critic.ppo_mini_batch_size=16",
    )
    entry = get_advantage_estimator(toy_estimator)
    assert entry.needs_critic and entry.min_group_size == 1
    assert roles_needed(config, entry) == {"actor", "critic"}
    # the same config with grpo (the default) builds no critic
    grpo = load()
    assert roles_needed(grpo, get_advantage_estimator("grpo")) == {"actor"}


def test_nodes_split_the_total_worker_count_and_verl_per_node_names_work() -> None:
    config = load("trainer.nnodes=2", "trainer.n_workers=4")
    assert config.trainer.workers_per_node == 2
    verl_style = load("trainer.nnodes=2", "trainer.n_gpus_per_node=2")
    assert verl_style.trainer.n_workers == 4 and verl_style.trainer.workers_per_node == 2
    with pytest.raises(ConfigurationError, match=r"n_workers=3 .*nnodes=2.*multiple of 2"):
        load("trainer.nnodes=2", "trainer.n_workers=3")
    with pytest.raises(ConfigurationError, match="set only one of them"):
        load("trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.n_workers=4")
    with pytest.raises(ConfigurationError, match="rollout_workers=3"):
        load(
            "trainer.nnodes=2",
            "trainer.n_workers=2",
            "trainer.placement=separate",
            "trainer.rollout_workers=3",
        )
    gpus = load("trainer.cpus_per_worker=0.5", "trainer.rollout_gpus_per_worker=2")
    assert gpus.trainer.cpus_per_worker == 0.5 and gpus.trainer.rollout_gpus_per_worker == 2
