"""``rollout.multi_turn``: keys, verl aliases, refusals that name the fix, and what the
trainer derives from it (the rollout workers' config, tool schemas for the chat template)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from hf_algos.config import DPOConfig, MultiTurnSection, load_config
from hf_algos.data import build_char_tokenizer
from hf_algos.trainers.ppo.multiturn import (
    data_with_tools,
    rollout_multi_turn,
    worker_environment_spec,
)
from hf_controller import ConfigurationError
from hf_rollout.multiturn import tool_schemas

from .test_config import MODEL, load


def test_off_by_default_and_verl_keys_map() -> None:
    assert load().rollout.multi_turn == MultiTurnSection()
    config = load(
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=32",
        "rollout.multi_turn.reward=both",
        "rollout.multi_turn.tools=[calc]",
    )
    section = config.rollout.multi_turn
    assert (section.enable, section.max_turns, section.max_tool_response_tokens) == (True, 3, 32)
    assert (section.reward, section.tools) == ("both", ("calc",))
    with pytest.raises(ConfigurationError, match=r"rollout\.multi_turn\.tools"):
        load("actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.multi_turn.tools=[calc,search]"], r"unknown tools \['search'\].*\['calc'"),
        (["rollout.multi_turn.environment=browser"], r"unknown environment 'browser'.*'tools'"),
        (["rollout.multi_turn.environment=nowhere.py:Env"], "does not exist"),
        (["+rollout.multi_turn.env_kwargs.depth=2"], "cannot be built with arguments"),
        (["rollout.multi_turn.max_turns=0"], "max_turns=0 must be >= 1"),
        (["rollout.multi_turn.max_tokens_per_turn=0"], "max_tokens_per_turn=0 must be >= 1"),
        (["rollout.multi_turn.reward=judge"], "reward"),
        (
            [
                "trainer.async_mode=one_step_off",
                "trainer.placement=separate",
            ],
            "trainer.async_mode='off' only",
        ),
        (
            [
                "trainer.async_mode=fully_async",
                "trainer.placement=separate",
                "rollout.partial=true",
            ],
            "set rollout.partial=false",
        ),
    ],
)
def test_refusals_name_the_fix(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load("rollout.multi_turn.enable=true", *overrides)


def test_names_are_checked_only_when_enabled() -> None:
    assert load("rollout.multi_turn.environment=browser").rollout.multi_turn.enable is False


def test_dpo_refuses_multi_turn() -> None:
    with pytest.raises(ConfigurationError, match="DPO pairs single responses"):
        load_config(
            DPOConfig,
            overrides=[
                *MODEL,
                "actor.engine.micro_batch.micro_batch_size=2",
                "rollout.multi_turn.enable=true",
            ],
        )


def test_worker_config_and_chat_tools(tmp_path: Path) -> None:
    build_char_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    config = load(
        "rollout.multi_turn.enable=true",
        "rollout.multi_turn.max_tool_response_tokens=12",
        "rollout.multi_turn.step_timeout_s=2.5",
    )
    worker = rollout_multi_turn(config.rollout.multi_turn, tokenizer, trust_remote_code=False)
    assert worker is not None
    assert (worker.tokenizer_path, worker.environment) == (str(tmp_path), "tools")
    assert worker.env_kwargs == {"tools": ["calc"]}  # the tools environment takes them
    assert (worker.max_tool_response_tokens, worker.step_timeout_s) == (12, 2.5)
    assert rollout_multi_turn(MultiTurnSection(), tokenizer, False) is None
    # "calculator" is hf-rollout's own: it stays a name, and takes no tools argument
    calculator = MultiTurnSection(enable=True, environment="calculator")
    assert calculator.environment_kwargs() == {}
    assert worker_environment_spec("calculator") == "calculator"

    data = data_with_tools(config.data, config.rollout.multi_turn)
    assert data.chat_template_kwargs == {"tools": tool_schemas(["calc"])}
    assert data_with_tools(config.data, MultiTurnSection()) is config.data
    raw = load("rollout.multi_turn.enable=true", "data.apply_chat_template=false")
    assert data_with_tools(raw.data, raw.rollout.multi_turn) is raw.data
