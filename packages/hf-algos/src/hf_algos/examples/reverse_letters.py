"""The quickstart's task, model and tokenizer, all made on the spot (nothing is downloaded).

Shipped in the package so ``hybridflow grpo --config-name quickstart`` runs from a wheel:
the packaged configs name the torch-free :mod:`hf_algos.examples.reverse_letters_reward`
as their reward file (``reward.function_path``) and make
the model and the data on first use through the ``${reverse_letters.*:...}`` resolvers
(:mod:`hf_algos.examples`); ``python -m recipes.quickstart.main`` uses the same code.

Task: reverse six random lowercase letters, ``abcdef=`` -> ``fedcba``. The reward
(:func:`compute_reverse_letters_score`) gives 1 for an exact answer, -0.5 for an answer of
the wrong length (a response without ``<eos>`` is cut one letter too long) and partial
credit for a right-length answer, so a policy that gets most letters right still learns
which ones it got wrong but never gains by dropping ``<eos>``.
:func:`register_reward` hands it to the reward manager for rows whose ``data_source`` is
``reverse_letters``, the way any user adds a scoring function.

Model: a Qwen2 decoder of 0.53M parameters (hidden 128, 2 layers, 4 heads, tied embeddings)
with random weights, next to a character-level tokenizer, in one Hugging Face directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase, Qwen2Config

from hf_algos.data import build_char_tokenizer
from hf_algos.examples.letter_tasks import (
    LetterTask,
    TaskConfig,
    make_letter_rows,
    random_letters,
    register_letter_task,
    write_letter_task_files,
)
from hf_algos.examples.reverse_letters_reward import compute_reverse_letters_score

__all__ = [
    "REVERSE_LETTERS",
    "REVERSE_LETTERS_SOURCE",
    "ModelShape",
    "TaskConfig",
    "build_model_dir",
    "compute_reverse_letters_score",
    "make_reverse_letters_rows",
    "random_letters",
    "read_metrics",
    "register_reward",
    "tiny_qwen2_config",
    "write_task_files",
]

REVERSE_LETTERS_SOURCE = "reverse_letters"
"""The ``data_source`` of the task's rows (the name its scoring function is registered as)."""


def make_reverse_letters_rows(n: int, length: int = 6, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` task rows in the ``hf_algos.data`` row format, reproducible from ``seed``.

    Each row is ``{"prompt": "abcdef=", "data_source": "reverse_letters",
    "reward_model": {"ground_truth": "fedcba"}, "extra_info": {"index": i}}``; the prompt is
    raw text (a chat template, if the tokenizer has one, wraps it as a user message).
    """
    return make_letter_rows(REVERSE_LETTERS, n, length, seed)


def _reversed(word: str) -> str:
    return word[::-1]


REVERSE_LETTERS = LetterTask(REVERSE_LETTERS_SOURCE, _reversed, compute_reverse_letters_score)
"""The task: ``abcdef=`` -> ``fedcba``."""


def register_reward() -> None:
    """Register :func:`compute_reverse_letters_score` for ``data_source`` ``reverse_letters``.

    Call it before a trainer or ``RewardManager`` scores the task's rows; a second call in
    the same process does nothing. The scoring processes import this module by name to
    unpickle the function (it is installed with hf-algos).
    """
    register_letter_task(REVERSE_LETTERS)


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
    """Write the reverse-letters task's ``train.jsonl``, ``val.jsonl`` and ``sft.jsonl``
    (see :func:`~hf_algos.examples.letter_tasks.write_letter_task_files`)."""
    return write_letter_task_files(directory, task, REVERSE_LETTERS)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a jsonl metrics file, in order."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
