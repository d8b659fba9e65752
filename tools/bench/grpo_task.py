"""The quickstart GRPO task, shared by every column of ``bench_grpo.py``.

Task: reverse 6 random lowercase letters. The prompt is ``abcdef=`` (the tokenizer puts
``<bos>`` in front), the answer ``fedcba`` followed by ``<eos>``. Every prompt is 8 tokens and
every answer 7, so batches need no padding.

What lives here:

* a character-level tokenizer built locally with the ``tokenizers`` library (49 symbols:
  ``<pad>``, ``<bos>``, ``<eos>``, ``=``, the lowercase letters, the digits and a few
  punctuation marks), wrapped as a ``transformers`` fast tokenizer so TRL can use it;
* the tiny Qwen2 config (hidden 128, 2 layers, 4 heads, tied embeddings: 0.53M parameters)
  and :func:`build_task_model`, which saves tokenizer and random-weight model to one folder;
* the task rows and the partial-credit reward (1 for an exact answer, else 0.5 x the
  fraction of positions that hold the right letter), both taken from hf-algos
  (``hf_algos.data.make_reverse_letters_rows``, ``hf_algos.rewards``), as the quickstart
  recipe uses them;
* KV-cached batched generation (sampled or greedy) and greedy exact-match evaluation, used
  by every column so accuracy is measured the same way for all of them.

This module imports torch, ``tokenizers``, ``transformers`` and hf-algos (whose reward and
data modules need hf-protocol, not Ray): it runs in the dev venv and in the TRL benchmark
venv alike (``setup_trl_venv.sh`` installs hf-protocol and hf-algos there).
"""

from __future__ import annotations

import os
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from hf_algos.data import make_reverse_letters_rows
from hf_algos.rewards import compute_reverse_letters_score

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)
SEPARATOR = "="
# 3 special tokens + "=" + 26 letters + 10 digits + 9 marks = 49 symbols.
SYMBOLS = (
    *SPECIAL_TOKENS,
    SEPARATOR,
    *string.ascii_lowercase,
    *string.digits,
    *" +-*/,.:?",
)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

WORD_LENGTH = 6
PROMPT_LENGTH = WORD_LENGTH + 2  # <bos> + letters + "="
RESPONSE_LENGTH = WORD_LENGTH + 1  # letters + <eos>
VALIDATION_SEED = 10_000
"""Seed of :func:`validation_rows` (training prompts use small seeds)."""


@dataclass(frozen=True)
class TinyQwen2Spec:
    """Shape of the tiny Qwen2 decoder the quickstart trains (0.53M parameters)."""

    hidden_size: int = 128
    """Width of the residual stream."""
    intermediate_size: int = 512
    """Width of the SwiGLU MLP."""
    num_hidden_layers: int = 2
    """Decoder layers."""
    num_attention_heads: int = 4
    """Query heads (head dim = hidden_size / heads = 32)."""
    num_key_value_heads: int = 4
    """Key/value heads; equal to the query heads (no grouped-query attention)."""
    max_position_embeddings: int = 64
    """Longest sequence the rotary embedding is sized for (the task needs 15)."""


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The task's character-level tokenizer: one id per symbol of :data:`SYMBOLS`.

    Encoding puts ``<bos>`` in front (when ``add_special_tokens`` is true, the default);
    decoding joins characters without spaces. A character outside the 49 symbols is an
    error. Padding is on the left, as generation needs.
    """
    vocab = {symbol: index for index, symbol in enumerate(SYMBOLS)}
    # WordLevel needs an unknown token; <pad> serves, and `encode_prompt` rejects strays.
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
        model_max_length=TinyQwen2Spec.max_position_embeddings,
    )


def tiny_qwen2_config(vocab_size: int = len(SYMBOLS), spec: TinyQwen2Spec | None = None) -> Any:
    """The ``transformers`` Qwen2 config of the task model (tied embeddings, fp32)."""
    spec = spec or TinyQwen2Spec()
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )


def build_task_model(directory: str | os.PathLike[str], seed: int = 0) -> Path:
    """Save the tokenizer and a randomly initialised tiny Qwen2 to ``directory``; return it.

    The folder loads with ``AutoModelForCausalLM.from_pretrained`` and
    ``AutoTokenizer.from_pretrained``. The same seed gives the same weights.
    """
    path = Path(directory)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.float32)
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.save_pretrained(path)
    build_char_tokenizer().save_pretrained(path)
    return path


def make_rows(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` task rows ``{"prompt": "abcdef=", "answer": "fedcba"}`` from ``seed``.

    The words come from :func:`hf_algos.data.make_reverse_letters_rows` (the quickstart's
    generator); only the answer is lifted out of its ``reward_model`` field.
    """
    rows = make_reverse_letters_rows(count, WORD_LENGTH, seed=seed)
    return [
        {"prompt": row["prompt"], "answer": row["reward_model"]["ground_truth"]} for row in rows
    ]


def reverse_letters_reward(completion: str, answer: str) -> float:
    """1.0 for an exact answer, else 0.5 x the fraction of positions holding the right letter.

    The quickstart's reward, :func:`hf_algos.rewards.compute_reverse_letters_score`. The
    partial credit keeps a gradient when no sample of a group is exactly right; with exact
    match alone the run collapsed at lr 3e-4 (see the issue's measurements).
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
