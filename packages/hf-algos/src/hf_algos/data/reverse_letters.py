"""Generated data for the quickstart task: reverse a few random lowercase letters.

A prompt is the letters followed by ``=`` (``"abcdef="``) and the answer is the letters
reversed (``"fedcba"``); :func:`hf_algos.rewards.compute_reverse_letters_score` scores it.
The task is small enough that a tiny model learns it on CPU, so the quickstart shows the
reward rising from near 0.
"""

from __future__ import annotations

import random
import string
from typing import Any

from hf_protocol import fields

REVERSE_LETTERS_SOURCE = "reverse_letters"
"""The ``data_source`` of the reverse-letters task (its key in the scoring registry)."""


def make_reverse_letters_rows(n: int, length: int = 6, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` task rows in the dataset row format, reproducible from ``seed``.

    Each row is ``{"prompt": "abcdef=", "data_source": "reverse_letters",
    "reward_model": {"ground_truth": "fedcba"}, "extra_info": {"index": i}}``; the prompt is
    raw text (a chat template, if the tokenizer has one, wraps it as a user message).
    """
    if n < 0 or length < 1:
        raise ValueError(f"need n >= 0 and length >= 1, got n={n}, length={length}")
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        letters = "".join(rng.choice(string.ascii_lowercase) for _ in range(length))
        rows.append(
            {
                "prompt": f"{letters}=",
                fields.DATA_SOURCE: REVERSE_LETTERS_SOURCE,
                fields.REWARD_MODEL: {"ground_truth": letters[::-1]},
                fields.EXTRA_INFO: {"index": index},
            }
        )
    return rows
