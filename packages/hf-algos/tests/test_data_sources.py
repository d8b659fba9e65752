"""Datasets through Hugging Face ``datasets``: every file kind, saved directories, verl's
parquet schema, the prompt options (system prompt, chat-template kwargs) and num_proc."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from hf_algos.data import DataError, RLDataset, RLDatasetConfig, build_char_tokenizer, write_rows
from hf_algos.data.prompts import PromptFormat, prompt_text

from .toy_task import make_sort_digits_rows

VERL_ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"What is {i} + 1? Think step by step."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        "extra_info": {"split": "train", "index": i, "answer": f"#### {i + 1}"},
    }
    for i in range(6)
]
"""Rows exactly as verl's ``examples/data_preprocess/gsm8k.py`` writes them."""


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return build_char_tokenizer()


def test_every_file_kind_and_a_saved_directory_load(tmp_path: Path, tokenizer) -> None:
    rows = make_sort_digits_rows(5, length=3, seed=2)
    table = datasets.Dataset.from_list(rows)
    table.to_json(str(tmp_path / "rows.json"), lines=False)
    table.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": table}).save_to_disk(str(tmp_path / "dict"))
    sources = [
        write_rows(rows, tmp_path / "rows.jsonl"),
        write_rows(rows, tmp_path / "rows.parquet"),
        tmp_path / "rows.json",
        next((tmp_path / "saved").glob("*.arrow")),
        tmp_path / "saved",
        tmp_path / "dict",
    ]
    expected = RLDataset(rows, tokenizer)
    for source in sources:
        loaded = RLDataset(str(source), tokenizer)
        assert [loaded[i]["input_ids"] for i in range(5)] == [
            expected[i]["input_ids"] for i in range(5)
        ], source
        assert loaded[0]["reward_model"]["ground_truth"] == rows[0]["reward_model"]["ground_truth"]
    # a datasets.Dataset in memory works too; two files are concatenated in order
    assert len(RLDataset(table, tokenizer)) == 5
    assert len(RLDataset([str(sources[0]), str(sources[1])], tokenizer)) == 10


def test_verl_parquet_schema_works_unchanged(tmp_path: Path, tokenizer) -> None:
    path = write_rows(VERL_ROWS, tmp_path / "gsm8k_train.parquet")
    dataset = RLDataset(str(path), tokenizer, RLDatasetConfig(max_prompt_length=128))
    batch = dataset.collate([dataset[i] for i in range(4)])
    assert batch.batch["input_ids"].shape == (4, 128)
    assert list(batch.non_tensor_batch["data_source"]) == ["openai/gsm8k"] * 4
    assert batch.non_tensor_batch["reward_model"][2]["ground_truth"] == "3"
    assert batch.non_tensor_batch["extra_info"][1]["answer"] == "#### 2"
    assert batch.non_tensor_batch["raw_prompt"][0][0]["role"] == "user"
    assert dataset[0]["ability"] == "math"  # extra columns travel with the row


def test_system_prompt_and_chat_template_kwargs(tokenizer) -> None:
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% if think %}T{% endif %}{% endif %}"
    )
    templated = build_char_tokenizer(chat_template=template)
    fmt = PromptFormat(True, {"think": True}, system_prompt="Be brief.")
    assert prompt_text(templated, "1+1=", fmt) == "<|system|>Be brief.<|user|>1+1=<|assistant|>T"
    own = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "x"}]
    assert prompt_text(templated, own, fmt).startswith("<|system|>Mine.<|user|>")
    raw = PromptFormat(False, system_prompt="Be brief.")
    assert prompt_text(templated, "1+1=", raw) == "Be brief.\n1+1="
    config = RLDatasetConfig(system_prompt="S", chat_template_kwargs={"think": True})
    dataset = RLDataset(make_sort_digits_rows(2), templated, config)
    assert templated.decode(dataset[0]["input_ids"]).startswith("<|system|>S<|user|>")


def test_num_proc_gives_the_same_rows_and_bad_rows_still_name_their_line(
    tmp_path: Path, tokenizer
) -> None:
    rows = make_sort_digits_rows(1200, length=3, seed=3)
    path = write_rows(rows, tmp_path / "many.jsonl")
    one = RLDataset(str(path), tokenizer, RLDatasetConfig(num_proc=1))
    two = RLDataset(str(path), tokenizer, RLDatasetConfig(num_proc=2))
    assert [one[i]["input_ids"] for i in (0, 700, 1199)] == [
        two[i]["input_ids"] for i in (0, 700, 1199)
    ]
    rows[900]["prompt"] = ""
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(json.dumps(row) for row in rows[:450]) + "\n\n")
    with broken.open("a") as handle:  # a blank line: row 900 is on line 902
        handle.write("".join(json.dumps(row) + "\n" for row in rows[450:]))
    with pytest.raises(DataError, match=r"broken\.jsonl, line 902: field 'prompt' is an empty"):
        RLDataset(str(broken), tokenizer, RLDatasetConfig(num_proc=2))


def test_a_directory_that_is_no_dataset_is_named(tmp_path: Path, tokenizer) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: is a directory but not a saved dataset"):
        RLDataset(str(tmp_path / "empty"), tokenizer)


def test_an_empty_list_or_dataset_is_refused_by_name(tokenizer) -> None:
    with pytest.raises(DataError, match=r"the given list of rows: it has no rows; give at least"):
        RLDataset([], tokenizer)
    empty = datasets.Dataset.from_list([{"prompt": "x"}]).select([])
    with pytest.raises(DataError, match=r"the given datasets.Dataset: it has no rows"):
        RLDataset(empty, tokenizer)
