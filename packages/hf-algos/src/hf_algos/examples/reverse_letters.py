"""The quickstart's task, model and tokenizer, all made on the spot (nothing is downloaded).

Shipped in the package so ``hybridflow grpo --config-name quickstart`` runs from a wheel:
the packaged configs name this file as their reward (``reward.function_path``) and make
the model and the data on first use through the ``${reverse_letters.*:...}`` resolvers
(:mod:`hf_algos.examples`); ``python -m recipes.quickstart.main`` uses the same code.

Task: reverse six random lowercase letters, ``abcdef=`` -> ``fedcba``. The reward
(:func:`compute_reverse_letters_score`) gives 1 for an exact answer and partial credit
otherwise, so a policy that gets most letters right still learns which ones it got wrong.
:func:`register_reward` hands it to the reward manager for rows whose ``data_source`` is
``reverse_letters``, the way any user adds a scoring function.

Model: a Qwen2 decoder of 0.53M parameters (hidden 128, 2 layers, 4 heads, tied embeddings)
with random weights, next to a character-level tokenizer, in one Hugging Face directory.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase, Qwen2Config

from hf_algos.data import build_char_tokenizer, write_rows
from hf_algos.rewards import SCORING_FUNCTIONS, register_scoring_function

REVERSE_LETTERS_SOURCE = "reverse_letters"
"""The ``data_source`` of the task's rows (the name its scoring function is registered as)."""


def random_letters(rng: random.Random, length: int) -> str:
    """``length`` random lowercase letters drawn from ``rng``."""
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))


def make_reverse_letters_rows(n: int, length: int = 6, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` task rows in the ``hf_algos.data`` row format, reproducible from ``seed``.

    Each row is ``{"prompt": "abcdef=", "data_source": "reverse_letters",
    "reward_model": {"ground_truth": "fedcba"}, "extra_info": {"index": i}}``; the prompt is
    raw text (a chat template, if the tokenizer has one, wraps it as a user message).
    """
    if n < 0 or length < 1:
        raise ValueError(f"need n >= 0 and length >= 1, got n={n}, length={length}")
    rng = random.Random(seed)
    words = [random_letters(rng, length) for _ in range(n)]
    return [
        {
            "prompt": f"{letters}=",
            "data_source": REVERSE_LETTERS_SOURCE,
            "reward_model": {"ground_truth": letters[::-1]},
            "extra_info": {"index": index},
        }
        for index, letters in enumerate(words)
    ]


def compute_reverse_letters_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """1.0 for the exact answer, else 0.5 x the fraction of right characters.

    The answer is ``solution`` with surrounding whitespace removed. Characters are compared
    position by position over the expected length, so a partly right answer earns partial
    credit that a small model can climb; extra characters only cost the exact-match bonus.
    """
    expected = str(ground_truth)
    answer = solution.strip()
    if answer == expected:
        return 1.0
    if not expected:
        return 0.0
    right = sum(1 for got, want in zip(answer, expected, strict=False) if got == want)
    return 0.5 * right / len(expected)


def register_reward() -> None:
    """Register :func:`compute_reverse_letters_score` for ``data_source`` ``reverse_letters``.

    Call it before a trainer or ``RewardManager`` scores the task's rows; a second call in
    the same process does nothing. The scoring processes import this module by name to
    unpickle the function (it is installed with hf-algos).
    """
    if SCORING_FUNCTIONS.get(REVERSE_LETTERS_SOURCE) is not compute_reverse_letters_score:
        register_scoring_function(REVERSE_LETTERS_SOURCE, compute_reverse_letters_score)


@dataclass(frozen=True)
class TaskConfig:
    """How much task data to generate."""

    word_length: int = 6
    """Letters per prompt."""
    train_prompts: int = 20_000
    """Distinct training prompts (GRPO and the SFT warm-up draw from them)."""
    sft_rows: int = 5_760
    """Prompt + answer rows for the SFT warm-up (steps x batch size of the warm-up)."""
    val_prompts: int = 256
    """Held-out prompts for greedy exact-match accuracy."""
    seed: int = 0
    """Seed of the data and of the model's random initialisation."""


@dataclass(frozen=True)
class ModelShape:
    """Shape of the tiny Qwen2 decoder."""

    hidden_size: int = 128
    """Width of the residual stream."""
    intermediate_size: int = 512
    """Width of the SwiGLU MLP."""
    num_hidden_layers: int = 2
    """Decoder layers."""
    num_attention_heads: int = 4
    """Attention heads (as many key/value heads: no grouped-query attention)."""
    vocab_size: int = 128
    """Embedding rows; the character tokenizer uses the first ~103."""
    max_position_embeddings: int = 64
    """Longest sequence the rotary embedding is sized for (the task needs about 15)."""


def tiny_qwen2_config(shape: ModelShape, tokenizer: PreTrainedTokenizerBase) -> Qwen2Config:
    """The ``transformers`` config of the tiny Qwen2 (tied embeddings), ``tokenizer``'s ids."""
    return Qwen2Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_attention_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def build_model_dir(
    directory: Path,
    shape: ModelShape,
    seed: int,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> Path:
    """Save a random-weight tiny Qwen2 and its tokenizer to ``directory``; return it.

    ``tokenizer`` defaults to the character tokenizer without a chat template. The same
    seed gives the same weights.
    """
    tokenizer = tokenizer or build_char_tokenizer(chat_template=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            tiny_qwen2_config(shape, tokenizer), dtype=torch.float32
        )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_task_files(directory: Path, task: TaskConfig) -> dict[str, Path]:
    """Write ``train.jsonl``, ``val.jsonl`` (prompts) and ``sft.jsonl`` (prompt + response).

    Validation prompts are drawn from their own seed and removed from the training set, so
    accuracy is measured on words the policy never trained on.
    """
    directory.mkdir(parents=True, exist_ok=True)
    val = make_reverse_letters_rows(task.val_prompts, task.word_length, seed=task.seed + 1)
    held_out = {row["prompt"] for row in val}
    train = [
        row
        for row in make_reverse_letters_rows(task.train_prompts, task.word_length, task.seed)
        if row["prompt"] not in held_out
    ]
    sft = [
        {**row, "response": row["reward_model"]["ground_truth"]} for row in train[: task.sft_rows]
    ]
    paths = {name: directory / f"{name}.jsonl" for name in ("train", "val", "sft")}
    for name, rows in (("train", train), ("val", val), ("sft", sft)):
        write_rows(rows, paths[name])
    return paths


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a jsonl metrics file, in order."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
