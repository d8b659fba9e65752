"""Rows from a reasoning-gym spec: parsing, the row schema through RLDataset, config checks."""

from __future__ import annotations

import json

import pytest

from hf_algos.config.data import DataSection
from hf_algos.data import (
    DataError,
    ReasoningGymSpec,
    RLDataset,
    RLDatasetConfig,
    build_char_tokenizer,
    reasoning_gym_rows,
)
from hf_algos.data.reasoning_gym import INSTRUCTIONS, parse_reasoning_gym_spec
from hf_controller import ConfigurationError

CHAIN_SUM = (
    "reasoning_gym:chain_sum?size=6&seed=3&answer=last_number"
    "&min_terms=2&max_terms=2&min_digits=1&max_digits=1"
)


def test_spec_string_parses_values_and_task_settings() -> None:
    spec = parse_reasoning_gym_spec(
        "reasoning_gym:basic_arithmetic?size=20&seed=7&answer=answer_tag"
        "&min_terms=2&max_digits=2&allow_parentheses=false&whitespace=single&ratio=0.5"
    )
    assert spec == ReasoningGymSpec(
        "basic_arithmetic",
        size=20,
        seed=7,
        answer="answer_tag",
        kwargs={
            "min_terms": 2,
            "max_digits": 2,
            "allow_parentheses": False,
            "whitespace": "single",
            "ratio": 0.5,
        },
    )
    assert parse_reasoning_gym_spec("reasoning_gym:chain_sum") == ReasoningGymSpec("chain_sum")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("reasoning_gym:?size=2", "names no task"),
        ("reasoning_gym:chain_sum?size=x", "size='x' must be an integer"),
        ("reasoning_gym:chain_sum?size=0", "size must be >= 1"),
        ("reasoning_gym:chain_sum?answer=boxed", "answer='boxed' is not one of"),
        ("reasoning_gym:chain_sum?seed=1&seed=2", "gives 'seed' twice"),
        ("reasoning_gym:chain_sum?size", "write it as 'reasoning_gym:chain_sum?size=2000"),
    ],
)
def test_malformed_specs_say_what_is_wrong(text: str, expected: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_reasoning_gym_spec(text)
    assert expected in str(error.value)


def test_rows_follow_verls_schema() -> None:
    rows = reasoning_gym_rows(CHAIN_SUM)
    assert rows == reasoning_gym_rows(CHAIN_SUM)  # the seed fixes the rows
    assert len(rows) == 6
    row = rows[0]
    assert row["data_source"] == "reasoning_gym"
    assert row["ability"] == "arithmetic"
    assert row["reward_model"]["style"] == "rule"
    (message,) = row["prompt"]
    entry = json.loads(row["extra_info"]["entry"])
    assert message == {"role": "user", "content": entry["question"]}  # no instruction
    assert row["reward_model"]["ground_truth"] == entry["answer"]
    assert entry["metadata"]["source_dataset"] == "chain_sum"
    assert row["extra_info"]["task"] == "chain_sum"
    assert [r["extra_info"]["index"] for r in rows] == list(range(6))
    assert row["extra_info"]["answer_format"] == "last_number"
    assert json.loads(row["extra_info"]["task_config"]) == {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
    }
    tagged = reasoning_gym_rows(CHAIN_SUM.replace("last_number", "answer_tag"))
    assert tagged[0]["prompt"][0]["content"].endswith(INSTRUCTIONS["answer_tag"])


def test_a_spec_loads_through_the_rl_dataset_as_a_file_would() -> None:
    tokenizer = build_char_tokenizer()
    config = RLDatasetConfig(max_prompt_length=256)
    dataset = RLDataset([CHAIN_SUM, "reasoning_gym:basic_arithmetic?size=3"], tokenizer, config)
    assert len(dataset) == 9
    item = dataset[7]
    assert item["data_source"] == "reasoning_gym"
    assert item["extra_info"]["task"] == "basic_arithmetic"
    assert json.loads(item["extra_info"]["entry"])["answer"] == item["reward_model"]["ground_truth"]
    batch = dataset.collate([dataset[0], dataset[7]])
    assert list(batch.non_tensor_batch["data_source"]) == ["reasoning_gym"] * 2
    with pytest.raises(DataError, match=r"reasoning_gym:chain_summ\?size=2: .*'chain_sum'"):
        RLDataset("reasoning_gym:chain_summ?size=2", tokenizer, config)


def test_the_config_check_validates_specs_with_the_fix() -> None:
    assert DataSection(train_files=(CHAIN_SUM,), val_files=(CHAIN_SUM,)).train_files
    with pytest.raises(ConfigurationError) as unknown:
        DataSection(train_files=("reasoning_gym:chain_summ?size=10",))
    message = str(unknown.value)
    assert "data.train_files" in message and "'reasoning_gym:chain_summ?size=10'" in message
    assert "did you mean one of ['chain_sum'" in message
    with pytest.raises(ConfigurationError) as bad_setting:
        DataSection(val_files=("reasoning_gym:chain_sum?min_term=2",))
    message = str(bad_setting.value)
    assert "data.val_files" in message and "unexpected keyword argument 'min_term'" in message
    assert "give settings among ['min_terms'" in message
    with pytest.raises(ConfigurationError, match="min_terms must be positive"):
        DataSection(train_files=("reasoning_gym:chain_sum?min_terms=0",))
    with pytest.raises(ConfigurationError, match=r"do not exist: \['missing.jsonl'\]"):
        DataSection(train_files=(CHAIN_SUM, "missing.jsonl"))
