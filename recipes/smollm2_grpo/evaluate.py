"""Held-out accuracy of a Hugging Face model directory in plain transformers.

The exported model of the recipe is checked here with nothing of HybridFlow's stack but the
prompt text (:func:`hf_algos.data.prompts.encode_prompt`, the chat template as the trainer
applied it) and the task's scorer: greedy answers of ``max_new_tokens`` tokens, scored by
the reasoning-gym verifier the trainer's validation used.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_algos.data.prompts import encode_prompt
from hf_algos.data.reasoning_gym import reasoning_gym_rows
from hf_algos.rewards.reasoning_gym import compute_reasoning_gym_score


def greedy_accuracy(
    model_dir: Path,
    spec: str,
    max_new_tokens: int = 32,
    batch_size: int = 16,
    dtype: torch.dtype = torch.float32,
) -> float:
    """Share of the rows of the reasoning-gym ``spec`` that the model at ``model_dir``
    answers right, greedily, in plain transformers (left-padded batches), with its weights
    in ``dtype`` (the run's rollout dtype, so that both measure the same model)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    rows = reasoning_gym_rows(spec)
    right = 0.0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        prompts = [encode_prompt(tokenizer, row["prompt"], True) for row in chunk]
        width = max(map(len, prompts))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=pad,
            )
        for row, ids in zip(chunk, out[:, width:].tolist(), strict=True):
            reply = str(tokenizer.decode(ids, skip_special_tokens=True))
            truth = row["reward_model"]["ground_truth"]
            right += float(compute_reasoning_gym_score(reply, truth, row["extra_info"]) >= 1.0)
    return right / len(rows)
