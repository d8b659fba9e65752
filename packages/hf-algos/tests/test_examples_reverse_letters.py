"""The quickstart's task on its own: its rows, its reward and how the recipe registers it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hf_algos.config import RewardSection
from hf_algos.data import build_char_tokenizer, write_rows
from hf_algos.examples.deal_letters import (
    DEAL_LETTERS,
    DEAL_LETTERS_SOURCE,
    compute_deal_letters_score,
    make_deal_letters_rows,
)
from hf_algos.examples.letter_tasks import WRONG_LENGTH_SCORE
from hf_algos.examples.reverse_letters import (
    REVERSE_LETTERS_SOURCE,
    compute_reverse_letters_score,
    make_reverse_letters_rows,
    register_reward,
)
from hf_algos.examples.sort_letters import (
    SORT_LETTERS,
    SORT_LETTERS_SOURCE,
    compute_sort_letters_score,
    make_sort_letters_rows,
)
from hf_algos.examples.tasks import letter_task
from hf_algos.rewards import SCORING_FUNCTIONS, RewardManager
from hf_protocol import DataProto, right_pad


@pytest.fixture
def unregistered() -> Iterator[None]:
    """No scoring function for the task before the test, and none left behind after it."""
    SCORING_FUNCTIONS.pop(REVERSE_LETTERS_SOURCE, None)
    yield
    SCORING_FUNCTIONS.pop(REVERSE_LETTERS_SOURCE, None)


def test_reverse_letters_rows_are_reproducible(tmp_path: Path) -> None:
    rows = make_reverse_letters_rows(5, length=6, seed=3)
    assert rows == make_reverse_letters_rows(5, length=6, seed=3)
    assert rows != make_reverse_letters_rows(5, length=6, seed=4)
    for row in rows:
        letters = row["prompt"][:-1]
        assert row["prompt"].endswith("=") and len(letters) == 6 and letters.islower()
        assert row["reward_model"]["ground_truth"] == letters[::-1]
        assert row["data_source"] == REVERSE_LETTERS_SOURCE
    path = write_rows(rows, tmp_path / "task.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows
    with pytest.raises(ValueError, match="length >= 1"):
        make_reverse_letters_rows(3, length=0)


def test_reverse_letters_score() -> None:
    # exact (surrounding whitespace ignored)
    assert compute_reverse_letters_score("fedcba", "fedcba") == 1.0
    assert compute_reverse_letters_score(" fedcba\n", "fedcba") == 1.0
    # right length, some letters wrong: 0.5 x the fraction of right positions
    assert compute_reverse_letters_score("fedcbx", "fedcba") == pytest.approx(0.5 * 5 / 6)
    assert compute_reverse_letters_score("fedxyz", "fedcba") == pytest.approx(0.5 * 3 / 6)
    assert compute_reverse_letters_score("abcdef", "fedcba") == 0.0
    # no <eos> before the 7-token cap: one letter too long, penalised even if the six are right
    assert compute_reverse_letters_score("fedcbaa", "fedcba") == WRONG_LENGTH_SCORE == -0.5
    assert compute_reverse_letters_score("fedcba fedcba", "fedcba") == -0.5
    # stopped early: too short
    assert compute_reverse_letters_score("fed", "fedcba") == -0.5
    assert compute_reverse_letters_score("", "fedcba") == -0.5


def test_sort_letters_rows_and_score() -> None:
    rows = make_sort_letters_rows(4, length=6, seed=1)
    assert rows == make_sort_letters_rows(4, length=6, seed=1)
    for row in rows:
        letters = row["prompt"][:-1]
        assert row["reward_model"]["ground_truth"] == "".join(sorted(letters))
        assert row["data_source"] == SORT_LETTERS_SOURCE
    assert compute_sort_letters_score("abcdef", "abcdef") == 1.0
    assert compute_sort_letters_score("abcdeg", "abcdef") == pytest.approx(0.5 * 5 / 6)
    assert compute_sort_letters_score("abcdeff", "abcdef") == -0.5
    assert compute_sort_letters_score("abcde", "abcdef") == -0.5
    assert letter_task("sort_letters") is SORT_LETTERS
    with pytest.raises(ValueError, match="reverse_letters"):
        letter_task("reverse_words")


def test_deal_letters_rows_and_score() -> None:
    rows = make_deal_letters_rows(4, length=6, seed=1)
    assert rows == make_deal_letters_rows(4, length=6, seed=1)
    assert DEAL_LETTERS.answer("abcdef") == "acebdf"
    for row in rows:
        letters = row["prompt"][:-1]
        assert row["reward_model"]["ground_truth"] == letters[0::2] + letters[1::2]
        assert row["data_source"] == DEAL_LETTERS_SOURCE
    assert compute_deal_letters_score("acebdf", "acebdf") == 1.0
    assert compute_deal_letters_score("acebdg", "acebdf") == pytest.approx(0.5 * 5 / 6)
    assert compute_deal_letters_score("acebd", "acebdf") == -0.5
    assert letter_task("deal_letters") is DEAL_LETTERS


def test_registered_reward_scores_the_task_in_worker_processes(unregistered: None) -> None:
    register_reward()
    register_reward()  # a second call (a second run in one process) is a no-op
    assert SCORING_FUNCTIONS[REVERSE_LETTERS_SOURCE] is compute_reverse_letters_score

    tokenizer = build_char_tokenizer(chat_template=None)
    answers = [("fedcba", "fedcba"), ("fedcbx", "fedcba")]
    ids = [tokenizer(text)["input_ids"] + [tokenizer.eos_token_id] for text, _ in answers]
    responses, response_mask = right_pad(ids, tokenizer.pad_token_id, 8)
    batch = DataProto.from_dict(
        tensors={"responses": responses, "response_mask": response_mask},
        non_tensors={
            "data_source": [REVERSE_LETTERS_SOURCE] * len(answers),
            "reward_model": [{"ground_truth": truth} for _, truth in answers],
        },
    )
    # The scoring processes import the task module by name to unpickle the function.
    with RewardManager(tokenizer, RewardSection(num_workers=1)) as manager:
        scored = manager.score(batch)
    assert scored.meta_info["metrics"]["reward/errors"] == 0
    per_sample = scored.batch["token_level_scores"].sum(dim=1).tolist()
    assert per_sample == [1.0, pytest.approx(0.5 * 5 / 6)]
