"""The quickstart task's reward, as a plain reward file (``reward.function_path``).

The packaged quickstart configs name this file (``${reverse_letters.reward_file:}``). It
imports nothing heavy, as a reward file should: the reward's scoring processes load it, and
torch or transformers would cost each of them seconds of start-up. Yours can look the same:
one function ``(solution, ground_truth, extra_info) -> float`` (docs/rewards.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hf_algos.examples.letter_tasks import score_letters


def compute_reverse_letters_score(
    solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """1.0 for the exact answer, -0.5 for one of the wrong length (no ``<eos>`` before the
    response cap, or stopped early), else 0.5 x the fraction of right characters.

    The rule of every letter task, :func:`hf_algos.examples.letter_tasks.score_letters`:
    partial credit only for right-length answers, so filling the length cap instead of
    ending with ``<eos>`` is never worth it.
    """
    return score_letters(solution, str(ground_truth))
