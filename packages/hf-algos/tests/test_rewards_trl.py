"""TRL users' rows and reward functions work unchanged: prompt-only rows (no data_source, no
reward_model), dataset columns passed to the function by name, completions given as
TRL gives them (one assistant message per chat completion), and TRL's reward functions
called with their exact signatures (``accuracy_reward(completions, solution, log_extra=None,
**kwargs)``, ``think_format_reward(completions, **kwargs)``, as in trl.rewards)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from hf_algos.config import RewardSection
from hf_algos.data import RLDataset, RLDatasetConfig, build_char_tokenizer
from hf_algos.data.collate import COLUMNS
from hf_algos.rewards import RewardManager
from hf_algos.rewards.user_file import FileScoringFunction
from hf_controller import ConfigurationError

from .test_rewards_manager import make_batch

TRL_REWARDS = textwrap.dedent(
    """
    import re

    from math_verify import parse, verify

    SEEN = []

    def accuracy_reward(completions, solution, log_extra=None, **kwargs):
        # trl.rewards.accuracy_reward's signature and inputs: one assistant message per
        # completion, the dataset's solution column, the other columns in kwargs
        assert kwargs["level"] == [1, 2, 3], kwargs
        contents = [completion[0]["content"] for completion in completions]
        return [float(verify(parse(s), parse(c))) for c, s in zip(contents, solution)]

    def think_format_reward(completions, **kwargs):
        pattern = r"^<think>(?!.*<think>)(.*?)</think>.*$"
        contents = [completion[0]["content"] for completion in completions]
        return [1.0 if re.match(pattern, c, re.DOTALL | re.MULTILINE) else 0.0 for c in contents]

    def reverse_reward(completions, solution, **kwargs):
        # a plain-text prompt gets plain-text completions, as in TRL
        return [float(c.strip() == s) for c, s in zip(completions, solution)]
    """
)
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]


def _manager(tmp_path: Path, name: str) -> RewardManager:
    path = tmp_path / "trl_rewards.py"
    path.write_text(TRL_REWARDS)
    function = FileScoringFunction(str(path), name)
    return RewardManager(
        build_char_tokenizer(), RewardSection(num_workers=1), default_function=function
    )


def _trl_batch(texts: list[str], columns: list[dict]) -> object:
    """Chat prompts with no data_source and no reward_model: TRL's prompt-only rows."""
    batch = make_batch(build_char_tokenizer(), [(t, "", "") for t in texts])
    size = len(texts)
    batch.non_tensor_batch["data_source"][:] = None
    batch.non_tensor_batch["reward_model"][:] = None
    batch.non_tensor_batch["raw_prompt"] = _objects([CHAT] * size)
    batch.non_tensor_batch[COLUMNS] = _objects(columns)
    return batch


def _objects(values: list) -> object:
    import numpy as np

    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def test_trl_accuracy_reward_gets_columns_and_chat_completions(tmp_path: Path) -> None:
    columns = [{"solution": "$4$", "level": level} for level in (1, 2, 3)]
    batch = _trl_batch(["4", "5", "\\boxed{4}"], columns)
    with _manager(tmp_path, "accuracy_reward") as manager:
        out = manager.score(batch)  # type: ignore[arg-type]
    assert out.batch["token_level_scores"].sum(-1).tolist() == [1.0, 0.0, 1.0]
    with _manager(tmp_path, "think_format_reward") as manager:
        think = _trl_batch(["<think>a</think>4", "4", "<think>a"], columns)
        scores = manager.score(think).batch["token_level_scores"].sum(-1)  # type: ignore[arg-type]
    assert scores.tolist() == [1.0, 0.0, 0.0]


def test_a_column_the_rows_lack_is_named(tmp_path: Path) -> None:
    batch = _trl_batch(["4"], [{"answer": "4"}])
    with (
        _manager(tmp_path, "accuracy_reward") as manager,
        pytest.raises(ConfigurationError, match=r"column\(s\) \['solution'\], which row 0 lacks"),
    ):
        manager.score(batch)  # type: ignore[arg-type]


def test_prompt_only_rows_load_and_carry_their_columns(tmp_path: Path) -> None:
    rows = tmp_path / "trl.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps({"prompt": p, "solution": p[::-1], "id": i})
            for i, p in enumerate(["ab", "cd"])
        )
    )
    tokenizer = build_char_tokenizer()
    with pytest.raises(ValueError, match="field 'data_source' is missing"):
        RLDataset(str(rows), tokenizer)  # data_source routes the scoring by default
    dataset = RLDataset(str(rows), tokenizer, RLDatasetConfig(require_reward_fields=False))
    batch = dataset.collate([dataset[0], dataset[1]])
    assert list(batch.non_tensor_batch[COLUMNS]) == [
        {"solution": "ba", "id": 0},
        {"solution": "dc", "id": 1},
    ]
