"""The quickstart's task, model and tokenizer, all made on the spot (nothing is downloaded).

Task: reverse six random lowercase letters, ``abcdef=`` -> ``fedcba``. The reward gives 1 for
an exact answer and partial credit otherwise (``hf_algos.rewards``'s ``reverse_letters``), so
a policy that gets most letters right still learns which ones it got wrong.

Model: a Qwen2 decoder of 0.53M parameters (hidden 128, 2 layers, 4 heads, tied embeddings)
with random weights, next to a character-level tokenizer, in one Hugging Face directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from hf_algos.data import build_char_tokenizer, make_reverse_letters_rows, write_rows


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
    """Attention heads (no grouped-query attention)."""
    vocab_size: int = 128
    """Embedding rows; the character tokenizer uses the first ~103."""


def build_model_dir(directory: Path, shape: ModelShape, seed: int) -> Path:
    """Save a random-weight tiny Qwen2 and the character tokenizer to ``directory``."""
    tokenizer = build_char_tokenizer(directory, chat_template=None)
    config = Qwen2Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_attention_heads,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)
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
