"""SmolLM2 on reasoning-gym's chain_sum, shared by the plain-loop and TRL columns of
``bench_real_grpo.py``.

What lives here, used the same way in the dev venv and in the TRL venv:

* :class:`RealSettings`: the GRPO settings every column runs with, read by the driver from
  HybridFlow's resolved ``smollm2_chain_sum`` config and handed to the columns as JSON;
* the rows (verl schema, written once to jsonl by the driver) and their prompt ids, built
  as HybridFlow's data pipeline builds them (``hf_algos.data.prompts.encode_prompt``: the
  chat template's text with the generation prompt, tokenized without special tokens);
* the scorer: ``hf_algos/rewards/reasoning_gym.py`` loaded by file path (torch-free, needs
  only ``reasoning_gym``), so every column scores with the same code as HybridFlow's reward;
* the compute precision (:func:`autocast`: fp32, or bf16 autocast over fp32 weights);
* batched ``model.generate`` (left-padded prompts) and the evaluator: greedy accuracy and
  the accuracy of ``val_samples`` seeded samples at the training temperature on the
  held-out rows (right = score >= 1, as HybridFlow's ``val/accuracy``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

ROOT = Path(__file__).resolve().parents[2]
SCORER_FILE = ROOT / "packages" / "hf-algos" / "src" / "hf_algos" / "rewards" / "reasoning_gym.py"
PRECISIONS = ("float32", "bfloat16")
"""Compute precisions every column can run (:attr:`RealSettings.precision`)."""


@dataclass
class RealSettings:
    """The GRPO settings of every column (the values of HybridFlow's resolved config)."""

    prompts_per_step: int
    """Prompts per step (``data.train_batch_size``)."""
    group_size: int
    """Samples per prompt (``rollout.n``)."""
    max_new_tokens: int
    """Response cap (``rollout.max_new_tokens``), in training and validation."""
    temperature: float
    """Sampling temperature (``rollout.temperature``), in training and sampled validation."""
    lr: float
    """AdamW learning rate, constant (``actor.engine.optim.lr``)."""
    weight_decay: float
    """AdamW weight decay."""
    betas: tuple[float, float]
    """AdamW betas."""
    adam_eps: float
    """AdamW epsilon."""
    grad_clip: float
    """Gradient-norm clip."""
    clip_low: float
    """PPO ratio clip below 1 (``actor.clip_low``)."""
    clip_high: float
    """PPO ratio clip above 1 (``actor.clip_high``)."""
    val_samples: int
    """Sampled answers per validation prompt (``trainer.val_samples``)."""
    model: str
    """The model directory (the imported SmolLM2 Hugging Face folder)."""
    precision: str = "float32"
    """Compute precision of generation and forward/backward: ``float32``, or ``bfloat16``
    mixed precision (fp32 master weights and AdamW state, bf16 compute): HybridFlow's
    ``actor.engine.fsdp.param_dtype``; TRL's ``bf16=True``; the plain loop's CPU autocast."""
    micro_batch_rows: int = 16
    """Rows per forward/backward in the plain loop and TRL (gradients accumulate over the
    step's ``prompts_per_step * group_size`` rows; one optimizer step per step)."""

    @classmethod
    def read(cls, path: Path) -> RealSettings:
        """The settings the driver wrote to ``path`` (JSON)."""
        data = json.loads(path.read_text())
        data["betas"] = tuple(data["betas"])
        return cls(**data)


@dataclass
class RealRunRecord:
    """What a column reports (JSON): step times and the validation curve."""

    name: str
    """Column name."""
    step_seconds: list[float] = field(default_factory=list)
    """Training wall time of each step (validation excluded)."""
    step_cpu_seconds: list[float] = field(default_factory=list)
    """CPU time of the column's process in each step (empty where the work runs in other
    processes)."""
    evals: list[dict[str, float]] = field(default_factory=list)
    """``{"step", "train_seconds", "greedy", "sampled"}`` at each validation (step 0: before
    training)."""
    rewards: list[float] = field(default_factory=list)
    """Mean training reward of each step."""
    notes: str = ""
    """Free text: settings that differ between columns, warnings."""


def autocast(settings: RealSettings) -> contextlib.AbstractContextManager[Any]:
    """bf16 CPU autocast when ``settings.precision`` is ``bfloat16``; else no change."""
    if settings.precision not in PRECISIONS:
        raise ValueError(f"precision {settings.precision!r}: use one of {PRECISIONS}")
    enabled = settings.precision == "bfloat16"
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def load_scorer() -> ModuleType:
    """``hf_algos.rewards.reasoning_gym`` loaded from its file, without the package (whose
    ``__init__`` pulls in torch-side modules the TRL venv does not need)."""
    spec = importlib.util.spec_from_file_location("real_grpo_scorer", SCORER_FILE)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the reasoning-gym scorer from {SCORER_FILE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SCORER: ModuleType | None = None


def score(response: str, row: dict[str, Any]) -> float:
    """HybridFlow's reasoning-gym score of ``response`` to ``row`` (1.0 right, else less)."""
    global _SCORER
    if _SCORER is None:
        _SCORER = load_scorer()
    truth = row["reward_model"]["ground_truth"]
    return float(_SCORER.compute_reasoning_gym_score(response, truth, row["extra_info"]))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a jsonl file (one verl-schema row a line)."""
    with path.open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat prompt, byte for byte as HybridFlow's data pipeline builds them
    (``hf_algos.data.prompts.encode_prompt`` with the chat template on)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return [int(t) for t in tokenizer(str(text), add_special_tokens=False)["input_ids"]]


def generation_config(
    tokenizer: PreTrainedTokenizerBase, max_new_tokens: int, temperature: float | None
) -> GenerationConfig:
    """Pure sampling at ``temperature`` (no top-k / top-p, as HybridFlow's rollout with
    ``top_k=-1, top_p=1``), or greedy when ``temperature`` is ``None``."""
    common = {
        "max_new_tokens": max_new_tokens,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if temperature is None:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, **common)


def left_pad(ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``, both ``(B, P)``, prompts aligned on the right."""
    width = max(len(row) for row in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return input_ids, mask


def response_mask(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
    """``(B, R)`` float mask: 1 up to and including the first ``eos_id``, 0 after it."""
    is_eos = (responses == eos_id).to(torch.int64)
    after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0
    return (~after_eos).to(torch.float32)


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    ids: list[list[int]],
    config: GenerationConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Responses to the prompt ``ids`` in one batched ``model.generate``.

    Returns ``(prompt_ids (B, P), prompt_mask (B, P), responses (B, R), response_mask
    (B, R))``; ``R <= config.max_new_tokens`` and the response mask ends at the first eos.
    """
    was_training = model.training
    model.eval()
    input_ids, attention = left_pad(ids, int(tokenizer.pad_token_id))
    out = model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config)
    model.train(was_training)
    responses = out[:, input_ids.shape[1] :]
    return input_ids, attention, responses, response_mask(responses, int(tokenizer.eos_token_id))


def decode(
    tokenizer: PreTrainedTokenizerBase, responses: torch.Tensor, mask: torch.Tensor
) -> list[str]:
    """Response texts, special tokens dropped (as HybridFlow decodes them for scoring)."""
    return [
        str(tokenizer.decode(row[m.bool()].tolist(), skip_special_tokens=True))
        for row, m in zip(responses, mask, strict=True)
    ]


def evaluate(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    settings: RealSettings,
    seed: int,
) -> dict[str, float]:
    """``{"greedy", "sampled"}`` accuracy on ``rows``: the share of greedy answers scoring
    >= 1, and of ``settings.val_samples`` answers per prompt sampled at the training
    temperature from ``seed`` (the caller's random state is left as it was)."""
    ids = [prompt_ids(tokenizer, row["prompt"]) for row in rows]
    greedy = generation_config(tokenizer, settings.max_new_tokens, None)
    *_, responses, mask = generate(model, tokenizer, ids, greedy)
    texts = decode(tokenizer, responses, mask)
    right = [score(t, r) >= 1.0 for t, r in zip(texts, rows, strict=True)]
    result = {"greedy": sum(right) / len(rows)}
    if settings.val_samples:
        k = settings.val_samples
        sampling = generation_config(tokenizer, settings.max_new_tokens, settings.temperature)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            *_, responses, mask = generate(
                model, tokenizer, [i for i in ids for _ in range(k)], sampling
            )
        repeated = [r for r in rows for _ in range(k)]
        texts = decode(tokenizer, responses, mask)
        right = [score(t, r) >= 1.0 for t, r in zip(texts, repeated, strict=True)]
        result["sampled"] = sum(right) / len(repeated)
    return result


def column_args(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line every column of the comparison takes: the run's files, steps,
    evaluation interval, seed and torch threads (``doc`` is the script's docstring)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for flag in ("--settings", "--train", "--val", "--result"):
        parser.add_argument(flag, type=Path, required=True)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--eval-every", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args(argv)
