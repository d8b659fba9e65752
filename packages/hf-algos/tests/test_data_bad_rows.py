"""Bad data fails while the dataset is built, naming the file, the row and the field."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from hf_algos.config.actor import ActorSection
from hf_algos.config.data import DataSection
from hf_algos.config.root import SFTConfig
from hf_algos.data import (
    DataError,
    PreferenceDataset,
    RLDataset,
    RLDatasetConfig,
    SFTDataset,
    build_char_tokenizer,
    write_rows,
)
from hf_algos.data.rl_dataset import rl_dataset
from hf_engines import EngineConfig
from hf_engines.config import ModelConfig


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return build_char_tokenizer()


def _good(index: int) -> dict[str, Any]:
    return {
        "prompt": f"{index}+1=",
        "data_source": "sort_digits",
        "reward_model": {"ground_truth": str(index + 1)},
        "extra_info": {"index": index},
    }


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# (what is wrong, how to break row 2 of 3, the field named, what the message says)
BAD_ROWS = [
    ("missing prompt", lambda r: r.pop("prompt"), "prompt", "is missing"),
    ("empty prompt", lambda r: r.update(prompt="  "), "prompt", "is an empty string"),
    ("non-string prompt", lambda r: r.update(prompt=12), "prompt", "has type int"),
    ("empty chat", lambda r: r.update(prompt=[]), "prompt", "is an empty message list"),
    (
        "bad message",
        lambda r: r.update(prompt=[{"role": "user"}]),
        "prompt[0]",
        "is .*, not a message",
    ),
    ("null prompt", lambda r: r.update(prompt=None), "prompt", "is null"),
    ("missing data_source", lambda r: r.pop("data_source"), "data_source", "is missing"),
    ("missing reward_model", lambda r: r.pop("reward_model"), "reward_model", "is missing"),
    (
        "missing ground truth",
        lambda r: r.update(reward_model={"answer": "1"}),
        "reward_model.ground_truth",
        "is missing",
    ),
    (
        "dict ground truth",
        lambda r: r.update(reward_model={"ground_truth": {"a": 1}}),
        "reward_model.ground_truth",
        "has type dict",
    ),
    (
        "bool ground truth",
        lambda r: r.update(reward_model={"ground_truth": True}),
        "reward_model.ground_truth",
        "has type bool",
    ),
    ("reward_model a string", lambda r: r.update(reward_model="3"), "reward_model", "has type str"),
    ("extra_info a list", lambda r: r.update(extra_info=[1]), "extra_info", "has type list"),
]


@pytest.mark.parametrize(("name", "breaker", "field", "problem"), BAD_ROWS, ids=lambda v: v)
def test_bad_rl_row_names_file_line_and_field(
    tmp_path: Path, tokenizer, name: str, breaker, field: str, problem: str
) -> None:
    rows = [_good(i) for i in range(3)]
    breaker(rows[1])
    path = _write_jsonl(tmp_path / "train.jsonl", rows)
    expected = f"{re.escape(str(path))}, line 2: field '{re.escape(field)}' {problem}"
    with pytest.raises(DataError, match=expected) as caught:
        RLDataset(path, tokenizer)
    assert caught.value.field == field
    assert "; " in str(caught.value), "the message says how to fix it"


def test_good_variants_pass(tokenizer) -> None:
    rows = [_good(0), _good(1), _good(2)]
    rows[0]["reward_model"] = {"ground_truth": 3}
    rows[1]["reward_model"] = {"ground_truth": ["3", "3.0"]}
    rows[2]["prompt"] = [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]
    del rows[2]["extra_info"]
    assert len(RLDataset(rows, tokenizer)) == 3
    # a reward-model run needs no ground truth, but a given one is still checked
    bare = [{"prompt": "hi"}]
    assert len(RLDataset(bare, tokenizer, RLDatasetConfig(require_reward_fields=False))) == 1


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"prompt": "a"}\n{"prompt": "b",\n', r"line 2: is not valid JSON"),
        ('{"prompt": "a"}\n\n["prompt"]\n', r"line 3: is \['prompt'\], not a JSON object"),
        (b'{"prompt": "a"}\n\xff\xfe\n', r"line 2: is not UTF-8 text"),
        ("\n\n", r"the file has no rows"),
    ],
)
def test_invalid_jsonl_names_the_line(tmp_path: Path, tokenizer, content, expected) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataError, match=re.escape(str(path)) + ".*" + expected):
        RLDataset(path, tokenizer)


def test_invalid_parquet_names_the_file(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "train.parquet"
    path.write_text('{"prompt": "this is json, not parquet"}\n')
    with pytest.raises(DataError, match=re.escape(str(path)) + ": is not a readable parquet"):
        RLDataset(path, tokenizer)
    rows = [_good(i) for i in range(3)]
    rows[2]["reward_model"] = {"ground_truth": None}
    good_path = write_rows(rows, tmp_path / "rows.parquet")
    with pytest.raises(DataError, match=r"rows\.parquet, row 2 \(0-based\): field 'reward_model"):
        RLDataset(good_path, tokenizer)


def test_overlong_error_drop_and_all_dropped(
    tmp_path: Path, tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [_good(1), {**_good(2), "prompt": "x" * 30}, _good(3)]
    path = _write_jsonl(tmp_path / "train.jsonl", rows)
    files = (str(path),)
    strict = DataSection(train_files=files, max_prompt_length=12)
    assert strict.overlong_prompts == "error"  # the default, as documented
    with pytest.raises(DataError, match=r"train\.jsonl, line 2: field 'prompt' is 32 tokens long"):
        rl_dataset(strict, files, tokenizer)
    dropping = DataSection(train_files=files, max_prompt_length=12, overlong_prompts="drop")
    with caplog.at_level(logging.WARNING, logger="hf_algos.data.rl_dataset"):
        assert len(rl_dataset(dropping, files, tokenizer)) == 2
    assert "dropped 1 of 3 prompts" in caplog.text
    tiny = DataSection(train_files=files, max_prompt_length=3, overlong_prompts="drop")
    with pytest.raises(ValueError, match=r"every one of the 3 prompts .*shortest 6, longest 32"):
        rl_dataset(tiny, files, tokenizer)
    with pytest.raises(ValueError, match="'filter' is now called 'drop'"):
        RLDatasetConfig(overlong_prompts="filter")


def test_sft_and_preference_rows_are_checked(tmp_path: Path, tokenizer) -> None:
    rows = [{"prompt": "a=", "response": "b"}, {"prompt": "c=", "response": ""}]
    path = _write_jsonl(tmp_path / "sft.jsonl", rows)
    actor = ActorSection(engine=EngineConfig(model=ModelConfig(hf_config={"model_type": "llama"})))
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer.save_pretrained(tokenizer_dir)
    data = DataSection(train_files=(str(path),), tokenizer_path=str(tokenizer_dir))
    config = SFTConfig(actor=actor, data=data)
    with pytest.raises(DataError, match=r"sft\.jsonl, line 2: field 'response' is an empty"):
        SFTDataset([str(path)], tokenizer, config)
    pairs = [{"prompt": "a=", "chosen": "b", "rejected": "c"}, {"prompt": ["a="], "chosen": "b"}]
    pair_path = _write_jsonl(tmp_path / "pairs.jsonl", pairs)
    with pytest.raises(DataError, match=r"pairs\.jsonl, line 2: field 'prompt\[0\]' is 'a='"):
        PreferenceDataset(pair_path, tokenizer)
