"""Scoring reasoning-gym rows with the task's own verifier; the extraction formats."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hf_algos.config import RewardSection
from hf_algos.data import RLDataset, RLDatasetConfig, build_char_tokenizer, reasoning_gym_rows
from hf_algos.data.reasoning_gym import decode_entry, encode_entry
from hf_algos.rewards import (
    ANSWER_FORMATS,
    RewardManager,
    compute_reasoning_gym_score,
    extract_answer,
    get_scoring_function,
)
from hf_protocol import DataProto, right_pad


@pytest.mark.parametrize(
    ("text", "answer_format", "expected"),
    [
        ("3 + 4 is 7, so the sum is 12.", "last_number", "12"),
        ("it is -1,234.50 in total", "last_number", "-1234.50"),
        ("half: 3/4", "last_number", "3/4"),
        ("no digits here", "last_number", None),
        ("work\n  Paris  \n\n", "last_line", "Paris"),
        ("  \n ", "last_line", None),
        ("<answer>1</answer> then <answer> 42 </answer> done", "answer_tag", "42"),
        ("<answer>\nmulti\nline</answer>", "answer_tag", "multi\nline"),
        ("<answer>  </answer>", "answer_tag", None),
        ("<answer>unclosed", "answer_tag", None),
        ("Answer: 1\nso... Final answer: 12 apples\nthanks", "answer_prefix", "12 apples"),
        ("the answer is 5", "answer_prefix", None),
    ],
)
def test_extract_answer_formats(text: str, answer_format: str, expected: str | None) -> None:
    assert extract_answer(text, answer_format) == expected


def test_extract_answer_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown answer format 'boxed'; use one of"):
        extract_answer("5", "boxed")
    assert ANSWER_FORMATS == ("last_number", "last_line", "answer_tag", "answer_prefix")


@pytest.mark.parametrize(
    ("spec", "render"),
    [
        (
            "reasoning_gym:chain_sum?size=5&seed=1&min_terms=2&max_terms=3&max_digits=2",
            "The total is {}.",
        ),
        ("reasoning_gym:basic_arithmetic?size=5&seed=2&answer=answer_tag", "<answer>{}</answer>"),
        ("reasoning_gym:basic_arithmetic?size=5&seed=2&answer=answer_prefix", "ok\nAnswer: {}"),
    ],
)
def test_the_tasks_verifier_scores_right_and_wrong_answers(spec: str, render: str) -> None:
    score = get_scoring_function("reasoning_gym")
    assert score is compute_reasoning_gym_score
    for row in reasoning_gym_rows(spec):
        truth, info = row["reward_model"]["ground_truth"], row["extra_info"]
        assert score(render.format(truth), truth, info) == 1.0
        wrong = str(int(float(truth)) + 1)
        assert score(render.format(wrong), truth, info) == 0.0
        assert score("I do not know.", truth, info) == 0.0  # no answer given: a real 0


def test_entry_may_be_a_dict_and_the_format_defaults_to_last_number() -> None:
    row = reasoning_gym_rows("reasoning_gym:chain_sum?size=1")[0]
    info = {"task": "chain_sum", "entry": json.loads(row["extra_info"]["entry"])}
    truth = row["reward_model"]["ground_truth"]
    assert compute_reasoning_gym_score(f"so {truth}", truth, info) == 1.0


def test_entries_round_trip_with_tuples_sets_and_number_keys() -> None:
    entry = {"answer": "1", "metadata": {"grid": ((1, 2), (3,)), "seen": {3, 1}, "by": {1: "a"}}}
    assert decode_entry(encode_entry(entry)) == entry
    # arc_agi's verifier compares its tuple grids: plain JSON (lists) would score its own
    # answer 0.05
    row = reasoning_gym_rows("reasoning_gym:arc_agi?size=1&answer=answer_tag")[0]
    answer = row["reward_model"]["ground_truth"]
    assert "\n" in answer
    response = f"<answer>{answer}</answer>"
    assert compute_reasoning_gym_score(response, answer, row["extra_info"]) == 1.0


@pytest.mark.parametrize(
    ("extra_info", "field"),
    [
        (None, "task"),
        ({"entry": "{}"}, "task"),
        ({"task": "chain_sum"}, "entry"),
        ({"task": "chain_sum", "entry": "{not json"}, "entry"),
        ({"task": "chain_sum", "entry": {"question": "1+1"}}, "entry"),
    ],
)
def test_rows_without_the_task_or_entry_raise_naming_the_field(
    extra_info: dict | None, field: str
) -> None:
    with pytest.raises(ValueError) as error:
        compute_reasoning_gym_score("2", "2", extra_info)
    message = str(error.value)
    assert f"extra_info[{field!r}]" in message
    assert "'reasoning_gym:<task>?size=...' spec" in message


def test_the_scorer_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from hf_algos.rewards.registry import get_scoring_function\n"
        "from hf_algos.rewards.reasoning_gym import compute_reasoning_gym_score\n"
        "from hf_algos.data.reasoning_gym import reasoning_gym_rows\n"
        "row = reasoning_gym_rows('reasoning_gym:chain_sum?size=1')[0]\n"
        "truth = row['reward_model']['ground_truth']\n"
        "assert get_scoring_function('reasoning_gym')(truth, truth, row['extra_info']) == 1.0\n"
        "from hf_algos.rewards.math_boxed import compute_math_score\n"
        "assert compute_math_score(r'\\boxed{\\sqrt{4}}', '2') == 1.0\n"
        "print(','.join(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == ""


def test_the_reward_manager_scores_spec_rows_in_its_worker_processes() -> None:
    """The built-in function, on rows as the RL dataset gives them, in a real scoring process
    (which imports reasoning_gym on its first row)."""
    tokenizer = build_char_tokenizer()
    spec = "reasoning_gym:chain_sum?size=3&seed=5&answer=answer_tag&max_terms=2&max_digits=1"
    dataset = RLDataset(spec, tokenizer, RLDatasetConfig(max_prompt_length=256))
    rows = [dataset[i] for i in range(3)]
    truths = [row["reward_model"]["ground_truth"] for row in rows]
    texts = [f"<answer>{truths[0]}</answer>", "<answer>100</answer>", "no answer"]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] + [3] for text in texts]
    responses, response_mask = right_pad(ids, tokenizer.pad_token_id, max(map(len, ids)) + 1)
    extra = [row["extra_info"] for row in rows]
    extra.append({"task": "chain_sum"})  # a row without its entry
    batch = DataProto.from_dict(
        tensors={
            "responses": responses[[0, 1, 2, 0]],
            "response_mask": response_mask[[0, 1, 2, 0]],
        },
        non_tensors={
            "data_source": [row["data_source"] for row in rows] + ["reasoning_gym"],
            "reward_model": [row["reward_model"] for row in rows] + [rows[0]["reward_model"]],
            "extra_info": extra,
        },
    )
    config = RewardSection(num_workers=1, timeout_s=60.0, max_error_fraction=1.0)
    with RewardManager(tokenizer, config) as manager:
        out = manager.score(batch)
    assert out.batch["token_level_scores"].sum(dim=1).tolist() == [1.0, 0.0, 0.0, 0.0]
    (report,) = out.meta_info["reward_errors"]
    assert report["index"] == 3 and "extra_info['entry']" in report["error"]
