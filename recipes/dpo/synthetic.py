"""A tiny synthetic preference dataset: reversing letters, right answer vs a near miss.

Each row is ``{"prompt": "abcd=", "chosen": "dcba", "rejected": ...}`` where the rejected
answer is the letters copied unchanged, or reversed with one letter wrong, so the pairs
teach a preference a tiny model can pick up on CPU within a few dozen steps.

    python -m recipes.dpo.synthetic --out data/prefs/train.jsonl --pairs 2048
"""

from __future__ import annotations

import argparse
import random
import string
from pathlib import Path
from typing import Any

from hf_algos.data import write_rows
from hf_algos.examples.reverse_letters import random_letters


def near_miss(answer: str, rng: random.Random) -> str:
    """``answer`` with one letter replaced by another."""
    position = rng.randrange(len(answer))
    other = rng.choice([c for c in string.ascii_lowercase if c != answer[position]])
    return answer[:position] + other + answer[position + 1 :]


def make_preference_rows(pairs: int, length: int = 4, seed: int = 0) -> list[dict[str, Any]]:
    """``pairs`` rows of ``prompt`` / ``chosen`` / ``rejected``, reproducible from ``seed``."""
    if pairs < 1 or length < 2:
        raise ValueError(f"need pairs >= 1 and length >= 2, got pairs={pairs}, length={length}")
    rng = random.Random(seed)
    rows = []
    for _ in range(pairs):
        letters = random_letters(rng, length)
        chosen = letters[::-1]
        rejected = letters if rng.random() < 0.5 and letters != chosen else near_miss(chosen, rng)
        rows.append({"prompt": f"{letters}=", "chosen": chosen, "rejected": rejected})
    return rows


def write_preference_files(directory: Path, train: int, val: int, seed: int = 0) -> list[Path]:
    """``train.jsonl`` and ``val.jsonl`` under ``directory`` (disjoint seeds)."""
    return [
        write_rows(make_preference_rows(train, seed=seed), directory / "train.jsonl"),
        write_rows(make_preference_rows(val, seed=seed + 1), directory / "val.jsonl"),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output .jsonl (or .parquet)")
    parser.add_argument("--pairs", type=int, default=2048, help="number of pairs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = write_rows(make_preference_rows(args.pairs, seed=args.seed), args.out)
    print(f"{args.pairs} pairs -> {path}")
