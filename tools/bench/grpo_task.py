"""The quickstart GRPO task, shared by every column of ``bench_grpo.py``.

Task: reverse 6 random lowercase letters. The prompt is ``abcdef=`` (the tokenizer puts
``<bos>`` in front), the answer ``fedcba`` followed by ``<eos>``. Every prompt is 8 tokens and
every answer 7, so batches need no padding.

What lives here:

* the task's character-level tokenizer (49 symbols: ``<pad>``, ``<bos>``, ``<eos>``, ``=``,
  the lowercase letters, the digits and a few punctuation marks), built by
  ``hf_algos.data.build_char_tokenizer`` with this smaller alphabet and ``<bos>`` in front;
* :func:`build_task_model`: that tokenizer and the quickstart's random-weight tiny Qwen2
  (``hf_algos.examples.reverse_letters.ModelShape``: hidden 128, 2 layers, 4 heads, tied embeddings,
  0.53M parameters) saved to one folder;
* the task rows and the reward (1 for an exact answer, -0.5 for an answer of the wrong
  length, e.g. no ``<eos>`` before the 7-token cap, else 0.5 x the fraction of positions
  that hold the right letter), both the quickstart recipe's own
  (``hf_algos/examples/reverse_letters.py``, reward in ``reverse_letters_reward.py``);
* KV-cached batched generation (sampled or greedy) and greedy exact-match evaluation, used
  by every column so accuracy is measured the same way for all of them.

This module imports torch, ``transformers``, hf-algos (whose data and reward modules need
hf-protocol, not Ray) and the quickstart recipe's task module (found from the repository
root, which it puts on ``sys.path``): it runs in the dev venv and in the TRL benchmark venv
alike (``setup_trl_venv.sh`` installs hf-protocol and hf-algos there).
"""

from __future__ import annotations

import os
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from hf_algos.data import build_char_tokenizer

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `recipes` is a folder of the repository, not a package
from hf_algos.examples.reverse_letters import (  # noqa: E402
    ModelShape,
    build_model_dir,
    compute_reverse_letters_score,
    make_reverse_letters_rows,
)

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)
SEPARATOR = "="
ALPHABET = (SEPARATOR, *string.ascii_lowercase, *string.digits, *" +-*/,.:?")
"""The task tokenizer's characters: "=", 26 letters, 10 digits, 9 marks."""
SYMBOLS = (*SPECIAL_TOKENS, *ALPHABET)
"""Every token, in id order: 3 special tokens + 46 characters = 49 symbols."""
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

WORD_LENGTH = 6
PROMPT_LENGTH = WORD_LENGTH + 2  # <bos> + letters + "="
RESPONSE_LENGTH = WORD_LENGTH + 1  # letters + <eos>
VALIDATION_SEED = 10_000
"""Seed of :func:`validation_rows` (training prompts use small seeds)."""

MODEL_SHAPE = ModelShape(vocab_size=len(SYMBOLS))
"""The quickstart's tiny Qwen2 with one embedding row per symbol (the recipe's has 128)."""


def build_task_tokenizer() -> PreTrainedTokenizerFast:
    """The task's character-level tokenizer: one id per symbol of :data:`SYMBOLS`.

    Encoding puts ``<bos>`` in front (when ``add_special_tokens`` is true, the default);
    decoding joins characters without spaces. A character outside the 49 symbols encodes
    as ``<pad>`` (:func:`encode_prompts` rejects them). Padding is on the left, as
    generation needs.
    """
    tokenizer = build_char_tokenizer(
        chat_template=None,
        characters=ALPHABET,
        special_tokens=SPECIAL_TOKENS,
        add_bos_token=True,
        padding_side="left",
    )
    tokenizer.model_max_length = MODEL_SHAPE.max_position_embeddings
    return tokenizer


def build_task_model(directory: str | os.PathLike[str], seed: int = 0) -> Path:
    """Save the tokenizer and a randomly initialised tiny Qwen2 to ``directory``; return it.

    The folder loads with ``AutoModelForCausalLM.from_pretrained`` and
    ``AutoTokenizer.from_pretrained``. The same seed gives the same weights.
    """
    return build_model_dir(Path(directory), MODEL_SHAPE, seed, build_task_tokenizer())


