"""The tool_calc task: multiply two 3-digit numbers, with or without the ``calc`` tool.

Everything is made on the spot (nothing is downloaded):

* **data**: prompts ``a*b=`` with ``a`` and ``b`` drawn from 317..999, the product as the
  ground truth; held-out prompts come from their own seed and never appear in training;
* **demonstrations** for the supervised warm-up. With the tool, one episode
  ``a*b=`` -> ``<calc>a*b</calc><eos>`` [environment: ``<result>P</result>``] ``P<eos>`` is
  written as two SFT rows, one per model turn, each with everything before the turn as its
  prompt: the SFT loss covers the model's tokens only, never the environment's (the SFT
  trainer has no per-token loss mask inside a response, so the turns are split instead).
  Without the tool the row is ``a*b=`` -> ``P<eos>``;
* **tokenizer**: one token per printable character, and the tool tags ``<calc>``,
  ``</calc>``, ``<result>``, ``</result>``, ``<error>``, ``</error>`` as single non-special
  tokens (decoding keeps them, so the environment and the reward see them). A model turn
  ends at ``<eos>``, as a chat model's assistant turn ends at its end-of-turn token, so the
  tool call ``<calc>...</calc><eos>`` ends the turn and the environment answers.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

from hf_algos.data import build_char_tokenizer, write_rows
from hf_algos.data.tokenizer import PRINTABLE_CHARACTERS

DATA_SOURCE = "tool_calc"
"""The ``data_source`` of the task's rows."""

TOOL_TAGS: tuple[str, ...] = (
    "<calc>",
    "</calc>",
    "<result>",
    "</result>",
    "<error>",
    "</error>",
)
"""The tags of a tool call and of the environment's replies, one token each."""

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<unk>", "<bos>", "<eos>")
"""Special tokens of the task's tokenizer (``<pad>`` = 0, ``<eos>`` = 3)."""


@dataclass(frozen=True)
class TaskConfig:
    """How much of the task's data to generate."""

    low: int = 317
    """Smallest factor. 317..999 are 3-digit numbers whose products all have 6 digits
    (317 x 317 = 100489): with 100..999, 17 % of products have 5 digits, and the 0.5M model
    kept copying those as 6 (held-out accuracy stuck at 0.83 after 120 GRPO steps, measured)."""
    high: int = 999
    """Largest factor."""
    train_prompts: int = 20_000
    """Distinct training prompts for GRPO."""
    demonstrations: int = 4_000
    """Episodes the warm-up's rows are made from (the no-tool arm gets as many rows as the
    tool arm, whose episodes are two rows each: the same SFT budget)."""
    val_prompts: int = 200
    """Held-out prompts for greedy exact-match accuracy."""
    seed: int = 0
    """Seed of the data and of the model's random initialisation."""


def make_rows(n: int, low: int, high: int, seed: int) -> list[dict[str, Any]]:
    """``n`` task rows in the ``hf_algos.data`` row format, reproducible from ``seed``.

    Each row: ``{"prompt": "123*456=", "data_source": "tool_calc", "reward_model":
    {"ground_truth": "56088"}, "extra_info": {"index": i}}``.
    """
    if n < 0 or not 0 <= low <= high:
        raise ValueError(f"need n >= 0 and 0 <= low <= high, got n={n}, low={low}, high={high}")
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        a, b = rng.randint(low, high), rng.randint(low, high)
        rows.append(
            {
                "prompt": f"{a}*{b}=",
                "data_source": DATA_SOURCE,
                "reward_model": {"ground_truth": str(a * b)},
                "extra_info": {"index": index},
            }
        )
    return rows


def tool_demonstration(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """The two SFT rows (one per model turn) of a tool-use episode for task ``row``.

    Turn 1 answers the prompt with the call; turn 2 sees the call, its ``<eos>`` and the
    environment's ``<result>`` as its prompt and answers with the value (the SFT trainer
    appends ``<eos>`` to each response).
    """
    prompt, product = str(row["prompt"]), str(row["reward_model"]["ground_truth"])
    call = f"<calc>{prompt[:-1]}</calc>"
    return [
        {"prompt": prompt, "response": call},
        {"prompt": f"{prompt}{call}<eos><result>{product}</result>", "response": product},
    ]


def direct_demonstration(row: Mapping[str, Any]) -> dict[str, str]:
    """The SFT row of the no-tool arm: the product straight after the prompt."""
    return {"prompt": str(row["prompt"]), "response": str(row["reward_model"]["ground_truth"])}


def write_task_files(directory: Path, task: TaskConfig) -> dict[str, Path]:
    """Write ``train.jsonl``, ``val.jsonl`` (prompts), ``sft_tool.jsonl`` and
    ``sft_direct.jsonl`` (warm-up rows of each arm, the same number of rows); return paths.

    The warm-up episodes are the first training prompts; the no-tool arm's rows are the
    first ``2 x demonstrations`` training prompts, so both arms train on as many rows.
    """
    val = make_rows(task.val_prompts, task.low, task.high, seed=task.seed + 1)
    held_out = {row["prompt"] for row in val}
    train = [
        row
        for row in make_rows(task.train_prompts, task.low, task.high, task.seed)
        if row["prompt"] not in held_out
    ]
    tool = [turn for row in train[: task.demonstrations] for turn in tool_demonstration(row)]
    direct = [direct_demonstration(row) for row in train[: len(tool)]]
    tables = {"train": train, "val": val, "sft_tool": tool, "sft_direct": direct}
    return {name: write_rows(rows, directory / f"{name}.jsonl") for name, rows in tables.items()}


def build_tokenizer(directory: Path | None = None) -> PreTrainedTokenizerFast:
    """The character tokenizer plus the tool tags as single (non-special) tokens.

    Non-special, so ``decode(..., skip_special_tokens=True)`` keeps them and the environment
    and reward see ``<calc>...</calc>``; encoding matches them in text before splitting into
    characters. Saved to ``directory`` when given.
    """
    tokenizer = build_char_tokenizer(
        chat_template=None, characters=PRINTABLE_CHARACTERS, special_tokens=SPECIAL_TOKENS
    )
    tokenizer.add_tokens(list(TOOL_TAGS), special_tokens=False)
    if directory is not None:
        tokenizer.save_pretrained(directory)
    return tokenizer
