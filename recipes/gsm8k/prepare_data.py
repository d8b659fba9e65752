"""Turn a local copy of GSM8K into the RL row format of ``hf_algos.data`` (train / test parquet).

Input: the files of the Hugging Face dataset ``openai/gsm8k`` (``main/train-*.parquet`` and
``main/test-*.parquet``) or of the original release (``train.jsonl`` / ``test.jsonl``); each
example has a ``question`` and an ``answer`` whose last line is ``#### <number>``.

Output, one row per example::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "<question> <instruction>"}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, "question": ..., "answer": ...}}

``hf_algos.rewards`` scores a response 1 when the number after its last ``####`` equals the
ground truth, so the instruction asks the model to end that way.

Run from the repository root::

    python -m recipes.gsm8k.prepare_data --src ~/data/gsm8k --out data/gsm8k
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_algos.data import read_rows, write_rows
from hf_algos.rewards.gsm8k import extract_gsm8k_answer

DATA_SOURCE = "openai/gsm8k"
"""The rows' ``data_source``: the key of the GSM8K scoring function in ``hf_algos.rewards``."""

INSTRUCTION = 'Reason step by step, then write the final answer as "#### <number>".'
"""Appended to every question; the reward reads the number after the last ``####``."""

SPLITS = ("train", "test")

_PATTERNS = ("main/{split}-*.parquet", "{split}-*.parquet", "{split}.parquet", "{split}.jsonl")
"""Where a split's files are looked for under ``--src``, first match wins."""


def find_split_files(src: Path, split: str) -> list[Path]:
    """The files of ``split`` under ``src`` (HF parquet shards or the original jsonl)."""
    for pattern in _PATTERNS:
        files = sorted(src.glob(pattern.format(split=split)))
        if files:
            return files
    tried = ", ".join(pattern.format(split=split) for pattern in _PATTERNS)
    raise FileNotFoundError(
        f"no GSM8K {split!r} files under {str(src)!r} (looked for {tried}); point --src at the "
        "folder of the dataset's files (the Hugging Face copy holds main/train-*.parquet)"
    )


def ground_truth(answer: str, where: str) -> str:
    """The number after ``####`` in a GSM8K solution, commas removed (``"1,234"`` -> ``"1234"``)."""
    number = extract_gsm8k_answer(answer, strict=True)
    if number is None:
        raise ValueError(f"{where}: the answer has no '#### <number>' line: {answer[-80:]!r}")
    return number


def to_rl_row(example: dict[str, Any], split: str, index: int, instruction: str) -> dict[str, Any]:
    """One GSM8K example as an RL prompt row (see the module docstring)."""
    where = f"{split} example {index}"
    missing = [key for key in ("question", "answer") if key not in example]
    if missing:
        raise KeyError(f"{where} lacks {missing} (fields: {sorted(example)})")
    question, answer = str(example["question"]), str(example["answer"])
    content = f"{question} {instruction}".strip()
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth(answer, where)},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
    }


def prepare_gsm8k(
    src: Path, out: Path, instruction: str = INSTRUCTION, limit: int | None = None
) -> dict[str, Path]:
    """Write ``out/train.parquet`` and ``out/test.parquet``; return them by split.

    ``limit`` keeps only the first examples of each split (for a quick try).
    """
    written = {}
    for split in SPLITS:
        examples = read_rows(find_split_files(src, split))[:limit]
        rows = [to_rl_row(ex, split, i, instruction) for i, ex in enumerate(examples)]
        written[split] = write_rows(rows, out / f"{split}.parquet")
        print(f"{split}: {len(rows)} rows -> {written[split]}")
    return written


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line: where the GSM8K files are, where the parquet files go."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--src", type=Path, required=True, help="local GSM8K folder")
    parser.add_argument("--out", type=Path, default=Path("data/gsm8k"), help="output folder")
    parser.add_argument("--instruction", default=INSTRUCTION, help="appended to each question")
    parser.add_argument("--limit", type=int, default=None, help="keep the first N per split")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    prepare_gsm8k(args.src, args.out, args.instruction, args.limit)