def make_rows(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` task rows ``{"prompt": "abcdef=", "answer": "fedcba"}`` from ``seed``.

    The words come from the quickstart recipe's ``make_reverse_letters_rows``; only the
    answer is lifted out of its ``reward_model`` field.
    """
    rows = make_reverse_letters_rows(count, WORD_LENGTH, seed=seed)
    return [
        {"prompt": row["prompt"], "answer": row["reward_model"]["ground_truth"]} for row in rows
    ]


def reverse_letters_reward(completion: str, answer: str) -> float:
    """1.0 for an exact answer, -0.5 for one of the wrong length, else 0.5 x the fraction of
    positions holding the right letter.

    The quickstart's reward,
    ``hf_algos.examples.reverse_letters.compute_reverse_letters_score``. The partial credit
    keeps a gradient when no sample of a group is exactly right; with exact match alone the
    run collapsed at lr 3e-4. The wrong-length penalty stops the policy from dropping
    ``<eos>`` to fill the cap (:func:`completion_texts` cuts at the first ``<eos>``, so a
    response without one is 7 letters long).
    """
    return compute_reverse_letters_score(completion, answer)


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[str]) -> torch.Tensor:
    """Token ids ``(B, PROMPT_LENGTH)`` of the prompts, ``<bos>`` first."""
    for prompt in prompts:
        stray = set(prompt) - set(SYMBOLS)
        if stray or len(prompt) != PROMPT_LENGTH - 1:
            raise ValueError(
                f"prompt {prompt!r} is not {WORD_LENGTH} task symbols plus {SEPARATOR!r}; "
                "build prompts with make_rows"
            )
    return tokenizer(prompts, return_tensors="pt")["input_ids"]


def completion_texts(tokenizer: PreTrainedTokenizerBase, responses: torch.Tensor) -> list[str]:
    """Decode ``(B, R)`` response ids to text, cut at the first ``<eos>``."""
    texts = []
    for row in responses.tolist():
        if EOS_ID in row:
            row = row[: row.index(EOS_ID)]
        texts.append(str(tokenizer.decode(row, skip_special_tokens=True)))
    return texts


def response_mask(responses: torch.Tensor) -> torch.Tensor:
    """``(B, R)`` float mask: 1 up to and including the first ``<eos>``, 0 after it."""
    is_eos = (responses == EOS_ID).to(torch.int64)
    after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0
    return (~after_eos).to(torch.float32)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    max_new_tokens: int = RESPONSE_LENGTH,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample (or, at ``temperature == 0``, greedily pick) ``max_new_tokens`` per prompt.

    ``prompt_ids`` is ``(B, P)`` with no padding. One prefill, then one cached forward per
    token. Returns ``(responses, log_probs)``, both ``(B, max_new_tokens)``: the log-prob of
    each chosen token under the temperature-scaled distribution the sampler drew from
    (at temperature 1, the policy's own). Tokens after ``<eos>`` are kept; mask them with
    :func:`response_mask`.
    """
    output = model(input_ids=prompt_ids, use_cache=True)
    cache, logits = output.past_key_values, output.logits[:, -1, :]
    tokens, log_probs = [], []
    for step in range(max_new_tokens):
        scaled = logits.float() / (temperature if temperature > 0 else 1.0)
        logp = torch.log_softmax(scaled, dim=-1)
        if temperature > 0:
            chosen = torch.multinomial(logp.exp(), 1, generator=generator)
        else:
            chosen = logp.argmax(dim=-1, keepdim=True)
        tokens.append(chosen)
        log_probs.append(logp.gather(1, chosen))
        if step + 1 < max_new_tokens:
            output = model(input_ids=chosen, past_key_values=cache, use_cache=True)
            cache, logits = output.past_key_values, output.logits[:, -1, :]
    return torch.cat(tokens, dim=1), torch.cat(log_probs, dim=1)


def exact_match_accuracy(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, str]],
    batch_size: int = 256,
) -> float:
    """Greedy exact-match accuracy of ``model`` on ``rows`` (fraction in [0, 1])."""
    was_training = model.training
    model.eval()
    right = 0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        prompt_ids = encode_prompts(tokenizer, [row["prompt"] for row in chunk])
        responses, _ = generate(model, prompt_ids, temperature=0.0)
        texts = completion_texts(tokenizer, responses)
        right += sum(text == row["answer"] for text, row in zip(texts, chunk, strict=True))
    model.train(was_training)
    return right / len(rows)


def validation_rows(count: int = 256) -> list[dict[str, str]]:
    """The fixed validation set every column is scored on (its own seed, never trained on
    by construction: 26^6 words make an overlap with training draws negligible)."""
    return make_rows(count, seed=VALIDATION_SEED)


@dataclass
class RunRecord:
    """What a column of the benchmark reports (written as JSON by every baseline)."""

    name: str
    """Column name."""
    warmup_accuracy: float = float("nan")
    """Greedy accuracy of the starting checkpoint."""
    step_seconds: list[float] = field(default_factory=list)
    """Training wall time of each GRPO step (evaluation excluded)."""
    step_cpu_seconds: list[float] = field(default_factory=list)
    """CPU time of the measuring process in each step (empty where the work runs in other
    processes): less sensitive than wall time to other programs sharing the cores."""
    evals: list[dict[str, float]] = field(default_factory=list)
    """``{"step", "train_seconds", "accuracy"}`` at each evaluation."""
    notes: str = ""
    """Free text: settings that differ from the defaults, warnings."""
